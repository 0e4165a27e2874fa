"""Target health and the build/info metric, probed at scrape time.

SGLang's /metrics says how fast the server is, not *what* it is: which KV dtype, backend and
pool size, and whether our patch series is in. The info metric joins GET /server_info with the
build-info file the launcher writes, so a dashboard can show "FP8 KV, patched, pool 495k" and an
alert can catch an FP8 pool running the upstream full-pool cast.
"""

from __future__ import annotations

import logging
import threading
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import httpx
from prometheus_client import CollectorRegistry
from prometheus_client.core import (
    CounterMetricFamily,
    GaugeMetricFamily,
    InfoMetricFamily,
    Metric,
)
from prometheus_client.registry import Collector

from glmserve import buildinfo, sglang_api

log = logging.getLogger(__name__)

PROBE_FAILURE_REASONS = ("connect", "timeout", "http_status", "malformed")

INFO_LABELS = (
    "summary",
    "sglang_version",
    "model",
    "kv_cache_dtype",
    "attention_backend",
    "tp_size",
    "max_total_num_tokens",
    "patch_series",
    "patch_lock_sha256",
    "fp8_gather",
    "fp8_attention",
    "fp8_attention_requested",
    "build_source",
)


def _text(value: Any) -> str:
    return "" if value is None else str(value)


def server_fields(info: dict[str, Any]) -> dict[str, str]:
    """The labels we take from /server_info, read as glmserve.sglang_api defines its fields."""
    return {
        "sglang_version": _text(sglang_api.info_version(info)),
        "model": _text(sglang_api.info_model(info)),
        "kv_cache_dtype": _text(info.get("kv_cache_dtype")),
        "attention_backend": _text(sglang_api.info_attention_backend(info)),
        "tp_size": _text(info.get("tp_size")),
        "max_total_num_tokens": _text(sglang_api.info_kv_pool_tokens(info)),
    }


# Batch limits from /server_info, as gauges: decode above cuda_graph_max_bs runs without CUDA
# graphs (several times slower), and max_running_requests says whether the batch can get there.
LIMITS = {
    "cuda_graph_max_bs": "Largest decode batch SGLang captured a CUDA graph for; bigger batches "
    "decode eagerly (server arg cuda_graph_max_bs).",
    "max_running_requests": "Largest running batch the scheduler admits (server arg "
    "max_running_requests); above cuda_graph_max_bs it allows eager decode.",
}


def server_limits(info: dict[str, Any]) -> dict[str, float]:
    out = {}
    for key in LIMITS:
        value = info.get(key)
        if isinstance(value, (int, float)) and not isinstance(value, bool):
            out[key] = float(value)
    return out


def summarize(labels: dict[str, str], build_present: bool) -> str:
    """One human line, e.g. "FP8 KV, patched, pool 495k" or "FP8 KV, nsa attention, patch not in
    use, pool 96k"."""
    dtype = labels.get("kv_cache_dtype", "")
    if dtype.startswith("fp8"):
        kv = "FP8 KV"
    elif dtype in ("bfloat16", "bf16"):
        kv = "BF16 KV"
    else:
        kv = f"KV {dtype or 'unknown'}"
    backend = labels.get("attention_backend", "")
    if backend and backend != "flashinfer":
        # DSA (nsa) and the other backends read the pool through code the series never touches:
        # an installed series must not read as "patched" there.
        patch = f"{backend} attention, patch not in use"
    elif not build_present:
        patch = "patch unknown"
    elif not labels.get("patch_series"):
        patch = "unpatched"
    elif labels.get("fp8_gather") == "on":
        path = labels.get("fp8_attention", "")
        patch = f"patched, {path} decode" if path else "patched"
    else:
        patch = "patched, gather off"
    parts = [kv, patch]
    pool = labels.get("max_total_num_tokens", "")
    if pool.isdigit():
        n = int(pool)
        parts.append(f"pool {n // 1000}k" if n >= 10_000 else f"pool {n}")
    return ", ".join(parts)


class TargetInfoCollector(Collector):
    """`glmserve_target_up` and `glmserve_server_info`, fetched on each scrape.

    The last good server info is kept while the target is down, so the build panel still says
    what was running; `glmserve_target_up` says whether it is running now.
    """

    def __init__(
        self,
        target: str,
        client: httpx.Client,
        registry: CollectorRegistry,
        build_info_file: str | Path | None,
    ) -> None:
        self.target = target.rstrip("/")
        self.client = client
        self.build_info_file = build_info_file
        self._lock = threading.Lock()
        self._last_server: dict[str, str] | None = None
        self._last_limits: dict[str, float] = {}
        # Counted here rather than in a registered Counter so that the scrape which sees the
        # target fail also shows that failure (a Counter would be collected before the probe).
        self.failures = dict.fromkeys(PROBE_FAILURE_REASONS, 0)
        registry.register(self)

    def describe(self) -> list[Metric]:
        # Registering must not probe the target, so the names are not declared up front.
        return []

    def probe(self) -> dict[str, Any] | None:
        """GET the server info; None (and a counted reason) when the target is not healthy."""
        reason, detail = "", ""
        # The deprecated alias only when the current path is missing (404).
        for path in sglang_api.SERVER_INFO_PATHS:
            try:
                resp = self.client.get(self.target + path)
            except httpx.TimeoutException as exc:
                reason, detail = "timeout", repr(exc)
                break
            except httpx.TransportError as exc:
                reason, detail = "connect", repr(exc)
                break
            if resp.status_code == 404 and path != sglang_api.SERVER_INFO_PATHS[-1]:
                continue
            if resp.status_code >= 300:
                reason, detail = "http_status", f"HTTP {resp.status_code} on {path}"
                break
            try:
                body = resp.json()
            except ValueError:
                body = None
            if not isinstance(body, dict):
                reason, detail = "malformed", f"{path} did not return a JSON object"
                break
            return body
        with self._lock:
            self.failures[reason] += 1
        log.debug("target probe failed (%s): %s", reason, detail)
        return None

    def read_build(self) -> dict[str, str] | None:
        if not self.build_info_file:
            return None
        try:
            return buildinfo.read_build_info(self.build_info_file)
        except (OSError, ValueError) as exc:
            log.warning("build info %s unreadable: %s", self.build_info_file, exc)
            return None

    def read_launch_error(self) -> dict[str, str] | None:
        if not self.build_info_file:
            return None
        return buildinfo.read_launch_error(self.build_info_file)

    def collect(self) -> Iterator[Metric]:
        body = self.probe()
        with self._lock:
            if body is not None:
                self._last_server = server_fields(body)
                self._last_limits = server_limits(body)
            server = self._last_server
            limits = dict(self._last_limits)
            failures = dict(self.failures)
        up = GaugeMetricFamily(
            "glmserve_target_up",
            "1 if the target answered GET /server_info with a JSON object on this scrape.",
            value=1.0 if body is not None else 0.0,
        )
        yield up
        counter = CounterMetricFamily(
            "glmserve_target_probe_failures",
            "Failed GET /server_info probes of the target, by reason.",
            labels=["reason"],
        )
        for reason, count in failures.items():
            counter.add_metric([reason], count)
        yield counter
        for key, value in limits.items():  # kept while the target is down, like the info
            yield GaugeMetricFamily(f"glmserve_server_{key}", LIMITS[key], value=value)
        refused = self.read_launch_error()
        if refused is not None:
            # The launcher refused to start and waits (GLMSERVE_HOLD_ON_ERROR): its one line,
            # where the operator looks, instead of a container that only says "restarting".
            gauge = GaugeMetricFamily(
                "glmserve_launch_refused",
                "1 while the launcher refuses to start the server; the error label is its "
                "one-line reason (docker compose logs sglang has the same line).",
                labels=["error"],
            )
            gauge.add_metric([refused["error"][:500]], 1.0)
            yield gauge
        build = self.read_build()
        if server is None and build is None and refused is None:
            return  # nothing known yet: no info series rather than a row of empty labels
        labels = dict.fromkeys(INFO_LABELS, "")
        if server:
            labels.update(server)
        if build:
            labels["patch_series"] = build.get("patch_series", "")
            labels["patch_lock_sha256"] = build.get("patch_lock_sha256", "")
            labels["fp8_gather"] = build.get("fp8_gather", "")
            # Which FP8 decode path serves (native or gather) and what was asked (auto = the
            # faster on this GPU): a fallback from native shows on the dashboard and alerts.
            labels["fp8_attention"] = build.get("fp8_attention", "")
            labels["fp8_attention_requested"] = build.get("fp8_attention_requested", "")
            labels["build_source"] = build.get("source", "")
            for key in ("sglang_version", "attention_backend"):  # the server's answer wins
                if not labels[key]:
                    labels[key] = build.get(key, "")
        labels["summary"] = summarize(labels, build is not None)
        if refused is not None:
            labels["summary"] = f"LAUNCH REFUSED: {refused['error'][:200]}"
        info = InfoMetricFamily(
            "glmserve_server",
            "What the target is: SGLang version, KV dtype, backend, TP, pool size, patch series.",
        )
        info.add_metric([], labels)
        yield info
