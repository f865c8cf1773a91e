"""Decode workers: a fixed pool of slots, continuous batching, ring-buffer decoding, streaming."""
