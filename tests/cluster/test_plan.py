"""ClusterSpec validation and the members' command lines (nothing is started)."""

from __future__ import annotations

import itertools
import sys
from pathlib import Path

import pytest

from cluster import ClusterSpec, plan_cluster
from cluster.certs import make_cluster_certs
from cluster.stores import StoreAccess

ACCESS = StoreAccess(password="pw-1")


def _plan(spec: ClusterSpec, access: StoreAccess = ACCESS):
    ports = itertools.count(41000)
    return plan_cluster(spec, Path("/data"), lambda: next(ports), access)


def _flags(argv: tuple[str, ...]) -> dict[str, str]:
    return dict(zip(argv[5::2], argv[6::2], strict=True))


def test_stages_start_store_then_workers_then_router() -> None:
    stages = _plan(ClusterSpec(decode_workers=2))
    assert [[m.name for m in stage] for stage in stages] == [
        ["store"], ["prefill", "decode-0", "decode-1"], ["router"]]


def test_router_gets_every_worker_and_workers_get_the_store() -> None:
    store, (prefill, *decodes), (router,) = _plan(
        ClusterSpec(store="nats", model=Path("/m"), decode_workers=2, rows=3,
                    backend="sn40l-sim", router_port=50051))
    (store,) = store
    assert store.address == "nats://snapstream:pw-1@127.0.0.1:41000?max_bytes=4294967296"
    assert store.argv == ("nats-server", "-js", "-c", "/data/nats.conf")
    assert 'password: "pw-1"' in store.files[0][1]
    assert router.address == "127.0.0.1:50051"
    assert router.argv[:5] == (sys.executable, "-m", "cli.main", "serve", "router")
    flags = _flags(router.argv)
    assert flags["--prefill-addrs"] == prefill.address
    assert flags["--decode-addrs"] == ",".join(d.address for d in decodes)
    for decode in decodes:
        flags = _flags(decode.argv)
        assert (flags["--rows"], flags["--backend"], flags["--model"]) == ("3", "sn40l-sim", "/m")
        assert dict(decode.env)["SNAPSTREAM_STORE"] == store.address
        assert "pw-1" not in " ".join(decode.argv)  # not on a command line: ps shows those
    assert router.service == "snapstream.v1.Generation" and store.service is None


def test_every_port_is_distinct_and_given_ports_are_kept() -> None:
    stages = _plan(ClusterSpec(decode_ports=(50060, 50061), router_port=0))
    members = [m for stage in stages for m in stage]
    ports = [m.port for m in members] + [m.metrics_port for m in members if m.metrics_port]
    assert len(set(ports)) == len(ports)
    assert [m.port for m in stages[1][1:]] == [50060, 50061]


def test_without_a_model_the_services_serve_the_embedded_one() -> None:
    assert all("--model" not in m.argv for stage in _plan(ClusterSpec()) for m in stage)


def test_only_the_prefill_worker_gets_the_draft_model() -> None:
    _, (prefill, *decodes), (router,) = _plan(ClusterSpec(model=Path("/m"),
                                                          draft_model=Path("/d")))
    assert _flags(prefill.argv)["--draft-model"] == "/d"
    assert all("--draft-model" not in m.argv for m in (*decodes, router))
    assert all("--draft-model" not in m.argv for stage in _plan(ClusterSpec()) for m in stage)


def test_both_model_workers_get_the_kv_dtype_and_the_router_not() -> None:
    (_,), (prefill, *decodes), (router,) = _plan(ClusterSpec(decode_workers=2, kv_dtype="int8"))
    assert [_flags(m.argv)["--kv-dtype"] for m in (prefill, *decodes)] == ["int8"] * 3
    assert "--kv-dtype" not in router.argv
    assert all("--kv-dtype" not in m.argv for stage in _plan(ClusterSpec()) for m in stage)


def test_model_workers_get_the_torch_thread_share_and_the_router_none() -> None:
    (store,), workers, (router,) = _plan(ClusterSpec(torch_threads=1))
    assert all(dict(m.env)["OMP_NUM_THREADS"] == "1" for m in workers)
    assert store.env == router.env == ()
    assert all("OMP_NUM_THREADS" not in dict(m.env) for stage in _plan(ClusterSpec())
               for m in stage)


def test_a_tls_store_is_configured_tls_only_and_its_url_trusts_the_cluster_ca(
        tmp_path: Path) -> None:
    certs = make_cluster_certs(tmp_path, ("127.0.0.1",))
    (redis,), _, _ = _plan(ClusterSpec(), StoreAccess(password="pw-1", certs=certs))
    assert redis.address == f"rediss://:pw-1@127.0.0.1:41000/0?tls_ca_file={certs.ca}"
    config = redis.files[0][1]
    assert "port 0\ntls-port 41000" in config and "requirepass pw-1" in config


def test_with_certificates_every_service_serves_tls_and_the_router_asks_for_keys(
        tmp_path: Path) -> None:
    certs = make_cluster_certs(tmp_path, ("127.0.0.1",))
    ports = itertools.count(41000)
    _, workers, (router,) = plan_cluster(ClusterSpec(), Path("/data"), lambda: next(ports),
                                         StoreAccess(password="pw-1", certs=certs),
                                         tmp_path / "api-key")
    def value(member, flag: str) -> str:
        return member.argv[member.argv.index(flag) + 1]

    for member in (*workers, router):
        assert [value(member, f"--tls-{name}") for name in ("cert", "key", "ca")] == [
            str(certs.cert), str(certs.key), str(certs.ca)], member.name
    assert value(router, "--api-keys-file") == str(tmp_path / "api-key")
    assert all("--api-keys-file" not in m.argv for m in workers)
    assert all("--tls-cert" not in m.argv for stage in _plan(ClusterSpec()) for m in stage)


@pytest.mark.parametrize(("fields", "message"), [
    ({"torch_threads": -1}, "torch_threads must be >= 0"),
    ({"store": "etcd"}, "store must be one of redis, nats"),
    ({"decode_workers": 0}, "decode_workers and rows must be >= 1"),
    ({"decode_ports": (1, 2, 3)}, "decode_ports must be empty or hold decode_workers"),
    ({"router_port": 70000}, "ports must lie in"),
    ({"drain_timeout_s": 0}, "start_timeout_s and drain_timeout_s must be > 0"),
])
def test_spec_rejects_bad_fields_by_name(fields, message) -> None:
    with pytest.raises(ValueError, match=message):
        ClusterSpec(**fields)


def test_a_port_in_use_stops_the_start_before_anything_runs(tmp_path: Path) -> None:
    import socket

    from cluster import ClusterError, LocalCluster

    with socket.socket() as taken:
        taken.bind(("127.0.0.1", 0))
        taken.listen()
        port = taken.getsockname()[1]
        cluster = LocalCluster(ClusterSpec(router_port=port, log_dir=tmp_path))
        with pytest.raises(ClusterError, match=f"port {port} on 127.0.0.1 is in use"):
            cluster.start()
    assert cluster.pids == {}


def test_the_router_serves_the_openai_api_on_its_own_port() -> None:
    stages = _plan(ClusterSpec(router_port=0))
    members, (router,) = [m for stage in stages for m in stage], stages[-1]
    assert _flags(router.argv)["--http-port"] == str(router.http_port)
    assert router.http_port not in {m.port for m in members} | {m.metrics_port for m in members}
    *_, (given,) = _plan(ClusterSpec(http_port=8000))
    assert (given.http_port, _flags(given.argv)["--http-port"]) == (8000, "8000")


@pytest.mark.parametrize("store", ["redis", "nats"])
def test_the_store_holds_at_most_its_limit_and_the_workers_get_the_secret(store) -> None:
    ports = itertools.count(41000)
    (stored,), workers, (router,) = plan_cluster(
        ClusterSpec(store=store, store_max_bytes=8 << 20), Path("/data"), lambda: next(ports),
        ACCESS, secret_file=Path("/data/cluster-secret"))
    if store == "redis":
        assert "maxmemory 8388608\nmaxmemory-policy noeviction" in stored.files[0][1]
    else:  # the blob stream's own limit, which every service opens it with
        assert stored.address.endswith("?max_bytes=8388608")
    for worker in workers:
        assert dict(worker.env)["SNAPSTREAM_CLUSTER_SECRET_FILE"] == "/data/cluster-secret"
    assert "SNAPSTREAM_CLUSTER_SECRET_FILE" not in dict(router.env)
