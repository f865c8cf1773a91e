"""SnapKV token selection (Li et al., 2024): the last prompt queries, its observation window,
vote for keys."""

from __future__ import annotations

import math

import torch
import torch.nn.functional as F


def pool_votes(votes: torch.Tensor, kernel: int, pooling: str) -> torch.Tensor:
    """votes (H, P) -> pooled (H, P), stride 1, zero padding of kernel // 2 on both sides.

    A kernel of 2P - 1 already spans the whole prompt from every position, so a wider one is
    cut to that: the ranking is the same (avg only divides by a larger constant), and the cost
    stays P x min(kernel, 2P - 1) whatever the request asks."""
    kernel = min(kernel, 2 * votes.shape[-1] - 1)
    return POOLS[pooling](votes[:, None], kernel, stride=1, padding=kernel // 2)[:, 0]


POOLS = {"avg": F.avg_pool1d, "max": F.max_pool1d}


def snapkv_scores(
    q_observed: torch.Tensor, k: torch.Tensor, kernel: int, pooling: str,
    positions: torch.Tensor | None = None,
) -> torch.Tensor:
    """Per-KV-head importance of every prompt key, as SnapKV (Alg. 1) and NVIDIA kvpress's
    SnapKVPress compute it.

    q_observed (Hq, O, D): rotated queries of the last O prompt positions, the observation
    window (O < P).
    k (Hkv, P, D): rotated keys of the whole prompt.
    Returns (Hkv, P) float32: each observed query's softmax attention (fp32, causal inside the
    observation window) over the keys before it, averaged over the observed queries, pooled along
    positions per query head, averaged over each GQA group; the observed queries' own keys get
    +inf (SnapKV always keeps them, so they never borrow votes from their attention to
    themselves).
    positions (Hkv, N) int64, optional: k (Hkv, N, D) holds only the keys of these positions
    (a stored prefix cache keeps a subset of its document; the observed queries' keys among them),
    the prompt being P = the largest of them + 1 long: the absent keys get no attention and
    score -inf.
    """
    num_q_heads, num_observed, head_dim = q_observed.shape
    num_kv_heads, num_keys, _ = k.shape
    prompt_len = num_keys if positions is None else int(positions.max()) + 1
    group, before = num_q_heads // num_kv_heads, prompt_len - num_observed
    q = q_observed.float().reshape(num_kv_heads, group * num_observed, head_dim)  # (Hkv, G*O, D)
    logits = q @ k.float().transpose(1, 2) / math.sqrt(head_dim)  # (Hkv, G*O, N)
    logits = logits.view(num_kv_heads, group, num_observed, num_keys)
    query_pos = torch.arange(before, prompt_len, device=k.device)  # (O,)
    key_pos = (torch.arange(num_keys, device=k.device) if positions is None
               else positions[:, None, None])  # (N,) or (Hkv, 1, 1, N)
    future = key_pos > query_pos[:, None]  # (O, N) or (Hkv, 1, O, N)
    probs = logits.masked_fill(future, float("-inf")).softmax(dim=-1)  # (Hkv, G, O, N)
    votes = probs.mean(dim=2)  # (Hkv, G, N)
    if positions is not None:  # each key's votes at its position, none where none is
        index = positions[:, None].expand(-1, group, -1)  # (Hkv, G, N)
        votes = votes.new_zeros(num_kv_heads, group, prompt_len).scatter_(2, index, votes)
    votes = votes[..., :before]  # (Hkv, G, P - O)
    pooled = pool_votes(votes.reshape(num_q_heads, before), kernel, pooling)  # (Hq, P - O)
    scores = pooled.view(num_kv_heads, group, before).mean(dim=1)  # (Hkv, P - O)
    if positions is not None:
        known = torch.zeros(num_kv_heads, prompt_len, dtype=torch.bool, device=k.device)
        known.scatter_(1, positions, True)  # (Hkv, P)
        scores = scores.masked_fill(~known[:, :before], float("-inf"))
    return F.pad(scores, (0, num_observed), value=math.inf)


def select_topk(scores: torch.Tensor, n_sink: int, n_recent: int, n_topk: int) -> torch.Tensor:
    """scores (..., P) -> ascending positions (..., n_topk) of the best keys that are neither
    sinks nor recent."""
    prompt_len = scores.shape[-1]
    candidates = scores[..., n_sink : prompt_len - n_recent]  # (..., P - n_sink - n_recent)
    if candidates.shape[-1] < n_topk:
        raise ValueError(
            f"prompt of {prompt_len} tokens has {candidates.shape[-1]} candidates for "
            f"n_topk={n_topk}; it should not have been compressed"
        )
    picked = candidates.topk(n_topk, dim=-1).indices + n_sink
    return picked.sort(dim=-1).values
