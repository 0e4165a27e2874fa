"""Emulator settings and the command line that builds them."""

from __future__ import annotations

import argparse
import math
from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import NoReturn

from glmserve import sglang_api
from glmserve.emulator.costmodel import GATHER_BYTES_PER_S, GLM5_LAYERS, MODES, DecodeCostModel

DEFAULT_MODEL_PATH = "nvidia/GLM-5-NVFP4"
# GLM-5's max_position_embeddings (what the real server reports as context_len when no
# --context-length is given). An emulator default, not read from the model here.
DEFAULT_CONTEXT_LENGTH = 202_752
# The pool the cost model's lab numbers were taken on (FP8, 495,552 x 576; costmodel.py).
DEFAULT_MAX_TOTAL_TOKENS = 495_552
# GLM-4.x family <|user|> stop id; only used as matched_stop in "stop" finishes.
DEFAULT_EOS_TOKEN_ID = 151_336


@dataclass(frozen=True)
class EmulatorConfig:
    """Everything that shapes what the emulator serves. Times are in milliseconds."""

    tpot_ms: float = 20.0
    ttft_ms: float = 200.0
    tokens_per_chunk: int = 1
    max_concurrency: int = 256
    host: str = "127.0.0.1"
    port: int = 30000
    model_path: str = DEFAULT_MODEL_PATH
    served_model_name: str | None = None
    max_total_tokens: int = DEFAULT_MAX_TOTAL_TOKENS
    context_length: int = DEFAULT_CONTEXT_LENGTH
    kv_cache_dtype: str = "fp8_e4m3"
    attention_backend: str = "flashinfer"
    tp_size: int = 8
    role_chunk: bool = True
    # SGLang's --enable-cache-report: the OpenAI routes' usage carries the prefix-cache hit as
    # prompt_tokens_details.cached_tokens (only when above 0, as there); /generate always does.
    enable_cache_report: bool = False
    cost_model: DecodeCostModel = field(default_factory=DecodeCostModel)
    eos_token_id: int = DEFAULT_EOS_TOKEN_ID
    health_delay_s: float = 1.0
    startup_delay_s: float = 0.0
    decode_log_interval: int = 40
    build_info_file: str | None = None
    # Decode batches up to this size count as CUDA-graph passes; None = --max-concurrency, so
    # the default stack never decodes "eagerly" (sglang:cuda_graph_passes_total).
    cuda_graph_max_bs: int | None = None
    # MTP speculative decoding: None = off; else the mean tokens one decode step (one verify
    # pass) delivers, 1 .. spec_num_draft_tokens (SGLang's acceptance length).
    spec_accept_length: float | None = None
    spec_num_draft_tokens: int = 4  # tokens one verify pass scores per request (steps + 1)

    def __post_init__(self) -> None:
        problems = []
        # isfinite as well: inf would sleep forever, nan compares false and slips past >= 0.
        if not (self.tpot_ms > 0 and math.isfinite(self.tpot_ms)):
            problems.append("--tpot-ms must be > 0 and finite")
        if not (self.ttft_ms >= 0 and math.isfinite(self.ttft_ms)):
            problems.append("--ttft-ms must be >= 0 and finite")
        for flag, value in (
            ("--health-delay-s", self.health_delay_s),
            ("--startup-delay-s", self.startup_delay_s),
        ):
            if not (value >= 0 and math.isfinite(value)):
                problems.append(f"{flag} must be >= 0 and finite")
        if not 0 <= self.port <= 65535:
            problems.append(f"--port must be 0-65535 (0 picks a free one), not {self.port}")
        if self.tokens_per_chunk < 1:
            problems.append("--tokens-per-chunk must be >= 1")
        if self.max_concurrency < 1:
            problems.append("--max-concurrency must be >= 1")
        if self.max_total_tokens < 1:
            problems.append("--max-total-tokens must be >= 1")
        if self.context_length < 2:
            problems.append("--context-length must be >= 2")
        if self.tp_size < 1:
            problems.append("--tp-size must be >= 1")
        if self.decode_log_interval < 1:
            problems.append("--decode-log-interval must be >= 1")
        if self.cuda_graph_max_bs is not None and self.cuda_graph_max_bs < 1:
            problems.append("--cuda-graph-max-bs must be >= 1")
        if self.spec_num_draft_tokens < 2:
            problems.append("--speculative-num-draft-tokens must be >= 2 (1 + the drafts)")
        if self.spec_accept_length is not None:
            accept, draft = self.spec_accept_length, self.spec_num_draft_tokens
            if not (math.isfinite(accept) and 1 <= accept <= draft):
                problems.append(
                    "--speculative-accept-length must be between 1 and "
                    f"--speculative-num-draft-tokens ({draft}), not {accept:g}"
                )
            if self.tokens_per_chunk != 1:
                problems.append(
                    "--tokens-per-chunk and --speculative-accept-length both set the tokens per "
                    "chunk: give one of them"
                )
        if self.served_model_name is not None and ":" in self.served_model_name:
            # The real server refuses it too: ':' is the LoRA separator.
            problems.append("--served-model-name cannot contain a colon (':')")
        if problems:
            raise ValueError("; ".join(problems))

    @property
    def model_name(self) -> str:
        """Like SGLang: served_model_name defaults to model_path."""
        return self.served_model_name or self.model_path

    @property
    def speculative(self) -> bool:
        """Emulating MTP speculative decoding (SGLang's EAGLE with the model's NextN layer)."""
        return self.spec_accept_length is not None

    def step_tokens(self, step: int) -> int:
        """Tokens the `step`-th decode step (0-based) of a request delivers: K without MTP; with
        MTP, floor((step + 1) A) - floor(step A), so every step accepts a whole number of
        tokens next to A (2 and 3 for 2.5) and any run of steps averages A (deterministic: a
        test knows what each request gets)."""
        if self.spec_accept_length is None:
            return self.tokens_per_chunk
        a = self.spec_accept_length
        return math.floor((step + 1) * a + 1e-9) - math.floor(step * a + 1e-9)

    @property
    def graph_max_bs(self) -> int:
        return (
            self.cuda_graph_max_bs if self.cuda_graph_max_bs is not None else self.max_concurrency
        )

    @property
    def tpot_s(self) -> float:
        return self.tpot_ms / 1000.0

    @property
    def ttft_s(self) -> float:
        return self.ttft_ms / 1000.0

    @property
    def fp8_gather(self) -> str:
        """Patch state the demo dashboard shows: only the 'patched' model is the gather path."""
        return "on" if self.cost_model.mode == "patched" else "off"


class _Parser(argparse.ArgumentParser):
    def error(self, message: str) -> NoReturn:
        # One line, like the launcher and the exporter (argparse prints its usage block first).
        self.exit(2, f"{self.prog}: error: {message} (see --help)\n")


def build_parser() -> argparse.ArgumentParser:
    p = _Parser(
        prog="python -m glmserve.emulator",
        description=f"SGLang {sglang_api.SGLANG_VERSION} protocol emulator with controlled timing "
        "(a test instrument, not a serving engine).",
    )
    p.add_argument("--host", default="127.0.0.1")
    p.add_argument("--port", type=int, default=30000, help="0 picks a free port (printed)")
    p.add_argument("--tpot-ms", type=float, required=True, help="time per output token")
    p.add_argument("--ttft-ms", type=float, required=True, help="time to first token")
    p.add_argument("--tokens-per-chunk", type=int, default=1, help="tokens per SSE chunk (K)")
    p.add_argument(
        "--max-concurrency",
        type=int,
        default=256,
        help="running requests; more wait in the queue (SGLang's --max-running-requests)",
    )
    p.add_argument("--model-path", default=DEFAULT_MODEL_PATH)
    p.add_argument("--served-model-name", default=None, help="default: the model path")
    p.add_argument(
        "--max-total-tokens",
        type=int,
        default=DEFAULT_MAX_TOTAL_TOKENS,
        help="KV pool size in tokens (sglang:max_total_num_tokens)",
    )
    p.add_argument("--context-length", type=int, default=DEFAULT_CONTEXT_LENGTH)
    p.add_argument("--kv-cache-dtype", default="fp8_e4m3")
    p.add_argument("--attention-backend", default="flashinfer")
    p.add_argument("--tp-size", type=int, default=8)
    p.add_argument(
        "--role-chunk",
        action=argparse.BooleanOptionalAction,
        default=True,
        help="send SGLang's role-only first delta in chat streams (default on)",
    )
    p.add_argument(
        "--enable-cache-report",
        action="store_true",
        help="OpenAI routes report prefix-cache hits in usage.prompt_tokens_details, like "
        "SGLang's flag of that name",
    )
    p.add_argument(
        "--cost-model",
        choices=MODES,
        default="off",
        help="decode-cost MODEL on top of --tpot-ms: upstream full-pool cast, patched gather, "
        "or bf16 (no cast); off = constant TPOT",
    )
    p.add_argument("--layers", type=int, default=GLM5_LAYERS, help="layers for the cost model")
    p.add_argument(
        "--pool-tokens",
        type=int,
        default=None,
        help="pool rows the upstream cast walks (default: --max-total-tokens)",
    )
    p.add_argument(
        "--gather-tbps",
        type=float,
        default=GATHER_BYTES_PER_S / 1e12,
        help="gather-cast bandwidth of the patched model in TB/s (the lab kernel: 3.5)",
    )
    p.add_argument("--eos-token-id", type=int, default=DEFAULT_EOS_TOKEN_ID)
    p.add_argument(
        "--health-delay-s",
        type=float,
        default=1.0,
        help="/health and /health_generate answer after this long, like the real server's "
        "1 s poll of a 1-token generation",
    )
    p.add_argument(
        "--startup-delay-s",
        type=float,
        default=0.0,
        help="answer 503 on /health* for this long after start (model loading)",
    )
    p.add_argument("--decode-log-interval", type=int, default=40)
    p.add_argument(
        "--cuda-graph-max-bs",
        type=int,
        default=None,
        help="decode batches above this count as passes without CUDA graphs "
        "(sglang:cuda_graph_passes_total{mode=decode_none}); default: --max-concurrency",
    )
    p.add_argument(
        "--speculative-accept-length",
        type=float,
        default=None,
        metavar="A",
        help="emulate MTP speculative decoding: each decode step (one verify pass) delivers A "
        "tokens on average as one SSE chunk, and the spec metrics, /server_info and /generate's "
        "meta_info say so as SGLang's do (default, or 0: off)",
    )
    p.add_argument(
        "--speculative-num-draft-tokens",
        type=int,
        default=4,
        metavar="D",
        help="with MTP: tokens one verify pass scores per request, 1 + the drafts (SGLang's "
        "flag; the GLM-5 recipes' 4); A is at most D",
    )
    p.add_argument(
        "--build-info-file",
        default=None,
        help="write glmserve build info (source=emulator, fp8_gather per --cost-model) here",
    )
    p.add_argument(
        "--log-level",
        default="warning",
        type=str.lower,
        choices=("debug", "info", "warning", "error", "critical"),
    )
    return p


def config_from_args(ns: argparse.Namespace) -> EmulatorConfig:
    cost = DecodeCostModel(
        mode=ns.cost_model,
        layers=ns.layers,
        pool_rows=ns.pool_tokens if ns.pool_tokens is not None else ns.max_total_tokens,
        gather_bytes_per_s=ns.gather_tbps * 1e12,
    )
    return EmulatorConfig(
        tpot_ms=ns.tpot_ms,
        ttft_ms=ns.ttft_ms,
        tokens_per_chunk=ns.tokens_per_chunk,
        max_concurrency=ns.max_concurrency,
        host=ns.host,
        port=ns.port,
        model_path=ns.model_path,
        served_model_name=ns.served_model_name,
        max_total_tokens=ns.max_total_tokens,
        context_length=ns.context_length,
        kv_cache_dtype=ns.kv_cache_dtype,
        attention_backend=ns.attention_backend,
        tp_size=ns.tp_size,
        role_chunk=ns.role_chunk,
        enable_cache_report=ns.enable_cache_report,
        cost_model=cost,
        eos_token_id=ns.eos_token_id,
        health_delay_s=ns.health_delay_s,
        startup_delay_s=ns.startup_delay_s,
        decode_log_interval=ns.decode_log_interval,
        build_info_file=ns.build_info_file,
        cuda_graph_max_bs=ns.cuda_graph_max_bs,
        # 0 is off too: compose passes its default that way.
        spec_accept_length=ns.speculative_accept_length or None,
        spec_num_draft_tokens=ns.speculative_num_draft_tokens,
    )


def parse_config(argv: Sequence[str] | None = None) -> tuple[EmulatorConfig, argparse.Namespace]:
    """Parse argv; a bad value exits 2 with one clear line (argparse's convention)."""
    parser = build_parser()
    ns = parser.parse_args(argv)
    try:
        return config_from_args(ns), ns
    except ValueError as exc:
        parser.error(str(exc))
        raise  # unreachable: parser.error exits
