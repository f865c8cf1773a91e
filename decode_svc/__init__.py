"""Decode workers: a fixed batch of rows, continuous batching, ring-buffer decoding, streaming."""
