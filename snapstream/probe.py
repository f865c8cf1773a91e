"""SnapKV's observed queries beyond the prompt's last ``observation`` (``CachePolicy.observe``).

SnapKV votes with the queries of the prompt's last tokens: the question's, when it ends the
prompt. When a message puts its question before the document, those queries are the document's
end and know nothing of it (docs/accuracy.md: 0 of the full cache's 5 paraphrased needles). Under
``observe="opening"`` prefill runs a probe after the prompt, in the same forward: the last turn's
opening (:meth:`~snapstream.tokenizer.Tokenizer.turn_probe`, where an instruction and the question
sit) and the prompt's closing read again, their queries now after the whole document. They join
the observation window; their keys and values are never kept, and the prompt's logits are its
last token's.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence

from snapstream.tokenizer import Tokenizer

PROBE_TOKENS = 96  # of the last turn's opening a probe reads again: an instruction and a question

PROBES: dict[str, Callable[[Tokenizer, Sequence[int]], list[int]]] = {
    "last": lambda tokenizer, ids: [],
    "opening": lambda tokenizer, ids: tokenizer.turn_probe(ids, PROBE_TOKENS),
}


def probe_ids(tokenizer: Tokenizer, ids: Sequence[int], observe: str) -> list[int]:
    """The tokens run after the prompt ``ids`` for their queries alone, under ``observe``."""
    return PROBES[observe](tokenizer, ids)
