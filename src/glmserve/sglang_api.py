"""One home per SGLang line: what glmserve builds on and relies on from each SGLang release it
supports. A line is one `Line` entry in LINES: the version, its base image, its torch, FlashInfer
and CUDA pins, its patch series (patches/<series>/) and the launch profiles written for it. The
Dockerfile, compose.yaml, .env.example and k8s/ name the pinned line (PINNED) and
tests/test_sglang_lines.py checks them against it; the launcher, the emulator, the exporter, the
load test and bench read it from here (`python -m glmserve.sglang_api` prints it for scripts).

Below the lines: the facts of the SGLang API glmserve reads (its HTTP routes, the server-info
fields, the label names and default buckets of its Prometheus metrics), shared by every line
until one differs (then it becomes a field of Line). The emulator serves these, the exporter and
the load test read them; tests/emulator checks the metric facts against the pinned wheel
(tests/emulator/data/sglang-<version>-metrics.json). The exposition details the emulator mirrors
(help texts, which gauges carry a pid label) stay with its renderer in glmserve.emulator.metrics.
Stdlib only: the launcher reads this inside the SGLang image.
"""

from __future__ import annotations

import argparse
import sys
from dataclasses import asdict, dataclass
from typing import Any

from glmserve import __version__

GLMSERVE_VERSION = __version__  # the version part of every image tag (pyproject.toml says the same)


@dataclass(frozen=True)
class Line:
    version: str  # the SGLang release: its wheel on PyPI and its official image
    base_image: str  # that image, pinned by digest (the tag is kept for humans)
    cuda: str  # CUDA major of the base's torch (the build checks it: --expect-cuda)
    python: str  # the base image's CPython
    torch: str
    flashinfer: str  # flashinfer_python (and flashinfer_cubin) as the release pins them
    sglang_kernel: str
    series: str  # the patch series under patches/ that the lock maps this version to
    profiles: tuple[str, ...]  # the launch profiles written and checked for this line

    @property
    def image(self) -> str:
        """The server image glmserve builds on this line (the tag names its parts)."""
        return f"glmserve/server:{GLMSERVE_VERSION}-sglang{self.version}"

    def build_env(self) -> dict[str, str]:
        """The .env entries that build and run this line (compose passes them as build args)."""
        return {
            "BASE_IMAGE": self.base_image,
            "SGLANG_VERSION": self.version,
            "PATCH_SERIES": self.series,
            "GLMSERVE_IMAGE": self.image,
        }


# Adding a line: one entry here (the series under patches/ first; docs/patch.md, "Adding a series
# for a new SGLang version"). The pinned line is what the Dockerfile builds by default.
LINES: tuple[Line, ...] = (
    Line(
        version="0.5.12.post1",
        # Official image, CUDA 13.0, the full (devel) variant: FlashInfer JIT-compiles its MLA
        # kernels with nvcc at first start.
        base_image=(
            "lmsysorg/sglang:v0.5.12.post1-cu130"
            "@sha256:ceaf8b16e02d165143633ac228bbb994a05fe77d7e0526cf035ae4bbf4eacc36"
        ),
        cuda="13",
        python="3.12",
        torch="2.11.0",
        flashinfer="0.6.11.post1",
        sglang_kernel="0.4.2.post2",
        series="0.5.12.post1",
        profiles=(
            "glm5-nvfp4-b200-tp4",
            "glm5-nvfp4-b200-tp8",
            "glm5-nvfp4-b200-tp8-dense",
            "glm5-nvfp4-rtxpro6000-2node-tp8",
            "glm5-nvfp4-rtxpro6000-tp8",
            "tiny-mla",
            "tiny-mla-78l",
        ),
    ),
)
PINNED = LINES[0]
SGLANG_VERSION = PINNED.version


class UnknownLine(LookupError):
    """An SGLang version glmserve has no line for; the message is the one line to show."""


def line(version: str) -> Line:
    for entry in LINES:
        if entry.version == version:
            return entry
    known = ", ".join(entry.version for entry in LINES)
    raise UnknownLine(f"SGLang {version} is not a line glmserve supports (lines: {known})")


def lines_for_profile(profile: str) -> tuple[Line, ...]:
    return tuple(entry for entry in LINES if profile in entry.profiles)


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
# 0.5.12 /get_server_info logs a warning on every call), so clients try them only as a fallback
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


# --- Prometheus metrics (`sglang:` prefix) ---------------------------------------------------
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


def main(argv: list[str] | None = None) -> int:
    """`python -m glmserve.sglang_api [FIELD] [--line VERSION]`: one field of a line for scripts
    (version, base_image, image, series, torch, ...), `env` for its .env entries, or, with no
    field, every line."""
    parser = argparse.ArgumentParser(prog="python -m glmserve.sglang_api", description=main.__doc__)
    parser.add_argument("field", nargs="?", help="a Line field, image, or env")
    parser.add_argument("--line", default=PINNED.version, help="SGLang version (default: pinned)")
    args = parser.parse_args(argv)
    try:
        chosen = line(args.line)
    except UnknownLine as exc:
        print(f"{parser.prog}: {exc}", file=sys.stderr)
        return 2
    fields = {**asdict(chosen), "image": chosen.image}
    if args.field is None:
        for entry in LINES:
            pinned = " (pinned)" if entry is PINNED else ""
            print(
                f"{entry.version}{pinned}: series {entry.series}, torch {entry.torch}, "
                f"FlashInfer {entry.flashinfer}, CUDA {entry.cuda}, {entry.base_image}"
            )
        return 0
    if args.field == "env":
        for key, value in chosen.build_env().items():
            print(f"{key}={value}")
        return 0
    if args.field not in fields:
        print(
            f"{parser.prog}: no field {args.field!r} (fields: {', '.join(fields)}, env)",
            file=sys.stderr,
        )
        return 2
    value = fields[args.field]
    print(" ".join(value) if isinstance(value, (list, tuple)) else value)
    return 0


if __name__ == "__main__":
    sys.exit(main())
