from __future__ import annotations

import json

import pytest
import torch

from cli.main import main
from snapstream.engine import Engine
from snapstream.policy import CachePolicy
from snapstream.sampling import sample_batch, sample_row
from snapstream.sampling_params import SamplingParams
from snapstream.tokenizer import IncrementalDetokenizer
from tests.tiny_models import tiny_snapstream_tokenizer


def test_seeded_sampling_depends_only_on_seed_and_position():
    logits = torch.randn(300, generator=torch.Generator().manual_seed(0))
    params = SamplingParams(temperature=1.0, seed=42)
    draws = [sample_row(logits, params, position=p) for p in range(50)]
    assert draws == [sample_row(logits, params, position=p) for p in range(50)]
    assert len(set(draws)) > 5  # it does sample


def test_top_k_and_top_p_restrict_the_support():
    logits = torch.arange(300, dtype=torch.float32) / 10
    top3 = {sample_row(logits, SamplingParams(temperature=5.0, top_k=3, seed=s), 0)
            for s in range(200)}
    assert top3 == {297, 298, 299}
    nucleus = {sample_row(logits, SamplingParams(temperature=1.0, top_p=0.3, seed=s), 0)
               for s in range(200)}
    assert nucleus <= {299, 298, 297, 296} and 299 in nucleus


def test_batch_sampling_mixes_greedy_sampled_and_idle_rows():
    logits = torch.randn(3, 50, generator=torch.Generator().manual_seed(1))
    rows = sample_batch(logits, [SamplingParams(), None, SamplingParams(temperature=1, seed=3)],
                        [5, 0, 7])
    assert rows[0] == int(logits[0].argmax()) and rows[1] == -1 and 0 <= rows[2] < 50


@pytest.mark.parametrize(("fields", "name"), [({"temperature": -1}, "temperature"),
                                              ({"top_p": 0}, "top_p"), ({"top_k": -2}, "top_k"),
                                              ({"seed": -5}, "seed")])
def test_invalid_sampling_names_the_field(fields, name):
    with pytest.raises(ValueError, match=name):
        SamplingParams(**fields)


def test_incremental_detokenizer_never_splits_utf8():
    tokenizer = tiny_snapstream_tokenizer()
    text = "naïve → 東京 🚀 ok"
    detok = IncrementalDetokenizer(tokenizer)  # the tiny vocabulary's first 256 ids are bytes
    pieces = [detok.feed([b]) for b in text.encode()] + [detok.flush()]
    assert "".join(pieces) == text
    assert all("\ufffd" not in piece for piece in pieces)


def test_generate_stops_on_stop_token_and_reports_reason(llama_dir):
    engine = Engine.from_pretrained(llama_dir)
    free = engine.generate("hello", max_new_tokens=12, policy=CachePolicy(kind="full"),
                           sampling=SamplingParams(ignore_eos=True))
    stop_at = free.token_ids[4]
    stopped = engine.generate("hello", max_new_tokens=12, policy=CachePolicy(kind="full"),
                              sampling=SamplingParams(stop_token_ids=(stop_at,), ignore_eos=True))
    assert stopped.finish_reason == "stop_token"
    assert stopped.token_ids == free.token_ids[: free.token_ids.index(stop_at) + 1]
    assert free.finish_reason == "length" and len(free.token_ids) == 12


@pytest.mark.parametrize("policy", [CachePolicy(kind="full"),
                                    CachePolicy(n_sink=2, n_topk=8, n_recent=6, observation=4)])
def test_forced_ids_continue_the_sequence_as_if_generated(llama_dir, policy):
    engine = Engine.from_pretrained(llama_dir)
    prompt = engine.encode("the forced tokens follow this prompt")
    free = engine.generate(prompt, max_new_tokens=10, policy=policy,
                           sampling=SamplingParams(ignore_eos=True))
    forced, rest = list(free.token_ids[:4]), free.token_ids[4:]
    resumed = engine.generate(prompt, max_new_tokens=6, policy=policy, forced_ids=forced,
                              sampling=SamplingParams(ignore_eos=True))
    assert resumed.token_ids == rest and resumed.prompt_tokens == len(prompt)
    with pytest.raises(ValueError, match="forced_ids"):
        engine.generate(prompt, max_new_tokens=2, forced_ids=[10**6])


def test_generate_rejects_bad_requests(llama_dir):
    engine = Engine.from_pretrained(llama_dir)
    with pytest.raises(ValueError, match="empty"):
        engine.generate([], max_new_tokens=3)
    with pytest.raises(ValueError, match="context"):
        engine.generate([1] * 5000, max_new_tokens=3)
    with pytest.raises(ValueError, match="max_new_tokens"):
        engine.generate("x", max_new_tokens=0)
    with pytest.raises(ValueError, match="vocabulary"):
        engine.generate([1, 999], max_new_tokens=3)


def test_cli_generate_json_matches_engine(llama_dir, capsys):
    code = main(["generate", "--model", str(llama_dir), "--prompt-ids", "5,6,7,8",
                 "--max-new-tokens", "6", "--policy", "snapstream", "--n-sink", "1",
                 "--n-topk", "1", "--n-recent", "2", "--observation", "2", "--json"])
    assert code == 0
    out = json.loads(capsys.readouterr().out)
    policy = CachePolicy(n_sink=1, n_topk=1, n_recent=2, observation=2)
    expected = Engine.from_pretrained(llama_dir).generate([5, 6, 7, 8], 6, policy=policy)
    assert out["token_ids"] == expected.token_ids and out["text"] == expected.text


@pytest.mark.parametrize("argv", [["generate", "--prompt-ids", "1,x"],
                                  ["generate", "--prompt", "hi", "--n-sink", "-2"],
                                  ["generate", "--prompt", "hi", "--policy", "bogus"],
                                  ["nonsense"]])
def test_cli_bad_arguments_give_one_line_and_exit_2(argv, capsys):
    assert main(argv) == 2
    err = capsys.readouterr().err.strip()
    assert err.startswith("error:") and "\n" not in err


@pytest.mark.parametrize(("text", "opening"), [
    # a question before the document in the last turn: past its role line, to the blank line
    ("<|im_start|>system\nBe brief.<|im_end|>\n<|im_start|>user\nWhat is it?\n\nThe text."
     "<|im_end|>\n", "What is it?\n"),
    # the last turn is the document: its own opening
    ("<|im_start|>system\nThe text.\n\nMore.<|im_end|>\n", "The text.\n"),
    ("What is it?\n\nThe text.", "What is it?\n"),  # a raw prompt: from its start
    ("<|im_start|>user\n<|im_end|>\n", ""),  # an empty turn
])
def test_turn_opening_is_the_last_turns_first_paragraph(text, opening):
    tokenizer = tiny_snapstream_tokenizer()
    ids = tokenizer.encode(text)
    assert tokenizer.decode(tokenizer.turn_opening(ids, limit=64)) == opening


@pytest.mark.parametrize(("text", "probe"), [
    # an instruction, then the question, before the document: all read again, then the closing
    ("<|im_start|>user\nRead it.\n\nWhat is it?\n\nThe text.<|im_end|>\n"
     "<|im_start|>assistant\n", "Read it.\n\nWhat is it?\n\nThe text.\nassistant\n"),
    # a raw prompt: its opening, nothing after
    ("What is it?\n\nThe text.", "What is it?\n\nThe text."),
    # the paragraphs that fit whole: the document's first, cut by the limit, is left out
    ("<|im_start|>user\nWhat is it?\n\n" + "the " * 80 + "<|im_end|>\n<|im_start|>assistant\n",
     "What is it?\n\n\nassistant\n"),
])
def test_turn_probe_reads_the_last_closed_turn_then_the_closing(text, probe):
    tokenizer = tiny_snapstream_tokenizer()
    ids = tokenizer.encode(text)
    assert tokenizer.decode(tokenizer.turn_probe(ids, limit=64)) == probe


def test_turn_probe_keeps_the_closing_past_its_limit():
    tokenizer = tiny_snapstream_tokenizer()
    ids = tokenizer.encode("<|im_start|>user\n" + "the " * 40 + "<|im_end|>\n"
                           "<|im_start|>assistant\n")
    probe = tokenizer.turn_probe(ids, limit=8)  # one paragraph, longer than the limit
    closing = ids[ids.index(tokenizer.encode("<|im_end|>")[-1]):]
    assert probe[8:] == closing and len(closing) > 1
    assert ("the " * 40).startswith(tokenizer.decode(probe[:8]))


def test_turn_opening_stops_at_its_limit():
    tokenizer = tiny_snapstream_tokenizer()
    ids = tokenizer.encode("<|im_start|>user\n" + "the " * 40)
    opening = tokenizer.turn_opening(ids, limit=8)
    assert len(opening) == 8
    assert ("the " * 40).startswith(tokenizer.decode(opening))  # the role line skipped
