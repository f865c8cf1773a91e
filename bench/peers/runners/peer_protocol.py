"""The JSON-lines protocol between the benchmark and a peer runner. Standard library only: the
runners import it from their own directory with a peer venv's python, the benchmark imports it
as ``bench.peers.runners.peer_protocol``.

One request per line on the runner's stdin, one reply per line on its stdout, in order:

    request  {"id": 3, "op": "generate", "args": {"prompt_ids": [...], "max_new_tokens": 32}}
    reply    {"id": 3, "ok": true, "result": {...}}
             {"id": 3, "ok": false, "error": "ValueError: ...", "traceback": "..."}

Every runner answers these ops (``args`` in brackets):

- ``hello`` []: ``{"system", "versions": {package: version}, "pid"}``; sent first.
- ``load`` [``model``: model path, ``n_threads``, ``n_ctx``, ``attention_windows``: per layer
  its sliding window or null for a global layer (used by runners whose cache follows them),
  ``options``: runner-specific]: loads the model once; ``{"load_s"}``.
- ``generate`` [``prompt_ids``, ``max_new_tokens``, ``options``]: greedy, exactly
  ``max_new_tokens`` new tokens (EOS does not stop it); a ``GenerateReply`` as a dict.
- ``shutdown`` []: replies ``{}`` and exits.
- ``generate_batch`` [``prompts``: a list of prompt ids, ``max_new_tokens``, ``options``]:
  greedy, every prompt at once under the system's own batching, each to exactly
  ``max_new_tokens`` tokens; a ``BatchReply`` as a dict (runners that batch).

A runner may add ops (llama.cpp: ``serve``). Anything a library prints on stdout is moved to
stderr before the loop starts, so stdout carries replies only; stderr is the runner's log.
"""

from __future__ import annotations

import itertools
import json
import os
import resource
import sys
import traceback
from collections.abc import Callable
from dataclasses import asdict, dataclass, field
from typing import IO, Any

Handler = Callable[[dict], dict]


class ProtocolError(RuntimeError):
    """A line that is not a well-formed request or reply."""


@dataclass(frozen=True)
class Request:
    id: int
    op: str
    args: dict = field(default_factory=dict)

    def encode(self) -> str:
        return json.dumps({"id": self.id, "op": self.op, "args": self.args}) + "\n"

    @classmethod
    def decode(cls, line: str) -> Request:
        message = _loads(line)
        if not isinstance(message.get("id"), int) or not isinstance(message.get("op"), str):
            raise ProtocolError(f"a request needs an integer id and a string op: {line[:200]!r}")
        args = message.get("args", {})
        if not isinstance(args, dict):
            raise ProtocolError(f"request args must be an object: {line[:200]!r}")
        return cls(message["id"], message["op"], args)


@dataclass(frozen=True)
class Reply:
    id: int
    ok: bool
    result: dict | None = None
    error: str | None = None
    traceback: str | None = None

    def encode(self) -> str:
        fields = {k: v for k, v in asdict(self).items() if v is not None}
        return json.dumps(fields) + "\n"

    @classmethod
    def decode(cls, line: str) -> Reply:
        message = _loads(line)
        if not isinstance(message.get("id"), int) or not isinstance(message.get("ok"), bool):
            raise ProtocolError(f"a reply needs an integer id and a boolean ok: {line[:200]!r}")
        return cls(message["id"], message["ok"], message.get("result"), message.get("error"),
                   message.get("traceback"))


@dataclass(frozen=True)
class GenerateReply:
    """What ``generate`` returns. Times in milliseconds; ``decode_ms_per_token`` is the median
    gap between consecutive new tokens; ``peak_rss_bytes`` is the runner's peak so far;
    ``kv_bytes`` is the KV cache held for this sequence (None where the peer shows none) and
    ``kv_note`` says how it was obtained."""

    token_ids: list[int]
    ttft_ms: float
    decode_ms_per_token: float
    peak_rss_bytes: int
    kv_bytes: int | None
    kv_note: str
    extra: dict = field(default_factory=dict)


@dataclass(frozen=True)
class BatchReply:
    """What ``generate_batch`` returns: for each prompt, in order, its tokens and the seconds
    from the batch's start at which each came out; the KV bytes one sequence holds;
    ``peak_rss_bytes``: the peak so far of the process that served the batch (the runner, or
    the server it started)."""

    token_ids: list[list[int]]
    stamps_s: list[list[float]]
    peak_rss_bytes: int
    kv_bytes: int | None
    kv_note: str
    extra: dict = field(default_factory=dict)


def batch_reply(*, start: float, stamps: list[list[float]], token_ids: list[list[int]],
                kv_bytes: int | None, kv_note: str, extra: dict | None = None,
                server_pid: int | None = None) -> dict:
    """A ``generate_batch`` reply from ``time.perf_counter()`` stamps (``start``: when the
    prompts went in); the peak RSS is the runner's, or that of ``server_pid`` where a server
    process of the runner's served the batch."""
    for row_stamps, row_ids in zip(stamps, token_ids, strict=True):
        if len(row_stamps) != len(row_ids) or not row_ids:
            raise ValueError(f"need one stamp per token and a token per prompt, got "
                             f"{len(row_stamps)} stamps for {len(row_ids)} tokens")
    return asdict(BatchReply(
        token_ids=token_ids, stamps_s=[[s - start for s in row] for row in stamps],
        peak_rss_bytes=peak_rss_bytes() if server_pid is None else process_peak_rss_bytes(
            server_pid), kv_bytes=kv_bytes, kv_note=kv_note, extra=extra or {}))


def generation_reply(*, start: float, stamps: list[float], token_ids: list[int],
                     kv_bytes: int | None, kv_note: str, extra: dict | None = None) -> dict:
    """A ``generate`` reply from ``time.perf_counter()`` stamps: ``start`` when the prompt went
    in, ``stamps[i]`` when new token ``i`` came out (at least two tokens)."""
    if len(stamps) != len(token_ids) or len(stamps) < 2:
        raise ValueError(f"need one stamp per token and at least 2 tokens, got {len(stamps)} "
                         f"stamps for {len(token_ids)} tokens")
    gaps = [(later - earlier) * 1e3 for earlier, later in itertools.pairwise(stamps)]
    return asdict(GenerateReply(token_ids=token_ids, ttft_ms=(stamps[0] - start) * 1e3,
                             decode_ms_per_token=median(gaps), peak_rss_bytes=peak_rss_bytes(),
                             kv_bytes=kv_bytes, kv_note=kv_note, extra=extra or {}))


def median(values: list[float]) -> float:
    ordered = sorted(values)
    if not ordered:
        raise ValueError("median of no values")
    mid = len(ordered) // 2
    return ordered[mid] if len(ordered) % 2 else (ordered[mid - 1] + ordered[mid]) / 2


def peak_rss_bytes() -> int:
    return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss * 1024  # Linux: KiB


def process_peak_rss_bytes(pid: int) -> int:
    """Another living process's peak resident memory (its VmHWM)."""
    with open(f"/proc/{pid}/status") as status:
        for line in status:
            if line.startswith("VmHWM:"):
                return int(line.split()[1]) * 1024  # kB
    raise RuntimeError(f"/proc/{pid}/status has no VmHWM")


def serve(handlers: dict[str, Handler], stdin: IO[str] | None = None,
          stdout: IO[str] | None = None) -> None:
    """Answer requests until ``shutdown`` or end of input. A handler's exception becomes an
    error reply; the runner lives on."""
    out = stdout or _private_stdout()
    for line in stdin or sys.stdin:
        if not line.strip():
            continue
        try:
            request = Request.decode(line)
        except ProtocolError as exc:
            out.write(Reply(-1, False, error=str(exc)).encode())
            out.flush()
            continue
        reply = _answer(handlers, request)
        out.write(reply.encode())
        out.flush()
        if request.op == "shutdown":
            return


def _answer(handlers: dict[str, Handler], request: Request) -> Reply:
    if request.op == "shutdown":
        return Reply(request.id, True, {})
    handler = handlers.get(request.op)
    if handler is None:
        known = ", ".join(sorted([*handlers, "shutdown"]))
        return Reply(request.id, False, error=f"unknown op {request.op!r} (known: {known})")
    try:
        return Reply(request.id, True, handler(request.args))
    except Exception as exc:
        return Reply(request.id, False, error=f"{type(exc).__name__}: {exc}",
                     traceback=traceback.format_exc())


def _private_stdout() -> IO[str]:
    """A private copy of fd 1 for replies; fd 1 itself then points at stderr, so C libraries
    that print to stdout cannot corrupt the reply stream."""
    sys.stdout.flush()
    replies = os.fdopen(os.dup(1), "w", buffering=1)
    os.dup2(2, 1)
    return replies


def _loads(line: str) -> dict[str, Any]:
    try:
        message = json.loads(line)
    except json.JSONDecodeError as exc:
        raise ProtocolError(f"not JSON ({exc}): {line[:200]!r}") from exc
    if not isinstance(message, dict):
        raise ProtocolError(f"not a JSON object: {line[:200]!r}")
    return message
