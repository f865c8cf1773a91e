"""Background clean-up of a blob store: deletes that outlive their caller and retry while the
server is away, so that an outage does not leave blobs to the TTL (NATS: the stream's max_age).

A clean-up runs in a task of its own, which cancelling the caller does not stop (a request being
cancelled still cleans up after itself). One that fails with ``StoreUnavailable`` is tried
again with exponential backoff until it succeeds or ``give_up_after_s`` has passed; then it is
logged and the TTL removes what is left.
"""

from __future__ import annotations

import asyncio
import logging
import time
from collections.abc import Awaitable, Callable
from dataclasses import dataclass

from kvstore.stores.errors import StoreUnavailable

log = logging.getLogger(__name__)


@dataclass(frozen=True)
class RetryPolicy:
    first_delay_s: float = 0.5
    max_delay_s: float = 30.0
    give_up_after_s: float = 3600.0  # the longest a blob lives in either store by default

    def __post_init__(self) -> None:
        for name in ("first_delay_s", "max_delay_s", "give_up_after_s"):
            if not getattr(self, name) > 0:
                raise ValueError(f"{name} must be > 0, got {getattr(self, name)}")


class Janitor:
    def __init__(self, retry: RetryPolicy = RetryPolicy()) -> None:
        self.retry = retry
        self._tasks: set[asyncio.Task] = set()
        self.failed_attempts = 0  # attempts the store could not serve (each retried later)

    @property
    def pending(self) -> int:
        """Clean-ups not finished yet (running or waiting to retry)."""
        return len(self._tasks)

    def soon(self, what: str, operation: Callable[[], Awaitable[None]]) -> asyncio.Task:
        """Runs ``operation()`` in a task of its own, retrying while the store is unavailable;
        ``what`` names it in the log. -> the task (a caller may wait for it)."""
        task = asyncio.ensure_future(self._with_retry(what, operation))
        self._tasks.add(task)
        task.add_done_callback(self._tasks.discard)
        return task

    async def _with_retry(self, what: str, operation: Callable[[], Awaitable[None]]) -> None:
        delay, give_up_at = self.retry.first_delay_s, time.monotonic() + self.retry.give_up_after_s
        while True:
            try:
                await operation()
                return
            except StoreUnavailable as exc:
                self.failed_attempts += 1
                if time.monotonic() + delay > give_up_at:
                    log.warning("gave up on %s (the TTL removes it): %s", what, exc)
                    return
                log.info("%s failed, retrying in %.1f s: %s", what, delay, exc)
            except Exception as exc:  # a store that answers with an error will not change
                log.warning("could not %s (the TTL removes it): %s", what, exc)
                return
            await asyncio.sleep(delay)
            delay = min(2 * delay, self.retry.max_delay_s)

    async def close(self, grace_s: float = 2.0) -> None:
        """Lets running clean-ups finish for up to ``grace_s``, then stops the rest (the store
        is closing; the TTL removes what they leave)."""
        if self._tasks:
            await asyncio.wait(self._tasks, timeout=grace_s)
        if self._tasks:
            log.warning("%d blob clean-ups still pending at close; the TTL removes them",
                        len(self._tasks))
        for task in list(self._tasks):
            task.cancel()
        await asyncio.gather(*self._tasks, return_exceptions=True)
