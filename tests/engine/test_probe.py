"""A policy that observes the opening (snapstream.probe): prefill runs the last turn's opening
and the closing again after the prompt, their queries join SnapKV's window, none of it is
kept, and the prompt's logits are its own; the document cache honours it too."""

from __future__ import annotations

from dataclasses import replace

import torch

from snapstream.compress import compress_kv
from snapstream.policy import CachePolicy
from snapstream.probe import PROBE_TOKENS, probe_ids
from tests.engine.helpers import engine_for
from tests.engine.reference import record_prefill, snapkv_reference_scores
from tests.tiny_models import random_model, tiny_config

POLICY = CachePolicy(kind="snapstream", n_sink=2, n_topk=12, n_recent=8, observation=4, kernel=3,
                     observe="opening")


def question_first(engine, seed: int = 1) -> list[int]:
    """A chat prompt whose message asks first, then gives a 60-token document."""
    tokenizer = engine.tokenizer
    generator = torch.Generator().manual_seed(seed)
    doc = torch.randint(3, 200, (60,), generator=generator).tolist()
    head = tokenizer.encode("<|im_start|>user\nRead this.\n\nwhich key?\n\n")
    tail = tokenizer.encode("<|im_end|>\n<|im_start|>assistant\n")
    return head + doc + tail


def expected_positions(engine, ids: list[int], probe: list[int], policy: CachePolicy
                       ) -> torch.Tensor:
    """(L, Hkv, S): the selection of the last ``observation`` prompt queries and the probe's,
    over the prompt's keys, from a plain forward of prompt + probe."""
    queries, keys = record_prefill(engine.model, ids + probe)
    window, num_prompt = policy.observation + len(probe), len(ids)
    scores = torch.stack([snapkv_reference_scores(q[:, -window:], k, policy.kernel,
                                                  policy.pooling)[:, :num_prompt]
                          for q, k in zip(queries, keys, strict=True)])  # (L, Hkv, P)
    prompt_keys = torch.stack(keys)[:, :, :num_prompt]  # (L, Hkv, P, D)
    return compress_kv(policy.layout(num_prompt, 4), prompt_keys, prompt_keys,
                       scores.float())[2]


def test_the_probe_reads_the_instruction_and_question_then_the_closing():
    engine = engine_for(random_model(tiny_config(num_heads=4, num_kv_heads=2), seed=3))
    ids = question_first(engine)
    probe = probe_ids(engine.tokenizer, ids, "opening")
    text = engine.tokenizer.decode(probe)
    assert text.startswith("Read this.\n\nwhich key?\n\n") and text.endswith("\nassistant\n")
    assert len(probe) <= PROBE_TOKENS + len(engine.tokenizer.encode("<|im_end|>\n"
                                                                    "<|im_start|>assistant\n"))
    assert probe_ids(engine.tokenizer, ids, "last") == []


def test_prefill_selects_with_the_probes_queries_and_keeps_none_of_it():
    engine = engine_for(random_model(tiny_config(num_heads=4, num_kv_heads=2), seed=3))
    ids = question_first(engine)
    probe = probe_ids(engine.tokenizer, ids, "opening")
    result = engine.prefill(ids, POLICY, max_new_tokens=4)
    positions = result.cache.groups[0].positions
    assert torch.equal(positions, expected_positions(engine, ids, probe, POLICY))
    assert int(positions.max()) < len(ids) and result.cache.prompt_len == len(ids)
    last = engine.prefill(ids, replace(POLICY, observe="last"), max_new_tokens=4)
    assert not torch.equal(positions, last.cache.groups[0].positions)
    torch.testing.assert_close(result.logits, last.logits, atol=1e-4, rtol=0)


def test_a_prompt_kept_whole_runs_no_probe():
    engine = engine_for(random_model(tiny_config(num_heads=4, num_kv_heads=2), seed=3))
    ids = question_first(engine)[:20]  # within n_sink + n_topk + n_recent
    opening = engine.prefill(ids, POLICY, max_new_tokens=4)
    last = engine.prefill(ids, replace(POLICY, observe="last"), max_new_tokens=4)
    for name in ("k", "v", "positions"):
        assert torch.equal(getattr(opening.cache.groups[0], name),
                           getattr(last.cache.groups[0], name))
    assert torch.equal(opening.logits, last.logits)


def test_the_document_cache_selects_with_the_same_probe():
    """A document stored whole, the question after it: under observe="opening" the final
    selection is that of the suffix's last queries and the whole prompt's probe, as a full
    prefill of prompt + probe makes it."""
    engine = engine_for(random_model(tiny_config(num_heads=4, num_kv_heads=2), seed=3))
    ids = question_first(engine)
    doc_len = len(ids) - 12  # the suffix: the document's last tokens and the closing
    prefix = engine.compress_prefix(ids[:doc_len], POLICY, max_new_tokens=4)
    reused = engine.prefill_on_prefix(prefix, ids, POLICY, max_new_tokens=4)
    probe = probe_ids(engine.tokenizer, ids, "opening")
    assert torch.equal(reused.cache.groups[0].positions,
                       expected_positions(engine, ids, probe, POLICY))
