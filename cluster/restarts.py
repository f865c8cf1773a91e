"""When a local cluster restarts a member that exited: exponential backoff per member, reset
once the member has become ready (healthy) again, and a limit on a member that keeps exiting
before it gets there, a crash loop (pure bookkeeping: nothing is started here)."""

from __future__ import annotations

from dataclasses import dataclass


@dataclass(frozen=True)
class RestartPolicy:
    first_delay_s: float = 1.0
    max_delay_s: float = 30.0
    max_quick_exits: int = 5  # exits in a row, each before the member became ready

    def __post_init__(self) -> None:
        for name in ("first_delay_s", "max_delay_s"):
            if not getattr(self, name) > 0:
                raise ValueError(f"{name} must be > 0, got {getattr(self, name)}")
        if self.max_quick_exits < 1:
            raise ValueError(f"max_quick_exits must be >= 1, got {self.max_quick_exits}")


class Backoff:
    """One member's restart state; a member starts ready (the cluster waited for it)."""

    def __init__(self, policy: RestartPolicy) -> None:
        self.policy = policy
        self.quick_exits = 0
        self.restarts = 0
        self.is_ready = True
        self.restart_at: float | None = None  # monotonic time of the pending restart

    def on_exit(self, now: float) -> float | None:
        """Schedules the restart of a member that exited -> its delay (1, 2, 4 ... s while it
        keeps exiting before it is ready), or None after ``max_quick_exits`` such exits in a
        row (give up)."""
        self.quick_exits = 1 if self.is_ready else self.quick_exits + 1
        if self.quick_exits > self.policy.max_quick_exits:
            return None
        delay = min(self.policy.first_delay_s * 2 ** (self.quick_exits - 1),
                    self.policy.max_delay_s)
        self.restart_at = now + delay
        return delay

    def is_due(self, now: float) -> bool:
        return self.restart_at is not None and now >= self.restart_at

    def restarted(self) -> None:
        self.restart_at = None
        self.restarts += 1
        self.is_ready = False

    def ready(self) -> None:
        self.is_ready = True
