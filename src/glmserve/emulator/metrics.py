"""The `sglang:` Prometheus metrics of the default SGLang line (glmserve.sglang_lines), fed by what the emulator serves.

Names, types, label names and bucket boundaries are those of the pinned wheel
(`sglang/srt/observability/metrics_collector.py`); tests/emulator checks them against a list
extracted from that file. Semantics mirrored from the real server:

- The real server runs prometheus_client in multiprocess mode, so no `_created` series exist and
  gauges registered without a `multiprocess_mode` (num_retracted_reqs, num_paused_reqs) carry a
  `pid` label. We render the same shape from our own state instead of using prometheus_client's
  global registry, so several emulators can live in one process (tests).
- Scheduler metrics carry glmserve.sglang_api.SCHEDULER_LABELS; only the stats-logging rank
  (tp_rank 0) reports them. Tokenizer metrics carry TOKENIZER_LABELS. Bucket boundaries are
  sglang_api's too; the help texts and gauge table below are the renderer's alone.
- inter_token_latency_seconds is observed once per *output batch* of a request: the interval
  since the previous batch is divided by the number of new tokens, that per-token value picks
  the bucket, the bucket count grows by the number of tokens and the sum grows by the whole
  interval (TokenizerMetricsCollector.observe_inter_token_latency). So `_count` counts tokens and
  `_sum / _count` is the mean per-token latency even when a chunk carries several tokens.
- time_to_first_token_seconds is observed on the first output batch; e2e, prompt/generation
  token counters, num_requests_total and the token-length histograms when a request finishes.
- Scheduler gauges are refreshed like the real scheduler's log_stats: every
  `decode_log_interval` (40) decode steps while decoding, and every 30 s when idle (which is
  also when gen_throughput drops to 0).
"""

from __future__ import annotations

import math
import os
from collections.abc import Iterable, Iterator, Sequence
from dataclasses import dataclass, field

from prometheus_client.core import (
    CounterMetricFamily,
    GaugeMetricFamily,
    HistogramMetricFamily,
    Metric,
)
from prometheus_client.registry import Collector, CollectorRegistry
from prometheus_client.utils import floatToGoString

from glmserve.sglang_api import (
    E2E_BUCKETS,
    ITL_BUCKETS,
    QUEUE_TIME_BUCKETS,
    SCHEDULER_LABELS,
    TOKEN_LENGTH_BUCKETS,
    TOKENIZER_LABELS,
    TTFT_BUCKETS,
)

# Every scheduler gauge that SchedulerMetricsCollector.log_stats sets unconditionally, plus the
# constants from emit_constants. Help texts are the wheel's.
SCHEDULER_GAUGES: dict[str, str] = {
    "num_running_reqs": "The number of running requests.",
    "num_queue_reqs": "The number of requests in the waiting queue.",
    "num_grammar_queue_reqs": "The number of requests in the grammar waiting queue.",
    "gen_throughput": "The generation throughput (token/s).",
    "cache_hit_rate": "The prefix cache hit rate.",
    "decode_sum_seq_lens": "The sum of all sequence lengths in decode.",
    "token_usage": "The token usage.",
    "full_token_usage": "The token usage for full attention layers.",
    "swa_token_usage": "The token usage for SWA layers.",
    "mamba_usage": "The token usage for Mamba layers.",
    "num_used_tokens": "The number of used tokens.",
    "kv_available_tokens": "Number of free token slots in the KV cache pool.",
    "kv_evictable_tokens": "Number of evictable (radix-cached) token slots in the KV cache pool.",
    "kv_used_tokens": "Number of actively used token slots in the KV cache pool.",
    "swa_available_tokens": "Number of free token slots in the SWA pool (hybrid-SWA only).",
    "swa_evictable_tokens": "Number of evictable (radix-cached) token slots in the SWA pool.",
    "swa_used_tokens": "Number of actively used token slots in the SWA pool.",
    "mamba_available_tokens": "Number of free state slots in the mamba SSM pool (hybrid-SSM only).",
    "mamba_evictable_tokens": "Number of evictable (radix-cached) state slots in the mamba SSM pool.",
    "mamba_used_tokens": "Number of actively used state slots in the mamba SSM pool.",
    "spec_accept_length": "Mean acceptance length of speculative decoding (accepted drafts + bonus token per forward).",
    "spec_accept_rate": "Speculative acceptance rate (`accepted drafts / proposed drafts` in batch).",
    "num_retracted_reqs": "The number of retracted requests.",
    "num_paused_reqs": "The number of paused requests by async weight sync.",
    "num_prefill_bootstrap_queue_reqs": "The number of requests in the prefill bootstrap queue.",
    "num_prefill_inflight_queue_reqs": "The number of requests in the prefill inflight queue.",
    "num_decode_prealloc_queue_reqs": "The number of requests in the decode prealloc queue.",
    "num_decode_transfer_queue_reqs": "The number of requests in the decode transfer queue.",
    "pending_prealloc_token_usage": "The token usage for pending preallocated tokens (not preallocated yet).",
    "utilization": "The utilization.",
    "fwd_occupancy": "Forward pass GPU occupancy percentage.",
    "new_token_ratio": "The new token ratio.",
    "is_cuda_graph": "Whether the batch is using CUDA graph.",
    "num_unique_running_routing_keys": "Number of unique routing keys in running batch.",
    "max_total_num_tokens": "Maximum total number of tokens in the KV cache pool.",
    "engine_startup_time": "The time taken for the engine to start up.",
    "engine_load_weights_time": "The time taken for the engine to load weights.",
    "page_size": "KV cache page size in tokens.",
    "num_pages": "Number of KV cache pages.",
    "context_len": "Maximum context length.",
    "startup_available_gpu_memory_gb": "Available GPU memory in GB at startup.",
}
# Registered without multiprocess_mode ("all"), so multiprocess exposition adds a pid label.
PID_LABELLED_GAUGES = frozenset({"num_retracted_reqs", "num_paused_reqs"})


@dataclass
class Histogram:
    """Bucket counts (not cumulative) and a sum, rendered like prometheus_client's."""

    bounds: Sequence[float]
    counts: list[float] = field(default_factory=list)
    total: float = 0.0

    def __post_init__(self) -> None:
        self.counts = [0.0] * (len(self.bounds) + 1)  # last: +Inf

    def observe(self, value: float, count: int = 1, sum_inc: float | None = None) -> None:
        """`count` observations of `value`; the sum grows by `sum_inc` (default value*count)."""
        for i, bound in enumerate(self.bounds):
            if value <= bound:
                self.counts[i] += count
                break
        else:
            self.counts[-1] += count
        self.total += value * count if sum_inc is None else sum_inc

    @property
    def count(self) -> float:
        return sum(self.counts)

    def cumulative(self) -> list[tuple[str, float]]:
        out, acc = [], 0.0
        for bound, c in zip([*self.bounds, math.inf], self.counts, strict=True):
            acc += c
            out.append((floatToGoString(bound), acc))
        return out


@dataclass
class MetricsState:
    """Everything /metrics shows. The engine writes it; the collector only reads it."""

    model_name: str
    gauges: dict[str, float] = field(default_factory=lambda: dict.fromkeys(SCHEDULER_GAUGES, 0.0))
    prompt_tokens_total: float = 0.0
    generation_tokens_total: float = 0.0
    num_requests_total: float = 0.0
    num_aborted_requests_total: float = 0.0
    num_so_requests_total: float = 0.0
    realtime_tokens: dict[str, float] = field(
        default_factory=lambda: {"prefill_compute": 0.0, "prefill_cache": 0.0, "decode": 0.0}
    )
    # HTTP middleware metrics (--enable-metrics): keyed by (endpoint, method) and
    # (endpoint, status_code, method) like the real label order.
    http_requests: dict[tuple[str, str], float] = field(default_factory=dict)
    http_responses: dict[tuple[str, str, str], float] = field(default_factory=dict)
    http_active: dict[tuple[str, str], float] = field(default_factory=dict)
    ttft: Histogram = field(default_factory=lambda: Histogram(TTFT_BUCKETS))
    itl: Histogram = field(default_factory=lambda: Histogram(ITL_BUCKETS))
    e2e: Histogram = field(default_factory=lambda: Histogram(E2E_BUCKETS))
    queue_time: Histogram = field(default_factory=lambda: Histogram(QUEUE_TIME_BUCKETS))
    prompt_tokens_hist: Histogram = field(default_factory=lambda: Histogram(TOKEN_LENGTH_BUCKETS))
    uncached_prompt_tokens_hist: Histogram = field(
        default_factory=lambda: Histogram(TOKEN_LENGTH_BUCKETS)
    )
    generation_tokens_hist: Histogram = field(
        default_factory=lambda: Histogram(TOKEN_LENGTH_BUCKETS)
    )
    # Forward passes by mode ("decode_cuda_graph" / "decode_none"); like the real counter, a
    # mode's series exists once it has been counted.
    cuda_graph_passes: dict[str, float] = field(default_factory=dict)

    # --- observation hooks, named after the real collector's methods -------------------------
    def observe_time_to_first_token(self, seconds: float) -> None:
        self.ttft.observe(seconds)

    def observe_inter_token_latency(self, interval: float, num_new_tokens: int) -> None:
        if num_new_tokens <= 0:
            return
        self.itl.observe(interval / num_new_tokens, count=num_new_tokens, sum_inc=interval)

    def observe_one_finished_request(
        self, prompt_tokens: int, generation_tokens: int, e2e_latency: float
    ) -> None:
        self.prompt_tokens_total += prompt_tokens
        self.generation_tokens_total += generation_tokens
        self.num_requests_total += 1
        self.e2e.observe(e2e_latency)
        self.prompt_tokens_hist.observe(float(prompt_tokens))
        self.uncached_prompt_tokens_hist.observe(float(prompt_tokens))  # no prefix cache
        self.generation_tokens_hist.observe(float(generation_tokens))

    def increment_decode_cuda_graph_passes(self, passes: int, in_graph: bool) -> None:
        mode = "decode_cuda_graph" if in_graph else "decode_none"
        self.cuda_graph_passes[mode] = self.cuda_graph_passes.get(mode, 0.0) + passes

    def observe_one_aborted_request(self) -> None:
        self.num_aborted_requests_total += 1

    def http_request_started(self, endpoint: str, method: str) -> None:
        key = (endpoint, method)
        self.http_requests[key] = self.http_requests.get(key, 0.0) + 1
        self.http_active[key] = self.http_active.get(key, 0.0) + 1

    def http_response_started(self, endpoint: str, method: str, status: int) -> None:
        key = (endpoint, str(status), method)
        self.http_responses[key] = self.http_responses.get(key, 0.0) + 1

    def http_request_left(self, endpoint: str, method: str) -> None:
        self.http_active[(endpoint, method)] -= 1


class SGLangCollector(Collector):
    """Renders MetricsState in the real server's exposition shape."""

    def __init__(self, state: MetricsState) -> None:
        self.state = state
        self.pid = str(os.getpid())

    def _sched(self) -> list[str]:
        return [self.state.model_name, "unified", "0", "0", "0"]

    def _tok(self) -> list[str]:
        return [self.state.model_name, "unified"]

    def collect(self) -> Iterator[Metric]:
        s = self.state
        for name, help_text in SCHEDULER_GAUGES.items():
            labels = list(SCHEDULER_LABELS)
            values = self._sched()
            if name in PID_LABELLED_GAUGES:
                labels.append("pid")
                values.append(self.pid)
            g = GaugeMetricFamily(f"sglang:{name}", help_text, labels=labels)
            g.add_metric(values, s.gauges[name])
            yield g
        yield from self._counter(
            "sglang:realtime_tokens_total",
            "Total number of tokens processed (updated on each log interval). "
            "mode: prefill_compute, prefill_cache, decode.",
            [*SCHEDULER_LABELS, "mode"],
            (([*self._sched(), mode], v) for mode, v in s.realtime_tokens.items()),
        )
        if s.cuda_graph_passes:
            yield from self._counter(
                "sglang:cuda_graph_passes_total",
                "Total number of forward passes categorized by CUDA graph.",
                [*SCHEDULER_LABELS, "mode"],
                (([*self._sched(), m], v) for m, v in sorted(s.cuda_graph_passes.items())),
            )
        yield self._histogram(
            "sglang:queue_time_seconds",
            "Histogram of queueing time in seconds.",
            SCHEDULER_LABELS,
            self._sched(),
            s.queue_time,
        )
        yield from self._counter(
            "sglang:http_requests_total",
            "Total number of HTTP requests by endpoint and method",
            ["endpoint", "method"],
            ((list(k), v) for k, v in sorted(s.http_requests.items())),
        )
        yield from self._counter(
            "sglang:http_responses_total",
            "Total number of HTTP responses by endpoint and status code",
            ["endpoint", "status_code", "method"],
            ((list(k), v) for k, v in sorted(s.http_responses.items())),
        )
        active = GaugeMetricFamily(
            "sglang:http_requests_active",
            "Number of currently active HTTP requests",
            labels=["endpoint", "method"],
        )
        for k, v in sorted(s.http_active.items()):
            active.add_metric(list(k), v)
        yield active
        routing = GaugeMetricFamily(
            "sglang:routing_keys_active", "Number of unique routing keys with active requests"
        )
        routing.add_metric([], 0.0)  # requests with x-smg-routing-key are not modelled
        yield routing
        tok = self._tok()
        for name, help_text, value in (
            ("prompt_tokens_total", "Number of prefill tokens processed.", s.prompt_tokens_total),
            (
                "generation_tokens_total",
                "Number of generation tokens processed.",
                s.generation_tokens_total,
            ),
            ("num_requests_total", "Number of requests processed.", s.num_requests_total),
            (
                "num_so_requests_total",
                "Number of structured output requests processed.",
                s.num_so_requests_total,
            ),
            (
                "num_aborted_requests_total",
                "Number of requests aborted.",
                s.num_aborted_requests_total,
            ),
        ):
            yield from self._counter(f"sglang:{name}", help_text, TOKENIZER_LABELS, [(tok, value)])
        for name, help_text, hist in (
            ("prompt_tokens_histogram", "Histogram of prompt token length.", s.prompt_tokens_hist),
            (
                "uncached_prompt_tokens_histogram",
                "Histogram of uncached (compute) prompt token length.",
                s.uncached_prompt_tokens_hist,
            ),
            (
                "generation_tokens_histogram",
                "Histogram of generation token length.",
                s.generation_tokens_hist,
            ),
            (
                "time_to_first_token_seconds",
                "Histogram of time to first token in seconds.",
                s.ttft,
            ),
            (
                "inter_token_latency_seconds",
                "Histogram of inter-token latency in seconds.",
                s.itl,
            ),
            (
                "e2e_request_latency_seconds",
                "Histogram of End-to-end request latency in seconds",
                s.e2e,
            ),
        ):
            yield self._histogram(f"sglang:{name}", help_text, TOKENIZER_LABELS, tok, hist)

    @staticmethod
    def _counter(
        name: str,
        help_text: str,
        labels: Sequence[str],
        series: Iterable[tuple[list[str], float]],
    ) -> Iterator[Metric]:
        # CounterMetricFamily wants the name without _total and appends it to the sample.
        c = CounterMetricFamily(name.removesuffix("_total"), help_text, labels=list(labels))
        for values, value in series:
            c.add_metric(values, value)
        yield c

    @staticmethod
    def _histogram(
        name: str, help_text: str, labels: Sequence[str], values: list[str], hist: Histogram
    ) -> Metric:
        h = HistogramMetricFamily(name, help_text, labels=list(labels))
        h.add_metric(values, hist.cumulative(), hist.total)
        return h


def make_registry(state: MetricsState) -> CollectorRegistry:
    registry = CollectorRegistry(auto_describe=False)
    registry.register(SGLangCollector(state))
    return registry
