"""The Kubernetes manifests (k8s/), validated offline.

- Core kinds against Kubernetes' own OpenAPI schemas with kubernetes-validate (PyPI), strict.
- The LeaderWorkerSet against the openAPIV3Schema of the LWS v0.10.0 CRD
  (tests/fixtures/k8s/README.md), with unknown fields refused as the API server would prune them.
- The router's args through the pinned router's own parser, the workers' args through the
  launcher (with LWS's variables filled in), so the manifests start what compose starts.
"""

from __future__ import annotations

import copy
import gzip
import json
from pathlib import Path
from typing import Any

import jsonschema
import pytest
import yaml
from support.launch import dry_run_plan

from glmserve.fleet.router import ROUTER_MODULE, RouterConfig
from glmserve.launch import load_profile

ROOT = Path(__file__).resolve().parents[2]
K8S = ROOT / "k8s"
LWS_SCHEMA = ROOT / "tests" / "fixtures" / "k8s" / "leaderworkerset-v1.schema.json.gz"
kubernetes_validate = pytest.importorskip("kubernetes_validate", reason="pip install '.[dev]'")
K8S_VERSION = "1.37.0"


def documents() -> list[tuple[str, dict[str, Any]]]:
    out = []
    for path in sorted(K8S.glob("*.yaml")):
        out += [(path.name, d) for d in yaml.safe_load_all(path.read_text()) if d]
    return out


def by_kind(kind: str) -> dict[str, Any]:
    (doc,) = [d for _, d in documents() if d["kind"] == kind]
    return doc


def strict(schema: Any) -> Any:
    """Refuse unknown fields wherever the CRD lists the known ones (the API server prunes
    them, so a typo would vanish silently)."""
    if isinstance(schema, dict):
        schema = {k: strict(v) for k, v in schema.items()}
        if (
            schema.get("type") == "object"
            and "properties" in schema
            and "additionalProperties" not in schema
            and not schema.get("x-kubernetes-preserve-unknown-fields")
        ):
            schema["additionalProperties"] = False
        return schema
    if isinstance(schema, list):
        return [strict(v) for v in schema]
    return schema


@pytest.fixture(scope="module")
def lws_validator() -> jsonschema.Validator:
    crd = json.loads(gzip.decompress(LWS_SCHEMA.read_bytes()))
    assert (crd["group"], crd["kind"], crd["version"]) == (
        "leaderworkerset.x-k8s.io", "LeaderWorkerSet", "v1"
    )  # fmt: skip
    return jsonschema.Draft7Validator(strict(crd["openAPIV3Schema"]))


@pytest.mark.parametrize(
    "name, doc",
    [(n, d) for n, d in documents() if d["kind"] != "LeaderWorkerSet"],
    ids=lambda v: v if isinstance(v, str) else v.get("kind", ""),
)
def test_core_kinds_validate_strictly_against_kubernetes_schemas(name, doc):
    kubernetes_validate.validate(doc, K8S_VERSION, strict=True)


def test_the_core_validator_can_fail():
    doc = copy.deepcopy(by_kind("Deployment"))
    doc["spec"]["template"]["spec"]["containers"][0]["imagePullPolicy"] = 7
    with pytest.raises(kubernetes_validate.ValidationError):
        kubernetes_validate.validate(doc, K8S_VERSION, strict=True)
    doc = copy.deepcopy(by_kind("Deployment"))
    doc["spec"]["replica"] = 1  # typo of replicas
    with pytest.raises(kubernetes_validate.ValidationError):
        kubernetes_validate.validate(doc, K8S_VERSION, strict=True)


def test_the_leaderworkerset_validates_against_the_lws_crd(lws_validator):
    errors = [e.message for e in lws_validator.iter_errors(by_kind("LeaderWorkerSet"))]
    assert not errors, errors


def test_the_lws_check_can_fail(lws_validator):
    lws = copy.deepcopy(by_kind("LeaderWorkerSet"))
    lws["spec"]["leaderWorkerTemplate"]["sise"] = 2
    assert list(lws_validator.iter_errors(lws))
    lws = copy.deepcopy(by_kind("LeaderWorkerSet"))
    lws["spec"]["leaderWorkerTemplate"]["size"] = "two"
    assert list(lws_validator.iter_errors(lws))


LWS_ENV = {"LWS_GROUP_SIZE": "2", "LWS_LEADER_ADDRESS": "glmserve-0.glmserve", "POD_IP": "10.0.0.9"}


def fill(args: list[str], values: dict[str, str]) -> list[str]:
    out = []
    for a in args:
        for k, v in values.items():
            a = a.replace(f"$({k})", v)
        assert "$(" not in a, f"unfilled variable in {a!r}"
        out.append(a)
    return out


@pytest.mark.parametrize("index", ["0", "1"])
def test_each_pod_runs_the_launcher_with_a_valid_multi_node_plan(index, tmp_path):
    lws = by_kind("LeaderWorkerSet")
    template = lws["spec"]["leaderWorkerTemplate"]
    pod = template["leaderTemplate" if index == "0" else "workerTemplate"]["spec"]
    (container,) = pod["containers"]
    assert "command" not in container  # the image's ENTRYPOINT: python3 -m glmserve.launch
    args = fill(container["args"], {**LWS_ENV, "LWS_WORKER_INDEX": index})
    args[args.index("--model-path") + 1] = str(ROOT / "tests" / "fixtures" / "glm5-nvfp4")
    environ = {"HOME": str(tmp_path), "FLASHINFER_WORKSPACE_BASE": str(tmp_path / "fi")}
    plan = dry_run_plan(args, environ)
    argv = plan["argv"]
    assert argv[argv.index("--node-rank") + 1] == index
    assert argv[argv.index("--dist-init-addr") + 1] == "glmserve-0.glmserve:25000"
    assert argv[argv.index("--host") + 1] == "10.0.0.9"  # the pod IP, never 0.0.0.0
    assert plan["fit"]["fits"]
    profile = load_profile(ROOT / "deploy" / "profiles", plan["profile"])
    gpus = int(container["resources"]["limits"]["nvidia.com/gpu"])
    assert gpus * template["size"] == profile.tp and template["size"] == profile.nodes


def test_the_router_args_parse_with_the_pinned_router_and_match_our_settings():
    launch_router = pytest.importorskip("smg.launch_router")
    deployment = by_kind("Deployment")
    (container,) = deployment["spec"]["template"]["spec"]["containers"]
    assert container["command"] == ["python", "-m", ROUTER_MODULE]
    values = {"POD_IP": "10.0.0.9", "POD_NAMESPACE": "glmserve", "ROUTER_API_KEY": "from-secret"}
    args = fill(container["args"], values)
    got = launch_router.parse_router_args(args)
    got._validate_router_args()
    assert got.host == got.prometheus_host == "10.0.0.9"
    assert got.service_discovery and got.service_discovery_namespace == "glmserve"
    assert got.selector == {
        "app.kubernetes.io/name": "glmserve-worker",
        "glmserve.io/role": "leader",
    }
    leader = by_kind("LeaderWorkerSet")["spec"]["leaderWorkerTemplate"]["leaderTemplate"]
    assert got.selector.items() <= leader["metadata"]["labels"].items()
    ours = RouterConfig()
    assert (got.policy, got.health_check_interval_secs, got.health_failure_threshold) == (
        ours.policy, ours.health_check_interval_s, ours.health_failure_threshold
    )  # fmt: skip
    assert (got.cb_failure_threshold, got.cb_timeout_duration_secs) == (
        ours.cb_failure_threshold, ours.cb_timeout_s
    )  # fmt: skip
    assert (got.request_timeout_secs, got.sse_keepalive_secs, got.retry_max_retries) == (
        ours.request_timeout_s, ours.sse_keepalive_s, ours.retry_max_retries
    )  # fmt: skip
    assert got.model_aliases == {"default": ours.served_model}
    # The API key comes from a Secret, never from the manifest itself.
    assert got.api_key == "from-secret"
    (key_env,) = [e for e in container["env"] if e["name"] == "ROUTER_API_KEY"]
    assert key_env["valueFrom"]["secretKeyRef"] == {"name": "glmserve-router-api-key", "key": "key"}


def test_images_are_the_ones_the_dockerfile_builds_and_never_latest():
    images = []
    for _, doc in documents():
        text = json.dumps(doc)
        images += [v for k, v in _walk(doc) if k == "image"]
        assert ":latest" not in text
    assert set(images) == {
        "glmserve/server:0.1.0-sglang0.5.12.post1",
        "glmserve/router:0.1.0-smg1.13.0",
    }


def _walk(node: Any):
    if isinstance(node, dict):
        for k, v in node.items():
            yield k, v
            yield from _walk(v)
    elif isinstance(node, list):
        for v in node:
            yield from _walk(v)


def pod_specs() -> list[tuple[str, dict[str, Any]]]:
    """(name, pod spec) of every pod template: the router's, the LWS leader's and worker's."""
    deployment = by_kind("Deployment")
    lws = by_kind("LeaderWorkerSet")["spec"]["leaderWorkerTemplate"]
    return [
        ("router", deployment["spec"]["template"]["spec"]),
        ("leader", lws["leaderTemplate"]["spec"]),
        ("worker", lws["workerTemplate"]["spec"]),
    ]


@pytest.mark.parametrize("name, pod", pod_specs(), ids=lambda v: v if isinstance(v, str) else "")
def test_every_container_runs_unprivileged(name, pod):
    """Non-root (the images' uid 10001), no capabilities, no privilege escalation, a read-only
    root filesystem with the written paths on volumes; the router also has resource limits."""
    for container in pod["containers"]:
        ctx = {**pod.get("securityContext", {}), **container.get("securityContext", {})}
        assert ctx.get("runAsNonRoot") is True and ctx.get("runAsUser") == 10001, (name, ctx)
        assert ctx.get("allowPrivilegeEscalation") is False, name
        assert ctx.get("capabilities", {}).get("drop") == ["ALL"], name
        assert not ctx.get("capabilities", {}).get("add"), name
        assert ctx.get("readOnlyRootFilesystem") is True, name
        assert ctx.get("seccompProfile", {}).get("type") == "RuntimeDefault", name
        mounts = {m["mountPath"] for m in container.get("volumeMounts", [])}
        assert "/tmp" in mounts, name
        if name == "router":
            limits = container["resources"]["limits"]
            assert limits.get("cpu") and limits.get("memory"), limits
        else:  # what SGLang writes, each on a volume of its own
            assert {"/cache/jit", "/cache/huggingface", "/cache/home", "/run/glmserve"} <= mounts


def test_every_pod_is_fenced_in_both_directions():
    """Every pod of ours is selected by a NetworkPolicy with Ingress and Egress, and the only
    egress without a pod selector is the router's to the Kubernetes API ports."""
    policies = [d for _, d in documents() if d["kind"] == "NetworkPolicy"]
    for label in ("glmserve-worker", "glmserve-router"):
        (policy,) = [
            p
            for p in policies
            if p["spec"]["podSelector"]["matchLabels"]["app.kubernetes.io/name"] == label
        ]
        assert set(policy["spec"]["policyTypes"]) == {"Ingress", "Egress"}, label
        for rule in policy["spec"]["egress"]:
            if "to" not in rule:
                assert label == "glmserve-router", rule
                assert {p["port"] for p in rule["ports"]} == {443, 6443}, rule
