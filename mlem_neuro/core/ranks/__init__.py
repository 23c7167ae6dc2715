"""Ranks: exact and soft ranks, Spearman scores, grouped (tied) pairs."""
