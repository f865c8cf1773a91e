"""The four retrieval tasks: layout, lengths, depths, placements, answers, validation."""

import random

import pytest

from snapstream.data import (
    ANSWER_CUE,
    LENGTH_SLACK,
    MAX_ANSWER_LEN,
    TASKS,
    Placement,
    Sample,
    Split,
    TaskConfig,
    exact_match,
    generate,
    layout,
)
from snapstream.data.tasks import min_context_len

DEPTHS = (0.0, 0.25, 0.5, 0.75, 1.0)


def make(task: str, seed: int = 0, **overrides) -> Sample:
    cfg = TaskConfig(**{"context_len": 1024, **overrides})
    return generate(task, random.Random(seed), cfg)


@pytest.mark.parametrize("task", TASKS)
def test_same_seed_same_sample_and_other_seed_another(task):
    assert make(task, seed=7) == make(task, seed=7)
    assert make(task, seed=7).prompt != make(task, seed=8).prompt


@pytest.mark.parametrize("task", TASKS)
@pytest.mark.parametrize("placement", list(Placement))
def test_answer_sits_at_its_offset_inside_the_target_needle(task, placement):
    for seed in range(20):
        sample = make(task, seed, placement=placement, depth=seed / 19)
        start = sample.answer_offset
        assert sample.prompt[start : start + len(sample.answer)] == sample.answer
        holder = [n for n in sample.needles if n.offset <= start < n.offset + len(n.text)]
        assert len(holder) == 1 and holder[0].is_target
        for needle in sample.needles:
            assert sample.prompt[needle.offset : needle.offset + len(needle.text)] == needle.text
        assert sample.answer not in sample.question


@pytest.mark.parametrize("task", TASKS)
def test_prompt_length_is_within_slack_of_context_len(task):
    for i, context_len in enumerate(range(384, 4300, 131)):
        placement = list(Placement)[i % 2]
        split = list(Split)[i // 2 % 2]
        sample = make(task, i, context_len=context_len, placement=placement, split=split)
        assert context_len - LENGTH_SLACK <= len(sample.prompt.encode()) <= context_len
        assert sample.context_len == context_len


@pytest.mark.parametrize("task", TASKS)
def test_answer_offset_grows_with_depth(task):
    offsets = [make(task, 3, context_len=2048, depth=d).answer_offset for d in DEPTHS]
    assert offsets == sorted(set(offsets))


def test_passkey_lands_near_the_requested_depth():
    for depth in DEPTHS:
        sample = make("passkey", 5, context_len=2048, depth=depth)
        (needle,) = sample.needles
        filler_len = len(sample.prompt) - len(f"\n\n{sample.question}{ANSWER_CUE}")
        filler_len -= len(needle.text) + 1
        assert abs(needle.offset - depth * filler_len) <= 121  # half the longest sentence


@pytest.mark.parametrize("task", TASKS)
def test_question_after_the_context_ends_the_prompt(task):
    sample = make(task, 1, placement="after")
    assert sample.placement is Placement.AFTER
    assert sample.prompt.endswith(f"\n\n{sample.question}{ANSWER_CUE}")
    question_at = sample.prompt.rindex(sample.question)
    assert all(n.offset + len(n.text) < question_at for n in sample.needles)


@pytest.mark.parametrize("task", TASKS)
def test_question_before_the_context_stays_out_of_the_last_window(task):
    sample = make(task, 1, placement="before")
    assert sample.prompt.startswith(f"{sample.question}\n\n")
    assert sample.prompt.endswith(f"\n{ANSWER_CUE}")
    assert all(n.offset > len(sample.question) for n in sample.needles)
    assert sample.question not in sample.prompt[len(sample.question) :]


@pytest.mark.parametrize("task", TASKS)
def test_text_is_ascii_and_answers_are_short_and_checkable(task):
    for seed in range(10):
        sample = make(task, seed, split=list(Split)[seed % 2])
        assert sample.prompt.isascii() and sample.answer.isascii()
        assert 0 < len(sample.answer) <= MAX_ANSWER_LEN
        assert sample.target == sample.answer + "\n"
        assert exact_match(f" {sample.answer} \nmore text", sample.answer)
        assert not exact_match(sample.answer + "0\n", sample.answer)


def test_vartrack_chain_leads_from_the_asked_variable_to_the_answer():
    sample = make("vartrack", 2, num_hops=3, num_distractors=2)
    chain = [n.text for n in sample.needles if n.is_target]
    assert len(chain) == 4 and sample.answer in chain[0]
    assert len(sample.needles) == 12
    asked = sample.question.split()[-1].rstrip("?")
    assert asked in chain[-1]


def test_multikey_distractors_share_a_word_with_the_asked_key():
    sample = make("multikey", 4, num_distractors=5)
    key = next(word for word in sample.question.split() if "-" in word).rstrip("?.,")
    adjective, noun = key.split("-")
    distractors = [n.text for n in sample.needles if not n.is_target]
    assert len(distractors) == 5
    assert all(adjective in text or noun in text for text in distractors)


def test_kv_table_holds_one_row_per_key():
    sample = make("kv", 6, num_distractors=7)
    (block,) = sample.needles
    assert block.text.count("\n") == 1 + 8


@pytest.mark.parametrize(
    ("overrides", "field"),
    [
        ({"context_len": 64}, "context_len"),
        ({"depth": 1.5}, "depth"),
        ({"depth": -0.1}, "depth"),
        ({"placement": "middle"}, "placement"),
        ({"split": "test"}, "split"),
        ({"num_distractors": -1}, "num_distractors"),
        ({"num_hops": 0}, "num_hops"),
    ],
)
def test_bad_config_names_the_field(overrides, field):
    with pytest.raises(ValueError, match=field):
        TaskConfig(**{"context_len": 1024, **overrides})


def test_placement_and_split_accept_their_string_values():
    cfg = TaskConfig(context_len=512, placement="before", split="heldout")
    assert cfg.placement is Placement.BEFORE and cfg.split is Split.HELDOUT


def test_needles_too_big_for_the_context_name_context_len():
    with pytest.raises(ValueError, match="context_len"):
        make("vartrack", context_len=256, num_distractors=8, num_hops=4)
    with pytest.raises(ValueError, match="context_len"):
        make("passkey", context_len=200_000, split="heldout")


def test_unknown_task_is_named():
    with pytest.raises(ValueError, match="task"):
        generate("haystack", random.Random(0), TaskConfig(context_len=512))


@pytest.mark.parametrize("task", ["multikey", "kv", "vartrack"])
def test_followups_ask_about_every_distractor_and_the_context_answers_them(task):
    for seed in range(10):
        sample = make(task, seed, num_distractors=seed % 4)
        assert len(sample.followups) == seed % 4
        answers = [answer for _, answer in sample.followups]
        assert sample.answer not in answers and len(set(answers)) == len(answers)
        for question, answer in sample.followups:
            assert question != sample.question
            assert sample.prompt.count(answer) == 1
            assert question not in sample.prompt


def test_passkey_has_no_followups():
    assert make("passkey").followups == ()


def test_training_segments_alternate_cues_and_answers():
    sample = make("kv", 5, num_distractors=2)
    segments = sample.training_segments()
    assert segments[0] == (sample.prompt, False)
    assert segments[1] == (sample.answer + "\n", True)
    for (cue, cue_is_answer), (answer, is_answer), (question, expected) in zip(
        segments[2::2], segments[3::2], sample.followups, strict=True
    ):
        assert cue == question + ANSWER_CUE and not cue_is_answer
        assert answer == expected + "\n" and is_answer


@pytest.mark.parametrize("task", TASKS)
@pytest.mark.parametrize("split", list(Split))
def test_min_context_len_holds_every_sample_and_is_a_tight_bound(task, split):
    for num_distractors, num_hops in [(0, 1), (2, 1), (3, 2), (6, 4)]:
        bound = min_context_len(task, split, num_distractors, num_hops)
        needs = [
            layout.context_len_for(sample.question, [needle.text for needle in sample.needles])
            for seed in range(150) for placement in Placement
            for sample in [make(task, seed, context_len=bound, split=split, placement=placement,
                                num_distractors=num_distractors, num_hops=num_hops)]
        ]  # each sample builds at the bound, and the largest of them comes close to it
        assert 0.9 * bound <= max(needs) <= bound
