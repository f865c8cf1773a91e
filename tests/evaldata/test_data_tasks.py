"""Every task builds prompts of the asked token count, with its needles, question and cue where
they belong, reproducibly; verdict scores exact matches of the needle values."""

import random
import re
from dataclasses import replace

import pytest

from evaldata import (
    LENGTH_SLACK,
    PHRASES,
    TASKS,
    Placement,
    TaskConfig,
    exact_match,
    generate,
    model_format,
    verdict,
)
from tests.evaldata.helpers import spec

FORMATS = ("raw", "chat")


@pytest.mark.parametrize("prompt_format", FORMATS)
@pytest.mark.parametrize("task", list(TASKS))
@pytest.mark.parametrize("placement", list(Placement))
def test_prompt_fits_its_token_count_and_holds_the_answers(task, placement, prompt_format):
    s = spec(prompt_format)
    for context_len in (900, 2500):
        cfg = TaskConfig(context_len=context_len, depth=0.4, placement=placement)
        sample = generate(task, random.Random(f"{task}/{context_len}"), cfg, s)
        assert context_len - LENGTH_SLACK <= sample.num_tokens <= context_len
        assert sample.num_tokens == s.count(sample.prompt)
        assert sample.prompt.endswith(sample.cue) and sample.question in sample.prompt
        for needle in sample.needles:
            assert sample.prompt[needle.offset:].startswith(needle.text)
        targets = " ".join(n.text for n in sample.needles if n.is_target)
        assert all(answer in targets for answer in sample.answers)
        question_first = sample.prompt.index(sample.question) < sample.needles[0].offset
        assert question_first == (placement is Placement.BEFORE)


def test_chat_format_opens_the_assistant_turn_with_the_cue():
    sample = generate("niah", random.Random(0), TaskConfig(context_len=600), spec("chat"))
    assert sample.prompt.startswith("<|im_start|>system\n")
    assert sample.prompt.endswith(f"<|im_end|>\n<|im_start|>assistant\n{sample.cue}")
    raw = generate("niah", random.Random(0), TaskConfig(context_len=600), spec("raw"))
    assert raw.prompt.endswith(f"\n\nAnswer: {raw.cue}")


@pytest.mark.parametrize("depth", [0.0, 0.5, 1.0])
def test_target_needle_sits_at_its_depth(depth):
    sample = generate("realtext", random.Random(3), TaskConfig(context_len=1500, depth=depth),
                      spec())
    context = sample.prompt.split("\n\n")[1]
    offset = sample.needles[0].offset - sample.prompt.index(context)
    assert abs(offset / len(context) - depth) < 0.1


def test_before_placement_cue_names_no_key():
    for task in ("niah", "multikey", "kv", "vartrack", "realtext", "multivalue"):
        after = generate(task, random.Random(5), TaskConfig(context_len=900), spec())
        before = generate(task, random.Random(5),
                          TaskConfig(context_len=900, placement="before"), spec())
        assert before.cue == PHRASES[task].blind_cue
        template_words = set(re.sub(r"\{\w+\}", " ", PHRASES[task].cue).split())
        keys = set(after.cue.split()) - template_words
        assert keys and all(key in after.question for key in keys)
        assert not any(key in before.cue for key in keys)


def test_multikey_distractors_share_a_word_and_multivalue_asks_every_value():
    cfg = TaskConfig(context_len=1200, num_distractors=4, num_values=4)
    multikey = generate("multikey", random.Random(1), cfg, spec())
    assert len(multikey.needles) == 5 and len(multikey.answers) == 1
    multivalue = generate("multivalue", random.Random(1), cfg, spec())
    assert len(multivalue.answers) == 4 == len(set(multivalue.answers))


def test_vartrack_chain_is_in_order():
    cfg = TaskConfig(context_len=1500, num_hops=3, num_distractors=2, depth=0.2)
    sample = generate("vartrack", random.Random(2), cfg, spec())
    chain = [n.text for n in sample.needles if n.is_target]
    assert len(chain) == 4 and chain[0].endswith(f"= {sample.answers[0]}.")
    assert sample.question.split("VAR ")[1].split()[0] in chain[-1]


def test_same_rng_same_sample_and_passkey_uses_the_classic_noise():
    cfg = TaskConfig(context_len=500)
    first = generate("passkey", random.Random(7), cfg, spec())
    assert first == generate("passkey", random.Random(7), cfg, spec())
    assert first != generate("passkey", random.Random(8), cfg, spec())
    assert "The grass is green. The sky is blue." in first.prompt


def test_too_short_a_context_says_so():
    with pytest.raises(ValueError, match="too small for vartrack"):
        generate("vartrack", random.Random(0),
                 TaskConfig(context_len=128, num_distractors=16, num_hops=8), spec())


@pytest.mark.parametrize(("field", "value"), [
    ("context_len", 64), ("depth", 1.5), ("placement", "middle"), ("num_distractors", 17),
    ("num_hops", 0), ("num_values", 0),
])
def test_task_config_names_the_bad_field(field, value):
    with pytest.raises(ValueError, match=field):
        TaskConfig(**{"context_len": 512, field: value})


def test_unknown_task_is_named():
    with pytest.raises(ValueError, match="task must be one of"):
        generate("sudoku", random.Random(0), TaskConfig(context_len=512), spec())


@pytest.mark.parametrize(("answers", "text", "is_final", "expected"), [
    (("12345",), " 12345.", False, True),
    (("12345",), " 1234", False, None),  # the number may still grow
    (("12345",), " 1234", True, False),
    (("12345",), " 123456", True, False),
    (("12345",), " 54321 or 12345", False, False),
    (("12345",), ": the pass key is 12345\n", False, True),  # words without digits are skipped
    (("A7BQ2Z",), ' "A7BQ2Z"', False, True),
    (("111", "222"), " 222, 111 and", False, True),
    (("111", "222"), " 222, 222,", False, False),
    (("111", "222"), " 111", True, False),
    (("111", "222"), " 111, 2", False, None),
])
def test_verdict(answers, text, is_final, expected):
    assert verdict(answers, text, is_final) is expected
    assert exact_match(answers, text) is bool(verdict(answers, text, True))


def test_model_format_is_chat_with_a_template_and_raw_without():
    with_template = spec("chat").tokenizer
    assert model_format(with_template) == "chat"
    assert model_format(replace(with_template, chat_template=None)) == "raw"
