"""Shipped configurations: the model registry and the local demo."""
