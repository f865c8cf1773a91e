"""The public front door: validation, tokenization, scheduling, streaming, failover."""
