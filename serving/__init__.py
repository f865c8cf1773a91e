"""Shared plumbing of the three services: settings, server bootstrap, proto conversion, errors,
metrics. Torch-free, so the router imports it without the model."""
