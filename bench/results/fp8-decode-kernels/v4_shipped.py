"""Native FP8 MLA decode attention (added by the glmserve patch series).

FlashInfer's fa2 MLA kernel (SM120's family) reads only 16-bit KV, so with an FP8 KV cache the
gather-then-cast path (``fp8_kv_gather.py``) first writes a BF16 copy of every row the step
reads, and FlashInfer then reads that copy: 5 bytes moved per KV element against 2 for a BF16
pool. This kernel reads the FP8 e4m3 pool itself, 1 byte per element, through the step's
``kv_indptr``/``kv_indices`` (the buffers FlashInfer plans with) and writes what
``decode_wrapper.run`` writes. Decode only: prefill/extend stay on gather-then-cast + FlashInfer.

Design (flash-decoding):
  * stage 1, grid (head groups, requests, splits): one program owns BLOCK_H heads of one
    request and one contiguous slice of its KV. MLA's latent row is shared by every head, so
    each FP8 tile is loaded and converted once for all BLOCK_H heads' QK and PV products
    (tensor-core dots, fp32 accumulation, online softmax in the exp2 domain). With one split
    the program writes the bf16 output; otherwise its normalised partial and log-sum-exp;
  * stage 2, grid (requests, heads, 512 / MERGE_BLOCK_D): merges the splits by log-sum-exp.

Numerics: q is not quantized. The tensor cores take fp16 (e4m3 -> fp16 is exact and one
instruction per two values; e4m3 -> bf16 needs a second conversion per value, which made an
earlier version conversion-bound). Each (request, head) row of q is first scaled by a power of
two that puts its largest |value| in [2^14, 2^15): every bf16 value within 2^31 of that maximum
is then exact in fp16, and the scale is undone in the softmax exponent. Softmax weights go to
the PV product as fp16 scaled by 2^15 (more mantissa than the bf16 weights FlashInfer uses).

CUDA graphs: the grid depends only on the batch size and head count (fixed per captured
graph); request lengths and split bounds are computed on the device from ``kv_indptr``; the
partial-result workspace is allocated once per device, never inside a capture; nothing is
allocated per call and nothing syncs with the host. The split count is chosen on the host from
the batch size; on the device a split never takes fewer than ``min_chunk`` rows, so short
requests use fewer splits and the spare programs exit at once.

``GLMSERVE_FP8_ATTENTION=native`` (default) or ``gather`` chooses the decode path when the
patch is on; ``GLMSERVE_FP8_GATHER=0`` switches the whole series off (upstream cast).
"""

from __future__ import annotations

import logging
import os
import weakref
from dataclasses import dataclass
from typing import Any, Optional

import torch
import triton
import triton.language as tl

logger = logging.getLogger(__name__)

ENV_MODE = "GLMSERVE_FP8_ATTENTION"
MODES = ("native", "gather")
DEFAULT_MODE = "native"

D_LATENT = 512  # kv_lora_rank: the latent part of a row, which is also V
D_ROPE = 64  # qk_rope_head_dim
LOG2E = 1.4426950408889634
P_SCALE = tl.constexpr(32768.0)  # softmax weights are in (0, 1]: x 2^15 stays below fp16's max
BLOCK_H = 16  # heads per program: the smallest tensor-core M; fewer heads are masked
MAX_SPLITS = 256
MERGE_BLOCK_D = 128
MERGE_BLOCK_S = 16
# Programs the split count is computed for when the tensors are not on a GPU (interpreter).
INTERPRETER_SMS = 4


@dataclass(frozen=True)
class LaunchConfig:
    block_n: int  # KV rows per tile
    num_warps: int
    num_stages: int  # software-pipelining depth of the tile loads
    programs_per_sm: int  # stage-1 programs aimed for per SM when choosing the split count
    min_chunk: int = 64  # fewest KV rows a split takes


# Measured on an H200 with bench/fp8_decode.py (bench/results/fp8-decode-h200-2026-12-01.md);
# every configuration computes the same function, these were the fastest.
CONFIG_SMALL_BATCH_WIDE = LaunchConfig(block_n=64, num_warps=8, num_stages=2, programs_per_sm=1)
CONFIG_SMALL_BATCH = LaunchConfig(block_n=32, num_warps=4, num_stages=3, programs_per_sm=2)
CONFIG_LARGE_BATCH = LaunchConfig(block_n=32, num_warps=4, num_stages=3, programs_per_sm=4)
CONFIG_INTERPRETER = LaunchConfig(block_n=16, num_warps=4, num_stages=1, programs_per_sm=1)
SMALL_BATCH = 16  # batches up to this size take the small-batch configuration
# 64-row tiles take ~130 KB of shared memory per program: SM90/SM100 offer 227 KB, SM120
# (RTX PRO 6000) 99 KB, where the 32-row configuration (~74 KB) runs instead.
WIDE_TILE_SHARED_BYTES = 132 * 1024


@triton.jit
def _e4m3_to_f16(raw, ASM_CVT: tl.constexpr):
    if ASM_CVT:
        return tl.inline_asm_elementwise(
            asm="{ .reg .b16 lo, hi; mov.b32 {lo, hi}, $2; "
            "cvt.rn.f16x2.e4m3x2 $0, lo; cvt.rn.f16x2.e4m3x2 $1, hi; }",
            constraints="=r,=r,r",
            args=[raw],
            dtype=tl.float16,
            is_pure=False,
            pack=4,
        )
    return raw.to(tl.float8e4nv, bitcast=True).to(tl.float16)


@triton.jit
def _attend_tile(
    off,
    hi,
    m_i,
    l_i,
    acc0,
    acc1,
    acc2,
    acc3,
    q0,
    q1,
    q2,
    q3,
    q_pe,
    kv_ptr,
    kv_indices_ptr,
    kv_start,
    n_pool_rows,
    stride_kv,
    qk_scale,
    BLOCK_N: tl.constexpr,
    D_BLK: tl.constexpr,
    D_PE: tl.constexpr,
    ASM_CVT: tl.constexpr,
):
    """One BLOCK_N-row tile of one request's KV: the online-softmax update for BLOCK_H heads.

    The 512 latent columns are handled as four D_BLK-wide blocks with their own q slice,
    tile load and accumulator: four independent tensor-core chains instead of one long one
    (a single [H, 576] x [576, N] product is a chain of 36 dependent MMAs per warp).
    """
    pos = off + tl.arange(0, BLOCK_N)
    live = pos < hi
    slot = tl.load(kv_indices_ptr + kv_start + pos, mask=live, other=0)
    # Never read outside the pool, whatever the index buffer holds.
    live = live & (slot >= 0) & (slot < n_pool_rows)
    row = kv_ptr + slot.to(tl.int64)[:, None] * stride_kv
    cols = tl.arange(0, D_BLK)[None, :]
    mask = live[:, None]
    # e4m3 -> fp16 is exact and one instruction per two values (bf16 would take a second
    # conversion per value); each converted tile serves every head, for QK and for PV.
    k0 = _e4m3_to_f16(tl.load(row + cols, mask=mask, other=0), ASM_CVT)
    k1 = _e4m3_to_f16(tl.load(row + D_BLK + cols, mask=mask, other=0), ASM_CVT)
    k2 = _e4m3_to_f16(tl.load(row + 2 * D_BLK + cols, mask=mask, other=0), ASM_CVT)
    k3 = _e4m3_to_f16(tl.load(row + 3 * D_BLK + cols, mask=mask, other=0), ASM_CVT)
    pe_cols = 4 * D_BLK + tl.arange(0, D_PE)[None, :]
    k_pe = _e4m3_to_f16(tl.load(row + pe_cols, mask=mask, other=0), ASM_CVT)
    qk = tl.dot(q0, tl.trans(k0))
    qk += tl.dot(q1, tl.trans(k1))
    qk += tl.dot(q2, tl.trans(k2))
    qk += tl.dot(q3, tl.trans(k3))
    qk += tl.dot(q_pe, tl.trans(k_pe))
    qk = tl.where(live[None, :], qk * qk_scale[:, None], float("-inf"))
    m_new = tl.maximum(m_i, tl.max(qk, 1))
    # m_new is -inf only while every score so far is masked: keep exp2 finite.
    m_safe = tl.where(m_new == float("-inf"), 0.0, m_new)
    alpha = tl.exp2(m_i - m_safe)
    p = tl.exp2(qk - m_safe[:, None])
    l_i = l_i * alpha + tl.sum(p, 1)
    # P is scaled by 2^15 into fp16's normal range (exact), so small weights keep 11 bits.
    p16 = (p * P_SCALE).to(tl.float16)
    acc0 = tl.dot(p16, k0, acc0 * alpha[:, None])
    acc1 = tl.dot(p16, k1, acc1 * alpha[:, None])
    acc2 = tl.dot(p16, k2, acc2 * alpha[:, None])
    acc3 = tl.dot(p16, k3, acc3 * alpha[:, None])
    return m_new, l_i, acc0, acc1, acc2, acc3


@triton.jit
def _load_q(ptr, heads, head_ok, D: tl.constexpr):
    cols = tl.arange(0, D)[None, :]
    return tl.load(ptr + heads[:, None] + cols, mask=head_ok[:, None], other=0.0).to(tl.float32)


@triton.jit
def _store_rows(ptr, rows, cols, value, mask):
    tl.store(ptr + rows + cols, value.to(ptr.dtype.element_ty), mask=mask)


@triton.jit
def _mla_decode_fp8_stage1(
    q_nope_ptr,
    q_pe_ptr,
    kv_ptr,  # uint8 view of the FP8 e4m3 pool, rows of 4 * D_BLK + D_PE bytes
    kv_indptr_ptr,
    kv_indices_ptr,
    out_ptr,  # bf16 [B, H, 4 * D_BLK]: written when there is one split
    part_out_ptr,  # fp32 [B, H_PAD, num_splits, 4 * D_BLK]: written when there are several
    part_lse_ptr,  # fp32 [B, H_PAD, num_splits] (log2 domain)
    qk_scale,  # sm_scale * log2(e)
    num_heads,
    n_pool_rows,
    num_splits,
    min_chunk,
    stride_qn_b,
    stride_qn_h,
    stride_qp_b,
    stride_qp_h,
    stride_kv,
    stride_o_b,
    stride_o_h,
    BLOCK_H: tl.constexpr,
    BLOCK_N: tl.constexpr,
    D_BLK: tl.constexpr,
    D_PE: tl.constexpr,
    SPLIT: tl.constexpr,  # num_splits > 1
    ASM_CVT: tl.constexpr,  # convert with inline PTX (GPU) instead of tl casts (interpreter)
    ON_CPU: tl.constexpr,  # running under TRITON_INTERPRET=1 (see the loop below)
):
    group = tl.program_id(0)
    req = tl.program_id(1)
    split = tl.program_id(2)
    kv_start = tl.load(kv_indptr_ptr + req)
    kv_len = tl.load(kv_indptr_ptr + req + 1) - kv_start
    chunk = tl.maximum(tl.cdiv(kv_len, num_splits), min_chunk)
    chunk = tl.cdiv(chunk, BLOCK_N) * BLOCK_N
    lo = split * chunk
    hi = tl.minimum(lo + chunk, kv_len)

    heads = group * BLOCK_H + tl.arange(0, BLOCK_H)
    head_ok = heads < num_heads

    # Splits past the end of a short request have nothing to do (the merge skips them).
    if lo < hi or split == 0:
        qn = q_nope_ptr + req * stride_qn_b
        qh = heads * stride_qn_h
        q0 = _load_q(qn, qh, head_ok, D_BLK)
        q1 = _load_q(qn + D_BLK, qh, head_ok, D_BLK)
        q2 = _load_q(qn + 2 * D_BLK, qh, head_ok, D_BLK)
        q3 = _load_q(qn + 3 * D_BLK, qh, head_ok, D_BLK)
        q_pe = _load_q(q_pe_ptr + req * stride_qp_b, heads * stride_qp_h, head_ok, D_PE)
        # q goes to the tensor cores as fp16, each (request, head) row first scaled by a power
        # of two that puts its largest |value| in [2^14, 2^15): every bf16 value within 2^31
        # of that maximum is then exact in fp16, so q is not quantized; the scale is undone
        # in the softmax exponent.
        amax = tl.maximum(tl.max(tl.abs(q0), 1), tl.max(tl.abs(q1), 1))
        amax = tl.maximum(amax, tl.maximum(tl.max(tl.abs(q2), 1), tl.max(tl.abs(q3), 1)))
        amax = tl.maximum(amax, tl.max(tl.abs(q_pe), 1))
        exp_amax = ((amax.to(tl.int32, bitcast=True) >> 23) & 0xFF) - 127
        shift = tl.where(amax > 0.0, tl.minimum(tl.maximum(14 - exp_amax, -100), 100), 0)
        q_scale = ((shift + 127) << 23).to(tl.float32, bitcast=True)
        q0 = (q0 * q_scale[:, None]).to(tl.float16)
        q1 = (q1 * q_scale[:, None]).to(tl.float16)
        q2 = (q2 * q_scale[:, None]).to(tl.float16)
        q3 = (q3 * q_scale[:, None]).to(tl.float16)
        q_pe = (q_pe * q_scale[:, None]).to(tl.float16)
        row_qk_scale = qk_scale / q_scale
        m_i = tl.full([BLOCK_H], float("-inf"), dtype=tl.float32)
        l_i = tl.zeros([BLOCK_H], dtype=tl.float32)
        acc0 = tl.zeros([BLOCK_H, D_BLK], dtype=tl.float32)
        acc1 = tl.zeros([BLOCK_H, D_BLK], dtype=tl.float32)
        acc2 = tl.zeros([BLOCK_H, D_BLK], dtype=tl.float32)
        acc3 = tl.zeros([BLOCK_H, D_BLK], dtype=tl.float32)
        if ON_CPU:
            # The interpreter cannot take a device-loaded bound in range() (Triton 3.6 with
            # numpy >= 2.3); a `while` runs the same iterations over the same tile body.
            off = lo
            while off < hi:
                m_i, l_i, acc0, acc1, acc2, acc3 = _attend_tile(
                    off, hi, m_i, l_i, acc0, acc1, acc2, acc3, q0, q1, q2, q3, q_pe, kv_ptr,
                    kv_indices_ptr, kv_start, n_pool_rows, stride_kv, row_qk_scale,
                    BLOCK_N, D_BLK, D_PE, ASM_CVT,
                )  # fmt: skip
                off += BLOCK_N
        else:
            # A `for` with a device-computed bound: Triton software-pipelines it (the next
            # tiles' index and row loads go to shared memory asynchronously while this tile
            # computes), which a `while` does not get. Still one launch for any length.
            for off in range(lo, hi, BLOCK_N):
                m_i, l_i, acc0, acc1, acc2, acc3 = _attend_tile(
                    off, hi, m_i, l_i, acc0, acc1, acc2, acc3, q0, q1, q2, q3, q_pe, kv_ptr,
                    kv_indices_ptr, kv_start, n_pool_rows, stride_kv, row_qk_scale,
                    BLOCK_N, D_BLK, D_PE, ASM_CVT,
                )  # fmt: skip

        # An empty request (kv_len 0) has l_i == 0: its output is defined as zeros.
        has_mass = l_i > 0.0
        inv_l = tl.where(has_mass, 1.0 / tl.where(has_mass, l_i * P_SCALE, 1.0), 0.0)[:, None]
        cols = tl.arange(0, D_BLK)[None, :]
        if SPLIT:
            lse = tl.where(has_mass, m_i + tl.log2(tl.where(has_mass, l_i, 1.0)), float("-inf"))
            h_pad = tl.num_programs(0) * BLOCK_H
            part_row = (req * h_pad + heads) * num_splits + split
            rows = part_row.to(tl.int64)[:, None] * (4 * D_BLK)
            everywhere = tl.full([BLOCK_H, D_BLK], True, tl.int1)
            _store_rows(part_out_ptr, rows, cols, acc0 * inv_l, everywhere)
            _store_rows(part_out_ptr, rows, D_BLK + cols, acc1 * inv_l, everywhere)
            _store_rows(part_out_ptr, rows, 2 * D_BLK + cols, acc2 * inv_l, everywhere)
            _store_rows(part_out_ptr, rows, 3 * D_BLK + cols, acc3 * inv_l, everywhere)
            tl.store(part_lse_ptr + part_row, lse)
        else:
            rows = req * stride_o_b + heads[:, None] * stride_o_h
            mask = head_ok[:, None]
            _store_rows(out_ptr, rows, cols, acc0 * inv_l, mask)
            _store_rows(out_ptr, rows, D_BLK + cols, acc1 * inv_l, mask)
            _store_rows(out_ptr, rows, 2 * D_BLK + cols, acc2 * inv_l, mask)
            _store_rows(out_ptr, rows, 3 * D_BLK + cols, acc3 * inv_l, mask)


@triton.jit
def _mla_decode_fp8_merge(
    part_out_ptr,
    part_lse_ptr,
    kv_indptr_ptr,
    out_ptr,
    h_pad,
    num_splits,
    min_chunk,
    stride_o_b,
    stride_o_h,
    BLOCK_N: tl.constexpr,
    BLOCK_S: tl.constexpr,
    BLOCK_D: tl.constexpr,
    D_LAT: tl.constexpr,
):
    req = tl.program_id(0)
    head = tl.program_id(1)
    d = tl.program_id(2) * BLOCK_D + tl.arange(0, BLOCK_D)
    kv_len = tl.load(kv_indptr_ptr + req + 1) - tl.load(kv_indptr_ptr + req)
    # The same split geometry as stage 1: splits at or past n_used wrote nothing.
    chunk = tl.maximum(tl.cdiv(kv_len, num_splits), min_chunk)
    chunk = tl.cdiv(chunk, BLOCK_N) * BLOCK_N
    n_used = tl.maximum(tl.cdiv(kv_len, chunk), 1)
    base = (req * h_pad + head) * num_splits
    offs_s = tl.arange(0, BLOCK_S)

    # `while`, not `range(num_splits)`: the interpreter cannot take a runtime loop bound.
    m = tl.full([BLOCK_S], float("-inf"), dtype=tl.float32)
    s0 = 0
    while s0 < n_used:
        s = s0 + offs_s
        lse = tl.load(part_lse_ptr + base + s, mask=s < n_used, other=float("-inf"))
        m = tl.maximum(m, lse)
        s0 += BLOCK_S
    m_max = tl.max(m, 0)
    m_safe = tl.where(m_max == float("-inf"), 0.0, m_max)

    acc = tl.zeros([BLOCK_D], dtype=tl.float32)
    w_sum = tl.zeros([BLOCK_S], dtype=tl.float32)
    s0 = 0
    while s0 < n_used:
        s = s0 + offs_s
        used = s < n_used
        lse = tl.load(part_lse_ptr + base + s, mask=used, other=float("-inf"))
        w = tl.where(lse == float("-inf"), 0.0, tl.exp2(lse - m_safe))
        part = tl.load(
            part_out_ptr + (base + s).to(tl.int64)[:, None] * D_LAT + d[None, :],
            mask=used[:, None],
            other=0.0,
        )
        acc += tl.sum(part * w[:, None], 0)
        w_sum += w
        s0 += BLOCK_S
    total = tl.sum(w_sum, 0)
    o = tl.where(total > 0.0, acc / tl.where(total > 0.0, total, 1.0), 0.0)
    tl.store(out_ptr + req * stride_o_b + head * stride_o_h + d, o.to(out_ptr.dtype.element_ty))
_DEVICE_INFO: dict[int, tuple[int, int]] = {}


def _device_info(device: torch.device) -> tuple[int, int]:
    """(SM count, shared memory a program may use) of a CUDA device, cached."""
    index = device.index if device.index is not None else torch.cuda.current_device()
    if index not in _DEVICE_INFO:
        props = triton.runtime.driver.active.utils.get_device_properties(index)
        _DEVICE_INFO[index] = (props["multiprocessor_count"], props["max_shared_mem"])
    return _DEVICE_INFO[index]


def launch_config(batch: int, device: torch.device) -> LaunchConfig:
    """The configuration for a batch size on a device (a host-side choice: graph-stable)."""
    if device.type != "cuda":
        return CONFIG_INTERPRETER
    if batch > SMALL_BATCH:
        return CONFIG_LARGE_BATCH
    wide = _device_info(device)[1] >= WIDE_TILE_SHARED_BYTES
    return CONFIG_SMALL_BATCH_WIDE if wide else CONFIG_SMALL_BATCH


def num_splits_for(batch: int, num_heads: int, device: torch.device, config: LaunchConfig) -> int:
    """Host-side split count: a fixed function of the batch shape (graph-stable)."""
    sms = _device_info(device)[0] if device.type == "cuda" else INTERPRETER_SMS
    groups = triton.cdiv(num_heads, BLOCK_H)
    target = sms * config.programs_per_sm
    return max(1, min(MAX_SPLITS, triton.cdiv(target, max(batch, 1) * groups)))


# Partial results, one buffer per device, shared by every layer and call (layers run one after
# another on one stream; a call's merge consumes its partials before the next call starts).
_WORKSPACES: dict[tuple[str, Optional[int]], tuple[torch.Tensor, torch.Tensor]] = {}


def _workspace(device: torch.device, rows: int) -> tuple[torch.Tensor, torch.Tensor]:
    key = (device.type, device.index)
    found = _WORKSPACES.get(key)
    if found is not None and found[1].numel() >= rows:
        return found
    if device.type == "cuda" and torch.cuda.is_current_stream_capturing():
        # Memory taken during capture belongs to the graph's private pool; SGLang runs every
        # captured batch size eagerly first, so reaching this is a bug, not a cold start.
        raise RuntimeError(
            "glmserve native fp8 decode: workspace first requested inside CUDA-graph capture"
        )
    # With more than one split, batch * groups < target, so every layout the shipped
    # configurations produce fits 2 * target * BLOCK_H rows (target = SMs x programs/SM).
    sms = _device_info(device)[0] if device.type == "cuda" else INTERPRETER_SMS
    cap = max(rows, 2 * sms * CONFIG_LARGE_BATCH.programs_per_sm * BLOCK_H)
    part_out = torch.empty((cap, D_LATENT), dtype=torch.float32, device=device)
    part_lse = torch.empty((cap,), dtype=torch.float32, device=device)
    _WORKSPACES[key] = (part_out, part_lse)
    return part_out, part_lse


def mla_decode_fp8(
    q_nope: torch.Tensor,
    q_pe: torch.Tensor,
    kv_pool: torch.Tensor,
    kv_indptr: torch.Tensor,
    kv_indices: torch.Tensor,
    sm_scale: float,
    out: torch.Tensor,
    *,
    config: Optional[LaunchConfig] = None,
    num_splits: Optional[int] = None,
) -> torch.Tensor:
    """MLA decode attention over an FP8 e4m3 KV pool, one query token per request.

    ``q_nope`` [B, H, 512] and ``q_pe`` [B, H, 64] bf16; ``kv_pool`` [slots, 1, 576] (or
    [slots, 576]) float8_e4m3fn whose first 512 columns are the latent (also V) and last 64
    the rope part; request ``b`` attends to slots ``kv_indices[kv_indptr[b]:kv_indptr[b+1]]``
    (int32); ``out`` [B, H, 512] bf16 receives the result and is returned. An empty request
    gets zeros. No host sync and, after the first call on a device, no allocation.
    """
    if kv_pool.dtype != torch.float8_e4m3fn:
        raise TypeError(f"kv_pool must be float8_e4m3fn, got {kv_pool.dtype}")
    for name, t in (("q_nope", q_nope), ("q_pe", q_pe), ("out", out)):
        if t.dtype != torch.bfloat16:
            raise TypeError(f"{name} must be bfloat16, got {t.dtype}")
        if t.dim() != 3 or t.stride(-1) != 1:
            raise ValueError(f"{name} must be [B, H, D] with contiguous D")
    batch, heads, d_lat = q_nope.shape
    d_pe = q_pe.shape[-1]
    if d_lat != D_LATENT or d_pe != D_ROPE:
        raise ValueError(f"expects {D_LATENT}+{D_ROPE} dims, got {d_lat}+{d_pe}")
    if tuple(q_pe.shape[:2]) != (batch, heads) or tuple(out.shape) != (batch, heads, d_lat):
        raise ValueError("q_nope, q_pe and out disagree on [B, H]")
    n_rows = kv_pool.shape[0]
    pool = kv_pool.view(torch.uint8).reshape(n_rows, -1)
    if pool.shape[1] != D_LATENT + D_ROPE or pool.stride(1) != 1:
        raise ValueError(f"kv_pool rows must be {D_LATENT + D_ROPE} contiguous bytes")
    if kv_indptr.dtype != torch.int32 or kv_indices.dtype != torch.int32:
        raise TypeError("kv_indptr and kv_indices must be int32")
    if kv_indptr.numel() < batch + 1:
        raise ValueError(f"kv_indptr has {kv_indptr.numel()} entries, needs {batch + 1}")
    if batch == 0 or heads == 0:
        return out

    device = q_nope.device
    on_gpu = device.type == "cuda"
    cfg = config or launch_config(batch, device)
    groups = triton.cdiv(heads, BLOCK_H)
    splits = num_splits or num_splits_for(batch, heads, device, cfg)
    h_pad = groups * BLOCK_H
    part_out, part_lse = _workspace(device, batch * h_pad * splits)
    _mla_decode_fp8_stage1[(groups, batch, splits)](
        q_nope,
        q_pe,
        pool,
        kv_indptr,
        kv_indices,
        out,
        part_out,
        part_lse,
        sm_scale * LOG2E,
        heads,
        n_rows,
        splits,
        cfg.min_chunk,
        q_nope.stride(0),
        q_nope.stride(1),
        q_pe.stride(0),
        q_pe.stride(1),
        pool.stride(0),
        out.stride(0),
        out.stride(1),
        BLOCK_H=BLOCK_H,
        BLOCK_N=cfg.block_n,
        D_BLK=D_LATENT // 4,
        D_PE=D_ROPE,
        SPLIT=splits > 1,
        ASM_CVT=on_gpu,
        ON_CPU=not on_gpu,
        num_warps=cfg.num_warps,
        num_stages=cfg.num_stages,
    )
    if splits > 1:
        _mla_decode_fp8_merge[(batch, heads, D_LATENT // MERGE_BLOCK_D)](
            part_out,
            part_lse,
            kv_indptr,
            out,
            h_pad,
            splits,
            cfg.min_chunk,
            out.stride(0),
            out.stride(1),
            BLOCK_N=cfg.block_n,
            BLOCK_S=MERGE_BLOCK_S,
            BLOCK_D=MERGE_BLOCK_D,
            D_LAT=D_LATENT,
        )
    return out


def decode_mode() -> str:
    """GLMSERVE_FP8_ATTENTION: 'native' (default) or 'gather'; anything else is refused."""
    raw = os.environ.get(ENV_MODE, DEFAULT_MODE).strip().lower()
    if raw not in MODES:
        raise ValueError(f"{ENV_MODE} must be one of {', '.join(MODES)}, got {raw!r}")
    return raw


def unsupported_reason(model_runner: Any) -> Optional[str]:
    """Why this model/GPU cannot take the native decode path (None: it can)."""
    dtype = getattr(model_runner, "kv_cache_dtype", None)
    if dtype != torch.float8_e4m3fn:
        return f"KV cache dtype {dtype} (native decode reads float8_e4m3fn only)"
    cfg = model_runner.model_config
    dims = (getattr(cfg, "kv_lora_rank", None), getattr(cfg, "qk_rope_head_dim", None))
    if dims != (D_LATENT, D_ROPE):
        return f"MLA dims {dims[0]}+{dims[1]} (native decode is built for {D_LATENT}+{D_ROPE})"
    device = torch.device(model_runner.device)
    if device.type != "cuda":
        return f"device {device}"
    if torch.cuda.get_device_capability(device) < (8, 9):
        return "compute capability below 8.9 (no hardware e4m3 convert)"
    return None


_ANNOUNCED: set[str] = set()


def _announce(line: str) -> None:
    # One line per process (the target and a draft model each build a backend).
    if line not in _ANNOUNCED:
        _ANNOUNCED.add(line)
        logger.info(line)


class Fp8NativeDecode:
    """Per-backend state: the kv_indptr and sm_scale each decode wrapper was last planned with.

    A wrapper planned for a speculative (EAGLE) batch is recorded as None and keeps the
    gather-then-cast path, as does everything but plain decode.
    """

    def __init__(self) -> None:
        self._plans: weakref.WeakKeyDictionary[Any, Optional[tuple[torch.Tensor, float]]] = (
            weakref.WeakKeyDictionary()
        )

    @classmethod
    def create(cls, model_runner: Any, patch_on: bool) -> Optional[Fp8NativeDecode]:
        """The native decode state, or None (with one logged line saying why) for gather."""
        if not patch_on or getattr(model_runner, "kv_cache_dtype", None) not in (
            torch.float8_e4m3fn,
            torch.float8_e5m2,
        ):
            return None  # upstream cast or a 16-bit pool: nothing FP8 to decide
        mode = decode_mode()
        reason = f"{ENV_MODE}=gather" if mode == "gather" else unsupported_reason(model_runner)
        if reason:
            _announce(f"glmserve FP8 KV decode: gather-then-cast + FlashInfer ({reason})")
            return None
        _announce(
            "glmserve FP8 KV decode: native FP8 kernel (fp8_mla_decode.py); "
            "prefill/extend: gather-then-cast + FlashInfer"
        )
        return cls()

    def note_plan(
        self, wrapper: Any, kv_indptr: Optional[torch.Tensor], sm_scale: float
    ) -> None:
        """Record what `wrapper` was planned with (kv_indptr None: not a plain decode batch)."""
        self._plans[wrapper] = None if kv_indptr is None else (kv_indptr, sm_scale)

    def planned(self, wrapper: Any) -> Optional[tuple[torch.Tensor, float]]:
        """(kv_indptr, sm_scale) if `wrapper` was last planned for a plain decode batch."""
        return self._plans.get(wrapper)
