"""Training: the engine, its backends (compiled loop, torch, reference) and the metric W."""
