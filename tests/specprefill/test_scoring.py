"""The draft's token scores against a brute-force reference that runs the whole prompt plus the
look-ahead tokens in one forward and forms every query row."""

from __future__ import annotations

import math

import pytest
import torch
import torch.nn.functional as F

from snapstream.attention import causal_attention
from snapstream.config import FULL, SLIDING
from snapstream.cpu import matmul_dtype_name
from snapstream.engine import Engine
from snapstream.policy import CachePolicy
from snapstream.specprefill.chunks import chunk_bounds, rank_chunks
from snapstream.specprefill.scoring import score_prompt, voting_layers
from tests.engine.helpers import engine_for
from tests.tiny_models import random_model, tiny_config

PROMPT_LEN = 70


def _reference(model, ids: list[int], look_ahead_ids: list[int], kernel: int) -> torch.Tensor:
    """(P,): the definition, with the (T, T) attention of one forward over prompt + look-ahead
    (only the global layers vote)."""
    probs = {}
    windows = model.config.attention_windows

    def attend(layer_idx, q, k, v):
        if windows[layer_idx] is None:
            logits = q @ k.repeat_interleave(q.shape[1] // k.shape[1], dim=1).transpose(2, 3)
            logits = logits[0] / math.sqrt(q.shape[-1])  # (Hq, T, T)
            causal = torch.ones(logits.shape[1:], dtype=torch.bool).triu(1)
            probs[layer_idx] = logits.masked_fill(causal, -math.inf).softmax(-1)
        return causal_attention(q, k, v, windows[layer_idx])

    all_ids = ids + look_ahead_ids
    model(torch.tensor([all_ids]), torch.arange(len(all_ids))[None], attend)
    prompt_len = len(ids)
    rows = []
    for p in probs.values():  # (Hq, T, T)
        votes = p[:, prompt_len - 1 :, :prompt_len]  # (Hq, Q, P)
        pooled = F.avg_pool1d(votes.reshape(-1, 1, prompt_len), kernel, stride=1,
                              padding=kernel // 2).view(votes.shape)
        rows.append(pooled.amax(dim=0))  # (Q, P)
    return torch.stack(rows).amax(dim=0).mean(dim=0)


@pytest.mark.parametrize("layer_types", [(), (SLIDING, FULL, SLIDING)])
def test_scores_equal_the_full_attention_reference(layer_types):
    config = tiny_config(num_layers=len(layer_types) or 2, layer_types=layer_types,
                         sliding_window=16 if layer_types else None)
    model = random_model(config, seed=3)
    ids = torch.randint(0, 200, (PROMPT_LEN,), generator=torch.Generator().manual_seed(1)).tolist()
    out = score_prompt(model, ids, look_ahead=5, kernel=13, stop_ids=set())
    assert len(out.look_ahead_ids) == 5
    expected = _reference(model, ids, out.look_ahead_ids, kernel=13)
    torch.testing.assert_close(out.scores, expected, rtol=1e-4, atol=1e-6)


def test_look_ahead_tokens_are_the_drafts_greedy_tokens_and_stop_at_an_end_token():
    model = random_model(tiny_config(), seed=5)
    ids = list(range(10, 10 + PROMPT_LEN))
    greedy = engine_for(model).generate(ids, max_new_tokens=6,
                                        policy=CachePolicy(kind="full")).token_ids
    assert score_prompt(model, ids, 6, 13, set()).look_ahead_ids == greedy
    stopped = score_prompt(model, ids, 6, 13, stop_ids={greedy[2]})
    assert stopped.look_ahead_ids == greedy[:2]
    assert score_prompt(model, ids, 0, 13, set()).look_ahead_ids == []


def test_sliding_layers_do_not_vote_and_a_draft_needs_a_global_layer():
    assert voting_layers((512, None, 512, None)) == {1, 3}
    with pytest.raises(ValueError, match="global attention"):
        voting_layers((512, 512))


def test_chunks_rank_first_and_last_ahead_then_by_mean_score():
    scores = torch.tensor([0.0] * 4 + [5.0] * 4 + [1.0] * 4 + [9.0] * 4 + [0.0] * 3)
    bounds = chunk_bounds(19, 4)
    assert bounds.tolist() == [[0, 4], [4, 8], [8, 12], [12, 16], [16, 19]]
    assert rank_chunks(scores, bounds, (0, 4)).tolist() == [0, 4, 3, 1, 2]
    # the short last chunk is averaged over its own tokens
    tail = torch.tensor([1.0] * 4 + [3.0] * 4 + [2.0] * 4 + [0.0] * 4 + [4.0])
    ranked = rank_chunks(tail, chunk_bounds(17, 4), (0, 4)).tolist()
    assert ranked[:2] == [0, 4] and ranked[2:] == [1, 2, 3]


def test_a_templates_tokens_around_the_text_are_chunks_of_their_own():
    # tokens 0-2 and 17-18: the draft's template; the text's chunks of 4 start at token 3
    bounds = chunk_bounds(19, 4, start=3, end=17)
    assert bounds.tolist() == [[0, 3], [3, 7], [7, 11], [11, 15], [15, 17], [17, 19]]
    scores = torch.tensor([9.0] * 3 + [0.0] * 4 + [2.0] * 4 + [1.0] * 4 + [0.0] * 2 + [9.0] * 2)
    # the text's first and last chunks lead; the template's rank by their scores
    assert rank_chunks(scores, bounds, (1, 4)).tolist() == [1, 4, 0, 5, 2, 3]


def test_a_bfloat16_prompt_forward_keeps_the_chunks_float32_keeps(tiny_model_dir):
    """A quantized draft scores its prompt in its engine's prefill dtype (bfloat16 on a CPU
    with bfloat16 instructions), the look-ahead decode in float32 over the prompt's bfloat16
    K/V: the chunks kept at 25% are those of a float32 prompt forward over the same weights."""
    draft = Engine.from_pretrained(tiny_model_dir, dtype="int8")
    assert (draft.prefill_dtype, draft.dtype) == (getattr(torch, matmul_dtype_name()),
                                                  torch.float32)
    ids = torch.randint(5, 250, (640,), generator=torch.Generator().manual_seed(1)).tolist()
    seen = []
    hook = draft.model.model.layers[0].self_attn.register_forward_pre_hook(
        lambda _module, args: seen.append(args[0].dtype))
    try:
        half = score_prompt(draft.model, ids, 8, 13, set(), torch.bfloat16)
    finally:
        hook.remove()
    assert seen == [torch.bfloat16] + [torch.float32] * 8  # the prompt, then 8 look-ahead steps
    full = score_prompt(draft.model, ids, 8, 13, set(), torch.float32)
    assert half.scores.dtype == torch.float32 and half.look_ahead_ids == full.look_ahead_ids
    assert torch.corrcoef(torch.stack([half.scores, full.scores]))[0, 1] > 0.999
    num_kept = len(ids) // 32 // 4  # chunks of 32, keep 25%
    bounds = chunk_bounds(len(ids), 32)
    last = len(bounds) - 1
    assert rank_chunks(half.scores, bounds, (0, last))[:num_kept].tolist() == \
        rank_chunks(full.scores, bounds, (0, last))[:num_kept].tolist()
