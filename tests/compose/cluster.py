"""The compose cluster in real containers, driven through deploy/compose.sh as a user would."""

from __future__ import annotations

import json
import socket
import subprocess
from dataclasses import dataclass
from pathlib import Path

from tests.deploy.compose import DEPLOY

COMPOSE_SH = DEPLOY / "compose.sh"
PROJECT = "snapstream"


def run(*args: str, timeout_s: float = 300) -> str:
    """A command's stdout; its stderr joins the assertion message when it fails."""
    result = subprocess.run(args, capture_output=True, text=True, timeout=timeout_s, check=False)
    assert result.returncode == 0, f"{' '.join(args)} exited {result.returncode}:\n" \
        f"{result.stdout}\n{result.stderr}"
    return result.stdout


def free_port() -> int:
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        return probe.getsockname()[1]


@dataclass(frozen=True)
class Cluster:
    """What ``compose.sh up`` printed: the router's addresses (and, secure, the CA and key)."""

    addr: str
    openai_base_url: str
    ca: Path | None = None
    api_key: str | None = None

    @classmethod
    def up(cls, *options: str) -> Cluster:
        env = {"ROUTER_PORT": str(free_port()), "HTTP_PORT": str(free_port())}
        printed = run("env", *(f"{k}={v}" for k, v in env.items()), str(COMPOSE_SH), "up",
                      *options, timeout_s=1800)
        values = dict(line.split("=", 1) for line in printed.splitlines() if "=" in line)
        assert values["SNAPSTREAM_ADDR"] == f"127.0.0.1:{env['ROUTER_PORT']}"
        key_file = values.get("SNAPSTREAM_API_KEY_FILE")
        return cls(addr=values["SNAPSTREAM_ADDR"], openai_base_url=values["OPENAI_BASE_URL"],
                   ca=Path(values["SNAPSTREAM_TLS_CA"]) if "SNAPSTREAM_TLS_CA" in values else None,
                   api_key=Path(key_file).read_text().strip() if key_file else None)

    @staticmethod
    def down() -> None:
        run(str(COMPOSE_SH), "down", timeout_s=600)


def compose(*args: str) -> str:
    return run(str(COMPOSE_SH), "compose", *args, timeout_s=900)


def compose_wait() -> None:
    """Until every container of the cluster is healthy (``compose.sh wait``)."""
    run(str(COMPOSE_SH), "wait", timeout_s=900)


def containers(service: str) -> list[str]:
    """Ids of the service's containers, running or not."""
    return compose("ps", "-q", service).split()


def inspect(container: str) -> dict:
    return json.loads(run("docker", "inspect", container))[0]


def metrics(container: str, port: int) -> str:
    """A container's Prometheus text, read inside it (metrics ports are not published)."""
    return run("docker", "exec", container, "python", "-c",
               "import urllib.request; print(urllib.request.urlopen("
               f"'http://127.0.0.1:{port}/metrics', timeout=5).read().decode())")


def project_leftovers() -> dict[str, list[str]]:
    """Containers, networks and volumes that carry the compose project's label."""
    label = f"label=com.docker.compose.project={PROJECT}"
    return {kind: run("docker", *command, "--filter", label).split()
            for kind, command in (("containers", ("ps", "-aq")),
                                  ("networks", ("network", "ls", "-q")),
                                  ("volumes", ("volume", "ls", "-q")))}
