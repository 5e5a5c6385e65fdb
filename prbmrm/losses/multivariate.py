"""Multivariate scores that do not decompose over examples (paper 000, App. A.3)."""

MULTIVARIATE_LOSSES = ()
