"""A fleet, from the FLEET_* / ROUTER_* variables of .env: which workers, where, and how to watch.

One source for three outputs (glmserve.fleet.render): the compose services, the router's
worker list, and the Prometheus targets, so the router, the dashboards and the stack can never
disagree about who the workers are.

    FLEET_LOCAL_REPLICAS=0,1,2,3;4,5,6,7     GPU ids per local replica, ';' between replicas
    FLEET_REMOTE_WORKERS=http://10.0.0.5:30000|10.0.0.5:9464,http://10.0.0.6:30000
                                             workers elsewhere, each optionally with the address
                                             of its own exporter after '|'
"""

from __future__ import annotations

import json
from collections.abc import Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from glmserve.fleet.router import FleetError, RouterConfig, check_worker_url

DEFAULT_WORKER_BASE_PORT = 30001
DEFAULT_EXPORTER_BASE_PORT = 9465


@dataclass(frozen=True)
class Worker:
    """One worker as the router, Prometheus and compose see it."""

    name: str  # compose service / replica name, e.g. "replica-0" or "remote-1"
    url: str  # what the router is given, and the `worker` label everywhere
    exporter: str | None  # host:port of its exporter; None = run one here (remote only)
    local: bool = False  # a replica this compose project starts
    gpus: tuple[int, ...] = ()  # local GPU replicas only (emulated replicas have none)
    port: int | None = None  # local replicas only

    @property
    def address(self) -> str:
        """host:port Prometheus scrapes for the worker's own /metrics."""
        return self.url.split("://", 1)[1]


@dataclass(frozen=True)
class FleetSpec:
    workers: tuple[Worker, ...]
    router: RouterConfig
    profile: str | None = None  # launch profile of the local replicas
    emulated: bool = False  # local replicas are emulators (no GPU; CI and demos)
    extras: dict[str, str] = field(default_factory=dict)

    @property
    def worker_urls(self) -> list[str]:
        return [w.url for w in self.workers]


def _int(env: Mapping[str, str], key: str, default: int) -> int:
    raw = env.get(key, "").strip()
    if not raw:
        return default
    try:
        return int(raw)
    except ValueError:
        raise FleetError(f"{key} must be an integer, not {raw!r}") from None


def _port(env: Mapping[str, str], key: str, default: int, count: int = 1) -> int:
    """A port variable; with `count`, the first of `count` consecutive ports, all of them valid."""
    value = _int(env, key, default)
    last = value + count - 1
    if not 1 <= value <= 65535 or last > 65535:
        span = f"{value}" if count == 1 else f"{value}-{last} ({count} ports)"
        raise FleetError(f"{key}={value}: ports {span} must lie within 1-65535")
    return value


def parse_gpu_sets(raw: str) -> list[tuple[int, ...]]:
    """'0,1,2,3;4,5,6,7' -> [(0,1,2,3), (4,5,6,7)]; refuses overlaps and non-integers."""
    sets: list[tuple[int, ...]] = []
    seen: dict[int, int] = {}
    for n, chunk in enumerate(c for c in raw.split(";") if c.strip()):
        try:
            gpus = tuple(int(g) for g in chunk.split(",") if g.strip())
        except ValueError:
            raise FleetError(
                f"FLEET_LOCAL_REPLICAS replica {n}: {chunk!r} is not GPU ids"
            ) from None
        if not gpus or any(g < 0 for g in gpus):
            raise FleetError(f"FLEET_LOCAL_REPLICAS replica {n}: {chunk!r} is not GPU ids")
        if len(set(gpus)) != len(gpus):
            raise FleetError(
                f"FLEET_LOCAL_REPLICAS replica {n}: a GPU is listed twice in {chunk!r}"
            )
        for g in gpus:
            if g in seen:
                raise FleetError(f"FLEET_LOCAL_REPLICAS: GPU {g} is in replica {seen[g]} and {n}")
            seen[g] = n
        sets.append(gpus)
    return sets


def _is_host_port(value: str) -> bool:
    host, _, port = value.rpartition(":")
    return bool(host) and port.isdigit() and 1 <= int(port) <= 65535


def from_env(env: Mapping[str, str]) -> FleetSpec:
    """The fleet described by .env-style variables; one clear FleetError for bad input."""
    emulated = env.get("FLEET_EMULATED", "").strip().lower() in ("1", "true", "yes", "on")
    raw_local = env.get("FLEET_LOCAL_REPLICAS", "").strip()
    if emulated:
        # No GPUs: FLEET_EMULATED_REPLICAS emulators stand in for local replicas.
        count = _int(env, "FLEET_EMULATED_REPLICAS", 3)
        if count < 1:
            raise FleetError("FLEET_EMULATED_REPLICAS must be >= 1")
        gpu_sets: list[tuple[int, ...]] = [()] * count
    else:
        gpu_sets = parse_gpu_sets(raw_local)
    base = _port(env, "FLEET_WORKER_BASE_PORT", DEFAULT_WORKER_BASE_PORT, len(gpu_sets))
    exporter_base = _port(
        env, "FLEET_EXPORTER_BASE_PORT", DEFAULT_EXPORTER_BASE_PORT, len(gpu_sets)
    )
    host = env.get("SGLANG_HOST", "").strip() or "127.0.0.1"
    workers = [
        Worker(
            name=f"replica-{i}",
            url=f"http://{host}:{base + i}",
            exporter=f"127.0.0.1:{exporter_base + i}",
            local=True,
            gpus=gpus,
            port=base + i,
        )
        for i, gpus in enumerate(gpu_sets)
    ]
    remote = [r.strip() for r in env.get("FLEET_REMOTE_WORKERS", "").split(",") if r.strip()]
    for i, entry in enumerate(remote):
        url, _, exporter = entry.partition("|")
        exporter = exporter.strip()
        if exporter and not _is_host_port(exporter):
            raise FleetError(f"FLEET_REMOTE_WORKERS: exporter {exporter!r} must be HOST:PORT")
        workers.append(Worker(f"remote-{i}", check_worker_url(url.strip()), exporter or None))
    if not workers:
        raise FleetError(
            "the fleet has no workers: set FLEET_LOCAL_REPLICAS (GPU ids per replica, e.g. "
            "0,1,2,3;4,5,6,7) and/or FLEET_REMOTE_WORKERS (http://HOST:PORT,...)"
        )
    urls = [w.url for w in workers]
    dup = sorted({u for u in urls if urls.count(u) > 1})
    if dup:
        raise FleetError(f"worker {dup[0]} is listed twice")
    router = RouterConfig(
        host=env.get("ROUTER_HOST", "").strip() or "127.0.0.1",
        port=_port(env, "SGLANG_PORT", 30000),
        metrics_host="127.0.0.1",
        metrics_port=_port(env, "ROUTER_METRICS_PORT", 29000),
        policy=env.get("ROUTER_POLICY", "").strip() or "cache_aware",
    )
    profile = env.get("FLEET_PROFILE", "").strip() or env.get("GLMSERVE_PROFILE", "").strip()
    spec = FleetSpec(tuple(workers), router, profile or None, emulated)
    # Everything that listens on this host: the router, its metrics, the replicas, and the
    # exporters run here (exporter_addresses refuses ports past 65535).
    here = [_host_port(a) for a in exporter_addresses(spec).values() if a.startswith("127.0.0.1:")]
    ports = [w.port for w in workers if w.port] + [router.port, router.metrics_port] + here
    clash = sorted({p for p in ports if ports.count(p) > 1})
    if clash:
        raise FleetError(
            f"port {clash[0]} is used twice (router, metrics, replica and exporter ports)"
        )
    return spec


def _host_port(address: str) -> int:
    return int(address.rpartition(":")[2])


def exporter_addresses(spec: FleetSpec) -> dict[str, str]:
    """worker URL -> the exporter address Prometheus scrapes for it. Workers without an
    exporter of their own get one here, on the next free exporter port."""
    out: dict[str, str] = {}
    taken = {w.exporter for w in spec.workers if w.exporter}
    next_port = DEFAULT_EXPORTER_BASE_PORT
    for w in spec.workers:
        if w.exporter:
            out[w.url] = w.exporter
            continue
        while f"127.0.0.1:{next_port}" in taken:
            next_port += 1
        if next_port > 65535:
            raise FleetError(f"no exporter port left for {w.url} (past 65535)")
        out[w.url] = f"127.0.0.1:{next_port}"
        taken.add(out[w.url])
    return out


def targets(spec: FleetSpec) -> dict[str, list[dict[str, Any]]]:
    """Prometheus file_sd contents, by file name (monitoring/prometheus/prometheus-fleet.yml)."""
    exporters = exporter_addresses(spec)
    # The router's series are about workers already (worker="<URL>"): no target label, so
    # Prometheus keeps the router's own `worker` label instead of renaming it.
    return {
        "router.json": [{"targets": [f"127.0.0.1:{spec.router.metrics_port}"], "labels": {}}],
        "workers.json": [
            {"targets": [w.address], "labels": {"worker": w.url}} for w in spec.workers
        ],
        "exporters.json": [
            {"targets": [exporters[w.url]], "labels": {"worker": w.url}} for w in spec.workers
        ],
    }


def target_files(spec: FleetSpec) -> dict[str, str]:
    """file name -> text of each Prometheus file_sd file."""
    return {name: json.dumps(content, indent=2) + "\n" for name, content in targets(spec).items()}


def write_atomically(files: Mapping[Path, str]) -> None:
    """Write every file or, on an error before the first swap, none: each content goes to a
    temp file beside its target first, then each is renamed over its target (Prometheus re-reads
    file_sd files on change: never a half-written one). Renaming files, not swapping the
    directory, keeps a running Prometheus's bind mount of it live."""
    staged: list[tuple[Path, Path]] = []
    try:
        for path, text in files.items():
            path.parent.mkdir(parents=True, exist_ok=True)
            tmp = path.with_name(f".{path.name}.tmp")
            tmp.write_text(text)
            staged.append((tmp, path))
    except OSError as exc:
        for tmp, _ in staged:
            tmp.unlink(missing_ok=True)
        raise FleetError(f"cannot write {path}: {exc.strerror or exc}") from None
    for tmp, path in staged:
        tmp.replace(path)
