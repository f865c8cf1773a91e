"""Draft chunks carried to the target's tokens through character offsets, on the two installed
tokenizers (SmolLM2's byte-level BPE, Gemma 3's SentencePiece), over text they split very
differently: numbers, code, CJK, emoji, runs of spaces."""

from __future__ import annotations

import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st

from snapstream.checkpoints import open_checkpoint
from snapstream.checkpoints.registry import model_path
from snapstream.specprefill.chunks import chunk_bounds
from snapstream.specprefill.mapping import (
    char_mask,
    check_offsets,
    chunk_spans,
    tokens_touching,
)

PIECES = ["1234567", "3.14159", " 42 ", "def f(x):\n    return x**2", "{'a': [1, 2]}",
          "東京は日本の", "首都です。", "🤗", "👍🏽", "👨‍👩‍👧",
          "     ", "\t\t", "\n\n", " the cat", "naïve café",
          "<|im_start|>", "ﬁ", "x" * 9]
TEXTS = st.lists(st.sampled_from(PIECES), min_size=1, max_size=25).map("".join)


@pytest.fixture(scope="module")
def tokenizers():
    return {name: open_checkpoint(model_path(name)).tokenizer()
            for name in ("smollm2-135m", "gemma3-270m")}


def _offsets(tokenizer, text: str) -> torch.Tensor:
    return torch.tensor(tokenizer.encode_with_offsets(text)[1], dtype=torch.int64).view(-1, 2)


@settings(max_examples=60, deadline=None)
@given(text=TEXTS, chunk_size=st.integers(1, 9), picks=st.lists(st.booleans(), min_size=64,
                                                                max_size=64))
@pytest.mark.parametrize("direction", [("smollm2-135m", "gemma3-270m"),
                                       ("gemma3-270m", "smollm2-135m")])
def test_kept_characters_are_exactly_what_the_kept_target_tokens_touch(
        tokenizers, direction, text, chunk_size, picks):
    draft, target = (tokenizers[name] for name in direction)
    draft_offsets, target_offsets = _offsets(draft, text), _offsets(target, text)
    check_offsets(draft_offsets, len(text), "draft")
    check_offsets(target_offsets, len(text), "target")
    hulls = chunk_spans(draft_offsets, chunk_bounds(len(draft_offsets), chunk_size))
    # the picks repeat over the chunks: a text of digits has a chunk per character
    chosen = hulls[torch.tensor([picks[i % len(picks)] for i in range(len(hulls))],
                                dtype=torch.bool)]
    chars = char_mask(chosen, len(text))
    kept = tokens_touching(target_offsets, chars)
    covered = torch.zeros(len(text), dtype=torch.bool)
    for start, end in target_offsets[kept].tolist():
        covered[start:end] = True
    spelled = char_mask(target_offsets, len(text))
    # every kept character the target spells is in a kept target token ...
    assert bool((covered | ~(chars & spelled)).all())
    # ... and every kept target token has a kept character
    for start, end in target_offsets[kept].tolist():
        assert bool(chars[start:end].any())


@settings(max_examples=40, deadline=None)
@given(text=TEXTS)
def test_all_chunks_keep_every_target_token_with_characters(tokenizers, text):
    for draft, target in (("smollm2-135m", "gemma3-270m"), ("gemma3-270m", "smollm2-135m")):
        draft_offsets = _offsets(tokenizers[draft], text)
        target_offsets = _offsets(tokenizers[target], text)
        hulls = chunk_spans(draft_offsets, chunk_bounds(len(draft_offsets), 4))
        kept = tokens_touching(target_offsets, char_mask(hulls, len(text)))
        has_chars = target_offsets[:, 1] > target_offsets[:, 0]
        assert bool((kept == has_chars).all())


def test_the_tokenizers_split_these_texts_differently(tokenizers):
    """The property tests above are only worth something if the splits differ."""
    texts = ("12345 + 678", "東京は日本の首都です。", "hi 🤗👍🏽", "a      b", "def f(x):\n    x")
    for text in texts:
        spans = [tuple(map(tuple, _offsets(tokenizers[n], text).tolist())) for n in tokenizers]
        assert spans[0] != spans[1], text


def test_a_tokenizer_without_offsets_is_refused():
    with pytest.raises(ValueError, match="no character offsets"):
        check_offsets(torch.zeros(5, 2, dtype=torch.int64), 12, "draft model")
    with pytest.raises(ValueError, match="outside the text"):
        check_offsets(torch.tensor([[0, 3], [3, 20]]), 12, "draft model")


def test_a_chunk_takes_the_gaps_between_its_tokens():
    offsets = torch.tensor([[0, 0], [0, 3], [4, 7], [7, 9], [10, 12]])  # BOS, then gaps at 3, 9
    assert chunk_spans(offsets, torch.tensor([[0, 3], [3, 5]])).tolist() == [[0, 7], [7, 12]]
