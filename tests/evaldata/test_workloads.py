"""The workloads on real text keep their invariants: the code-search answer occurs once in the
context and its description names no word of it, the paraphrased question shares no content
word with its fact, every multi-needle value is asked for, and every sample is reproducible
from its generator."""

import random

import pytest

from evaldata import LENGTH_SLACK, Placement, TaskConfig, exact_match, generate
from evaldata.codebase import targets
from evaldata.describe import describe
from evaldata.document import NUM_QUESTIONS, multiquestion
from evaldata.paraphrases import PARAPHRASES
from evaldata.phrasing import PHRASES
from evaldata.sources import mentions
from evaldata.words import name_words_in, related, shared_words, stem
from tests.evaldata.helpers import spec, tiny_chat_tokenizer

SEEDS = range(6)


def _sample(task: str, seed: int, context_len: int = 2000, placement: str = "after",
            depth: float = 0.5):
    cfg = TaskConfig(context_len=context_len, depth=depth, placement=placement)
    return generate(task, random.Random(f"{task}/{seed}"), cfg, spec("chat"))


@pytest.mark.parametrize("seed", SEEDS)
def test_codesearch_answer_occurs_once_in_the_prompt_inside_the_target(seed):
    sample = _sample("codesearch", seed, placement="after" if seed % 2 else "before")
    (name,) = sample.answers
    target = next(n for n in sample.needles if n.is_target)
    assert mentions(sample.prompt, name) == 1
    assert mentions(target.text, name) == 1 and f"def {name}(" in target.text
    assert target.text.startswith("# file: ")
    assert sample.scoring == "name" and sample.cue == PHRASES["codesearch"].cue


@pytest.mark.parametrize("seed", SEEDS)
def test_codesearch_question_names_no_word_of_the_function(seed):
    sample = _sample("codesearch", seed)
    (name,) = sample.answers
    assert name_words_in(f"{sample.question} {sample.cue}", name) == []


def test_every_code_search_target_is_described_without_its_name_and_reworded():
    phrases = PHRASES["codesearch"]
    pool = targets(" ".join((phrases.intro, phrases.question, phrases.cue, phrases.blind_cue)))
    assert len(pool) >= 100
    for target in pool:
        assert name_words_in(target.description, target.name) == []
        docstring = target.function.docstring.split("\n\n")[0]
        assert target.description.lower().rstrip(".") not in docstring.lower()


@pytest.mark.parametrize(("docstring", "name", "expected"), [
    ("Return the list of files in a directory.", "list_entries",
     "Give back the sequence of documents in a folder."),
    ("Return `obj` converted to text.", "to_text", "Give back obj transformed to wording."),
    # a word of the name with no entry ("quote"), and one whose entry is related ("heading")
    ("Quote the string for a shell command line.", "quote_shell", None),
    ("Parse a header line into its key and value.", "parse_header", None),
    ("Return foo.bar for the given object.", "get_bar", None),  # a dotted name
    ("Create the thing.", "make_thing", None),  # fewer than five words
    ("Compute the mean of the numbers in a window of samples.", "rolling_average",
     "Calculate the mean of the counts in a window of samples."),
])
def test_describe_rewords_or_rejects(docstring, name, expected):
    assert describe(docstring, name) == expected


@pytest.mark.parametrize("pair", PARAPHRASES, ids=lambda p: p.fact.split()[1])
def test_paraphrased_question_shares_no_content_word_with_its_fact(pair):
    fact = pair.fact.format(value="5173920")
    phrases = PHRASES["paraphrase"]
    for asked in (f"{pair.question} {phrases.cue}", f"{pair.question} {phrases.blind_cue}"):
        assert shared_words(fact, asked) == []


@pytest.mark.parametrize("seed", SEEDS)
def test_paraphrase_sample_asks_without_the_fact_words(seed):
    sample = _sample("paraphrase", seed, placement="before" if seed % 2 else "after")
    (target,) = [n for n in sample.needles if n.is_target]
    assert sample.answers[0] in target.text
    assert shared_words(target.text, f"{sample.question} {sample.cue}") == []


def test_word_checks_relate_inflections_and_compounds():
    assert stem("parsing") == stem("parsed") == stem("parser") == stem("parses")
    assert related("copies", "copy") and related("decoder", "decoding")
    assert not related("owl", "bowl") and not related("glass", "gas")
    assert shared_words("The keeper stored flares.", "Where were the flares kept?") == [
        ("flares", "flares")]
    assert name_words_in("Give back the address info", "getaddrinfo") == ["info"]
    assert name_words_in("Split the text at spaces", "splitText") == ["Split", "text"]


@pytest.mark.parametrize("seed", SEEDS)
def test_multineedle_asks_for_every_needle(seed):
    placement = "before" if seed % 2 else "after"
    sample = _sample("multineedle", seed, placement=placement)
    targets_ = [n for n in sample.needles if n.is_target]
    assert 2 <= len(sample.answers) == len(targets_) <= 4
    assert len(set(sample.answers)) == len(sample.answers)
    assert sample.scoring == "all_values"
    for needle in targets_:
        key = needle.text.split()[[w.count("-") for w in needle.text.split()].index(1)]
        assert key.strip(".:") in sample.question
    if placement == "before":
        assert sample.cue == PHRASES["multineedle"].blind_cue


@pytest.mark.parametrize("task", ["codesearch", "paraphrase", "multineedle"])
@pytest.mark.parametrize("placement", list(Placement))
def test_workload_prompt_fits_its_token_count(task, placement):
    for context_len in (700, 3000):
        sample = _sample(task, 1, context_len=context_len, placement=placement)
        assert context_len - LENGTH_SLACK <= sample.num_tokens <= context_len
        assert sample.num_tokens == spec("chat").count(sample.prompt)


@pytest.mark.parametrize("task", ["codesearch", "paraphrase", "multineedle"])
def test_workloads_are_reproducible_from_their_generator(task):
    assert _sample(task, 3) == _sample(task, 3)
    assert _sample(task, 3) != _sample(task, 4)


@pytest.mark.parametrize(("scoring", "answers", "text", "expected"), [
    ("name", ("read_config",), " `read_config`", True),
    ("name", ("read_config",), " configparser.read_config().", True),
    ("name", ("read_config",), " read_config_file", False),
    ("name", ("read_config",), " Read_Config", False),
    ("name", ("read_config",), " the function that reads read_config", True),
    ("all_values", ("111", "222"), " 222 and 111", True),
    ("all_values", ("111", "222"), " 333, 222, 111.", True),
    ("all_values", ("111", "222"), " 111 only", False),
])
def test_scorers_on_crafted_outputs(scoring, answers, text, expected):
    assert exact_match(answers, text, scoring) is expected


def test_multiquestion_document_holds_each_fact_once():
    rng = random.Random("doc")
    document = multiquestion(rng, 1500, tiny_chat_tokenizer())
    assert len(document.asks) == NUM_QUESTIONS
    assert len({ask.answer for ask in document.asks}) == NUM_QUESTIONS
    for ask in document.asks:
        assert document.text.count(ask.fact) == 1 and ask.answer in ask.fact
        assert ask.key in ask.question and ask.key in ask.cue
    offsets = [document.text.index(ask.fact) for ask in document.asks]
    assert offsets == sorted(offsets)
    assert multiquestion(random.Random("doc"), 1500, tiny_chat_tokenizer()) == document
