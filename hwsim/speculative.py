"""Time to first token with speculative prefill, projected with the SN40L cost model.

A small draft prefills the whole prompt and decodes ``look_ahead`` tokens (its attention
picks the chunks), then the large target prefills the kept share of the prompt; the
baseline is the target's prefill of the whole prompt. Assumptions (docs/speculative.md):
draft and target run one after the other on the same sockets, each with its weights and
KV in HBM; the draft's look-ahead steps are decode steps at the prompt's length with the
full cache; the selection itself (chunk ranking, token mapping) costs nothing; the target's
kept tokens cost what a prompt of that many tokens costs.
"""

from __future__ import annotations

from dataclasses import dataclass

from hwsim.policy import PolicyConfig, PolicyKind
from hwsim.sim import SimTarget

FULL = PolicyConfig(PolicyKind.FULL)


@dataclass(frozen=True)
class SpeculativeTtft:
    prompt_len: int
    keep: float
    kept_tokens: int
    draft_prefill_s: float
    draft_look_ahead_s: float
    target_kept_s: float
    target_full_s: float

    @property
    def draft_s(self) -> float:
        return self.draft_prefill_s + self.draft_look_ahead_s

    @property
    def total_s(self) -> float:
        return self.draft_s + self.target_kept_s

    @property
    def speedup(self) -> float:
        """The target's full prefill over draft + target on the kept tokens."""
        return self.target_full_s / self.total_s


def speculative_ttft(target: SimTarget, draft: SimTarget, prompt_len: int, keep: float,
                     look_ahead: int = 8) -> SpeculativeTtft:
    """TTFT of one prompt of ``prompt_len`` tokens with the target prefilling ``keep`` of
    them (both models' ``prefill``; the draft's look-ahead as full-cache decode steps)."""
    if not 0.0 < keep <= 1.0:
        raise ValueError(f"keep must be in (0, 1], got {keep}")
    if look_ahead < 0:
        raise ValueError(f"look_ahead must be >= 0, got {look_ahead}")
    kept = max(1, round(keep * prompt_len))
    drafting = SimTarget(draft.model, draft.system, draft.precision, FULL,
                         draft.kernel_looping, draft.ddr_spill)
    step = drafting.decode_step(1, prompt_len).step_time_s if look_ahead else 0.0
    return SpeculativeTtft(
        prompt_len=prompt_len, keep=keep, kept_tokens=kept,
        draft_prefill_s=draft.prefill(1, prompt_len).time_s,
        draft_look_ahead_s=look_ahead * step,
        target_kept_s=target.prefill(1, kept).time_s,
        target_full_s=target.prefill(1, prompt_len).time_s)
