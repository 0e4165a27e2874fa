"""Which FP8 decode path is faster on this GPU: native FP8 decode or gather-then-cast + FlashInfer.

Part of the start-up self-test (GPU, torch): after both paths have proven correct, each is timed
per layer on the box itself, the way the server runs decode (one CUDA graph holding several
layers, each its own pool larger than L2, replayed; median), at the decode batch sizes the
launcher passes in (1 and the largest captured batch) and the model's heads per rank. The
launcher serves with the faster one unless an operator pinned the path
(``glmserve.switches.FP8_ATTENTION``).

We time on the target instead of trusting a table: the native kernel's launch configurations
were measured on an H200 (SM90); on an RTX PRO 6000 (SM120) or a B200 (SM100) either path may
win, and the server should not pay for our lab's choice.

The shape comes from the environment (set by the launcher; the defaults suit a bare ``python -m
glmserve.selftest``): ``glmserve.switches.SELFTEST_HEADS`` (heads per rank, default 16),
``SELFTEST_DECODE_BATCHES`` (default 1 and 16) and, under MTP, ``SELFTEST_VERIFY_TOKENS`` (the
query tokens of a target verify pass): the native kernel serves verify as well as decode, so both
paths are then also timed on verify at the same batches (causal, as SGLang plans it), and the
total over decode and verify decides.
"""

from __future__ import annotations

import math
import os
import statistics
from collections.abc import Callable
from types import ModuleType
from typing import Any

from glmserve.switches import SELFTEST_DECODE_BATCHES, SELFTEST_HEADS, SELFTEST_VERIFY_TOKENS

CONTEXT = 2048  # tokens per request: a typical decode context
LAYERS = 4  # distinct pools per graph, so that L2 does not serve the second layer
POOL_ROWS = 262_144  # 151 MB of FP8 rows per pool: several times an H200's or B200's L2
REPLAYS = 25
CKV, KPE = 512, 64
SM_SCALE = 1.0 / math.sqrt(192 + KPE)  # GLM-5: qk_nope 192 + rope 64


def requested_shape(env: dict[str, str] | None = None) -> tuple[int, tuple[int, ...]]:
    """(heads per rank, decode batch sizes) to time, from the environment (SwitchError on
    anything that is not positive integers)."""
    env = dict(os.environ) if env is None else env
    (heads,) = SELFTEST_HEADS.read(env)
    return heads, tuple(sorted(set(SELFTEST_DECODE_BATCHES.read(env))))


def requested_verify_tokens(env: dict[str, str] | None = None) -> int:
    """Query tokens per request of a target verify pass to time (0: no speculation)."""
    env = dict(os.environ) if env is None else env
    tokens = SELFTEST_VERIFY_TOKENS.read(env)
    return tokens[0] if tokens else 0


def faster_path(native_us: list[float], gather_us: list[float]) -> str:
    """The path with the smaller total time over the timed batches (each batch weighs its µs,
    so the loaded batch, where the time goes, counts most); ties go to native."""
    return "native" if sum(native_us) <= sum(gather_us) else "gather"


def time_decode_paths(
    torch: Any,
    flashinfer: Any,
    gather: ModuleType,
    native: ModuleType,
    device: Any,
    heads: int,
    batches: tuple[int, ...],
    seed: int = 0,
    verify_tokens: int = 0,
) -> dict[str, Any]:
    """Per-layer µs of both paths at each decode batch (and, with `verify_tokens`, each target
    verify batch of that many causal query tokens per request), and which is faster."""
    gen = torch.Generator(device=device).manual_seed(seed)
    pools = [
        torch.randn((POOL_ROWS, 1, CKV + KPE), device=device, generator=gen).to(torch.float8_e4m3fn)
        for _ in range(LAYERS)
    ]
    shadow = torch.empty(pools[0].shape, dtype=torch.bfloat16, device=device)
    rows = torch.zeros(1, dtype=torch.int32, device=device)
    workspace = torch.empty(128 << 20, dtype=torch.uint8, device=device)
    result: dict[str, Any] = {
        "heads": heads, "context": CONTEXT, "batches": list(batches),
        "native_us": [], "gather_us": [], "verify_tokens": verify_tokens,
        "verify_native_us": [], "verify_gather_us": [],
    }  # fmt: skip
    shapes = [(batch, 1) for batch in batches]
    # Above the kernel's VERIFY_MAX_HEADS speculative batches take gather on either path: no choice.
    verify = verify_tokens > 1 and heads <= getattr(native, "VERIFY_MAX_HEADS", heads)
    shapes += [(batch, verify_tokens) for batch in batches if verify]
    for batch, tokens in shapes:
        indptr = torch.arange(batch + 1, dtype=torch.int32, device=device) * CONTEXT
        qo = torch.arange(batch + 1, dtype=torch.int32, device=device) * tokens
        idx = torch.randint(0, POOL_ROWS, (batch * CONTEXT,), dtype=torch.int32, device=device,
                            generator=gen)  # fmt: skip
        q = torch.randn(batch * tokens, heads, CKV, device=device, generator=gen).bfloat16()
        q_pe = torch.randn(batch * tokens, heads, KPE, device=device, generator=gen).bfloat16()
        out = torch.empty_like(q)
        rows.fill_(batch * CONTEXT)
        # What SGLang's wrappers run: FlashInfer's "auto" backend (fa3 on SM90, fa2 where fa3
        # does not exist), causal for a verify pass.
        wrapper = flashinfer.mla.BatchMLAPagedAttentionWrapper(workspace, backend="auto")
        wrapper.plan(qo, indptr, idx, indptr[1:] - indptr[:-1], heads, CKV, KPE, 1, tokens > 1,
                     SM_SCALE, torch.bfloat16, torch.bfloat16)  # fmt: skip
        extra = {} if tokens == 1 else {"qo_indptr": qo, "max_q_len": tokens}

        def native_step(q=q, q_pe=q_pe, out=out, indptr=indptr, idx=idx, extra=extra):
            for pool in pools:
                native.mla_decode_fp8(q, q_pe, pool, indptr, idx, SM_SCALE, out, **extra)

        def gather_step(q=q, q_pe=q_pe, out=out, idx=idx, wrapper=wrapper):
            for pool in pools:
                kv = gather.gather_cast(pool, idx, rows, shadow)
                wrapper.run(q, q_pe, kv[:, :, :CKV], kv[:, :, CKV:], out=out)

        prefix = "" if tokens == 1 else "verify_"
        result[f"{prefix}native_us"].append(round(graph_us(torch, native_step) / LAYERS, 2))
        result[f"{prefix}gather_us"].append(round(graph_us(torch, gather_step) / LAYERS, 2))
    result["faster"] = faster_path(
        result["native_us"] + result["verify_native_us"],
        result["gather_us"] + result["verify_gather_us"],
    )
    return result


def graph_us(torch: Any, step: Callable[[], None]) -> float:
    """Median µs of replaying one CUDA graph of `step` (captured after an eager warm-up)."""
    step()
    torch.cuda.synchronize()
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        step()
    start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
    times = []
    for _ in range(REPLAYS):
        start.record()
        graph.replay()
        end.record()
        end.synchronize()
        times.append(start.elapsed_time(end) * 1e3)
    return statistics.median(times)


def summary(timing: dict[str, Any]) -> str:
    """One line: each batch's µs per layer for both paths (decode, then verify under MTP), and
    the faster one."""
    cells = [
        f"batch {b}: native {n:.1f} µs, gather {g:.1f} µs"
        for b, n, g in zip(timing["batches"], timing["native_us"], timing["gather_us"], strict=True)
    ]
    tokens = timing.get("verify_tokens", 0)
    cells += [
        f"verify {b}x{tokens}: native {n:.1f} µs, gather {g:.1f} µs"
        for b, n, g in zip(
            timing["batches"], timing.get("verify_native_us", []),
            timing.get("verify_gather_us", []), strict=False,
        )
    ]  # fmt: skip
    return (
        f"{timing['heads']} heads, {timing['context']} tokens per request, per layer: "
        + "; ".join(cells) + f"; faster: {timing['faster']}"
    )  # fmt: skip
