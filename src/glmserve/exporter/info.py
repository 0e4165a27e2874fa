"""Target health and the build/info metric, probed in the background.

SGLang's /metrics says how fast the server is, not *what* it is: which KV dtype, backend and
pool size, and whether our patch series is in. The info metric joins GET /server_info with the
build-info file the launcher writes, so a dashboard can show "FP8 KV, patched, pool 495k" and an
alert can catch an FP8 pool running the upstream full-pool cast.

Under speculative decoding (MTP) the info says what was asked (speculative_algorithm and the
tokens one verify pass scores), and the probe re-exports SGLang's acceptance gauges
(sglang:spec_accept_length / sglang:spec_accept_rate, read from the target's /metrics) as
glmserve_server_spec_accept_length / _rate: beside what the profile asked for, so a collapse of
acceptance can be told from a server that never ran MTP (whose gauges read 0).
"""

from __future__ import annotations

import json
import logging
import threading
import time
from collections.abc import Callable, Iterator
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
from glmserve.sglang_api import spec_gauges

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
    "patch_in_use",
    "speculative_algorithm",
    "speculative_num_draft_tokens",
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
        "speculative_algorithm": _text(sglang_api.info_speculative_algorithm(info)),
        "speculative_num_draft_tokens": _text(info.get("speculative_num_draft_tokens")),
    }


# Batch limits from /server_info, as gauges: decode above cuda_graph_max_bs runs without CUDA
# graphs (several times slower), and max_running_requests says whether the batch can get there.
LIMITS = {
    "cuda_graph_max_bs": "Largest decode batch SGLang captured a CUDA graph for; bigger batches "
    "decode eagerly (server arg cuda_graph_max_bs).",
    "max_running_requests": "Largest running batch the scheduler admits (server arg "
    "max_running_requests); above cuda_graph_max_bs it allows eager decode.",
    "speculative_num_draft_tokens": "Tokens one speculative verify pass scores per request (server "
    "arg speculative_num_draft_tokens, 1 + the drafts): the ceiling of the acceptance length. "
    "Only under speculative decoding.",
}
# Below this acceptance length (tokens per verify pass) MTP has collapsed: a verify pass plus
# the draft passes cost about 1.3 plain decode steps on GLM-5 at small batch, so under ~1.3 MTP
# is slower than no MTP at all; healthy GLM-5 MTP runs at 2.2-3.4 with 3 drafts (public figures
# in docs/deploy.md). Alert GlmserveMTPAcceptanceCollapsed and the dashboard's line use it.
SPEC_ACCEPT_LENGTH_FLOOR = 1.5


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
    in_use = labels.get("patch_in_use", "")
    if in_use == "no" or (not in_use and backend and backend != "flashinfer"):
        # DSA (nsa/dsa) and the other backends read the pool through code the series never
        # touches: an installed series must not read as "patched" there. Where the build says
        # nothing (an emulator, an older file), flashinfer is the one patched backend.
        patch = f"{backend or 'default'} attention, patch not in use"
    elif not build_present:
        patch = "patch unknown"
    elif not labels.get("patch_series"):
        patch = "unpatched"
    elif labels.get("fp8_gather") == "on":
        path = labels.get("fp8_attention", "")
        patch = f"patched, {path} decode" if path else "patched"
        if backend not in ("", "flashinfer"):  # fa3, patched from SGLang 0.5.17 on
            patch = f"{backend} attention, {patch}"
    else:
        patch = "patched, gather off"
    parts = [kv, patch]
    if labels.get("speculative_algorithm"):
        tokens = labels.get("speculative_num_draft_tokens", "")
        parts.append(f"MTP {tokens}-token verify" if tokens else "MTP")
    pool = labels.get("max_total_num_tokens", "")
    if pool.isdigit():
        n = int(pool)
        parts.append(f"pool {n // 1000}k" if n >= 10_000 else f"pool {n}")
    return ", ".join(parts)


# A real /server_info is tens of kilobytes; anything past this cap is not one, and reading it
# whole would let a broken target grow the exporter's memory without bound.
MAX_INFO_BYTES = 1 << 20
# SGLang's /metrics (read only under speculative decoding) is hundreds of kilobytes at most.
MAX_METRICS_BYTES = 16 << 20

# The acceptance gauges re-exported from SGLang's /metrics under speculative decoding.
SPEC_GAUGES = {
    sglang_api.SPEC_ACCEPT_LENGTH: (
        "glmserve_server_spec_accept_length",
        "SGLang's speculative acceptance length (sglang:spec_accept_length): tokens a request "
        "gains per verify pass, accepted drafts + 1, over the scheduler's last decode-log "
        "interval (40 decode steps); mean over the ranks that report it. Only while the server "
        "runs speculative decoding.",
    ),
    sglang_api.SPEC_ACCEPT_RATE: (
        "glmserve_server_spec_accept_rate",
        "SGLang's speculative acceptance rate (sglang:spec_accept_rate): accepted drafts / "
        "proposed drafts over the same interval. Only while the server runs speculative "
        "decoding.",
    ),
}


class ProbeFailed(Exception):
    def __init__(self, reason: str, detail: str) -> None:
        super().__init__(detail)
        self.reason = reason


def read_bounded(
    client: httpx.Client,
    url: str,
    *,
    deadline_s: float,
    max_bytes: int,
    clock: Callable[[], float] = time.monotonic,
) -> tuple[int, bytes]:
    """GET url: (status, body), or ProbeFailed once the body passes max_bytes or the whole
    request passes deadline_s (checked after every read, each read bounded by the client's read
    timeout, so the worst case is deadline_s plus one read timeout)."""
    t_end = clock() + deadline_s
    # identity: the cap counts the bytes we hold, and a compressed body could expand past it.
    with client.stream("GET", url, headers={"Accept-Encoding": "identity"}) as resp:
        if resp.headers.get("content-encoding", "identity") != "identity":
            raise ProbeFailed("malformed", "compressed body although identity was asked for")
        body = bytearray()
        for chunk in resp.iter_bytes():
            body += chunk
            if len(body) > max_bytes:
                raise ProbeFailed("malformed", f"body over {max_bytes} bytes")
            if clock() > t_end:
                raise ProbeFailed("timeout", f"body still arriving after {deadline_s:g} s")
        return resp.status_code, bytes(body)


class TargetInfoCollector(Collector):
    """`glmserve_target_up` and `glmserve_server_info`, from the last background probe.

    A scrape never waits for the target: `refresh()` probes it (from `start()`'s thread, every
    interval_s) and `collect()` only reads what the last probe left, so /metrics answers at once
    whether the target is fast, hung or streaming an endless body.
    The last good server info is kept while the target is down, so the build panel still says
    what was running; `glmserve_target_up` says whether the last probe reached it.
    """

    def __init__(
        self,
        target: str,
        client: httpx.Client,
        registry: CollectorRegistry,
        build_info_file: str | Path | None,
        *,
        deadline_s: float = 3.0,
        max_bytes: int = MAX_INFO_BYTES,
    ) -> None:
        self.target = target.rstrip("/")
        self.client = client
        self.build_info_file = build_info_file
        self.deadline_s = deadline_s
        self.max_bytes = max_bytes
        self._lock = threading.Lock()
        self._up = False
        self._last_server: dict[str, str] | None = None
        self._last_limits: dict[str, float] = {}
        self._last_spec: dict[str, float] = {}
        self.failures = dict.fromkeys(PROBE_FAILURE_REASONS, 0)
        self._stop = threading.Event()
        self._thread: threading.Thread | None = None
        registry.register(self)

    def describe(self) -> list[Metric]:
        # Registering must not probe the target, so the names are not declared up front.
        return []

    def probe(self) -> dict[str, Any] | None:
        """GET the server info; None (and a counted reason) when the target is not healthy."""
        try:
            return self._fetch_info()
        except ProbeFailed as exc:
            reason, detail = exc.reason, str(exc)
        except httpx.TimeoutException as exc:
            reason, detail = "timeout", repr(exc)
        except httpx.TransportError as exc:
            reason, detail = "connect", repr(exc)
        with self._lock:
            self.failures[reason] += 1
        log.debug("target probe failed (%s): %s", reason, detail)
        return None

    def _fetch_info(self) -> dict[str, Any]:
        # The deprecated alias only when the current path is missing (404).
        for path in sglang_api.SERVER_INFO_PATHS:
            status, raw = read_bounded(
                self.client,
                self.target + path,
                deadline_s=self.deadline_s,
                max_bytes=self.max_bytes,
            )
            if status == 404 and path != sglang_api.SERVER_INFO_PATHS[-1]:
                continue
            if status >= 300:
                raise ProbeFailed("http_status", f"HTTP {status} on {path}")
            try:
                body = json.loads(raw)
            except ValueError:
                body = None
            if not isinstance(body, dict):
                raise ProbeFailed("malformed", f"{path} did not return a JSON object")
            return body
        raise AssertionError("unreachable: the last path always returns or raises")

    def refresh(self) -> bool:
        """Probe once and keep the result for the scrapes that follow; True when up."""
        body = self.probe()
        spec = self.probe_spec() if body and sglang_api.info_speculative_algorithm(body) else {}
        with self._lock:
            self._up = body is not None
            if body is not None:
                self._last_server = server_fields(body)
                self._last_limits = server_limits(body)
            # Not kept while the target is down: a stale acceptance would hide a collapse.
            self._last_spec = spec
        return body is not None

    def probe_spec(self) -> dict[str, float]:
        """SGLang's acceptance gauges from the target's /metrics; {} when they cannot be read
        (no --enable-metrics, a broken answer): the panel then shows no line, not a stale one."""
        try:
            status, raw = read_bounded(
                self.client,
                self.target + sglang_api.METRICS,
                deadline_s=self.deadline_s,
                max_bytes=MAX_METRICS_BYTES,
            )
            if status >= 300:
                raise ProbeFailed("http_status", f"HTTP {status} on {sglang_api.METRICS}")
            return spec_gauges(raw.decode("utf-8", "replace"))
        except (ProbeFailed, httpx.HTTPError, ValueError) as exc:
            log.debug("acceptance gauges unreadable: %s", exc)
            return {}

    def start(self, interval_s: float) -> None:
        """Probe at once, then every interval_s, in a thread of its own (one probe at a time)."""
        self._thread = threading.Thread(
            target=self._loop, args=(interval_s,), name="target-probe", daemon=True
        )
        self._thread.start()

    def stop(self, timeout_s: float = 5.0) -> None:
        self._stop.set()
        if self._thread is not None:
            self._thread.join(timeout_s)

    def _loop(self, interval_s: float) -> None:
        while not self._stop.is_set():
            try:
                self.refresh()
            except Exception:  # a bug in one probe must not leave the target's state frozen
                log.exception("target probe crashed")
                with self._lock:
                    self._up = False
            self._stop.wait(interval_s)

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
        with self._lock:
            up = self._up
            server = self._last_server
            limits = dict(self._last_limits)
            spec = dict(self._last_spec)
            failures = dict(self.failures)
        up = GaugeMetricFamily(
            "glmserve_target_up",
            "1 if the target answered GET /server_info with a JSON object on the last "
            "background probe (every probe.interval; a scrape never waits for the target).",
            value=1.0 if up else 0.0,
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
        for source, value in spec.items():
            name, help_text = SPEC_GAUGES[source]
            yield GaugeMetricFamily(name, help_text, value=value)
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
            labels["patch_in_use"] = build.get("patch_in_use", "")
            labels["build_source"] = build.get("source", "")
            # The server's answer wins; the build info says what the deployment asked (MTP
            # included) while the server has not answered yet.
            for key in (
                "sglang_version",
                "attention_backend",
                "speculative_algorithm",
                "speculative_num_draft_tokens",
            ):
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
