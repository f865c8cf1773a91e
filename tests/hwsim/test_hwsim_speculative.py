"""The SN40L projection of speculative prefill's time to first token."""

from __future__ import annotations

import pytest

from hwsim.policy import PolicyConfig, PolicyKind
from hwsim.sim import SimTarget
from hwsim.speculative import speculative_ttft

FULL = PolicyConfig(PolicyKind.FULL)
KEEPS = (0.05, 0.1, 0.25, 0.5, 0.75, 1.0)


@pytest.fixture(scope="module")
def pair() -> tuple[SimTarget, SimTarget]:
    return (SimTarget.load("llama-3.1-70b", sockets=16, policy=FULL),
            SimTarget.load("llama-3.2-1b", sockets=16, policy=FULL))


@pytest.mark.parametrize("prompt_len", [8192, 32768])
def test_ttft_grows_with_the_keep_share(pair, prompt_len):
    runs = [speculative_ttft(*pair, prompt_len, keep) for keep in KEEPS]
    kept = [r.target_kept_s for r in runs]
    assert kept == sorted(kept) and len(set(kept)) == len(kept)
    assert len({r.draft_s for r in runs}) == 1  # the draft reads the whole prompt each time
    assert len({r.target_full_s for r in runs}) == 1
    assert [r.total_s for r in runs] == sorted(r.total_s for r in runs)
    # keeping everything costs the full prefill plus the draft
    assert runs[-1].target_kept_s == pytest.approx(runs[-1].target_full_s)
    assert runs[-1].speedup < 1


def test_a_1b_draft_for_a_70b_target_pays_off_at_a_quarter(pair):
    run = speculative_ttft(*pair, 32768, 0.25)
    assert run.kept_tokens == 8192
    assert run.draft_s < 0.1 * run.target_full_s  # 57x fewer weights
    assert run.speedup > 2
    assert run.draft_look_ahead_s > 0 and speculative_ttft(
        *pair, 32768, 0.25, look_ahead=0).draft_look_ahead_s == 0


@pytest.mark.parametrize(("keep", "look_ahead"), [(0.0, 8), (1.5, 8), (0.25, -1)])
def test_bad_settings_are_refused(pair, keep, look_ahead):
    with pytest.raises(ValueError, match=r"keep|look_ahead"):
        speculative_ttft(*pair, 8192, keep, look_ahead)
