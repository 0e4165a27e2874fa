"""A FleetSpec -> a compose override (the `fleet` profile) and the Prometheus targets.

Compose has no loops, so N replicas with their own GPU subsets cannot be written once in
compose.yaml; this writes them, reusing compose.yaml's own service definitions through
`extends` (the server's volumes, ulimits, IPC and healthcheck stay defined in one place).
The output is JSON-style YAML behind one comment line naming its source; values that must
replace, not merge with, the extended service's (the GPU reservation, the profiles) carry
compose's `!override` tag (Compose >= 2.24).
"""

from __future__ import annotations

import json
import os
from pathlib import Path
from typing import Any

from glmserve import buildinfo
from glmserve.fleet.router import ROUTER_VERSION, router_argv
from glmserve.fleet.spec import FleetSpec, exporter_addresses, target_files, write_atomically
from glmserve.launch.cli import ENV_INPUTS

PROFILE = ENV_INPUTS["profile"]

ROUTER_IMAGE = f"glmserve/router:0.1.0-smg{ROUTER_VERSION}"
# Where the generated Prometheus targets are mounted (monitoring/prometheus/prometheus-fleet.yml).
TARGETS_MOUNT = "/etc/prometheus-fleet"
TINY_MODEL = "./deploy/models/tiny-mla"


class Override:
    """A value compose must take as is instead of merging it into the extended service's."""

    def __init__(self, value: Any) -> None:
        self.value = value


def dump(obj: Any, indent: int = 0) -> str:
    """JSON layout (every JSON document is YAML) plus compose's !override tag."""
    pad, inner = "  " * indent, "  " * (indent + 1)
    if isinstance(obj, Override):
        return "!override " + dump(obj.value, indent)
    if isinstance(obj, dict) and obj:
        items = [f"{inner}{json.dumps(str(k))}: {dump(v, indent + 1)}" for k, v in obj.items()]
        return "{\n" + ",\n".join(items) + "\n" + pad + "}"
    if isinstance(obj, list) and obj:
        items = [f"{inner}{dump(v, indent + 1)}" for v in obj]
        return "[\n" + ",\n".join(items) + "\n" + pad + "]"
    return json.dumps(obj)


def _py_health(url: str) -> list[str]:
    code = (
        "import sys, urllib.request; "
        f"sys.exit(0 if urllib.request.urlopen('{url}', timeout=10).status == 200 else 1)"
    )
    return ["CMD", "python3", "-c", code]


def _replica(spec: FleetSpec, index: int) -> dict[str, Any]:
    w = spec.workers[index]
    build_info = f"/run/glmserve/{w.name}.json"
    if spec.emulated:
        return {
            "extends": {"file": "compose.yaml", "service": "emulator"},
            "profiles": Override(["fleet"]),
            "command": [
                "python",
                "-m",
                "glmserve.emulator",
                f"--host={w.url.split('://')[1].rsplit(':', 1)[0]}",
                f"--port={w.port}",
                "--tpot-ms=${EMULATOR_TPOT_MS:-20}",
                "--ttft-ms=${EMULATOR_TTFT_MS:-250}",
                "--max-concurrency=${EMULATOR_MAX_CONCURRENCY:-256}",
                "--cost-model=${EMULATOR_COST_MODEL:-patched}",
                # A path that exists in the router too: it loads the tokenizer from it.
                "--model-path=/model",
                f"--build-info-file={build_info}",
            ],
            "volumes": [
                {"type": "bind", "source": TINY_MODEL, "target": "/model", "read_only": True}
            ],
            "healthcheck": {"test": _py_health(f"http://127.0.0.1:{w.port}/health")},
        }
    return {
        "extends": {"file": "compose.yaml", "service": "sglang"},
        "profiles": Override(["fleet"]),
        "environment": {
            PROFILE: spec.profile or f"${{{PROFILE}:-glm5-nvfp4-b200-tp4}}",
            ENV_INPUTS["tp"]: str(len(w.gpus)),
            ENV_INPUTS["port"]: str(w.port),
            ENV_INPUTS["build_info"]: build_info,
        },
        "deploy": Override(
            {
                "resources": {
                    "reservations": {
                        "devices": [
                            {
                                "driver": "nvidia",
                                "device_ids": [str(g) for g in w.gpus],
                                "capabilities": ["gpu"],
                            }
                        ]
                    }
                }
            }
        ),
        "healthcheck": {"test": _py_health(f"http://127.0.0.1:{w.port}/health")},
    }


def compose_override(spec: FleetSpec, targets_dir: str) -> dict[str, Any]:
    exporters = exporter_addresses(spec)
    services: dict[str, Any] = {}
    local = [i for i, w in enumerate(spec.workers) if w.local]
    for i in local:
        services[spec.workers[i].name] = _replica(spec, i)
    for w in spec.workers:
        if not w.local and w.exporter:
            continue  # it has its own exporter, next to it; Prometheus scrapes that one
        service: dict[str, Any] = {
            "extends": {"file": "compose.yaml", "service": "exporter"},
            "profiles": Override(["fleet"]),
            "command": [
                "python",
                "-m",
                "glmserve.exporter",
                f"--target={w.url}",
                f"--web.listen-address={exporters[w.url]}",
                "--canary.interval=${EXPORTER_CANARY_INTERVAL:-15s}",
                "--canary.max-tokens=${EXPORTER_CANARY_MAX_TOKENS:-64}",
            ],
            "healthcheck": {"test": _py_health(f"http://{exporters[w.url]}/metrics")},
        }
        if w.local:
            service["environment"] = {buildinfo.ENV_VAR: f"/run/glmserve/{w.name}.json"}
            service["depends_on"] = {w.name: {"condition": "service_started"}}
        services[f"exporter-{w.name}"] = service
    model = TINY_MODEL if spec.emulated else "${MODEL_DIR:-./models/GLM-5-NVFP4}"
    services["router"] = {
        "image": "${GLMSERVE_ROUTER_IMAGE:-" + ROUTER_IMAGE + "}",
        "build": {
            "context": ".",
            "target": "router",
            "network": "host",
            "args": ["TOOLS_BASE_IMAGE"],
        },
        "pull_policy": "build",
        "profiles": ["fleet"],
        "network_mode": "host",
        "init": True,
        "restart": "unless-stopped",
        "command": router_argv(spec.router, spec.worker_urls, "python"),
        # smg routes HTTP workers by text and loads no tokenizer; a mode that needs one (gRPC
        # workers) finds it at the path the workers report (/model), never on the Hugging Face Hub.
        "volumes": [
            {
                "type": "bind",
                "source": model,
                "target": "/model",
                "read_only": True,
                "bind": {"create_host_path": False},
            }
        ],
        "environment": {"HF_HUB_OFFLINE": "1"},
        "depends_on": {spec.workers[i].name: {"condition": "service_healthy"} for i in local},
        # /readiness answers 200 once at least one worker is healthy.
        "healthcheck": {
            "test": _py_health(f"http://127.0.0.1:{spec.router.port}/readiness"),
            "interval": "10s",
            "timeout": "5s",
            "retries": 3,
            "start_period": "60s",
        },
        "stop_grace_period": f"{spec.router.shutdown_grace_period_s + 5}s",
    }
    services["prometheus"] = {
        "command": [
            "--config.file=/etc/prometheus/prometheus-fleet.yml",
            "--storage.tsdb.path=/prometheus",
            "--storage.tsdb.retention.time=${PROMETHEUS_RETENTION:-15d}",
            "--web.listen-address=${PROMETHEUS_LISTEN:-127.0.0.1:9090}",
            # As compose.yaml's: no --web.enable-lifecycle (/-/quit for any local process).
        ],
        "volumes": [
            {"type": "bind", "source": targets_dir, "target": TARGETS_MOUNT, "read_only": True}
        ],
    }
    # The single-server exporter would canary the router on :30000; the fleet has one per worker.
    services["exporter"] = {"profiles": Override(["single-server"])}
    return {"services": services}


def targets_source(out_dir: Path) -> str:
    """The targets folder as the override names it. Compose resolves a relative bind source
    against the project directory, the folder of the first -f file: compose.yaml in the
    checkout, where this command runs. So a relative out-dir stays relative to it, spelled as
    compose wants ("./.fleet/targets"; a bare ".fleet/targets" would be a named volume)."""
    path = out_dir / "targets"
    if path.is_absolute():
        return str(path)
    return "./" + os.path.normpath(path.as_posix())


def render(spec: FleetSpec, out_dir: Path, source: str) -> dict[Path, str]:
    """Every file the fleet needs, path -> text; nothing is written."""
    header = (
        f"# Generated by `python -m glmserve.fleet compose` from {source}; do not edit. Re-run it "
        "after changing FLEET_* or ROUTER_* (docs/fleet.md).\n"
    )
    doc = compose_override(spec, targets_source(out_dir))
    files = {out_dir / "targets" / name: text for name, text in target_files(spec).items()}
    files[out_dir / "compose.yaml"] = header + dump(doc) + "\n"
    return files


def write(spec: FleetSpec, out_dir: Path, source: str) -> tuple[Path, list[Path]]:
    """Write <out_dir>/compose.yaml and <out_dir>/targets/*.json (all rendered, and so all
    validated, before the first is written); return their paths."""
    files = render(spec, out_dir, source)
    write_atomically(files)
    compose = out_dir / "compose.yaml"
    return compose, [p for p in files if p != compose]


def main_compose(env: dict[str, str], out_dir: Path, source: str) -> int:
    from glmserve.fleet.spec import from_env

    spec = from_env(env)
    compose, _ = write(spec, out_dir, source)
    print(f"wrote {compose} and {out_dir / 'targets'}/ for {len(spec.workers)} workers:")
    for w in spec.workers:
        where = (
            f"GPUs {','.join(map(str, w.gpus))}"
            if w.gpus
            else ("emulated" if w.local else "remote")
        )
        print(f"  {w.name}: {w.url} ({where})")
    print(f"start: docker compose -f compose.yaml -f {compose} --profile fleet up")
    return 0
