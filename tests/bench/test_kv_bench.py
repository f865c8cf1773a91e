"""`snapstream bench kv`: KV bytes per sequence by the cache rules, counted by hand."""

from __future__ import annotations

from bench.kv_cli import kv_rows
from snapstream.policy import CachePolicy

# Gemma 3 270M's pattern: five sliding layers (window 512) before each global one, 18 layers
WINDOWS = ((512,) * 5 + (None,)) * 3
DEFAULT = CachePolicy()  # 4 sinks + 764 selected + 256 recent: a global budget of 1024


def test_gemma3_rows_by_hand():
    rows = dict(kv_rows(WINDOWS, DEFAULT, slot_bytes=10, token_bytes=8,
                        lengths=(300, 4096, 32768)))
    # snapstream: 3 global layers x 1024 slots + 15 sliding x 512, whatever the prompt
    assert rows["snapstream, default policy (global budget 1024)"] == [
        (3 * 1024 + 15 * 512) * 10] * 3
    # full: the global layers hold the prompt, the sliding ones still their window
    assert rows["snapstream, `full`"] == [(3 * n + 15 * 512) * 10 for n in (300, 4096, 32768)]
    # llama.cpp: n_ctx cells on global layers; min(n_ctx, 512 + n_ubatch 512) padded to 256
    assert rows["llama.cpp SWA cache (f16, n_ctx = prompt)"] == [
        (3 * 300 + 15 * 512) * 8, (3 * 4096 + 15 * 1024) * 8, (3 * 32768 + 15 * 1024) * 8]
    assert rows["full cache, every layer x prompt"] == [18 * n * 8 for n in (300, 4096, 32768)]
