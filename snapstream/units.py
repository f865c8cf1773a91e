"""What SnapKV keeps whole (``CachePolicy.unit``): a token, or a word.

SnapKV ranks every key alone. Pooling spreads a key's votes to its neighbours, but a fact's
tokens need not sit inside one kernel: the question names a needle's key, its queries vote for
the key's tokens, and the number after it, a digit a token on most tokenizers, is 5-12 tokens
further on, where the pooled votes run out. A head then keeps ``616441`` of ``6164416``, and the
answer is wrong (docs/accuracy.md, "Multi-needle at 1/8"). Under ``unit="word"`` every token of
a word scores its word's best, so a word is kept whole or not at all (ties at the budget's edge
aside). A word is a run of tokens with no whitespace between them: a number, an identifier
with its dots and underscores, a word with its punctuation; a special token is a word of its
own, and a run longer than ``WORD_TOKENS`` (a URL, an encoded blob) is cut into words of that
many.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence

import torch

from snapstream.tokenizer import Tokenizer

WORD_TOKENS = 16  # the longest word: a longer run of tokens without whitespace is cut


def word_ids(pieces: Sequence[str], max_tokens: int = WORD_TOKENS) -> torch.Tensor:
    """(P,) int64: each token's word, counted from 0, given each token's text. A word starts at
    a token whose text is empty (a special token) or starts with whitespace, after one whose
    text is empty or ends with whitespace, and every ``max_tokens`` tokens within a run."""
    ids, word, length, before = [], -1, 0, ""
    for piece in pieces:
        starts = (not piece or piece[0].isspace() or not before or before[-1].isspace()
                  or length == max_tokens)
        word, length = (word + 1, 1) if starts else (word, length + 1)
        ids.append(word)
        before = piece
    return torch.tensor(ids, dtype=torch.int64)


def keep_whole(scores: torch.Tensor, spans: torch.Tensor) -> torch.Tensor:
    """scores (..., P), spans (P,) ascending ids of the span each position belongs to ->
    (..., P): each position scores its span's best. A position scored -inf (a key that is not
    there) stays -inf."""
    index = spans.to(scores.device).expand_as(scores)  # (..., P)
    best = scores.new_full((*scores.shape[:-1], int(spans[-1]) + 1), float("-inf"))
    best = best.scatter_reduce(-1, index, scores, "amax")  # (..., spans)
    return torch.where(scores == float("-inf"), scores, best.gather(-1, index))


# unit -> the prompt's spans (P,) to keep whole, or None where each token stands alone
SPANS: dict[str, Callable[[Tokenizer, Sequence[int]], torch.Tensor | None]] = {
    "token": lambda tokenizer, ids: None,
    "word": lambda tokenizer, ids: word_ids([tokenizer.decode([token]) for token in ids]),
}


def unit_spans(tokenizer: Tokenizer, ids: Sequence[int], unit: str) -> torch.Tensor | None:
    """The spans of the prompt ``ids`` that SnapKV keeps whole under ``unit``."""
    return SPANS[unit](tokenizer, ids)
