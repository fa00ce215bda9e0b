"""The human audit of generated items (paper App. C.2): the sample, the labels, the two screens."""
