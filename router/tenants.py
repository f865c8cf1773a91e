"""Per-tenant quotas of the router: requests in flight and prompt tokens waiting for their
prefill. A tenant is the name its API key was given (``serving.auth``); without keys every
request is the one tenant ``default``."""

from __future__ import annotations

from collections import Counter
from dataclasses import dataclass

from serving import metrics
from serving.errors import OverQuota, RequestError


@dataclass(frozen=True)
class TenantLimits:
    """Each tenant's quotas (router flags); over one, a request answers RESOURCE_EXHAUSTED
    (HTTP 429) naming it."""

    max_running: int = 64  # --tenant-max-running: requests in flight
    max_queued_tokens: int = 1 << 20  # --tenant-max-queued-tokens: prompt tokens not yet
    # prefilled

    def __post_init__(self) -> None:
        for name, flag in (("max_running", "--tenant-max-running"),
                           ("max_queued_tokens", "--tenant-max-queued-tokens")):
            if getattr(self, name) < 1:
                raise ValueError(f"{flag} must be >= 1, got {getattr(self, name)}")


@dataclass
class Admission:
    """One admitted request: its prompt tokens count as queued until :meth:`prefilled`."""

    tenant: str
    prompt_tokens: int
    is_queued: bool = True


class TenantLoad:
    """What each tenant has in flight; :meth:`admit` checks the quotas, :meth:`release` gives
    a request's share back."""

    def __init__(self, limits: TenantLimits) -> None:
        self.limits = limits
        self.running: Counter[str] = Counter()
        self.queued_tokens: Counter[str] = Counter()

    def admit(self, tenant: str, prompt_tokens: int) -> Admission:
        limits = self.limits
        if prompt_tokens > limits.max_queued_tokens:
            raise RequestError(f"the prompt has {prompt_tokens} tokens, more than a tenant may "
                               f"queue ({limits.max_queued_tokens}, --tenant-max-queued-tokens):"
                               " shorten it", field="prompt")
        if self.running[tenant] >= limits.max_running:
            raise OverQuota(f"tenant {tenant!r} has {self.running[tenant]} requests running, "
                            f"its limit (--tenant-max-running {limits.max_running}); retry "
                            "when one ends")
        if self.queued_tokens[tenant] + prompt_tokens > limits.max_queued_tokens:
            raise OverQuota(f"tenant {tenant!r} has {self.queued_tokens[tenant]} prompt tokens "
                            f"waiting for prefill; {prompt_tokens} more would pass its limit "
                            f"(--tenant-max-queued-tokens {limits.max_queued_tokens}); retry "
                            "later")
        self.running[tenant] += 1
        self.queued_tokens[tenant] += prompt_tokens
        metrics.TENANT_PROMPT_TOKENS.labels(tenant).inc(prompt_tokens)
        self._publish(tenant)
        return Admission(tenant, prompt_tokens)

    def prefilled(self, admission: Admission) -> None:
        """The request's prompt is prefilled: its tokens no longer count as queued."""
        if admission.is_queued:
            admission.is_queued = False
            self.queued_tokens[admission.tenant] -= admission.prompt_tokens
            self._publish(admission.tenant)

    def release(self, admission: Admission) -> None:
        self.prefilled(admission)
        self.running[admission.tenant] -= 1
        self._publish(admission.tenant)

    def _publish(self, tenant: str) -> None:
        metrics.TENANT_RUNNING.labels(tenant).set(self.running[tenant])
        metrics.TENANT_QUEUED_TOKENS.labels(tenant).set(self.queued_tokens[tenant])
