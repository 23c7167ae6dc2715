"""Adapters: MNE Epochs, NIfTI images and plain arrays → stimulus × unit data + features."""
