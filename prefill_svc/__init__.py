"""Prefill workers: run the prompt, compress with SnapKV, store the blob, return its handle."""
