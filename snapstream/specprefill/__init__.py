"""Speculative prefill across model families (SpecPrefill, Liu et al. 2025; cross-family:
Upasani et al.): a small draft model's attention picks the prompt chunks the target prefills.

- :mod:`.settings`: the per-request settings (torch-free, shared with the router);
- :mod:`.scoring`: the draft's prefill, look-ahead decode and token scores;
- :mod:`.chunks`: chunk ranking;
- :mod:`.mapping`: draft chunks -> target tokens through character offsets;
- :mod:`.selector`: the whole selection for one prompt.

The target prefills the kept tokens at their original positions through
:meth:`snapstream.engine.Engine.prefill` (``positions``; :mod:`snapstream.placement`).
"""
