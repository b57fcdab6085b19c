"""Statistics that need no torch: intervals that hold their level (the median's, an unseen prompt's, the bootstrap),
goodness-of-fit tests, estimators from per-iteration counts, the racing rule and the speculate-or-not verdict.
Imports numpy and scipy only, nothing else of speclab.
"""
