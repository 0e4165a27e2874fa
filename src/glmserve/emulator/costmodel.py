"""A MODEL of the decode-step cost of FP8-KV MLA attention, upstream cast versus patched gather.

This is arithmetic on lab numbers, not a measurement: it lets a no-GPU demo show the shape of
the patch's effect on dashboards and load tests. Every constant is from one lab table, measured
before this repository's own benchmarks (H200, FlashInfer fa2 MLA, 16 heads, FP8 pool
495,552 x 576, CUDA-graph replay, median us per layer); docs/emulator.md ("The decode cost
MODEL") lists it, and bench/results/gather-cast-h200-2026-11-29.md has the project's own
measurement of the same kernels:

- upstream: `get_key_buffer(...).to(bf16)` casts the WHOLE pool on every layer of every step:
  826 us per layer at 495,552 rows (~1 TB/s, compute-bound), proportional to the pool's rows,
  plus attention over the active tokens.
- patched: gather-then-cast of only the active rows at ~3.5 TB/s, bytes = rows * 576 * 3
  (1 byte FP8 read + 2 bytes BF16 write), plus a small launch cost, plus attention.
- bf16: a BF16 pool needs no cast: attention only.

Attention cost is interpolated piecewise-linearly in the number of active tokens (the sum of
all running requests' sequence lengths) through the lab's "BF16 KV, no cast" column. The model
ignores everything else in a step (MoE, GEMMs, communication): that is what --tpot-ms stands for
when the model is on, so one token's step time is  tpot + layers * per_layer(active tokens).
"""

from __future__ import annotations

import bisect
import math
from dataclasses import dataclass

MODES = ("off", "upstream", "patched", "bf16")

# Lab table: full-pool FP8->BF16 cast per layer at 495,552 rows.
UPSTREAM_CAST_US = 826.0
UPSTREAM_CAST_ROWS = 495_552
# Lab table: the fused Triton gather-cast reached 3.5 TB/s.
GATHER_BYTES_PER_S = 3.5e12
ROW_DIMS = 576  # kv_lora_rank 512 + qk_rope 64
GATHER_BYTES_PER_ROW = ROW_DIMS * 3  # read 1 B (FP8) + write 2 B (BF16) per element
# Fit to the 1 x 512 row of the lab table: fused 17.3 us - attention 14.4 us - 0.25 us of bytes.
GATHER_LAUNCH_US = 2.6
# Lab table, "BF16 KV, no cast" column: (active tokens, us per layer).
ATTENTION_POINTS: tuple[tuple[int, float], ...] = (
    (512, 14.4),  # 1 x 512
    (65_536, 76.2),  # 1 x 65536
    (131_072, 83.9),  # 64 x 2048
    (448_000, 259.5),  # 64 x 7000
)
GLM5_LAYERS = 78  # GLM-5-NVFP4 has 78 layers (num_hidden_layers in its config.json)


def attention_us(active_tokens: int) -> float:
    """Per-layer attention time, interpolated; flat below the smallest point (launch-bound),
    extended with the last segment's slope above the largest."""
    xs = [p[0] for p in ATTENTION_POINTS]
    ys = [p[1] for p in ATTENTION_POINTS]
    if active_tokens <= xs[0]:
        return ys[0]
    i = bisect.bisect_left(xs, active_tokens)
    if i >= len(xs):
        i = len(xs) - 1
    x0, x1, y0, y1 = xs[i - 1], xs[i], ys[i - 1], ys[i]
    return y0 + (y1 - y0) * (active_tokens - x0) / (x1 - x0)


def upstream_cast_us(pool_rows: int) -> float:
    return UPSTREAM_CAST_US * pool_rows / UPSTREAM_CAST_ROWS


def gather_us(rows: int, bytes_per_s: float = GATHER_BYTES_PER_S) -> float:
    return GATHER_LAUNCH_US + rows * GATHER_BYTES_PER_ROW / bytes_per_s * 1e6


@dataclass(frozen=True)
class DecodeCostModel:
    """Step-time model; `mode` off means a constant TPOT."""

    mode: str = "off"
    layers: int = GLM5_LAYERS
    pool_rows: int = UPSTREAM_CAST_ROWS
    gather_bytes_per_s: float = GATHER_BYTES_PER_S

    def __post_init__(self) -> None:
        if self.mode not in MODES:
            raise ValueError(f"cost model must be one of {MODES}, not {self.mode!r}")
        values = (self.layers, self.pool_rows, self.gather_bytes_per_s)
        if not all(v > 0 and math.isfinite(v) for v in values):
            raise ValueError("layers, pool rows and gather bandwidth must be positive and finite")

    @property
    def enabled(self) -> bool:
        return self.mode != "off"

    def per_layer_us(self, active_tokens: int) -> float:
        """Attention (+ cast or gather) of one layer for this many active tokens."""
        if self.mode == "off":
            return 0.0
        attn = attention_us(active_tokens)
        if self.mode == "upstream":
            return upstream_cast_us(self.pool_rows) + attn
        if self.mode == "patched":
            return gather_us(active_tokens, self.gather_bytes_per_s) + attn
        return attn  # bf16

    def extra_step_s(self, active_tokens: int) -> float:
        """What the model adds to one decode step, in seconds (all layers)."""
        return self.layers * self.per_layer_us(active_tokens) * 1e-6
