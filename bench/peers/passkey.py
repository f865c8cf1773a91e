"""Passkey retrieval of every peer system at equal KV memory: 8 prompts per system, each with
its own pass key at its own depth, so that a fast system that loses the needle shows.

One system at a time (its runner started, the prompts sent one by one, its runner stopped), as
this part measures answers, not speed. The compressing systems keep the same budget as in the
other parts (the model's policy: 1,024 tokens for the default model, i.e. 1/4 of a 4k-token
prompt).
"""

from __future__ import annotations

from dataclasses import dataclass

from bench.peers.bench import PeersBenchConfig, _stderr, started_peer
from bench.peers.peer_model import peer_model
from bench.peers.process import RunnerError
from bench.peers.prompts import Prompt, filler_text, load_tokenizer, passkey_prompt
from bench.peers.systems import PeerBudget, get_system
from bench.peers.venvs import Echo, PeerBuildError
from bench.report import markdown_table


@dataclass(frozen=True)
class PeersPasskeyConfig:
    systems: tuple[str, ...] = PeersBenchConfig.systems  # every system of the batch-1 part
    prompts: int = 8
    prompt_len: int = 4096
    max_new_tokens: int = 16
    n_threads: int = 2
    model: str | None = None  # a registry name or a GGUF path; None: the default model
    budget: PeerBudget | None = None  # None: the model's policy
    timeout_s: float = 1800.0

    def __post_init__(self) -> None:
        if self.budget is None:
            object.__setattr__(self, "budget", peer_model(self.model).budget)
        for name in self.systems:
            get_system(name)
        if min(self.prompts, self.n_threads, self.max_new_tokens) < 1:
            raise ValueError("prompts, n_threads and max_new_tokens must be ≥ 1")
        peer_model(self.model).check_context(self.n_ctx, "prompt_len + max_new_tokens")

    @property
    def n_ctx(self) -> int:
        return self.prompt_len + self.max_new_tokens


def passkey_set(tokenizer, cfg: PeersPasskeyConfig) -> list[Prompt]:
    """``cfg.prompts`` prompts: prompt i has pass key seed i, at depth (i + 0.5) / prompts."""
    filler_ids = tokenizer.encode(filler_text())
    return [passkey_prompt(tokenizer, filler_ids, cfg.prompt_len, depth=(i + 0.5) / cfg.prompts,
                           seed=i) for i in range(cfg.prompts)]


def run_peers_passkey(cfg: PeersPasskeyConfig, echo: Echo | None = None) -> dict:
    echo = echo or _stderr
    model = peer_model(cfg.model)
    tokenizer = load_tokenizer(model.gguf, echo)
    prompts = passkey_set(tokenizer, cfg)
    systems, failures = {}, {}
    for name in cfg.systems:
        try:
            with started_peer(get_system(name), model, n_threads=cfg.n_threads, n_ctx=cfg.n_ctx,
                              budget=cfg.budget, timeout_s=cfg.timeout_s, echo=echo) as peer:
                answers = []
                for i, prompt in enumerate(prompts):
                    reply = peer.generate(list(prompt.token_ids), cfg.max_new_tokens,
                                          cfg.budget, cfg.timeout_s)
                    if reply is None:
                        raise RunnerError(peer.failure or "no reply")
                    text = tokenizer.decode(reply["token_ids"])
                    answers.append({"passkey": prompt.passkey, "text": text,
                                    "found": prompt.passkey in text})
                    echo(f"passkey · {name} · prompt {i + 1}/{len(prompts)}: "
                         f"{'found' if answers[-1]['found'] else 'missed'} {text!r}")
                systems[name] = {"label": peer.system.label, "answers": answers}
        except (PeerBuildError, RunnerError) as exc:
            failures[name] = str(exc)
            echo(f"{name}: skipped: {exc}")
    return {"prompts": [{"tokens": len(p.token_ids), "passkey": p.passkey} for p in prompts],
            "systems": systems, "failures": failures}


def render_passkey(results: dict, cfg: PeersPasskeyConfig, command: str) -> str:
    rows = [[name, f"{sum(a['found'] for a in s['answers'])}/{len(s['answers'])}",
             ", ".join(repr(a["text"].strip()[:24]) for a in s["answers"] if not a["found"])
             or "-"] for name, s in results["systems"].items()]
    failed = "\n".join(f"- {name}: {why}" for name, why in results["failures"].items())
    return "\n".join([
        "### Passkey retrieval at equal KV memory", "", f"Command: `{command}`", "",
        f"{cfg.prompts} prompts of {cfg.prompt_len} tokens per system, each with its own pass "
        f"key at depth (i + 0.5)/{cfg.prompts}, greedy, {cfg.max_new_tokens} new tokens; the "
        f"compressing systems hold {cfg.budget.total} tokens of KV (1/"
        f"{cfg.prompt_len // cfg.budget.total} of the prompt). Found = the pass key's digits "
        "appear in the answer.", "",
        markdown_table(["system", "found", "answers that missed it"], rows),
        *(["", "Failed:", "", failed] if failed else [])])
