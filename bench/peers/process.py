"""A runner process: started with a peer venv's python, spoken to in JSON lines, killed on exit.

Replies are read by a thread into a queue, so every request has a timeout; a runner that dies
or stops answering raises ``RunnerError`` with the tail of its log (its stderr). A runner is
killed with this process, even when this process is killed outright.
"""

from __future__ import annotations

import contextlib
import ctypes
import os
import queue
import signal
import subprocess
import threading
from collections.abc import Mapping
from pathlib import Path

from bench.peers.runners.peer_protocol import ProtocolError, Reply, Request

_EOF = None


class RunnerError(RuntimeError):
    """A runner failed: it died, timed out, or answered a request with an error."""


class RunnerProcess:
    """``with RunnerProcess(python, script, log_path) as runner: runner.call("load", ...)``."""

    def __init__(self, python: Path, script: Path, log_path: Path,
                 env: Mapping[str, str] | None = None, start_timeout_s: float = 120.0) -> None:
        script, log_path = Path(script), Path(log_path)
        self.name = script.stem
        self.log_path = log_path
        log_path.parent.mkdir(parents=True, exist_ok=True)
        self._log = open(log_path, "a")  # noqa: SIM115 - closed in close()
        # the runner must not see the project's packages unless its system says where they are
        child_env = {k: v for k, v in os.environ.items() if k != "PYTHONPATH"} | dict(env or {})
        self._proc = subprocess.Popen(
            [str(python), "-u", str(script)], stdin=subprocess.PIPE, stdout=subprocess.PIPE,
            stderr=self._log, env=child_env, text=True, bufsize=1, preexec_fn=_die_with_parent)
        self._replies: queue.Queue[str | None] = queue.Queue()
        self._reader = threading.Thread(target=self._read, daemon=True)
        self._reader.start()
        self._next_id = 0
        self.hello = self.call("hello", timeout_s=start_timeout_s)

    @property
    def pid(self) -> int:
        return self._proc.pid

    def call(self, op: str, timeout_s: float = 600.0, **args) -> dict:
        """Send one request and wait for its reply; its ``result`` or a ``RunnerError``."""
        self._next_id += 1
        request = Request(self._next_id, op, args)
        try:
            self._proc.stdin.write(request.encode())
            self._proc.stdin.flush()
        except (BrokenPipeError, ValueError) as exc:
            raise self._failure(f"could not send {op!r}: the runner is gone") from exc
        try:
            line = self._replies.get(timeout=timeout_s)
        except queue.Empty:
            self.kill()
            raise self._failure(f"no reply to {op!r} within {timeout_s:.0f} s; killed it") from None
        if line is _EOF:
            raise self._failure(f"the runner exited ({self._proc.wait()}) during {op!r}")
        try:
            reply = Reply.decode(line)
        except ProtocolError as exc:
            raise self._failure(f"bad reply to {op!r}: {exc}") from exc
        if reply.id != request.id:
            raise self._failure(f"reply {reply.id} to request {request.id} ({op!r})")
        if not reply.ok:
            raise RunnerError(f"{self.name}: {op} failed: {reply.error} (log: {self.log_path})")
        return reply.result or {}

    def close(self, timeout_s: float = 20.0) -> None:
        if self._proc.poll() is None:
            with contextlib.suppress(RunnerError):
                self.call("shutdown", timeout_s=timeout_s)
        self.kill()
        self._log.close()

    def kill(self) -> None:
        if self._proc.poll() is None:
            self._proc.kill()
        self._proc.wait()

    def _read(self) -> None:
        for line in self._proc.stdout:
            self._replies.put(line)
        self._replies.put(_EOF)

    def _failure(self, what: str) -> RunnerError:
        self._log.flush()
        tail = " | ".join(_tail(self.log_path, 6))
        return RunnerError(f"{self.name}: {what}; log {self.log_path}: {tail}")

    def __enter__(self) -> RunnerProcess:
        return self

    def __exit__(self, *exc_info) -> None:
        self.close()


def _die_with_parent() -> None:
    """In the child before exec: the kernel kills it when this process dies, however it dies."""
    PR_SET_PDEATHSIG = 1
    ctypes.CDLL("libc.so.6", use_errno=True).prctl(PR_SET_PDEATHSIG, signal.SIGKILL)


def _tail(path: Path, lines: int) -> list[str]:
    try:
        return [line.strip() for line in path.read_text(errors="replace").splitlines()[-lines:]]
    except OSError:
        return []
