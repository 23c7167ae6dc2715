"""Training: the engine, its backends behind one table
(:mod:`mlem_neuro.core.training.backends`: compiled, torch, reference) and the metric W."""
