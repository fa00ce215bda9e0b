"""Human labels for KnowOrNot: what to label, the two screens, evaluators against the humans."""
