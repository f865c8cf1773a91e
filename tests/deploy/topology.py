"""The compose topology as local processes, for a machine without a Docker engine.

Each compose service becomes one process per replica, run with its compose ``command`` and
``environment``: ``snapstream`` services through the image's ENTRYPOINT (``snapstream`` ->
``python -m cli.main``), ``redis`` and ``nats`` with the local ``redis-server`` and
``nats-server``. Every container port gets a free local port; ``service:port`` in a value
becomes ``127.0.0.1:local`` (one address per replica, as Docker's DNS answers with every
replica's address). Services start in ``depends_on`` order, each once its dependencies are
healthy; every process runs in its own process group, and stopping sends SIGTERM to the group,
as ``docker compose down`` does, then SIGKILL after a grace period.
"""

from __future__ import annotations

import contextlib
import json
import os
import re
import shutil
import signal
import socket
import subprocess
import sys
import time
import urllib.request
from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path

import grpc
from grpc_health.v1 import health_pb2, health_pb2_grpc

from tests.deploy.compose import DEPLOY, REPO, environment, parse_serve, serve_settings

START_TIMEOUT_S = 240.0
STOP_TIMEOUT_S = 20.0
LOCAL = "127.0.0.1"


class TopologyError(Exception):
    """The compose file cannot be started as local processes (names the service)."""


@dataclass
class Instance:
    service: str
    replica: int
    kind: str  # "snapstream", "redis" or "nats": what the image is
    ports: dict[int, int]  # container port -> local port
    compose: dict  # the service's compose definition
    grpc_port: int = 0  # container port of a snapstream service's gRPC server
    argv: list[str] = field(default_factory=list)
    env: dict[str, str] = field(default_factory=dict)
    process: subprocess.Popen | None = None
    log: Path | None = None

    @property
    def name(self) -> str:
        return f"{self.service}-{self.replica + 1}"

    def address(self, container_port: int) -> str:
        return f"{LOCAL}:{self.ports[container_port]}"

    def log_tail(self, lines: int = 40) -> str:
        text = self.log.read_text(errors="replace") if self.log and self.log.exists() else ""
        return f"--- {self.name} ({' '.join(self.argv)}):\n" + "\n".join(
            text.splitlines()[-lines:])


@dataclass
class Topology:
    levels: list[list[Instance]]  # start order: each level depends only on earlier ones
    exit_codes: dict[str, int | None] = field(default_factory=dict)
    strays: list[str] = field(default_factory=list)  # instances whose group outlived them

    @property
    def instances(self) -> list[Instance]:
        return [instance for level in self.levels for instance in level]

    def of(self, service: str) -> list[Instance]:
        return [instance for instance in self.instances if instance.service == service]


def plan(compose: dict, workdir: Path, overrides: dict[str, str]) -> Topology:
    """Instances with local ports, argv and environment; ``overrides`` are extra environment
    of every snapstream service (e.g. SNAPSTREAM_MODEL)."""
    services = compose["services"]
    instances = {name: _instances(name, service) for name, service in services.items()}
    for group in instances.values():
        for instance in group:
            _prepare(instance, instances, workdir, overrides)
    return Topology([[i for name in level for i in instances[name]]
                     for level in _start_levels(services)])


def _instances(name: str, service: dict) -> list[Instance]:
    kind = service["image"].rsplit("/", 1)[-1].split(":")[0]
    replicas = int(service.get("deploy", {}).get("replicas", 1))
    return [Instance(name, replica, kind, {port: _free_port() for port in
                                           _container_ports(kind, service)}, service)
            for replica in range(replicas)]


def _container_ports(kind: str, service: dict) -> list[int]:
    command = service.get("command", [])
    if kind == "snapstream":
        args = parse_serve(command, environment(service))
        return [port for port in (args.port, args.metrics_port, getattr(args, "http_port", 0))
                if port]
    if kind == "redis":
        return [6379]
    if kind == "nats":
        return [4222, int(_option(command, "-m"))]
    raise TopologyError(f"no local stand-in for image {service['image']!r}")


def _prepare(instance: Instance, instances: dict[str, list[Instance]], workdir: Path,
             overrides: dict[str, str]) -> None:
    own = workdir / instance.name
    own.mkdir(parents=True)
    instance.log = own / "log.txt"
    env = {key: _localize(value, instances) for key, value in
           environment(instance.compose).items()}
    command = [_localize(arg, instances) for arg in instance.compose.get("command", [])]
    if instance.kind == "snapstream":
        unknown = sorted(k for k in env if k.startswith("SNAPSTREAM_")
                         and k not in serve_settings(command[1]))
        if unknown:
            raise TopologyError(f"{instance.service}: `snapstream {' '.join(command)}` "
                                f"understands none of {unknown}")
        args = parse_serve(command, env)
        instance.grpc_port = args.port
        env |= {"SNAPSTREAM_HOST": LOCAL, "SNAPSTREAM_PORT": str(instance.ports[args.port])}
        if args.metrics_port:
            env["SNAPSTREAM_METRICS_PORT"] = str(instance.ports[args.metrics_port])
        if getattr(args, "http_port", 0):  # the router's OpenAI API
            env["SNAPSTREAM_HTTP_PORT"] = str(instance.ports[args.http_port])
        env |= overrides
        instance.argv = [*_entrypoint(instance.compose), *command]
    elif instance.kind == "redis":
        instance.argv = _redis_argv(command, instance.ports[6379], own)
    else:
        instance.argv = _nats_argv(command, instance, own)
    outer = {k: v for k, v in os.environ.items() if not k.startswith("SNAPSTREAM_")}
    instance.env = outer | env


def _entrypoint(service: dict) -> list[str]:
    """The compose ``entrypoint``, else the image's ENTRYPOINT; ``snapstream`` runs the CLI."""
    entrypoint = service.get("entrypoint")
    if entrypoint is None:
        lines = [line for line in (DEPLOY / "Dockerfile").read_text().splitlines()
                 if line.startswith("ENTRYPOINT ")]
        entrypoint = json.loads(lines[-1].split(None, 1)[1])
    if entrypoint[0] != "snapstream":
        raise TopologyError(f"unexpected entrypoint {entrypoint}")
    return [sys.executable, "-m", "cli.main", *entrypoint[1:]]


def _redis_argv(command: list[str], port: int, own: Path) -> list[str]:
    if command[:1] != ["redis-server"]:
        raise TopologyError(f"redis command must start with redis-server: {command}")
    # later options win: the local port, no persistence, files in the instance's folder
    return [_binary("redis-server"), *command[1:], "--port", str(port), "--bind", LOCAL,
            "--dir", str(own), "--save", "", "--appendonly", "no"]


def _nats_argv(command: list[str], instance: Instance, own: Path) -> list[str]:
    if command[:1] != ["nats-server"]:
        raise TopologyError(f"nats command must start with nats-server: {command}")
    args = list(command[1:])
    args[args.index("-sd") + 1] = str(own / "jetstream")
    monitor = args.index("-m") + 1
    args[monitor] = str(instance.ports[int(args[monitor])])
    return [_binary("nats-server"), *args, "-a", LOCAL, "-p", str(instance.ports[4222])]


def _localize(text: str, instances: dict[str, list[Instance]]) -> str:
    """``service:port`` -> the local address of every replica of ``service``."""
    names = "|".join(re.escape(name) for name in sorted(instances, key=len, reverse=True))
    is_url = "://" in text

    def replace(match: re.Match) -> str:
        name, port = match.group(1), int(match.group(2))
        replicas = instances[name]
        if port not in replicas[0].ports:
            raise TopologyError(f"{text!r}: {name} listens on {sorted(replicas[0].ports)}")
        if len(replicas) > 1 and is_url:
            raise TopologyError(f"{text!r}: {name} has {len(replicas)} replicas, not one host")
        return ",".join(replica.address(port) for replica in replicas)

    return re.sub(rf"(?<![\w.-])({names}):(\d+)\b", replace, text)


def _option(args: list[str], name: str) -> str:
    if name not in args:
        raise TopologyError(f"{name} missing in {args}")
    return args[args.index(name) + 1]


def _start_levels(services: dict) -> list[list[str]]:
    levels, placed = [], set()
    while len(placed) < len(services):
        level = sorted(name for name, service in services.items() if name not in placed
                       and set(service.get("depends_on", {})) <= placed)
        if not level:
            raise TopologyError(f"depends_on cycle among {sorted(set(services) - placed)}")
        levels.append(level)
        placed.update(level)
    return levels


def _binary(name: str) -> str:
    found = shutil.which(name)
    if found is None:
        raise TopologyError(f"{name} is not on PATH (scripts/setup.sh installs it)")
    return found


def _free_port() -> int:
    with socket.socket() as sock:
        sock.bind((LOCAL, 0))
        return sock.getsockname()[1]


# -- running ------------------------------------------------------------------------------------
@contextlib.contextmanager
def up(topology: Topology) -> Iterator[Topology]:
    """Starts level by level, each instance healthy before the next level; always stops all."""
    try:
        for level in topology.levels:
            for instance in level:
                _start(instance)
            for instance in level:
                wait_healthy(instance)
        yield topology
    except BaseException:
        print("\n".join(i.log_tail() for i in topology.instances if i.process), file=sys.stderr)
        raise
    finally:
        down(topology)


def _start(instance: Instance) -> None:
    # setpriv (util-linux): the child gets SIGKILL if the test process dies without stopping it
    guard = ["setpriv", "--pdeathsig", "KILL", "--"] if shutil.which("setpriv") else []
    with instance.log.open("wb") as log:
        instance.process = subprocess.Popen([*guard, *instance.argv], env=instance.env,
                                            cwd=REPO, stdout=log, stderr=subprocess.STDOUT,
                                            start_new_session=True)


def wait_healthy(instance: Instance) -> None:
    """The service's own readiness, then its compose healthcheck run as a command, retried every
    ``start_interval`` as compose does within the start period (the router's Generation health
    turns SERVING once its channels to the workers are up, a moment after it listens)."""
    deadline = time.monotonic() + START_TIMEOUT_S
    while not _is_ready(instance):
        if instance.process.poll() is not None:
            raise TopologyError(f"{instance.name} exited with {instance.process.returncode}:\n"
                                f"{instance.log_tail()}")
        if time.monotonic() > deadline:
            raise TopologyError(f"{instance.name} not healthy in {START_TIMEOUT_S} s")
        time.sleep(0.2)
    interval_s = _seconds(instance.compose["healthcheck"].get("start_interval", "5s"))
    while True:
        try:
            _run_healthcheck(instance)
            return
        except (TopologyError, OSError):
            if time.monotonic() > deadline:
                raise
        time.sleep(interval_s)


def _seconds(duration: str) -> float:
    """A compose duration such as ``2s`` or ``500ms``."""
    match = re.fullmatch(r"(\d+(?:\.\d+)?)(ms|s|m)", duration)
    if match is None:
        raise TopologyError(f"unsupported compose duration {duration!r}")
    return float(match[1]) * {"ms": 0.001, "s": 1.0, "m": 60.0}[match[2]]


def _is_ready(instance: Instance) -> bool:
    if instance.kind != "snapstream":
        with contextlib.suppress(OSError):
            socket.create_connection((LOCAL, next(iter(instance.ports.values()))), 0.2).close()
            return True
        return False
    with grpc.insecure_channel(instance.address(instance.grpc_port)) as channel:
        try:
            response = health_pb2_grpc.HealthStub(channel).Check(
                health_pb2.HealthCheckRequest(), timeout=1.0)
        except grpc.RpcError:
            return False
    return response.status == health_pb2.HealthCheckResponse.SERVING


def _run_healthcheck(instance: Instance) -> None:
    """``snapstream health`` as a process, the nats monitor URL over HTTP; the redis check is a
    shell pipeline on the container's default port, covered by the workers' own connection."""
    test = instance.compose["healthcheck"]["test"]
    if test[0] != "CMD":
        return
    local = [re.sub(rf"(?:127\.0\.0\.1|localhost):({'|'.join(map(str, instance.ports))})\b",
                    lambda m: instance.address(int(m.group(1))), arg) for arg in test[1:]]
    if local[0] == "wget":
        with urllib.request.urlopen(local[-1], timeout=5):  # raises unless 2xx
            return
    argv = [sys.executable, "-m", "cli.main", *local[1:]] if local[0] == "snapstream" \
        else local
    result = subprocess.run(argv, env=instance.env, cwd=REPO, capture_output=True, text=True,
                            timeout=60)
    if result.returncode != 0:
        raise TopologyError(f"{instance.name} healthcheck {local} exited "
                            f"{result.returncode}: {result.stdout}{result.stderr}")


def down(topology: Topology) -> None:
    """SIGTERM to every process group, dependents first; SIGKILL what outlives the grace."""
    for instance in reversed(topology.instances):
        if instance.process and instance.process.poll() is None:
            with contextlib.suppress(ProcessLookupError):
                os.killpg(instance.process.pid, signal.SIGTERM)
    for instance in reversed(topology.instances):
        if instance.process is None:
            continue
        try:
            instance.process.wait(timeout=STOP_TIMEOUT_S)
        except subprocess.TimeoutExpired:
            os.killpg(instance.process.pid, signal.SIGKILL)
            instance.process.wait()
        topology.exit_codes[instance.name] = instance.process.returncode
        if not group_is_empty(instance.process.pid):  # a child outlived its service
            topology.strays.append(instance.name)
            with contextlib.suppress(ProcessLookupError):
                os.killpg(instance.process.pid, signal.SIGKILL)


def group_is_empty(pid: int) -> bool:
    try:
        os.killpg(pid, 0)
    except ProcessLookupError:
        return True
    return False
