"""``LocalCluster``: starts a ClusterSpec's processes, waits until each is healthy, and stops
them in order, leaving no process behind."""

from __future__ import annotations

import os
import secrets
import shutil
import signal
import tempfile
import time
from pathlib import Path

from cluster.certs import ClusterCerts, make_cluster_certs
from cluster.health import health_statuses, is_accepting
from cluster.plan import Member, plan_cluster
from cluster.process import Child, free_ports, is_free
from cluster.restarts import Backoff
from cluster.spec import ClusterSpec
from cluster.stores import STORE_SERVERS, StoreAccess
from snapstream.client.tls import TlsConfig

POLL_INTERVAL_S = 0.1
STOP_GRACE_S = 5.0  # on top of the drain timeout: closing the server and the store client


class ClusterError(RuntimeError):
    """The cluster cannot start: a binary is missing, or a member exited or stayed unhealthy
    (the message ends with the member's last log lines)."""


class LocalCluster:
    """``start()`` runs the store, the workers, then the router, each in its own session,
    returning once every gRPC health check (overall and per service) says SERVING; on failure or
    interrupt it stops what it started. ``stop()`` SIGTERMs the stages in reverse order (router,
    workers, store), SIGKILLs what has not exited in time, and may be called again to finish an
    interrupted stop. A temporary log directory (``spec.log_dir`` None) goes with a stop that
    finds every member running and ending when asked, and stays for reading after a fault: a
    member that failed to start, crashed, or had to be killed (a ``kill()`` drill is not one).
    A context manager: ``with LocalCluster(spec) as cluster: ...``."""

    def __init__(self, spec: ClusterSpec) -> None:
        self.spec = spec
        self.log_dir: Path | None = None
        self._stages: tuple[tuple[Member, ...], ...] = ()
        self._children: dict[str, Child] = {}
        self._backoff: dict[str, Backoff] = {}
        self._certs: ClusterCerts | None = None
        self._api_keys_file: Path | None = None
        self._secret_file: Path | None = None
        self._fault = False  # keeps a temporary log directory
        self._killed: set[str] = set()  # by kill(), not yet seen by restart_exited()

    def start(self) -> LocalCluster:
        if self._stages:
            raise ClusterError("this cluster was already started; make a new LocalCluster")
        self._check_store_binary()
        self._check_ports_free()
        self.log_dir = self.spec.log_dir or Path(tempfile.mkdtemp(prefix="snapstream-cluster-"))
        (self.log_dir / "store").mkdir(parents=True, exist_ok=True)
        self._make_secrets()
        access = StoreAccess(password=secrets.token_urlsafe(24), certs=self._certs)
        with free_ports(self.spec.host) as take_port:
            self._stages = plan_cluster(self.spec, self.log_dir / "store", take_port, access,
                                        self._api_keys_file, self._secret_file)
        deadline = time.monotonic() + self.spec.start_timeout_s
        self._backoff = {m.name: Backoff(self.spec.restarts) for stage in self._stages
                         for m in stage}
        try:
            for stage in self._stages:
                for member in stage:
                    self._children[member.name] = self._start_member(member)
                for member in stage:
                    self._wait_ready(member, deadline)
        except BaseException:
            self._fault = True
            self.stop()
            raise
        return self

    def stop(self) -> dict[str, int]:
        """Exit code of every member (negative: killed by that signal)."""
        for stage in reversed(self._stages):
            live = [self._children[m.name] for m in stage
                       if m.name in self._children and self._children[m.name].returncode is None]
            self._fault |= any(child.has_exited() for child in live)  # crashed, unseen so far
            for child in live:
                child.signal_group(signal.SIGTERM)
            deadline = time.monotonic() + self.spec.drain_timeout_s + STOP_GRACE_S
            while not all(child.has_exited() for child in live) and time.monotonic() < deadline:
                time.sleep(POLL_INTERVAL_S)
            self._fault |= not all(child.has_exited() for child in live)
            for child in live:
                child.kill()
        if self.spec.log_dir is None and self.log_dir is not None and not self._fault:
            shutil.rmtree(self.log_dir, ignore_errors=True)
        return {name: child.returncode for name, child in self._children.items()}

    @property
    def logs_kept(self) -> bool:
        """Whether ``log_dir`` is there to read (after ``stop()``: given in the spec, or a
        temporary one kept after a fault)."""
        return self.log_dir is not None and self.log_dir.is_dir()

    def restart_exited(self) -> list[str]:
        """Supervision, called periodically (``snapstream up`` does, every second): a member
        that has ended (a crash, or ``kill()``) is started again with its own command line
        and ports after its backoff (1 s; doubling up to 30 s while it keeps exiting before it
        is ready again). -> one line per exit seen, restart done or member ready again.
        Raises ClusterError for a member that exits before it is ready ``max_quick_exits``
        times in a row (a crash loop)."""
        now, news = time.monotonic(), []
        for member in (m for stage in self._stages for m in stage):
            child, backoff = self._children.get(member.name), self._backoff[member.name]
            if child is None:
                continue
            if backoff.is_due(now):
                self._children[member.name] = self._start_member(member)
                backoff.restarted()
                news.append(f"{member.name} restarted (restart {backoff.restarts})")
            elif backoff.restart_at is None and child.has_exited():
                self._fault |= member.name not in self._killed  # a crash, not a drill
                self._killed.discard(member.name)
                code = child.kill()
                delay = backoff.on_exit(now)
                if delay is None:
                    raise ClusterError(f"{member.name} keeps exiting before it is ready (code "
                                       f"{code}); {child.log_path} ends with:\n"
                                       f"{child.log_tail()}")
                news.append(f"{member.name} exited with code {code}; restarting in "
                            f"{delay:.0f} s (log: {child.log_path})")
            elif not backoff.is_ready and self._is_ready(member):
                backoff.ready()
                news.append(f"{member.name} is ready again")
        return news

    def kill(self, name: str) -> int:
        """SIGKILLs one member (to test failover); ``stop()`` leaves it alone."""
        if name not in self._children:
            raise KeyError(f"no member {name!r}; members: {', '.join(self._children)}")
        self._killed.add(name)
        return self._children[name].kill()

    @property
    def endpoints(self) -> dict[str, str]:
        """Member name -> ``host:port`` of a gRPC service, or the store URL."""
        return {m.name: m.address for stage in self._stages for m in stage}

    @property
    def store_config(self) -> Path:
        """The store server's configuration file (it holds the password)."""
        (store,) = self._stages[0]
        return store.files[0][0]

    @property
    def openai_url(self) -> str:
        """Base URL of the router's OpenAI-compatible HTTP API (https with ``spec.tls``)."""
        (router,) = self._stages[-1]
        scheme = "http" if self._certs is None else "https"
        return f"{scheme}://{self.spec.host}:{router.http_port}/v1"

    @property
    def client_tls(self) -> TlsConfig | None:
        """With ``spec.tls``: what a client of any service needs (the CA it trusts, the
        certificate the workers' mutual TLS asks for); None otherwise."""
        return None if self._certs is None else self._certs.client()

    @property
    def ca_file(self) -> Path | None:
        """With ``spec.tls``: the CA certificate (what a client of the router needs)."""
        return None if self._certs is None else self._certs.ca

    @property
    def api_key(self) -> str | None:
        """With ``spec.api_key``: the key the router asks for (also in ``api_key_file``); with
        ``spec.api_keys_file``, the first key of that file."""
        if self._api_keys_file is None:
            return None
        lines = [line.split() for line in self._api_keys_file.read_text().splitlines()
                 if line.strip() and not line.lstrip().startswith("#")]
        return lines[0][-1]

    @property
    def api_key_file(self) -> Path | None:
        return self._api_keys_file

    @property
    def metrics(self) -> dict[str, str]:
        """Service name -> its Prometheus /metrics URL."""
        return {m.name: f"http://{self.spec.host}:{m.metrics_port}/metrics"
                for stage in self._stages for m in stage if m.metrics_port is not None}

    @property
    def running(self) -> set[str]:
        """Members that have not ended (a killed or crashed one is not among them)."""
        return {name for name, child in self._children.items() if not child.has_exited()}

    @property
    def pids(self) -> dict[str, int]:
        return {name: child.pid for name, child in self._children.items()}

    def health(self) -> dict[str, dict[str, str]]:
        """Service name -> status of its overall ("") and named health checks."""
        return {m.name: health_statuses(m.address, ("", m.service), tls=self.client_tls)
                for stage in self._stages for m in stage if m.service is not None}

    def exited(self) -> dict[str, int]:
        """Members that ended without ``stop()`` or ``kill()`` -> exit code (a crash)."""
        crashed = {name: child.kill() for name, child in self._children.items()
                   if child.returncode is None and child.has_exited()}
        self._fault |= bool(crashed)
        return crashed

    def __enter__(self) -> LocalCluster:
        return self.start()

    def __exit__(self, *exc_info: object) -> None:
        self.stop()

    def _check_store_binary(self) -> None:
        binary = STORE_SERVERS[self.spec.store].binary
        if shutil.which(binary) is None:
            raise ClusterError(f"{binary} is not on PATH; install it to run a {self.spec.store} "
                               "store (scripts/setup.sh does)")

    def _make_secrets(self) -> None:
        """A new cluster secret, which keys every blob's MAC (in ``log_dir/store``, mode 0600,
        beside the store's configuration and its password); with ``spec.tls``, a new CA and
        certificate (in ``log_dir/tls``); with ``spec.api_key``, a new API key (in
        ``log_dir/api-key``, mode 0600), or with ``spec.api_keys_file``, that file's keys."""
        self._secret_file = _private_file(self.log_dir / "store" / "cluster-secret",
                                          secrets.token_urlsafe(32))
        if self.spec.tls:
            hosts = tuple(dict.fromkeys((self.spec.host, "127.0.0.1", "localhost")))
            self._certs = make_cluster_certs(self.log_dir / "tls", hosts)
        if self.spec.api_key:
            self._api_keys_file = _private_file(self.log_dir / "api-key",
                                                secrets.token_urlsafe(32))
        elif self.spec.api_keys_file is not None:
            self._api_keys_file = self.spec.api_keys_file.resolve()

    def _start_member(self, member: Member) -> Child:
        for path, text in member.files:
            path.touch(mode=0o600)
            path.write_text(text)
        env = {**os.environ, "PYTHONUNBUFFERED": "1", **dict(member.env)}
        return Child(member.argv, self.log_dir / f"{member.name}.log", env)

    def _check_ports_free(self) -> None:
        """A port another process listens on (a second ``snapstream up``) stops the start
        before anything runs, instead of a member failing to bind."""
        spec = self.spec
        for port in (spec.router_port, spec.http_port, spec.prefill_port, spec.store_port,
                     *spec.decode_ports):
            if port and not is_free(spec.host, port):
                raise ClusterError(f"port {port} on {spec.host} is in use (another snapstream "
                                   f"up?); stop it, or pass another port (0: any free one)")

    def _wait_ready(self, member: Member, deadline: float) -> None:
        child = self._children[member.name]
        while not self._is_ready(member):
            if child.has_exited():
                code = child.kill()
                tail = child.log_tail()
                reason = _error_line(tail)
                if reason is not None:  # the service said what to change, in one line
                    raise ClusterError(f"{member.name} could not start: {reason} (log: "
                                       f"{child.log_path})")
                raise ClusterError(f"{member.name} exited with code {code} while starting; "
                                   f"{child.log_path} ends with:\n{tail}")
            if time.monotonic() > deadline:
                raise ClusterError(f"{member.name} was not ready within "
                                   f"{self.spec.start_timeout_s:.0f} s; {child.log_path} ends "
                                   f"with:\n{child.log_tail()}")
            time.sleep(POLL_INTERVAL_S)

    def _is_ready(self, member: Member) -> bool:
        if member.service is None:
            return is_accepting(self.spec.host, member.port)
        statuses = health_statuses(member.address, ("", member.service), tls=self.client_tls)
        return all(status == "SERVING" for status in statuses.values())


def _private_file(path: Path, text: str) -> Path:
    """``path`` (mode 0600, made before anything is written to it) holding ``text``."""
    path.unlink(missing_ok=True)
    path.touch(mode=0o600)
    path.write_text(text + "\n")
    return path


def _error_line(log_tail: str) -> str | None:
    """The one-line reason a service gives when it refuses to start (``error: ...``)."""
    lines = [line for line in log_tail.splitlines() if line.startswith("error: ")]
    return lines[-1].removeprefix("error: ") if lines else None
