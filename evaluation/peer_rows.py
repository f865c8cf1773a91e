"""Peer systems in the grid: each sample answered by a system of :mod:`bench.peers` (kvpress's
SnapKV on transformers, OpenVINO GenAI's cache eviction, ...) at every budget of the grid,
scored as snapstream's rows are.

A peer prefills the prompt itself (nothing is shared with snapstream's one prefill a sample),
greedily, and is not handed the answer cue as tokens to decode after compression: its prompt is
the whole prompt, cue included, so the cue lies inside its observation window where snapstream's
rows compress before it. Its budget is snapstream's split of the same budget
(:class:`~bench.peers.systems.PeerBudget`: total, sinks, ring, observation window, kernel; each
system applies what it has of it, OpenVINO rounding its sinks up to a 32-token block). A runner
is started per cell and budget (OpenVINO takes the budget when it loads) in its own venv, built
on first use. A peer that fails is reported and skipped: its rows are missing, not wrong.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence

from evaldata import Sample
from evaluation.config import EvalConfig
from evaluation.results import Row
from evaluation.runner import max_new_tokens
from snapstream.engine import Engine
from snapstream.policy import CachePolicy

PEER_TIMEOUT_S = 3600.0


def peer_budget(policy: CachePolicy):
    """The budget a peer gets for snapstream's ``policy`` at one budget."""
    from bench.peers.systems import PeerBudget

    return PeerBudget(total=policy.budget, n_sink=policy.n_sink, n_recent=policy.n_recent,
                      observation=policy.observation, kernel=policy.kernel)


def evaluate_peers(engine: Engine, cfg: EvalConfig, model: str, indices: Sequence[int],
                   samples: Sequence[Sample], n_threads: int,
                   echo: Callable[[str], object] = print) -> list[Row]:
    """A row per sample, peer system (``cfg.peers``) and budget; ``samples``: one cell's, of one
    context length; ``model``: what the peers load (a registry name or a GGUF path)."""
    from bench.peers.bench import started_peer
    from bench.peers.peer_model import peer_model
    from bench.peers.process import RunnerError
    from bench.peers.systems import get_system
    from bench.peers.venvs import PeerBuildError

    context_len = samples[0].context_len
    ids = [engine.encode(sample.prompt) for sample in samples]
    news = [max_new_tokens(engine, sample) for sample in samples]
    n_ctx = max(map(len, ids)) + max(news)
    rows = []
    for name in cfg.peers:
        for budget in cfg.budgets:
            tokens = budget.tokens_for(context_len)
            policy = cfg.split_rule.policy("snapstream", tokens)
            try:
                with started_peer(get_system(name), peer_model(model), n_threads=n_threads,
                                  n_ctx=n_ctx, budget=peer_budget(policy),
                                  timeout_s=PEER_TIMEOUT_S, echo=echo) as peer:
                    for index, sample, prompt_ids, new in zip(indices, samples, ids, news,
                                                              strict=True):
                        reply = peer.generate(prompt_ids, new, peer_budget(policy),
                                              PEER_TIMEOUT_S)
                        if reply is None:
                            raise RunnerError(peer.failure or "no reply")
                        rows.append(_row(engine, index, sample, name, budget.label, tokens,
                                         policy, len(prompt_ids), reply["token_ids"]))
            except (PeerBuildError, RunnerError) as exc:
                echo(f"peer {name} at {budget.label} of {context_len}: skipped: {exc}")
    return rows


def _row(engine: Engine, index: int, sample: Sample, name: str, label: str, tokens: int,
         policy: CachePolicy, prompt_len: int, token_ids: list[int]) -> Row:
    """The reply's tokens up to the first stop token, scored by the sample's scorer."""
    stops = set(engine.tokenizer.eos_token_ids)
    cut = next((i for i, t in enumerate(token_ids) if t in stops), len(token_ids))
    text = engine.tokenizer.decode(token_ids[:cut])
    return Row(
        sample=index, task=sample.task, context_len=sample.context_len, depth=sample.depth,
        placement=str(sample.placement), gap=0, policy=name, budget_label=label,
        budget=tokens, budget_fraction=tokens / sample.context_len, n_sink=policy.n_sink,
        n_topk=policy.n_topk, n_recent=policy.n_recent, observation=policy.observation,
        kernel=policy.kernel, pooling=policy.pooling, observe=policy.observe,
        unit=policy.unit, correct=sample.is_correct(text),
        answer=sample.answer, generated=text, prompt_tokens=prompt_len, new_tokens=cut,
        finish_reason="stop_token" if cut < len(token_ids) else "length", forced_nll=None)
