"""One child process of the cluster, in its own session, logging to a file."""

from __future__ import annotations

import contextlib
import os
import signal
import socket
import subprocess
import time
from collections.abc import Callable, Iterator
from pathlib import Path


class Child:
    """A process started in a new session: a terminal's Ctrl-C reaches only the supervisor, and
    the child's whole process group (its pid) can be signalled at once. ``kill`` takes down
    whatever is left of the group before the pid is released, so nothing outlives the cluster."""

    def __init__(self, argv: tuple[str, ...], log_path: Path, env: dict[str, str]) -> None:
        self.log_path = log_path
        self.started_at = time.monotonic()
        with log_path.open("ab") as log:
            self._popen = subprocess.Popen(argv, stdin=subprocess.DEVNULL, stdout=log,
                                           stderr=subprocess.STDOUT, env=env,
                                           start_new_session=True)

    @property
    def pid(self) -> int:
        return self._popen.pid

    @property
    def returncode(self) -> int | None:
        """None until reaped; negative: killed by that signal."""
        return self._popen.returncode

    def has_exited(self) -> bool:
        """True once the process has ended; it is left unreaped (a zombie holds its pid)."""
        if self._popen.returncode is not None:
            return True
        status = os.waitid(os.P_PID, self.pid, os.WEXITED | os.WNOHANG | os.WNOWAIT)
        return status is not None

    def signal_group(self, sig: signal.Signals) -> None:
        if self._popen.returncode is None:  # after reaping, the pid may belong to another
            with contextlib.suppress(ProcessLookupError, PermissionError):
                os.killpg(self.pid, sig)

    def kill(self) -> int:
        """SIGKILLs the process group (what is left of it, after a graceful exit), reaps the
        process and returns its exit code."""
        if self._popen.returncode is None:
            self.signal_group(signal.SIGKILL)  # an exited leader's zombie keeps the group id
            self._popen.wait()
        return self._popen.returncode

    def log_tail(self, num_lines: int = 20) -> str:
        lines = self.log_path.read_text(errors="replace").splitlines()
        return "\n".join(lines[-num_lines:])


@contextlib.contextmanager
def free_ports(host: str) -> Iterator[Callable[[], int]]:
    """Yields ``take()`` returning a port free on ``host``; ports taken within one block are
    distinct (each stays bound until the block ends)."""
    sockets: list[socket.socket] = []

    def take() -> int:
        sock = socket.socket()
        sockets.append(sock)
        sock.bind((host, 0))
        return sock.getsockname()[1]

    try:
        yield take
    finally:
        for sock in sockets:
            sock.close()


def is_free(host: str, port: int) -> bool:
    """Whether a listener could bind ``host:port`` (nothing listens there)."""
    with socket.socket() as sock:
        try:
            sock.bind((host, port))
        except OSError:
            return False
    return True
