"""Filler windows: a window that runs past the corpus's end goes on from its start, so prompts
of 32k tokens find enough prose; one that ends before the end is a plain slice."""

import pytest

from evaldata import CORPORA, corpus
from evaldata.filler import MAX_WINDOW_CHARS, START_MARGIN_CHARS


@pytest.mark.parametrize("name", list(CORPORA))
def test_a_window_past_the_end_goes_on_from_the_start(name):
    source = corpus(name)
    start = max(s for s in source.sentence_starts if s <= len(source.text) - START_MARGIN_CHARS)
    window = source.window(start, MAX_WINDOW_CHARS)
    tail = source.text[start:]
    assert window.text.startswith(f"{tail} {source.text[:1000]}")
    assert len(tail) + 1 in window.boundaries  # the corpus's first sentence takes needles too
    assert MAX_WINDOW_CHARS - 20 <= len(window.text) <= MAX_WINDOW_CHARS
    assert not window.text.endswith(" ")


def test_a_window_before_the_end_is_a_slice_cut_at_a_word_end():
    source = corpus("prose")
    start = source.sentence_starts[10]
    window = source.window(start, 5000)
    assert source.text[start:].startswith(window.text)
    assert source.text[start + len(window.text)] == " " and len(window.text) <= 5000
    assert window.boundaries[0] == 0 and window.boundaries[-1] == len(window.text)
    assert all(window.text[b - 1] == " " for b in window.boundaries[1:-1])


def test_a_window_longer_than_the_limit_is_refused():
    with pytest.raises(ValueError, match=f"0 to {MAX_WINDOW_CHARS} characters"):
        corpus("classic").window(0, MAX_WINDOW_CHARS + 1)
