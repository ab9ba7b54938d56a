"""The deployment files (issue 53), checked offline: the Kubernetes manifests against the API
schemas (kubernetes-validate, strict: no unknown fields) and against each other (the
InferencePool selects the Deployment's pods on the server's port; the objective names the
pool), the containers run as non-root with a health check on /health, and the Ray Serve config
builds our application. Nothing here needs a cluster or a container build."""

import re
from pathlib import Path

import pytest
import yaml

ROOT = Path(__file__).resolve().parents[2]
DEPLOY = ROOT / "deploy"
K8S_VERSION = "1.33"


def manifests():
    docs = list(yaml.safe_load_all((DEPLOY / "k8s" / "expert-runtime.yaml").read_text()))
    return {d["kind"]: d for d in docs}


def test_core_resources_match_the_kubernetes_schemas():
    kv = pytest.importorskip("kubernetes_validate")
    m = manifests()
    for kind in ("Deployment", "Service"):
        kv.validate(m[kind], K8S_VERSION, strict=True)
    # A mistake of the kind a typo makes is caught (the check is not vacuous).
    bad = yaml.safe_load(yaml.safe_dump(m["Deployment"]))
    bad["spec"]["template"]["spec"]["containers"][0]["readinessProbe"]["httpGet"]["paht"] = "/health"
    with pytest.raises(kv.ValidationError):
        kv.validate(bad, K8S_VERSION, strict=True)


def test_the_pool_selects_the_servers_and_the_picker_reads_vllm_metrics():
    m = manifests()
    dep, svc, pool, objective = m["Deployment"], m["Service"], m["InferencePool"], m["InferenceObjective"]
    labels = dep["spec"]["template"]["metadata"]["labels"]
    container = dep["spec"]["template"]["spec"]["containers"][0]
    ports = {p["name"]: p["containerPort"] for p in container["ports"]}
    # The picker maps metric names by this label: ours are vLLM's.
    assert labels["llm-d.ai/engine-type"] == "vllm"
    assert pool["apiVersion"] == "inference.networking.k8s.io/v1"
    assert set(pool["spec"]["selector"]["matchLabels"].items()) <= set(labels.items())
    assert set(pool["spec"]) <= {"selector", "targetPorts", "appProtocol", "endpointPickerRef"}
    assert pool["spec"]["targetPorts"] == [{"number": ports["http"]}]
    epp = pool["spec"]["endpointPickerRef"]
    assert set(epp) <= {"group", "kind", "name", "port", "failureMode"} and epp["name"] and epp["failureMode"] in ("FailOpen", "FailClose")
    assert objective["apiVersion"] == "inference.networking.x-k8s.io/v1alpha2"
    assert objective["spec"]["poolRef"] == {"group": "inference.networking.k8s.io", "name": pool["metadata"]["name"]}
    assert isinstance(objective["spec"]["priority"], int)
    assert svc["spec"]["selector"].items() <= labels.items()
    # Readiness and liveness on /health, the server's port; KV events published where the
    # Service exposes them; non-root.
    for probe in ("readinessProbe", "livenessProbe", "startupProbe"):
        assert container[probe]["httpGet"] == {"path": "/health", "port": "http"}
    args = container["args"]
    assert args[args.index("--kv-events") + 1] == f"tcp://*:{ports['kv-events']}"
    assert dep["spec"]["template"]["spec"]["securityContext"]["runAsNonRoot"] is True


@pytest.mark.parametrize("name", ["Dockerfile", "Dockerfile.cuda"])
def test_the_containers_run_as_non_root_with_a_health_check(name):
    text = (DEPLOY / "docker" / name).read_text()
    user = re.findall(r"^USER (\S+)", text, re.M)
    assert user and not user[-1].startswith(("0", "root")), user
    health = re.search(r"^HEALTHCHECK .*\n?.*", text, re.M)
    assert health and "/health" in text[health.start():health.start() + 400]
    assert re.search(r'^ENTRYPOINT \[.*"serve"', text, re.M)
    port = re.search(r'"--port", "(\d+)"', text).group(1)
    assert re.search(rf"^EXPOSE .*\b{port}\b", text, re.M)
    manifest_port = manifests()["Deployment"]["spec"]["template"]["spec"]["containers"][0]["ports"][0]["containerPort"]
    assert int(port) == manifest_port


def test_the_ray_config_names_our_application_builder():
    config = yaml.safe_load((DEPLOY / "ray" / "serve.yaml").read_text())
    (application,) = config["applications"]
    assert application["import_path"] == "expert_runtime.ray:build_app"
    assert set(application["args"]) <= {"model", "experts_dir", "num_replicas", "base", "threads", "context_length", "kv_cache"}
    assert application["args"]["model"]
    module, attr = application["import_path"].split(":")
    assert attr in (ROOT / "python" / module.replace(".", "/")).with_suffix(".py").read_text()
