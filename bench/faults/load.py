"""The faults benchmark's load: closed-loop greedy streams through the router, each request's
outcome classified against the tokens of an undisturbed run of the same prompt. A request the
cluster refuses for overload (RESOURCE_EXHAUSTED, with its retry hint) is counted as refused,
not lost, and its client waits as long as the hint asks before its next request."""

from __future__ import annotations

import asyncio
import time
from collections import Counter
from dataclasses import dataclass, field

import grpc

from snapstream.client import AsyncSnapstreamClient, DeadlineExceeded, SnapstreamError

RETRY_AFTER_S = 0.25  # before a client's next request after a failure without a retry hint
PROMPTS = tuple(f"request {i}: " + "the quick brown fox jumps over the lazy dog " * (4 + 5 * i)
                for i in range(8))


@dataclass
class Tally:
    """Outcomes of the requests of one scenario."""

    ok: int = 0
    different: int = 0  # completed, but not the undisturbed run's tokens
    hung: int = 0  # no end within the hang timeout
    refused: int = 0  # RESOURCE_EXHAUSTED: overloaded, told when to retry
    lost: Counter = field(default_factory=Counter)  # status code name -> requests
    lost_examples: dict[str, str] = field(default_factory=dict)  # code -> first message

    @property
    def total(self) -> int:
        return self.ok + self.different + self.hung + self.refused + sum(self.lost.values())

    def lost_line(self) -> str:
        return ", ".join(f"{code} {n}" for code, n in self.lost.most_common()) or "0"


async def reference(client: AsyncSnapstreamClient, max_new_tokens: int) -> dict[str, tuple]:
    """The undisturbed run: each prompt's greedy tokens."""
    return {prompt: (await client.generate(prompt, max_new_tokens=max_new_tokens,
                                           temperature=0.0)).token_ids for prompt in PROMPTS}


async def one_request(client: AsyncSnapstreamClient, prompt: str, expected: tuple,
                      max_new_tokens: int, hang_timeout_s: float, tally: Tally) -> None:
    try:
        completion = await client.generate(prompt, max_new_tokens=max_new_tokens,
                                           temperature=0.0, timeout_s=hang_timeout_s)
    except DeadlineExceeded:
        tally.hung += 1
    except SnapstreamError as exc:
        if exc.code == grpc.StatusCode.RESOURCE_EXHAUSTED:
            tally.refused += 1
        else:
            tally.lost[exc.code.name] += 1
            tally.lost_examples.setdefault(exc.code.name, exc.details)
        await asyncio.sleep(exc.retry_after_s or RETRY_AFTER_S)  # as a client would
    else:
        if completion.token_ids == expected:
            tally.ok += 1
        else:
            tally.different += 1


async def closed_loop(client: AsyncSnapstreamClient, expected: dict[str, tuple],
                      streams: int, until: asyncio.Event, max_new_tokens: int,
                      hang_timeout_s: float) -> Tally:
    """``streams`` clients, each sending its next request when the last one ended, until
    ``until`` is set (requests in flight then still finish)."""
    tally = Tally()

    async def stream(index: int) -> None:
        turn = index
        while not until.is_set():
            prompt = PROMPTS[turn % len(PROMPTS)]
            await one_request(client, prompt, expected[prompt], max_new_tokens,
                              hang_timeout_s, tally)
            turn += 1

    await asyncio.gather(*(stream(i) for i in range(streams)))
    return tally


async def wait_for(predicate, timeout_s: float, interval_s: float = 0.2) -> float | None:
    """Seconds until ``await predicate()`` is true, None if it never was within timeout_s."""
    start = time.monotonic()
    while time.monotonic() - start < timeout_s:
        if await predicate():
            return time.monotonic() - start
        await asyncio.sleep(interval_s)
    return None
