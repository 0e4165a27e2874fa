"""Startup check of the native FP8 decode kernel (fp8_mla_decode.py) on the target GPU.

The native kernel is not bit-identical to the upstream path (it is a different attention
kernel), so it is held to a tolerance: on fresh real-valued FP8 pools, its largest per-row
relative error against fp64 attention on the same FP8 values must be no worse than 1.5x that
of FlashInfer on the BF16 cast (the upstream path), or within bf16 rounding of the output.
Every output element is NaN-poisoned first and must be written; empty requests must be zero;
one CUDA graph is captured once and replayed with other lengths and slots.

`inject` names a deliberate fault (used to show the check refuses a wrong kernel):
  drop-last-token  each request attends to one slot fewer than it should.
Run by glmserve.selftest in its GPU child; a failure there switches the server to
the gather path (glmserve.switches.FP8_ATTENTION) instead of refusing to serve.
"""

from __future__ import annotations

import math
from collections.abc import Callable
from pathlib import Path
from types import ModuleType
from typing import Any

NATIVE_REL = Path("srt", "layers", "attention", "fp8_mla_decode.py")
FAULTS = ("drop-last-token",)
BAR = 1.5
BF16_ROUNDING = 2.0**-8  # rounding a vector to bf16 can cost this much of its norm
HEADS = 16
SM_SCALE = 1.0 / math.sqrt(192 + 64)


class NativeCheckFailure(AssertionError):
    """The native kernel computed something other than attention on this GPU."""


def kernel_under_test(module: ModuleType, inject: str | None) -> Callable[..., Any]:
    """module.mla_decode_fp8, or a deliberately wrong variant of it."""
    if inject is None:
        return module.mla_decode_fp8
    if inject not in FAULTS:
        raise ValueError(f"unknown fault {inject!r} (known: {', '.join(FAULTS)})")

    def drop_last_token(q_nope, q_pe, pool, kv_indptr, kv_indices, sm_scale, out, **kw):
        shorter = kv_indptr.clone()
        shorter[1:] = (kv_indptr[1:] - 1).clamp_min(kv_indptr[:-1])
        return module.mla_decode_fp8(q_nope, q_pe, pool, shorter, kv_indices, sm_scale, out, **kw)

    return drop_last_token


def _pool(torch: Any, rows: int, device: Any, gen: Any) -> Any:
    return (torch.randn((rows, 1, 576), device=device, generator=gen)).to(torch.float8_e4m3fn)


def fp64_decode_attention(
    torch: Any, q_nope, q_pe, pool, kv_indptr, kv_indices, sm_scale: float = SM_SCALE
) -> Any:
    """The definition: MLA decode attention in fp64 on the pool's FP8 values (one query token
    per request; an empty request gives zeros). The oracle of the self-test, bench and tests."""
    kv = pool.view(pool.shape[0], 576)
    bounds = kv_indptr.tolist()
    out = torch.zeros(q_nope.shape, dtype=torch.float64, device=q_nope.device)
    for b in range(q_nope.shape[0]):
        rows = kv[kv_indices[bounds[b] : bounds[b + 1]].long()].double()
        if rows.shape[0]:
            q = torch.cat([q_nope[b], q_pe[b]], dim=-1).double()
            out[b] = torch.softmax((q @ rows.T) * sm_scale, dim=-1) @ rows[:, :512]
    return out


def fp64_causal_attention(
    torch: Any, q_nope, q_pe, pool, qo_indptr, kv_indptr, kv_indices, sm_scale: float = SM_SCALE
) -> Any:
    """The definition with several query tokens per request (speculative target verify, draft
    extend), in fp64: request b's token t of q_len sees its slot positions 0 .. kv_len - q_len
    + t (causal, aligned to the end); a token no request owns, or of an empty request, is zeros."""
    kv = pool.view(pool.shape[0], 576)
    kv_bounds, q_bounds = kv_indptr.tolist(), qo_indptr.tolist()
    out = torch.zeros(q_nope.shape, dtype=torch.float64, device=q_nope.device)
    for b in range(len(q_bounds) - 1):
        rows = kv[kv_indices[kv_bounds[b] : kv_bounds[b + 1]].long()].double()
        q_len = q_bounds[b + 1] - q_bounds[b]
        for t in range(q_len):
            seen = rows[: rows.shape[0] - q_len + t + 1]
            if seen.shape[0]:
                token = q_bounds[b] + t
                q = torch.cat([q_nope[token], q_pe[token]], dim=-1).double()
                out[token] = torch.softmax((q @ seen.T) * sm_scale, dim=-1) @ seen[:, :512]
    return out


def _worst_row_error(torch: Any, out, ref, lens: list[int]) -> float:
    live = torch.tensor(lens, device=out.device) > 0
    o, r = out.double()[live], ref[live]
    return float(((o - r).norm(dim=-1) / r.norm(dim=-1)).max())


def run_native_checks(
    torch: Any,
    module: ModuleType,
    upstream: Callable[..., Any],
    *,
    device: Any,
    seed: int,
    pool_rows: int = 65_537,
    inject: str | None = None,
    heads: int = HEADS,
) -> list[str]:
    """One line per passed case; raises NativeCheckFailure on the first wrong one.

    `upstream(q_nope, q_pe, bf16_kv, kv_indptr, kv_indices, out)` runs FlashInfer on the cast.
    """
    kernel = kernel_under_test(module, inject)
    gen = torch.Generator(device=device).manual_seed(seed)
    pool = _pool(torch, pool_rows, device, gen)
    cast = pool.to(torch.bfloat16)
    lines = []
    worst_upstream = 0.0
    cases = [
        ("decode, mixed lengths", [1, 37, 1500, 4096]),
        ("decode, one long request", [20_000]),
        ("decode, duplicate slots (shared prefix)", [900, 900, 900]),
    ]
    for name, lens in cases:
        batch = len(lens)
        indptr = torch.zeros(batch + 1, dtype=torch.int32, device=device)
        indptr[1:] = torch.tensor(lens, device=device).cumsum(0)
        total = int(indptr[-1])
        idx = torch.randint(0, pool_rows, (total,), dtype=torch.int32, device=device, generator=gen)
        if name.startswith("decode, duplicate"):
            idx[900:] = idx[:900].repeat(2)
        idx[total // 2] = pool_rows - 1
        q_nope = torch.randn(batch, heads, 512, device=device, generator=gen).bfloat16()
        q_pe = torch.randn(batch, heads, 64, device=device, generator=gen).bfloat16()
        ref = fp64_decode_attention(torch, q_nope, q_pe, pool, indptr, idx)
        out = torch.full_like(q_nope, float("nan"))
        kernel(q_nope, q_pe, pool, indptr, idx, SM_SCALE, out)
        if not bool(torch.isfinite(out).all()):
            raise NativeCheckFailure(f"{name}: output not fully written (NaN left)")
        up = torch.full_like(q_nope, float("nan"))
        upstream(q_nope, q_pe, cast, indptr, idx, up)
        err, err_up = (_worst_row_error(torch, o, ref, lens) for o in (out, up))
        if err > max(BAR * err_up, BF16_ROUNDING):
            raise NativeCheckFailure(
                f"{name}: max row error {err:.2e} vs fp64, upstream {err_up:.2e} (bar {BAR}x)"
            )
        lines.append(f"{name}: {err:.1e} (upstream {err_up:.1e})")
        worst_upstream = max(worst_upstream, err_up)
    lines.append(_graph_case(torch, kernel, pool, device, gen, worst_upstream, heads))
    return lines


def _graph_case(
    torch: Any, kernel: Callable[..., Any], pool, device, gen, worst_upstream: float, heads: int
) -> str:
    """Captured once at batch 4, replayed with other lengths (0 included) and slots."""
    batch, cap = 4, 9000
    indptr = torch.zeros(batch + 1, dtype=torch.int32, device=device)
    idx = torch.zeros(batch * cap, dtype=torch.int32, device=device)
    q_nope = torch.empty(batch, heads, 512, dtype=torch.bfloat16, device=device)
    q_pe = torch.empty(batch, heads, 64, dtype=torch.bfloat16, device=device)
    out = torch.empty_like(q_nope)

    def load(lens: list[int]) -> None:
        indptr[1:] = torch.tensor(lens, device=device).cumsum(0)
        idx.random_(0, pool.shape[0], generator=gen)
        q_nope.normal_(generator=gen)
        q_pe.normal_(generator=gen)

    def step() -> None:
        kernel(q_nope, q_pe, pool, indptr, idx, SM_SCALE, out)

    load([8, 8, 8, 8])
    step()  # eager first: the Triton compile and the workspace, outside the capture
    torch.cuda.synchronize()
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        step()
    worst = 0.0
    for lens in ([1, 2, 3, 4], [9000, 0, 17, 4000], [300, 300, 300, 300]):
        load(lens)
        out.fill_(float("nan"))
        graph.replay()
        torch.cuda.synchronize()
        empty = torch.tensor(lens, device=device) == 0
        if not bool(torch.isfinite(out).all()) or not bool((out[empty] == 0).all()):
            raise NativeCheckFailure(f"CUDA graph replay {lens}: output not written as defined")
        ref = fp64_decode_attention(torch, q_nope, q_pe, pool, indptr, idx[: sum(lens)])
        worst = max(worst, _worst_row_error(torch, out, ref, lens))
    # No FlashInfer inside the graph: the bar is the worst upstream error of the eager cases.
    if worst > max(BAR * worst_upstream, BF16_ROUNDING):
        raise NativeCheckFailure(f"CUDA graph replays: max row error {worst:.2e} vs fp64")
    return f"CUDA graph captured once, 3 replays with new lengths/slots: {worst:.1e}"
