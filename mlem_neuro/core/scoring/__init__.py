"""Scoring fitted models: permutation importances and their nulls."""
