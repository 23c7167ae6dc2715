"""Stimuli and their pairs: feature distances, pair indexing and splits, the grid of
numeric distances, design diagnostics."""
