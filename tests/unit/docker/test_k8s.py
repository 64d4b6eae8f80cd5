"""Kubernetes manifests: rendered with `kubectl kustomize` (offline), built-in kinds validated
against the Kubernetes JSON schemas (kubernetes-validate, strict), custom resources
(ServiceMonitor, PrometheusRule, DestinationRule) checked by their invariants."""

from __future__ import annotations

import os
import re
from concurrent.futures import ThreadPoolExecutor

import pytest
import yaml

from tests.unit.docker.deploy_helpers import DEPLOY_DOC, K8S, k8s_validate, kustomize_build

kv = pytest.importorskip(
    "kubernetes_validate", reason="pip install -e '.[dev]' (kubernetes-validate)"
)

K8S_VERSIONS = ("1.30", "1.37")  # oldest and newest minor these manifests are meant for
CRDS = {
    ("monitoring.coreos.com/v1", "ServiceMonitor"),
    ("monitoring.coreos.com/v1", "PrometheusRule"),
    ("networking.istio.io/v1", "DestinationRule"),
    ("security.istio.io/v1", "PeerAuthentication"),
}
TEMPLATE_HEADER = "x-facefuse-template"
INFERENCE_PORTS = {8000, 8001}
NAMESPACE = "facefuse"


COMBINATIONS = {
    "cpu": (("overlays/cpu",), ()),
    "gpu": (("overlays/gpu",), ()),
    "cpu+s3": (("overlays/cpu",), ("model-repository-s3",)),
    "gpu+pvc": (("overlays/gpu",), ("model-repository-pvc",)),
    "base+nginx": (("base",), ("affinity-nginx",)),
}


def render(root, resources: tuple[str, ...], components: tuple[str, ...]) -> list[dict]:
    """Render an ad-hoc overlay in ``root``: the given overlays/bases plus components."""
    root.mkdir()
    (root / "kustomization.yaml").write_text(
        yaml.safe_dump(
            {
                "apiVersion": "kustomize.config.k8s.io/v1beta1",
                "kind": "Kustomization",
                # kustomize refuses absolute paths
                "resources": [os.path.relpath(K8S / r, root) for r in resources],
                "components": [os.path.relpath(K8S / "components" / c, root) for c in components],
            }
        )
    )
    return kustomize_build(root)


@pytest.fixture(scope="module")
def rendered(tmp_path_factory) -> dict[str, list[dict]]:
    """Every combination, rendered once, concurrently (kubectl takes ~0.4 s per build)."""
    base = tmp_path_factory.mktemp("kustomize")
    with ThreadPoolExecutor(max_workers=len(COMBINATIONS)) as pool:
        futures = {
            name: pool.submit(render, base / name.replace("+", "-"), *combination)
            for name, combination in COMBINATIONS.items()
        }
        return {name: future.result() for name, future in futures.items()}


def by_kind(docs: list[dict], kind: str) -> list[dict]:
    return [d for d in docs if d["kind"] == kind]


def one(docs: list[dict], kind: str) -> dict:
    (doc,) = by_kind(docs, kind)
    return doc


def container(docs: list[dict]) -> dict:
    (c,) = one(docs, "Deployment")["spec"]["template"]["spec"]["containers"]
    return c


def env_of(c: dict) -> dict[str, dict]:
    return {e["name"]: e for e in c.get("env", [])}


def test_validator_is_strict():
    bad = {
        "apiVersion": "apps/v1",
        "kind": "Deployment",
        "metadata": {"name": "x"},
        "spec": {"replica": 2, "selector": {}, "template": {}},
    }
    with pytest.raises(kv.ValidationError):
        k8s_validate(bad, "1.37")


@pytest.mark.parametrize("overlay", ["cpu", "gpu"])
def test_every_builtin_object_validates_against_the_schemas(rendered, overlay):
    kinds = set()
    for doc in rendered[overlay]:
        kinds.add(doc["kind"])
        assert doc["metadata"]["namespace"] == NAMESPACE
        if (doc["apiVersion"], doc["kind"]) in CRDS:
            continue
        for version in K8S_VERSIONS:
            k8s_validate(doc, version)
    assert {
        "Deployment",
        "Service",
        "HorizontalPodAutoscaler",
        "PodDisruptionBudget",
        "NetworkPolicy",
        "ServiceAccount",
        "ServiceMonitor",
        "PrometheusRule",
        "DestinationRule",
    } <= kinds


@pytest.mark.parametrize("combination", ["cpu+s3", "gpu+pvc", "base+nginx"])
def test_components_render_and_validate(rendered, combination):
    docs = rendered[combination]
    components = COMBINATIONS[combination][1]
    for doc in docs:
        if (doc["apiVersion"], doc["kind"]) not in CRDS:
            k8s_validate(doc, "1.37")
    env = env_of(container(docs))
    if "model-repository-s3" in components:
        assert env["FACEFUSE_MODEL_REPOSITORY"]["value"].startswith("s3://")
        for name in ("AWS_ACCESS_KEY_ID", "AWS_SECRET_ACCESS_KEY", "AWS_DEFAULT_REGION"):
            assert env[name]["valueFrom"]["secretKeyRef"] == {"name": "facefuse-s3", "key": name}
        pod = one(docs, "Deployment")["spec"]["template"]["spec"]
        tmp = {v["name"]: v for v in pod["volumes"]}["tmp"]
        assert tmp["emptyDir"]["sizeLimit"] == "20Gi", "Triton downloads the repository to /tmp"
    if "model-repository-pvc" in components:
        mounts = {m["mountPath"]: m for m in container(docs)["volumeMounts"]}
        assert (
            env["FACEFUSE_MODEL_REPOSITORY"]["value"] == "/models" and mounts["/models"]["readOnly"]
        )
        assert env["FACEFUSE_MODEL_CONFIG"]["value"] == "gpu", "the overlay's settings survive"
    if "affinity-nginx" in components:
        ingress = one(docs, "Ingress")
        annotation = ingress["metadata"]["annotations"][
            "nginx.ingress.kubernetes.io/upstream-hash-by"
        ]
        assert annotation == "$http_" + TEMPLATE_HEADER.replace("-", "_")
        paths = [p["path"] for r in ingress["spec"]["rules"] for p in r["http"]["paths"]]
        assert "/v2/repository" not in " ".join(paths), "only inference and health are exposed"


@pytest.mark.parametrize("overlay", ["cpu", "gpu"])
def test_deployment_probes_shm_security_and_image(rendered, overlay):
    docs = rendered[overlay]
    pod = one(docs, "Deployment")["spec"]["template"]["spec"]
    c = container(docs)
    # the probes ask the supervisor (issue 33): Triton's /v2/health/* say 200 with a dead model
    for probe, path in (("livenessProbe", "/live"), ("readinessProbe", "/ready")):
        assert c[probe]["httpGet"] == {"path": path, "port": "health"}, probe
    assert c["startupProbe"]["httpGet"] == {"path": "/ready", "port": "health"}
    ready = c["readinessProbe"]
    assert ready["periodSeconds"] * ready["failureThreshold"] <= 5, "drained within 5 s"
    live = c["livenessProbe"]
    assert live["periodSeconds"] * live["failureThreshold"] >= 30, "no restart on a blip"
    assert "FACEFUSE_SUPERVISOR" not in env_of(c), "the supervisor is on (the default)"
    startup = c["startupProbe"]
    startup_s = startup["periodSeconds"] * startup["failureThreshold"]
    assert startup_s >= (1800 if overlay == "gpu" else 600), "long enough for engine builds / loads"
    assert {p["name"]: p["containerPort"] for p in c["ports"]} == {
        "http": 8000,
        "grpc": 8001,
        "metrics": 8002,
        "health": 8003,
    }
    volumes = {v["name"]: v for v in pod["volumes"]}
    (shm,) = [m for m in c["volumeMounts"] if m["mountPath"] == "/dev/shm"]
    assert volumes[shm["name"]]["emptyDir"]["medium"] == "Memory"
    assert pod["securityContext"]["runAsNonRoot"] is True
    assert c["securityContext"]["allowPrivilegeEscalation"] is False
    assert c["securityContext"]["capabilities"]["drop"] == ["ALL"]
    assert pod["automountServiceAccountToken"] is False
    image = c["image"]
    assert image == f"facefuse:{overlay}" and not image.endswith(":latest")
    assert env_of(c)["FACEFUSE_MODEL_CONFIG"]["value"] == overlay
    # the admin key comes from a Secret file mounted where the entrypoint reads it
    key_file = env_of(c)["FACEFUSE_ADMIN_KEY_FILE"]["value"]
    (mount,) = [m for m in c["volumeMounts"] if key_file.startswith(m["mountPath"] + "/")]
    secret = volumes[mount["name"]]["secret"]
    assert secret["secretName"] == "facefuse-admin-key"
    assert [i["path"] for i in secret["items"]] == [key_file.rsplit("/", 1)[1]]


def test_gpu_resources_and_engine_cache(rendered):
    c = container(rendered["gpu"])
    assert (
        c["resources"]["limits"]["nvidia.com/gpu"]
        == 1
        == c["resources"]["requests"]["nvidia.com/gpu"]
    )
    assert "nvidia.com/gpu" not in str(container(rendered["cpu"])["resources"])
    for docs in rendered.values():
        resources = container(docs)["resources"]
        assert resources["requests"]["memory"] == resources["limits"]["memory"], (
            "no memory overcommit"
        )
    pvc = one(rendered["gpu"], "PersistentVolumeClaim")
    mounts = {m["mountPath"]: m["name"] for m in c["volumeMounts"]}
    volumes = {
        v["name"]: v
        for v in one(rendered["gpu"], "Deployment")["spec"]["template"]["spec"]["volumes"]
    }
    cache_env = env_of(c)["FACEFUSE_ENGINE_CACHE"]["value"]
    assert (
        volumes[mounts[cache_env]]["persistentVolumeClaim"]["claimName"] == pvc["metadata"]["name"]
    )


@pytest.mark.parametrize("overlay", ["cpu", "gpu"])
def test_service_monitor_pdb_and_hpa_select_the_pods(rendered, overlay):
    docs = rendered[overlay]
    deployment = one(docs, "Deployment")
    pod_labels = deployment["spec"]["template"]["metadata"]["labels"]
    service = one(docs, "Service")
    assert service["spec"]["selector"].items() <= pod_labels.items()
    assert {p["name"]: p["port"] for p in service["spec"]["ports"]} == {
        "http": 8000,
        "grpc": 8001,
        "metrics": 8002,
        "health": 8003,
    }
    monitor = one(docs, "ServiceMonitor")
    assert (
        monitor["spec"]["selector"]["matchLabels"].items() <= service["metadata"]["labels"].items()
    )
    assert [e["port"] for e in monitor["spec"]["endpoints"]] == ["metrics", "health"]
    rule = one(docs, "PrometheusRule")
    assert rule["metadata"]["labels"]["release"] == monitor["metadata"]["labels"]["release"]
    pdb = one(docs, "PodDisruptionBudget")
    assert pdb["spec"]["selector"]["matchLabels"].items() <= pod_labels.items()
    hpa = one(docs, "HorizontalPodAutoscaler")
    target = hpa["spec"]["scaleTargetRef"]
    assert (target["kind"], target["name"]) == ("Deployment", deployment["metadata"]["name"])
    assert pdb["spec"]["minAvailable"] < hpa["spec"]["minReplicas"], "drains must be possible"
    assert hpa["spec"]["behavior"]["scaleDown"]["stabilizationWindowSeconds"] >= 300


@pytest.mark.parametrize("overlay", ["cpu", "gpu"])
def test_network_policy_exposes_only_the_inference_ports(rendered, overlay):
    policies = by_kind(rendered[overlay], "NetworkPolicy")
    open_ports, monitoring_ports = set(), set()
    for policy in policies:
        for rule in policy["spec"].get("ingress", []):
            ports = {p["port"] for p in rule["ports"]}
            if "from" not in rule:
                open_ports |= ports
            else:
                selectors = [f["namespaceSelector"]["matchLabels"] for f in rule["from"]]
                assert selectors == [{"kubernetes.io/metadata.name": "monitoring"}]
                monitoring_ports |= ports
        for rule in policy["spec"].get("egress", []):
            assert rule.get("ports"), "no egress rule without port restriction"
    assert open_ports == INFERENCE_PORTS
    assert monitoring_ports == {8002, 8003}  # Triton's metrics, the supervisor's
    (main,) = [p for p in policies if p["metadata"]["name"] == "facefuse"]
    assert main["spec"]["policyTypes"] == ["Ingress", "Egress"]


@pytest.mark.parametrize("overlay", ["cpu", "gpu"])
def test_destination_rule_hashes_on_the_template_header(rendered, overlay):
    docs = rendered[overlay]
    rule = one(docs, "DestinationRule")
    assert rule["spec"]["host"] == one(docs, "Service")["metadata"]["name"]
    balancer = rule["spec"]["trafficPolicy"]["loadBalancer"]
    assert set(balancer) == {"consistentHash"}
    consistent = balancer["consistentHash"]
    assert consistent["httpHeaderName"] == TEMPLATE_HEADER
    assert set(consistent) == {"httpHeaderName", "ringHash"}  # one hash key, one algorithm
    assert isinstance(consistent["ringHash"]["minimumRingSize"], int)
    peer = one(docs, "PeerAuthentication")["spec"]
    pod_labels = one(docs, "Deployment")["spec"]["template"]["metadata"]["labels"]
    assert peer["selector"]["matchLabels"].items() <= pod_labels.items()
    assert peer["mtls"] == {"mode": "UNSET"}, "the inference ports keep the mesh's mTLS mode"
    assert peer["portLevelMtls"] == {
        "8002": {"mode": "PERMISSIVE"},
        "8003": {"mode": "PERMISSIVE"},
    }, "Prometheus scrapes 8002 and 8003"
    grpc = [p for p in one(docs, "Service")["spec"]["ports"] if p["name"] == "grpc"]
    assert grpc[0]["appProtocol"] == "grpc", "Istio balances gRPC per request only when it knows"


def test_docs_create_every_secret_the_manifests_read(rendered):
    docs = [doc for docs in rendered.values() for doc in docs]
    needed: dict[str, set[str]] = {}
    for doc in docs:
        text = yaml.safe_dump(doc)
        for match in re.finditer(r"secretKeyRef:\s+key: (\S+)\s+name: (\S+)", text):
            needed.setdefault(match.group(2), set()).add(match.group(1))
        if doc["kind"] == "Deployment":
            for volume in doc["spec"]["template"]["spec"]["volumes"]:
                if "secret" in volume:
                    keys = {i["key"] for i in volume["secret"]["items"]}
                    needed.setdefault(volume["secret"]["secretName"], set()).update(keys)
    assert set(needed) == {"facefuse-admin-key", "facefuse-s3"}
    doc_text = re.sub(r"\\\n\s*", " ", DEPLOY_DOC.read_text())
    for name, keys in needed.items():
        create = re.compile(rf"kubectl (-n \S+ )?create secret generic {name} ")
        commands = [line for line in doc_text.splitlines() if create.search(line)]
        assert commands, f"docs/deploy.md does not create the Secret {name}"
        for key in keys:
            assert (
                f"--from-literal={key}=" in commands[0] or f"--from-file={key}=" in commands[0]
            ), (name, key)
