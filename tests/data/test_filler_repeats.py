"""Filler with repeated random strings (training only): each appears exactly twice, the window
keeps its length contract and boundaries, and the default draws no repeats."""

import random
from itertools import pairwise

import pytest

from snapstream.data import Split, TaskConfig, TrainingMixture, filler_corpus, generate
from snapstream.data.filler import MAX_WORD_LEN, MIN_REPEAT_LEN
from snapstream.data.sample import LENGTH_SLACK


def twice_pieces(text: str, boundaries: tuple[int, ...]) -> set[str]:
    """Pieces between consecutive boundaries that occur twice: the corpus holds each sentence
    once, so only a repeat makes one."""
    pieces = [text[a:b].strip() for a, b in pairwise(boundaries)]
    return {p for p in pieces if len(p) >= MIN_REPEAT_LEN and pieces.count(p) == 2}


@pytest.mark.parametrize("length", [300, 800, 2000])
def test_repeats_keep_the_window_contract(length):
    corpus = filler_corpus(Split.TRAIN)
    for seed in range(20):
        window = corpus.window(random.Random(seed), length, repeats=2)
        assert length - MAX_WORD_LEN <= len(window.text) <= length
        assert window.boundaries[0] == 0 and window.boundaries[-1] == len(window.text)
        assert list(window.boundaries) == sorted(set(window.boundaries))
        assert all(window.text[b - 1] == " " for b in window.boundaries[1:-1])
        assert "  " not in window.text and window.text[0] != " "


def test_repeated_sentences_appear_twice_and_only_with_repeats():
    corpus = filler_corpus(Split.TRAIN)
    with_repeats = [corpus.window(random.Random(seed), 1200, repeats=2) for seed in range(20)]
    without = [corpus.window(random.Random(seed), 1200) for seed in range(20)]
    assert all(len(twice_pieces(w.text, w.boundaries)) >= 2 for w in with_repeats)
    assert not any(twice_pieces(w.text, w.boundaries) for w in without)


def test_zero_repeats_draw_the_same_window_as_before():
    corpus = filler_corpus(Split.HELDOUT)
    assert corpus.window(random.Random(3), 900, repeats=0) == corpus.window(random.Random(3), 900)


def test_samples_with_repeats_keep_the_length_rule_and_their_needles():
    for seed in range(20):
        cfg = TaskConfig(context_len=600, num_distractors=2, filler_repeats=2)
        sample = generate("multikey", random.Random(seed), cfg)
        assert cfg.context_len - LENGTH_SLACK <= len(sample.prompt) <= cfg.context_len
        assert all(sample.prompt[n.offset : n.offset + len(n.text)] == n.text
                   for n in sample.needles)
        assert sample.prompt[sample.answer_offset :].startswith(sample.answer)


def test_the_mixture_passes_repeats_to_its_samples():
    plain = TrainingMixture(seed=1, context_len_range=(900, 1000))
    repeated = TrainingMixture(seed=1, context_len_range=(900, 1000), filler_repeats=2)
    assert [plain[i].answer for i in range(5)] == [repeated[i].answer for i in range(5)]
    assert all(plain[i].prompt != repeated[i].prompt for i in range(5))


def test_negative_repeats_are_refused():
    with pytest.raises(ValueError, match="repeats"):
        filler_corpus(Split.TRAIN).window(random.Random(0), 500, repeats=-1)
    with pytest.raises(ValueError, match="filler_repeats"):
        TaskConfig(context_len=500, filler_repeats=-1)
