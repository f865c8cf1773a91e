"""Peer systems (llama.cpp, OpenVINO GenAI, transformers, kvpress) benchmarked on the same CPU,
model and token ids as snapstream. Each peer runs in its own cached virtualenv as a runner
process that speaks JSON lines (``runners/peer_protocol.py``); this process never imports a
peer library."""
