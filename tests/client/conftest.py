"""A real cluster (Redis, one prefill, one decode worker, router) on a tiny random model, shared
by the client's end-to-end tests and started only when one of them runs."""

from __future__ import annotations

import json
from collections.abc import Iterator
from pathlib import Path

import pytest

from cluster import ClusterSpec, LocalCluster
from snapstream.policy import POLICY_FILE
from tests.tiny_models import write_tiny_model

MODEL_POLICY = {"kernel": 9, "observation": 16}


@pytest.fixture(scope="session")
def cluster_model(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """The tiny model, with its own default policy: the router must serve it."""
    path = write_tiny_model(tmp_path_factory.mktemp("tiny-model"))
    (path / POLICY_FILE).write_text(json.dumps(MODEL_POLICY))
    return path


@pytest.fixture(scope="session")
def cluster(cluster_model: Path, tmp_path_factory: pytest.TempPathFactory
            ) -> Iterator[LocalCluster]:
    spec = ClusterSpec(store="redis", model=cluster_model, router_port=0, decode_workers=1,
                       rows=2, log_dir=tmp_path_factory.mktemp("cluster-logs"),
                       drain_timeout_s=5.0)
    with LocalCluster(spec) as started:
        yield started
        assert started.exited() == {}, "a member crashed during the client tests"


@pytest.fixture(scope="session")
def router_address(cluster: LocalCluster) -> str:
    return cluster.endpoints["router"]
