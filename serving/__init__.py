"""Shared plumbing of the three services: settings, server bootstrap, proto conversion, errors,
metrics, TLS and API keys. Torch-free, so the router imports it without the model, except
``serving.worker``, which ties a model worker's engine to its blob spec and store."""
