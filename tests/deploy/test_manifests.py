"""deploy/ agrees with the code: env names are settings, ports and probe paths are served, the KEDA
triggers count the jobs waiting on the workers' streams (the tune stream of the GPU workers' arch too),
commands are real CLI subcommands."""

import re
from pathlib import Path

import pytest
import yaml

from fxcc.client.cli import build_parser
from fxcc.service import keys
from fxcc.service.app import create_app
from fxcc.service.settings import ServiceSettings

DEPLOY = Path(__file__).parents[2] / "deploy"
SETTINGS_ENV = {f"FXCC_{name.upper()}" for name in ServiceSettings.model_fields}


def docs():
    out = []
    for path in [DEPLOY / "docker-compose.yml", *sorted((DEPLOY / "k8s").glob("*.yaml"))]:
        out += [(path.name, d) for d in yaml.safe_load_all(path.read_text()) if d]
    return out


def walk(obj):
    yield obj
    if isinstance(obj, dict):
        for v in obj.values():
            yield from walk(v)
    elif isinstance(obj, list):
        for v in obj:
            yield from walk(v)


def routes():
    return set(create_app(ServiceSettings()).openapi()["paths"])


def test_every_env_name_is_a_setting():
    names = set()
    for _, d in docs():
        for node in walk(d):
            if isinstance(node, dict):
                env = node.get("environment") or node.get("data") or node.get("stringData") or {}
                if isinstance(env, dict):
                    names |= {k for k in env if k.startswith("FXCC_")}
    assert names, "no FXCC_ settings found in the manifests"
    assert names <= SETTINGS_ENV, sorted(names - SETTINGS_ENV)


def test_ports_and_probe_paths_match_the_service():
    port = ServiceSettings().port
    served = routes()
    probes = []
    for name, d in docs():
        for node in walk(d):
            if isinstance(node, dict) and "httpGet" in node:
                probes.append(node["httpGet"]["path"])
            if isinstance(node, dict) and "containerPort" in node:
                assert node["containerPort"] == port, name
    assert probes and set(probes) <= served, (probes, served)
    compose = yaml.safe_load((DEPLOY / "docker-compose.yml").read_text())
    assert compose["services"]["api"]["ports"] == [f"{port}:{port}"]
    assert compose["services"]["api"]["environment"]["FXCC_PORT"] == str(port)


def test_compose_has_queue_and_cache_redis_and_prometheus_scrapes_metrics():
    compose = yaml.safe_load((DEPLOY / "docker-compose.yml").read_text())
    services = compose["services"]
    queue = " ".join(services["redis-queue"]["command"])
    cache = " ".join(services["redis-cache"]["command"])
    assert "--appendonly yes" in queue and "noeviction" in queue
    assert "allkeys-lru" in cache and "--maxmemory " in cache
    env = services["api"]["environment"]
    assert env["FXCC_REDIS_URL"].startswith("redis://redis-queue")
    assert env["FXCC_CACHE_REDIS_URL"].startswith("redis://redis-cache")
    prom = yaml.safe_load((DEPLOY / "prometheus.yml").read_text())
    (job,) = prom["scrape_configs"]
    assert job["metrics_path"] in routes()
    assert job["static_configs"][0]["targets"] == [f"api:{ServiceSettings().port}"]


def keda_triggers():
    """The ScaledObject, the Deployment it scales, and its redis-streams triggers' metadata by stream."""
    (keda,) = [d for _, d in docs() if d.get("kind") == "ScaledObject"]
    target = keda["spec"]["scaleTargetRef"]["name"]
    (deployment,) = [d for _, d in docs() if d.get("kind") == "Deployment" and d["metadata"]["name"] == target]
    triggers = {t["metadata"]["stream"]: t["metadata"] for t in keda["spec"]["triggers"] if t["type"] == "redis-streams"}
    return deployment, triggers


def test_keda_scales_on_jobs_waiting_not_only_on_jobs_held():
    """Every trigger counts a stream's length (waiting + running: workers delete the entries they
    acknowledge). With a consumer group KEDA would count its pending entries, the jobs workers
    already hold, which never exceed the workers running: a backlog would add no replica."""
    _, triggers = keda_triggers()
    assert ServiceSettings().redis_prefix + keys.STREAM_INTERACTIVE in triggers
    for meta in triggers.values():
        assert "consumerGroup" not in meta and int(meta["streamLength"]) > 0, meta
    assert len({m["address"] for m in triggers.values()}) == 1  # the queue Redis the workers read


def test_keda_scales_gpu_workers_on_the_tune_stream_of_their_arch():
    """Tune jobs waiting for the scaled workers' GPUs add replicas: a trigger on the tune stream of
    the arch that the Deployment's nodes have (GPU feature discovery's compute capability labels)."""
    deployment, triggers = keda_triggers()
    labels = deployment["spec"]["template"]["spec"]["nodeSelector"]
    arch = int(labels["nvidia.com/gpu.compute.major"] + labels["nvidia.com/gpu.compute.minor"])
    assert arch == 90  # the H200 deployment
    assert keys.RedisKeys(ServiceSettings().redis_prefix).tune_stream(arch) in triggers
    (container,) = deployment["spec"]["template"]["spec"]["containers"]
    assert container["command"][:2] == ["fxcc", "worker"] and "cpu" not in container["command"]
    assert container["resources"]["limits"]["nvidia.com/gpu"] == 1


def test_keda_logs_in_to_redis_with_a_password_from_a_secret():
    """Every trigger authenticates through a TriggerAuthentication whose password comes from a key
    that a Secret of the manifests holds (a Redis with a password refuses an anonymous scaler)."""
    (keda,) = [d for _, d in docs() if d.get("kind") == "ScaledObject"]
    auths = {d["metadata"]["name"]: d for _, d in docs() if d.get("kind") == "TriggerAuthentication"}
    secrets = {d["metadata"]["name"]: d.get("stringData", {}) for _, d in docs() if d.get("kind") == "Secret"}
    for trigger in keda["spec"]["triggers"]:
        auth = auths[trigger["authenticationRef"]["name"]]
        refs = {r["parameter"]: r for r in auth["spec"]["secretTargetRef"]}
        assert refs["password"]["key"] in secrets[refs["password"]["name"]], refs


@pytest.mark.parametrize("dockerfile", ["Dockerfile.api", "Dockerfile.worker"])
def test_images_run_real_subcommands(dockerfile):
    text = (DEPLOY / dockerfile).read_text()
    assert "torch==2.13.0" in text  # pinned, never a surprise CUDA build
    (cmd,) = re.findall(r'^CMD \["fxcc", "(\w+)"', text, re.MULTILINE)
    subcommands = build_parser()._subparsers._group_actions[0].choices
    assert cmd in subcommands


def test_only_workers_hold_the_signing_key():
    """The workers' private key reaches worker containers only: an API or a client that held it could
    sign what it likes, and every client would run it."""
    holders = set()
    for name, d in docs():
        for node in walk(d):
            if isinstance(node, dict) and ("FXCC_SIGNING_KEY" in node or "FXCC_SIGNING_KEY_FILE" in node
                                           or node.get("secretRef", {}).get("name") == "fxcc-signing-key"):
                holders.add(name)
            if isinstance(node, dict) and isinstance(node.get("environment"), dict) and \
                    "FXCC_SIGNING_KEY" in node["environment"]:
                assert "worker" in str(node.get("command")), (name, node.get("command"))
    assert holders == {"worker.yaml", "secret.yaml", "docker-compose.yml"}, holders
    compose = yaml.safe_load((DEPLOY / "docker-compose.yml").read_text())
    assert "FXCC_SIGNING_KEY" not in compose["x-fxcc-env"] and "FXCC_SIGNING_KEY" not in compose["services"]["api"].get(
        "environment", {})
