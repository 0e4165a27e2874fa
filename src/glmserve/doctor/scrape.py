"""Prometheus scrapes where the services listen.

Prometheus cannot read .env, so compose.yaml hands it each address from the same settings the
services use (SGLANG_PORT, EXPORTER_LISTEN, PROMETHEUS_LISTEN), as `SCRAPE_<NAME>` variables
of the prometheus service that its entrypoint writes into file_sd files
(/etc/prometheus-targets/<NAME>.json) before Prometheus starts. This check holds the two ends
together: each scrape job of the config Prometheus is given reads either such a file, whose
address must be the service's, or a static target, which must be the service's address too (a
hand-edited prometheus.yml with a fixed port is how a moved port goes unscraped).
"""

from __future__ import annotations

from collections.abc import Mapping
from pathlib import Path, PurePosixPath
from typing import Any

from glmserve.doctor import compose

TARGETS_DIR = PurePosixPath("/etc/prometheus-targets")
SCRAPE_PREFIX = "SCRAPE_"


def _flag(argv: list[Any], name: str) -> str | None:
    for arg in argv:
        key, sep, value = str(arg).partition("=")
        if sep and key == name:
            return value
    return None


def listen_addresses(
    svcs: Mapping[str, dict[str, Any]], values: Mapping[str, str]
) -> dict[str, str]:
    """Scrape job -> the address its service listens on, as compose builds it from `values`."""
    out: dict[str, str] = {}
    sglang_env = compose.interpolate(svcs.get("sglang", {}).get("environment") or {}, values)
    if sglang_env.get("GLMSERVE_PORT"):
        out["sglang"] = f"127.0.0.1:{sglang_env['GLMSERVE_PORT']}"
    for job, service in (("glmserve-exporter", "exporter"), ("prometheus", "prometheus")):
        argv = compose.interpolate(svcs.get(service, {}).get("command") or [], values)
        address = _flag(argv, "--web.listen-address")
        if address:
            out[job] = address
    return out


def _mounted_config(prometheus: Mapping[str, Any], project: Path) -> Path | None:
    """The host file behind --config.file, through the service's bind mounts."""
    config = _flag(list(prometheus.get("command") or []), "--config.file")
    if config is None:
        return None
    for volume in prometheus.get("volumes") or []:
        source, target = _bind(volume)
        if source is None or target is None:
            continue
        inside = PurePosixPath(config)
        if inside.is_relative_to(target):
            host = Path(source)
            host = host if host.is_absolute() else project / host
            return host / inside.relative_to(target)
    return None


def _bind(volume: Any) -> tuple[str | None, PurePosixPath | None]:
    if isinstance(volume, dict):
        return volume.get("source"), PurePosixPath(volume["target"]) if volume.get(
            "target"
        ) else None
    parts = str(volume).split(":")
    if len(parts) >= 2 and (parts[0].startswith((".", "/"))):
        return parts[0], PurePosixPath(parts[1])
    return None, None


def scrape_problems(
    svcs: Mapping[str, dict[str, Any]], values: Mapping[str, str], project: Path
) -> list[str]:
    """One line per scrape job whose target is not where its service listens."""
    import yaml

    if "prometheus" not in svcs:
        return []
    prometheus = compose.interpolate(svcs["prometheus"], values)
    path = _mounted_config(prometheus, project)
    if path is None or not path.is_file():
        return []
    try:
        config = yaml.safe_load(path.read_text(encoding="utf-8")) or {}
    except (OSError, yaml.YAMLError) as exc:
        return [f"prometheus: cannot read {path}: {exc}"]
    expected = listen_addresses(svcs, values)
    written = {
        str(TARGETS_DIR / f"{name[len(SCRAPE_PREFIX) :]}.json"): str(address)
        for name, address in (prometheus.get("environment") or {}).items()
        if name.startswith(SCRAPE_PREFIX)
    }
    problems = []
    for job in config.get("scrape_configs") or []:
        name = job.get("job_name")
        if name not in expected:
            continue
        for target, origin in _targets(job, written):
            if target != expected[name]:
                problems.append(
                    f"prometheus: job {name} scrapes {target} ({origin}) but the service "
                    f"listens on {expected[name]}; its metrics would be missing"
                )
    return problems


def _targets(job: Mapping[str, Any], written: Mapping[str, str]) -> list[tuple[str, str]]:
    """(target, where it comes from) for each target of a scrape job."""
    out = []
    for static in job.get("static_configs") or []:
        out += [(str(t), "a fixed target in prometheus.yml") for t in static.get("targets") or []]
    for sd in job.get("file_sd_configs") or []:
        for file in sd.get("files") or []:
            if file in written:
                out.append((written[file], f"{file}, from compose.yaml's prometheus environment"))
    return out
