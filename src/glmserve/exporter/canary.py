"""The canary: one fixed-length streaming request per interval, timed by glmserve.streaming.

SGLang exports no per-request TPOT histogram, so the canary is the only source of request-level
TPOT quantiles. It reuses the project's one stream-timing definition; nothing here re-derives
TTFT or TPOT from raw events.
"""

from __future__ import annotations

import logging
import threading
import time
from collections.abc import Callable
from typing import Any

from prometheus_client import CollectorRegistry, Counter, Gauge, Histogram

from glmserve.sglang_api import ITL_BUCKETS as SGLANG_ITL_BUCKETS
from glmserve.streaming import FAILURE_REASONS, StreamError, StreamRequest, time_stream

log = logging.getLogger(__name__)

# The TPOT SLO (seconds per output token). It is a bucket boundary both of our canary histograms
# and of SGLang's default inter_token_latency buckets (0.035, 0.040, 0.060 ...), so attainment is
# an exact bucket ratio on both sides rather than an interpolation.
TPOT_SLO_S = 0.040


def _tpot_buckets() -> tuple[float, ...]:
    # histogram_quantile interpolates inside one bucket, so its error is bounded by the bucket's
    # relative width: <= 5 % from 10 ms to 200 ms and <= 2.5 % from 20 to 40 ms, where GLM-5
    # decode lives (~20 ms single stream). Bounds are built in integer tenths of a millisecond
    # so the `le` label text is exact ("0.04", never "0.04000000000000001").
    tenths = list(range(10, 100, 10))  # 1..9 ms
    tenths += range(100, 400, 5)  # 10..39.5 ms, 0.5 ms steps
    tenths += range(400, 1000, 20)  # 40..98 ms, 2 ms steps
    tenths += range(1000, 2001, 50)  # 100..200 ms, 5 ms steps
    coarse = [0.25, 0.3, 0.4, 0.5, 0.75, 1.0, 2.0, 5.0]
    return tuple([t / 10_000 for t in tenths] + coarse)


TPOT_BUCKETS = _tpot_buckets()
TTFT_BUCKETS = (
    0.01, 0.025, 0.05, 0.075, 0.1, 0.15, 0.2, 0.3, 0.4, 0.5, 0.75, 1.0, 1.5, 2.0, 3.0, 4.0, 6.0,
    8.0, 10.0, 15.0, 20.0, 30.0, 60.0,
)  # fmt: skip
assert TPOT_SLO_S in TPOT_BUCKETS and TPOT_SLO_S in SGLANG_ITL_BUCKETS

# The canary's stream is capped at this many bytes per requested token (SGLang's chat chunk with
# usage is ~400 B), plus room for the role and usage chunks: an endless body costs a bounded read.
STREAM_BYTES_PER_TOKEN = 2048
STREAM_BYTES_OVERHEAD = 64 * 1024


def stream_byte_cap(max_tokens: int) -> int:
    return STREAM_BYTES_OVERHEAD + max_tokens * STREAM_BYTES_PER_TOKEN


def canary_overhead(
    interval_s: float, max_tokens: int, tpot_s: float, ttft_s: float, decode_slots: int
) -> float:
    """Share of the server's decode slots the canary occupies on average (0..1).

    The canary holds one running-request slot for TTFT + (max_tokens - 1) * TPOT out of every
    interval (at most the whole interval: the probe runs serially, never overlapping itself).
    """
    busy = min(interval_s, ttft_s + (max_tokens - 1) * tpot_s)
    return busy / interval_s / decode_slots


class CanaryMetrics:
    """The canary's series, registered on an injected registry (one fresh registry per test)."""

    def __init__(self, registry: CollectorRegistry) -> None:
        self.ttft = Histogram(
            "glmserve_canary_ttft_seconds",
            "Canary time to first token: request sent to first event carrying a token "
            "(the role-only ack chunk does not count).",
            buckets=TTFT_BUCKETS,
            registry=registry,
        )
        self.tpot = Histogram(
            "glmserve_canary_tpot_seconds",
            "Canary time per output token of one request: (t_last - t_first) / (tokens - 1), "
            "tokens from usage.",
            buckets=TPOT_BUCKETS,
            registry=registry,
        )
        self.itl = Histogram(
            "glmserve_canary_itl_seconds",
            "Canary inter-token latency: one observation per output token after the first; a "
            "chunk carrying k tokens contributes k gaps of gap/k.",
            # SGLang's own ITL buckets, so client- and server-side ITL quantiles compare 1:1.
            buckets=SGLANG_ITL_BUCKETS,
            registry=registry,
        )
        self.decode_tps = Gauge(
            "glmserve_canary_decode_tokens_per_second",
            "Decode speed of the last successful canary request (1 / TPOT).",
            registry=registry,
        )
        self.output_tps = Gauge(
            "glmserve_canary_output_tokens_per_second",
            "Output tokens / end-to-end time of the last successful canary request.",
            registry=registry,
        )
        self.tokens_per_step = Gauge(
            "glmserve_canary_tokens_per_step",
            "Tokens per decode step of the last successful canary request, as glmserve.streaming "
            "defines it: 1 without speculative decoding, about the acceptance length with MTP.",
            registry=registry,
        )
        self.output_tokens = Counter(
            "glmserve_canary_output_tokens",
            "Output tokens received by the canary (from usage).",
            registry=registry,
        )
        self.busy = Counter(
            "glmserve_canary_busy_seconds",
            "Wall time the canary held a request open on the target (its decode-slot cost).",
            registry=registry,
        )
        self.requests = Counter(
            "glmserve_canary_requests",
            "Canary requests attempted.",
            registry=registry,
        )
        self.failures = Counter(
            "glmserve_canary_failures",
            "Canary requests that yielded no timing, by reason.",
            ["reason"],
            registry=registry,
        )
        self.last_success = Gauge(
            "glmserve_canary_last_success_timestamp_seconds",
            "Unix time of the last successful canary request (0 until the first).",
            registry=registry,
        )
        # Every reason exists from the start so that rate() and alerts see a 0, not a gap.
        for reason in FAILURE_REASONS:
            self.failures.labels(reason=reason)


class Canary:
    """Runs the probe; `run_once` is the unit the tests drive, `start` adds the interval loop."""

    def __init__(
        self,
        target: str,
        request: StreamRequest,
        metrics: CanaryMetrics,
        client: Any,
        *,
        interval_s: float = 15.0,
        timeout_s: float = 60.0,
        on_result: Callable[[bool], None] | None = None,
        clock: Callable[[], float] = time.perf_counter,
        wall_clock: Callable[[], float] = time.time,
    ) -> None:
        self.target = target
        self.request = request
        self.metrics = metrics
        self.client = client
        self.interval_s = interval_s
        self.timeout_s = timeout_s
        self.on_result = on_result
        self._clock = clock  # injected so recorded streams replay to golden /metrics output
        self._wall_clock = wall_clock
        self._stop = threading.Event()
        self._thread: threading.Thread | None = None

    def run_once(self) -> str | None:
        """Probe once; returns None on success or the failure reason."""
        m = self.metrics
        m.requests.inc()
        t0 = self._clock()
        try:
            timing = time_stream(
                self.target,
                self.request,
                client=self.client,
                timeout_s=self.timeout_s,
                clock=self._clock,
                max_bytes=stream_byte_cap(self.request.max_tokens),
            )
        except StreamError as exc:
            return self._failed(t0, exc.reason, str(exc))
        m.busy.inc(self._clock() - t0)
        m.ttft.observe(timing.ttft_s)
        if timing.tpot_s is not None:
            m.tpot.observe(timing.tpot_s)
        if timing.decode_tokens_per_s is not None:
            m.decode_tps.set(timing.decode_tokens_per_s)
        for gap in timing.itl_s:
            m.itl.observe(gap)
        m.output_tps.set(timing.output_tokens_per_s)
        if timing.tokens_per_step is not None:
            m.tokens_per_step.set(timing.tokens_per_step)
        m.output_tokens.inc(timing.output_tokens)
        m.last_success.set(self._wall_clock())
        self._notify(True)
        return None

    def _failed(self, t0: float, reason: str, detail: str) -> str:
        self.metrics.busy.inc(self._clock() - t0)
        self.metrics.failures.labels(reason=reason).inc()
        log.warning("canary failed (%s): %s", reason, detail)
        self._notify(False)
        return reason

    def _notify(self, ok: bool) -> None:
        if self.on_result is not None:
            self.on_result(ok)

    def start(self) -> None:
        self._thread = threading.Thread(target=self._loop, name="canary", daemon=True)
        self._thread.start()

    def stop(self, timeout_s: float = 5.0) -> None:
        self._stop.set()
        if self._thread is not None:
            self._thread.join(timeout_s)

    def _loop(self) -> None:
        # Fixed-rate schedule: a slow probe delays the next one but never makes them overlap,
        # so the canary never holds more than one decode slot.
        next_at = time.monotonic()
        while not self._stop.is_set():
            try:
                self.run_once()
            except Exception:  # a bug in one probe must not kill the loop
                log.exception("canary probe crashed")
            next_at = max(next_at + self.interval_s, time.monotonic())
            self._stop.wait(max(0.0, next_at - time.monotonic()))
