"""The KnowOrNot report: what a finished run reports, its figures, its sections and the page."""
