"""Train and held-out pools never share a wording or a filler sentence."""

import random
import re

import pytest

from snapstream.data import (
    ANSWER_CUE,
    PHRASES,
    TASKS,
    Phrases,
    Placement,
    Sample,
    Split,
    build_eval_set,
    filler_corpus,
)
from snapstream.data.filler import MAX_WORD_LEN, is_prose, module_split

PLACEHOLDERS = {
    "value": r"(?:\d{5,7}|[A-Z0-9]{6})",
    "key": r"(?:[a-z]+-[a-z]+|[a-z0-9]{5})",
    "name": r"[A-Z]{4}",
    "src": r"[A-Z]{4}",
}


def template_pattern(template: str) -> re.Pattern[str]:
    parts = re.split(r"\{(\w+)\}", template)
    return re.compile("".join(PLACEHOLDERS[p] if i % 2 else re.escape(p)
                              for i, p in enumerate(parts)))


def patterns(split: Split) -> list[re.Pattern[str]]:
    return [template_pattern(t) for task in PHRASES.values() for t in task[split].templates()]


@pytest.fixture(scope="module")
def samples() -> dict[Split, list[Sample]]:
    train = build_eval_set(tasks=list(TASKS), context_lens=[768, 1024], depths=[0.2, 0.5, 0.8],
                           n_per_cell=10, seed=2, split=Split.TRAIN)
    heldout = build_eval_set(tasks=list(TASKS), context_lens=[768, 1536], depths=[0.1, 0.9],
                             n_per_cell=10, seed=2)
    return {Split.TRAIN: train, Split.HELDOUT: heldout}


def test_every_task_has_wordings_in_both_splits():
    assert set(PHRASES) == set(TASKS)
    assert all(set(by_split) == set(Split) for by_split in PHRASES.values())


@pytest.mark.parametrize("split", list(Split))
def test_no_wording_of_one_split_appears_in_the_other(samples, split):
    other = Split.HELDOUT if split is Split.TRAIN else Split.TRAIN
    own, foreign = patterns(split), patterns(other)
    for sample in samples[split]:
        assert any(p.search(sample.prompt) for p in own)  # the patterns do match
        assert not [p.pattern for p in foreign if p.search(sample.prompt)]


def filler_pieces(sample: Sample) -> list[str]:
    tail = f"\n\n{sample.question}{ANSWER_CUE}"
    start, stop = 0, len(sample.prompt) - len(tail)
    if sample.placement is Placement.BEFORE:
        start, stop = len(sample.question) + 2, len(sample.prompt) - len(ANSWER_CUE) - 1
    cuts = [(n.offset, n.offset + len(n.text)) for n in sample.needles] + [(stop, stop)]
    pieces = []
    for cut_start, cut_stop in cuts:
        pieces.append(sample.prompt[start:cut_start].strip())
        start = cut_stop
    return [piece for piece in pieces if piece]


def corpus_sentences(split: Split) -> set[str]:
    corpus = filler_corpus(split)
    ends = [start - 1 for start in corpus.sentence_starts[1:]] + [len(corpus.text)]
    return {corpus.text[a:b] for a, b in zip(corpus.sentence_starts, ends, strict=True)}


@pytest.mark.parametrize("split", list(Split))
def test_filler_is_whole_sentences_of_its_own_split(samples, split):
    other = Split.HELDOUT if split is Split.TRAIN else Split.TRAIN
    own, foreign = corpus_sentences(split), corpus_sentences(other)
    for sample in samples[split][::3]:
        pieces = filler_pieces(sample)
        assert all(piece in filler_corpus(split).text for piece in pieces)
        sentences = [s for piece in pieces for s in re.split(r"(?<=[.!?]) (?=[A-Z])", piece)]
        assert all(s in own and s not in foreign for s in sentences[1:])  # [0] starts mid-way


def test_corpora_share_no_sentence_and_are_large_enough():
    train, heldout = corpus_sentences(Split.TRAIN), corpus_sentences(Split.HELDOUT)
    assert not train & heldout
    assert all(is_prose(sentence) for sentence in train | heldout)
    assert len(filler_corpus(Split.HELDOUT).text) > 50_000
    assert len(filler_corpus(Split.TRAIN).text) > 3 * len(filler_corpus(Split.HELDOUT).text)
    assert filler_corpus(Split.TRAIN).text.isascii()


def test_corpus_is_stable_and_modules_split_by_name():
    assert filler_corpus(Split.TRAIN).fingerprint == filler_corpus("train").fingerprint
    assert {module_split(name) for name in ("os", "re", "json", "ast", "typing", "shutil")} == set(
        Split
    )


def test_windows_end_at_sentence_ends_and_start_at_words():
    corpus = filler_corpus(Split.HELDOUT)
    rng = random.Random(0)
    for length in (64, 300, 2000, 9000):
        window = corpus.window(rng, length)
        assert length - MAX_WORD_LEN <= len(window.text) <= length
        assert window.text[-1] in ".!?" and window.text[0] != " "
        assert window.boundaries[0] == 0 and window.boundaries[-1] == len(window.text)
        inner = window.boundaries[1:-1]
        assert all(window.text[b - 1] == " " and window.text[b].isupper() for b in inner)


@pytest.mark.parametrize(
    "sentence",
    [
        "Too short.",
        "the first word of this long sentence is not capitalised at all.",
        "This sentence mentions a number like 12345 and is otherwise fine.",
        "This sentence asks a question about the answer, which is reserved.",
        "This sentence has an extraordinarilylongidentifier inside it somewhere.",
        "x = foo(bar) + baz[qux] * 3 if y else z; return {a: b for a in c}.",
    ],
)
def test_prose_filter_rejects(sentence):
    assert not is_prose(sentence)


def test_phrases_validate_their_fields():
    with pytest.raises(ValueError, match="facts"):
        Phrases(facts=(), questions=("Where?",))
    with pytest.raises(ValueError, match="links"):
        Phrases(facts=("A {value}.", "B {value}."), questions=("Q?",), links=("C {src}.",))
    with pytest.raises(ValueError, match="ASCII"):
        Phrases(facts=("Le mot de passe est {value} \u00e9.",), questions=("Q?",))
