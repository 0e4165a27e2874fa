"""What glmserve relies on from SGLang's API: its HTTP routes, the server-info fields we read,
and the label names and default buckets of its Prometheus metrics.

These are facts of the SGLang lines in glmserve.sglang_lines (the one table of lines: version,
base image, pins, series, profiles), shared by every line until one differs; then the fact
becomes a field of that table's Line. The emulator serves these, the exporter and the load test
read them; tests/emulator checks the metric facts against the default line's wheel
(tests/emulator/data/sglang-<version>-metrics.json). The exposition details the emulator mirrors
(help texts, which gauges carry a pid label) stay with its renderer in glmserve.emulator.metrics.
"""

from __future__ import annotations

from typing import Any

from glmserve.sglang_lines import DEFAULT_LINE

SGLANG_VERSION = DEFAULT_LINE  # the line the emulator answers as and the tests read facts from

# --- HTTP routes ----------------------------------------------------------------------------
CHAT_COMPLETIONS = "/v1/chat/completions"
COMPLETIONS = "/v1/completions"
GENERATE = "/generate"  # SGLang's native API
MODELS = "/v1/models"
HEALTH = "/health"
HEALTH_GENERATE = "/health_generate"
METRICS = "/metrics"  # only with --enable-metrics
FLUSH_CACHE = "/flush_cache"  # empties the radix cache (benchmarks between cold runs)
# The current path first: /get_server_info and /get_model_info are the deprecated aliases (in
# the default line /get_server_info logs a warning on every call), so clients try them only as a fallback
# for a server that lacks the current path.
SERVER_INFO_PATHS = ("/server_info", "/get_server_info")
MODEL_INFO_PATHS = ("/model_info", "/get_model_info")

# --- the server-info answer -----------------------------------------------------------------
# server_args are flattened into the top level of the answer; these are the ones glmserve reads.
SERVER_ARGS_READ = (
    "model_path",
    "served_model_name",
    "kv_cache_dtype",
    "attention_backend",
    "tp_size",
    "dp_size",
    "quantization",
    "max_running_requests",
    "cuda_graph_max_bs",  # after SGLang resolved its default: decode batches replayed in graphs
    "context_length",
    "page_size",
    "chunked_prefill_size",
    "disable_cuda_graph",
    # Speculative decoding (MTP): algorithm None when off; num_draft_tokens = steps + 1 with topk 1.
    "speculative_algorithm",
    "speculative_num_steps",
    "speculative_eagle_topk",
    "speculative_num_draft_tokens",
)


def info_version(info: dict[str, Any]) -> Any:
    return info.get("version")


def info_model(info: dict[str, Any]) -> Any:
    """The name clients send as "model": served_model_name, else the path it was loaded from."""
    return info.get("served_model_name") or info.get("model_path")


def info_attention_backend(info: dict[str, Any]) -> Any:
    # attention_backend is None when only the per-phase decode backend was set.
    return info.get("attention_backend") or info.get("decode_attention_backend")


def info_kv_pool_tokens(info: dict[str, Any]) -> Any:
    """The KV pool size in tokens: the scheduler's max_total_num_tokens, else the first
    internal state's memory_usage.token_capacity (the same number)."""
    pool = info.get("max_total_num_tokens")
    if pool is None:
        states = info.get("internal_states") or []
        if states and isinstance(states[0], dict):
            pool = (states[0].get("memory_usage") or {}).get("token_capacity")
    return pool


def info_speculative_algorithm(info: dict[str, Any]) -> Any:
    """The speculative algorithm the server runs (None or "" when it runs none)."""
    return info.get("speculative_algorithm")


# --- Prometheus metrics (`sglang:` prefix) ---------------------------------------------------
# Speculative decoding, scheduler gauges refreshed with the decode log (every 40 decode steps):
# accept length = tokens a request gains per verify pass (accepted drafts + the bonus token,
# 1..num_draft_tokens); accept rate = accepted drafts / proposed drafts (0..1). Both read 0 on a
# server without speculative decoding.
SPEC_ACCEPT_LENGTH = "sglang:spec_accept_length"
SPEC_ACCEPT_RATE = "sglang:spec_accept_rate"


def spec_gauges(metrics_text: str) -> dict[str, float]:
    """The acceptance gauges in a /metrics answer, each the mean over its series (one per
    scheduler that reports; every TP rank repeats the same value with
    --enable-metrics-for-all-schedulers); absent ones are left out. Only those two gauges'
    lines are parsed, with prometheus_client's parser (the exporter and loadtest extras)."""
    from prometheus_client.parser import text_string_to_metric_families

    wanted = (SPEC_ACCEPT_LENGTH, SPEC_ACCEPT_RATE)
    lines = [line for line in metrics_text.splitlines() if line.startswith(wanted)]
    values: dict[str, list[float]] = {}
    for family in text_string_to_metric_families("\n".join(lines) + "\n"):
        for sample in family.samples:
            if sample.name in wanted:
                values.setdefault(sample.name, []).append(sample.value)
    return {name: sum(v) / len(v) for name, v in values.items() if v}


# Scheduler metrics carry these labels (only the stats-logging rank, tp_rank 0, reports them);
# tokenizer metrics the shorter set.
SCHEDULER_LABELS = ("model_name", "engine_type", "tp_rank", "pp_rank", "moe_ep_rank")
TOKENIZER_LABELS = ("model_name", "engine_type")

# Default bucket boundaries, used when no --bucket-* flag is given.
# bucket_inter_token_latency (TokenizerMetricsCollector); the exporter's canary histogram uses
# the same bounds so client- and server-side quantiles compare bucket for bucket.
ITL_BUCKETS = (
    0.002, 0.004, 0.006, 0.008, 0.010, 0.015, 0.020, 0.025, 0.030, 0.035, 0.040, 0.060, 0.080,
    0.100, 0.200, 0.400, 0.600, 0.800, 1.000, 2.000, 4.000, 6.000, 8.000,
)  # fmt: skip
TTFT_BUCKETS = (0.1, 0.2, 0.4, 0.6, 0.8, 1, 2, 4, 6, 8, 10, 20, 40, 60, 80, 100, 200, 400)
E2E_BUCKETS = (
    0.1, 0.2, 0.4, 0.6, 0.8, 1, 2, 4, 6, 8, 10, 20, 40, 60, 80, 100, 200, 400, 600, 1200, 1800,
    2400,
)  # fmt: skip
QUEUE_TIME_BUCKETS = (
    0.0, 0.001, 0.005, 0.010, 0.050, 0.100, 0.200, 0.500, 1, 2, 3, 4, 5, 10, 15, 20, 30, 40, 50,
    60, 70, 80, 90, 100, 200, 300, 400, 500, 600, 700, 800, 900, 1000, 1200, 1400, 1600, 1800,
    2000, 2500, 3000,
)  # fmt: skip
TOKEN_LENGTH_BUCKETS = (
    100, 300, 500, 700, 1000, 1500, 2000, 3000, 4000, 5000, 6000, 7000, 8000, 9000, 10000, 12500,
    15000, 17500, 20000, 22500, 25000, 27500, 30000, 35000, 40000, 60000, 80000, 100000, 200000,
    300000, 400000, 600000, 800000, 1000000, 1100000,
)  # fmt: skip
