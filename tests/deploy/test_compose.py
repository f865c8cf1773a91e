"""deploy/docker-compose.yml: valid against the Compose specification, configured only through
settings the services understand, started in health order, only the router published."""

from __future__ import annotations

import json
from importlib import resources

import jsonschema
import pytest
import yaml

from tests.deploy.compose import (
    COMPOSE_FILE,
    DEPLOY,
    environment,
    load_compose,
    parse_serve,
    serve_settings,
)

COMPOSE = load_compose()
APP_SERVICES = {name: service for name, service in COMPOSE["services"].items()
                if service.get("command", [None])[0] == "serve"}
NATS_URL = "nats://snapstream:snapstream-dev@nats:4222"


def compose_schema_errors(document: dict) -> list[str]:
    # the official compose-spec.json, as vendored by check-jsonschema (`vendor.compose-spec`)
    schema_file = resources.files("check_jsonschema.builtin_schemas.vendor") / "compose-spec.json"
    schema = json.loads(schema_file.read_text())
    validator = jsonschema.validators.validator_for(schema)(schema)
    return [f"{error.json_path}: {error.message}" for error in validator.iter_errors(document)]


@pytest.mark.parametrize("variables", [None, {}, {"STORE_URL": NATS_URL, "ROUTER_PORT": "8443"}],
                         ids=["as-written", "defaults", "nats"])
def test_compose_file_follows_the_compose_specification(variables):
    document = (yaml.safe_load(COMPOSE_FILE.read_text()) if variables is None
                else load_compose(variables))
    assert compose_schema_errors(document) == []


def test_schema_check_catches_a_mistake():
    broken = load_compose()
    broken["services"]["router"]["healthcheck"]["retires"] = 3
    assert compose_schema_errors(broken)


def test_topology_is_redis_nats_router_one_prefill_two_decode():
    services = COMPOSE["services"]
    assert set(services) == {"redis", "nats", "router", "prefill", "decode"}
    assert {name: service["command"][1] for name, service in APP_SERVICES.items()} == {
        "router": "router", "prefill": "prefill", "decode": "decode"}
    assert services["decode"]["deploy"]["replicas"] == 2
    assert services["prefill"].get("deploy", {}).get("replicas", 1) == 1
    assert "-js" in services["nats"]["command"]


@pytest.mark.parametrize("name", sorted(APP_SERVICES))
def test_every_variable_is_a_setting_the_service_understands(name):
    service = APP_SERVICES[name]
    assert service["command"] == ["serve", name], "settings go through the environment only"
    env = environment(service)
    settings = serve_settings(service["command"][1])
    unknown = sorted(set(env) - set(settings))
    assert not unknown, f"{name}: no `snapstream serve {name}` flag reads {unknown}"
    args = parse_serve(service["command"], env)  # every value parses as its flag's type
    assert args.service == name


def test_workers_share_one_store_and_the_router_finds_them_by_service_name():
    prefill, decode, router = (environment(COMPOSE["services"][name])
                               for name in ("prefill", "decode", "router"))
    assert prefill["SNAPSTREAM_STORE"] == decode["SNAPSTREAM_STORE"]
    assert prefill["SNAPSTREAM_STORE"].startswith("redis://:snapstream-dev@redis:6379/")
    assert router["SNAPSTREAM_PREFILL_ADDRS"] == f"prefill:{prefill['SNAPSTREAM_PORT']}"
    assert router["SNAPSTREAM_DECODE_ADDRS"] == f"decode:{decode['SNAPSTREAM_PORT']}"
    nats = load_compose({"STORE_URL": NATS_URL})["services"]
    assert environment(nats["decode"])["SNAPSTREAM_STORE"] == NATS_URL


def test_only_the_router_publishes_its_ports_grpc_and_openai_http():
    published = {name for name, service in COMPOSE["services"].items() if service.get("ports")}
    assert published == {"router"}
    router = COMPOSE["services"]["router"]
    env = environment(router)
    assert router["ports"] == [f"50051:{env['SNAPSTREAM_PORT']}",
                               f"8000:{env['SNAPSTREAM_HTTP_PORT']}"]


def test_services_start_once_their_dependencies_are_healthy():
    services = COMPOSE["services"]
    assert set(services["router"]["depends_on"]) == {"prefill", "decode"}
    for name, service in services.items():
        for dependency, condition in service.get("depends_on", {}).items():
            assert condition == {"condition": "service_healthy"}, f"{name} -> {dependency}"
            assert "healthcheck" in services[dependency], dependency


@pytest.mark.parametrize("name", sorted(APP_SERVICES))
def test_healthcheck_asks_the_grpc_health_service_on_the_services_port(name):
    service = APP_SERVICES[name]
    port = environment(service)["SNAPSTREAM_PORT"]
    grpc_service = {"router": "Generation", "prefill": "Prefill", "decode": "Decode"}[name]
    assert service["healthcheck"]["test"] == [
        "CMD", "snapstream", "health", "--addr", f"127.0.0.1:{port}",
        "--service", f"snapstream.v1.{grpc_service}"]


@pytest.mark.parametrize("name", sorted(APP_SERVICES))
def test_stop_grace_period_covers_the_drain(name):
    service = APP_SERVICES[name]
    grace_s = int(service["stop_grace_period"].removesuffix("s"))
    assert grace_s > float(environment(service)["SNAPSTREAM_DRAIN_TIMEOUT_S"])


def test_one_variable_switches_to_the_images_built_from_debian_packages():
    def stock(services: dict) -> tuple[str, str, str]:
        return (services["router"]["build"]["args"]["PYTHON_IMAGE"], services["redis"]["image"],
                services["nats"]["image"])

    assert stock(COMPOSE["services"]) == (
        "python:3.11-slim-bookworm", "redis:7.4-alpine", "nats:2.10-alpine")
    local = load_compose({"STOCK_TAG": "snapstream-local"})["services"]
    assert stock(local) == ("python:snapstream-local", "redis:snapstream-local",
                            "nats:snapstream-local")
    for name in ("python", "redis", "nats"):  # what deploy/images/build.sh builds them from
        assert (DEPLOY / "images" / f"{name}.Dockerfile").is_file()
    assert {service["build"]["args"]["PYTHON_IMAGE"] for service in APP_SERVICES.values()} == {
        "python:3.11-slim-bookworm"}


def test_secure_override_turns_on_tls_everywhere_and_api_keys_on_the_router():
    secure = load_compose({"SECRETS_DIR": "/secrets"}, DEPLOY / "docker-compose.secure.yml")
    assert set(secure["services"]) == set(APP_SERVICES)
    for name, service in secure["services"].items():
        env = environment(service)
        unknown = sorted(set(env) - set(serve_settings(name)))
        assert not unknown, f"{name}: no `snapstream serve {name}` flag reads {unknown}"
        assert {env[f"SNAPSTREAM_TLS_{part}"] for part in ("CERT", "KEY", "CA")} == {
            "/tls/tls.crt", "/tls/tls.key", "/tls/ca.crt"}
        assert "/secrets/tls:/tls:ro" in service["volumes"]
        probe = service["healthcheck"]["test"]
        assert probe[:7] == APP_SERVICES[name]["healthcheck"]["test"], "same port and service"
        assert probe[7:] == ["--tls-ca", "/tls/ca.crt", "--tls-cert", "/tls/tls.crt",
                             "--tls-key", "/tls/tls.key", "--tls-server-name",
                             env["SNAPSTREAM_TLS_SERVER_NAME"]]
    router = secure["services"]["router"]
    assert environment(router)["SNAPSTREAM_API_KEYS_FILE"] == "/keys/api-keys"
    assert "/secrets/api-keys:/keys/api-keys:ro" in router["volumes"]


@pytest.mark.parametrize("name", sorted(APP_SERVICES))
def test_kubernetes_configmaps_agree_with_what_the_compose_run_proved(name):
    """Settings both set have the same value, but the drain: Kubernetes pods pause in preStop
    and decode drains longer (docs/deploy.md)."""
    lines = (DEPLOY / "k8s" / "base" / "config" / f"{name}.env").read_text().splitlines()
    k8s = dict(line.split("=", 1) for line in lines if line and not line.startswith("#"))
    compose = environment(APP_SERVICES[name])
    shared = (set(k8s) & set(compose)) - {"SNAPSTREAM_DRAIN_TIMEOUT_S"}
    assert {"SNAPSTREAM_HOST", "SNAPSTREAM_PORT", "SNAPSTREAM_METRICS_PORT"} <= shared
    assert {key: k8s[key] for key in shared} == {key: compose[key] for key in shared}


def test_the_workers_mount_the_cluster_secret_and_redis_evicts_nothing():
    for name in ("prefill", "decode"):
        service = COMPOSE["services"][name]
        path = environment(service)["SNAPSTREAM_CLUSTER_SECRET_FILE"]
        assert f"./.compose/cluster-secret:{path}:ro" in service["volumes"]
    assert "SNAPSTREAM_CLUSTER_SECRET_FILE" not in environment(COMPOSE["services"]["router"])
    command = COMPOSE["services"]["redis"]["command"]
    assert command[command.index("--maxmemory-policy") + 1] == "noeviction"
    assert command[command.index("--maxmemory") + 1] == "4gb"
