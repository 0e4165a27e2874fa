"""Native FP8 MLA attention for decode and speculative batches (added by the glmserve patch series).

FlashInfer's fa2 MLA kernel (SM120's family) reads only 16-bit KV, so with an FP8 KV cache the
gather-then-cast path (``fp8_kv_gather.py``) first writes a BF16 copy of every row the step
reads, and FlashInfer then reads that copy: 5 bytes moved per KV element against 2 for a BF16
pool. This kernel reads the FP8 e4m3 pool itself, 1 byte per element, through the step's
``kv_indptr``/``kv_indices`` (the buffers FlashInfer plans with) and writes what
``decode_wrapper.run`` writes. It serves decode (one query token per request) and speculative
batches of a few causal query tokens per request (MTP target verify, draft extend: ``qo_indptr``
and ``max_q_len``, the (token, head) rows of a request sharing each KV tile); prefill and other
extends stay on gather-then-cast + FlashInfer.

Design:
  * work balance over the whole step. Every request costs its token count plus a fixed
    ``overhead`` (its q load and output write); the step's total cost, read on the device from
    ``kv_indptr``, is cut into equal contiguous chunks, one per program of a grid fixed per
    device (SMs x programs per SM). A program walks the requests its chunk touches: one it
    covers whole is written straight to ``out``; one cut by a chunk border leaves a normalised
    partial and its log-sum-exp in one of the program's two partial slots (only its first and
    its last request can be cut). Short requests share a program, long ones spread over many,
    whatever the mix of lengths;
  * the tile loop (``BLOCK_N`` KV rows) is software-pipelined by Triton: the next tiles' index
    and row loads are in flight while one computes. All loads of a tile have one shape, so the
    slot indices sit in one register layout and are prefetched with the rows (with two shapes
    Triton reloads them synchronously, and the pipeline stalls on every tile);
  * MLA's latent row is shared by every head: each FP8 tile is converted once (e4m3 -> fp16 is
    exact, one instruction per two values) into one fp16 copy that serves QK and PV for all
    heads of the program;
  * two tile forms compute the same function. ``kv-m`` puts the tile's KV rows in the MMA's M
    dimension (S^T = K q^T, O^T = V^T P^T): 8 heads fill N = 8 with no padding, the layout of
    GLM-5 at TP8. ``heads-m`` puts 16 heads in M (S = q K^T, O = P V): with 16 heads it moves
    fewer operand bytes through shared memory than kv-m, which would put them in wgmma's N;
  * the merge kernel combines each cut request's partials by log-sum-exp in one pass, and
    writes zeros for empty requests.

Numerics: q is not quantized. Each (request, head) row of q is scaled by a power of two that
puts its largest |value| in [2^14, 2^15) (any finite bf16 fits; the scale stays a normal fp32
both ways): every bf16 value within 2^31 of that maximum is then exact in fp16, and the scale
is undone in the softmax exponent. Softmax weights go to the PV product as fp16 scaled by 2^15
(more mantissa than the bf16 weights FlashInfer uses). NaN in q or in a row read reaches that
head's output, as through the upstream cast: no guard maps it to zeros.

CUDA graphs and memory safety: the grids depend only on the device, the batch size and the head
count; every length and chunk border is computed on the device from ``kv_indptr``; nothing
syncs with the host and nothing is allocated per call. The partial-result workspace depends on
the device and the head layout only (not on the batch), is allocated outside any capture and is
never freed or replaced: a graph captured with it keeps writing into live memory, whatever runs
eagerly afterwards.

``GLMSERVE_FP8_ATTENTION=native`` (default) or ``gather`` chooses the decode path when the
patch is on; ``GLMSERVE_FP8_GATHER=0`` switches the whole series off (upstream cast).
"""

from __future__ import annotations

import logging
import os
import weakref
from dataclasses import dataclass
from typing import Any

import torch
import triton
import triton.language as tl

logger = logging.getLogger(__name__)

ENV_MODE = "GLMSERVE_FP8_ATTENTION"
MODES = ("native", "gather")
DEFAULT_MODE = "native"

D_LATENT = 512  # kv_lora_rank: the latent part of a row, which is also V
D_ROPE = 64  # qk_rope_head_dim
# In-kernel constants: the latent is handled as four column blocks (independent PV chains);
# the rope part is read as a fifth block of the same width with its upper half masked.
LATENT = tl.constexpr(D_LATENT)
D_BLK = tl.constexpr(D_LATENT // 4)
LOG2E = 1.4426950408889634
P_SCALE = tl.constexpr(32768.0)  # softmax weights are in (0, 1]: x 2^15 stays below fp16's max
FORM_HEADS_M = 0
FORM_KV_M = 1
MERGE_BLOCK_D = 64
MERGE_BLOCK_S = 32
# Programs per device assumed when the tensors are not on a GPU (the interpreter).
INTERPRETER_SMS = 4


@dataclass(frozen=True)
class LaunchConfig:
    form: int  # FORM_KV_M (KV rows in the MMA's M) or FORM_HEADS_M (q rows in M)
    block_n: int  # KV rows per tile
    num_warps: int
    num_stages: int  # software-pipelining depth of the tile loads (>= 5 keeps a tile in flight)
    programs_per_sm: int  # stage-1 programs per SM (the grid is SMs x this)
    min_chunk: int = 64  # fewest cost units (tokens) a program takes
    overhead: int = 64  # cost of a request's q load and output write, in tokens
    heads: int = 0  # heads per program; 0: the form's own (kv-M 8, heads-M 16)

    @property
    def heads_per_program(self) -> int:
        return self.heads or (8 if self.form == FORM_KV_M else 16)


# Decode, measured on an H200 with bench/fp8_decode_sweep.py (bench/results/fp8-decode-kernels/
# README.md lists every variant tried); every configuration computes the same function. The
# *_SM90 ones were the fastest there and need more shared memory than SM120's ~99 KB per block;
# the others fit it (RTX PRO 6000) and compile without spills for SM100 (B200) as well.
CONFIG_KV_M_SM90 = LaunchConfig(FORM_KV_M, 64, num_warps=4, num_stages=5, programs_per_sm=1)
CONFIG_KV_M = LaunchConfig(FORM_KV_M, 32, num_warps=4, num_stages=5, programs_per_sm=2)
CONFIG_HEADS_M_SM90 = LaunchConfig(FORM_HEADS_M, 32, num_warps=4, num_stages=5, programs_per_sm=2)
CONFIG_HEADS_M = LaunchConfig(FORM_HEADS_M, 32, num_warps=4, num_stages=4, programs_per_sm=2)
# Several query tokens per request (MTP verify, draft extend): 8 heads x QT tokens per program,
# in M. Chosen without spills by the compile check (tests/kernels/test_kernel_native_compile.py:
# sm_90a 182 registers and 164 KB of shared memory; SM120's ~99 KB per block takes 16-row
# tiles), then timed on the H100 (bench/fp8_decode_sweep.py --verify).
CONFIG_MULTI_SM90 = LaunchConfig(
    FORM_HEADS_M, 64, num_warps=8, num_stages=3, programs_per_sm=1, heads=8
)
CONFIG_MULTI_SM100 = LaunchConfig(
    FORM_HEADS_M, 64, num_warps=8, num_stages=2, programs_per_sm=1, heads=8
)
CONFIG_MULTI = LaunchConfig(FORM_HEADS_M, 16, num_warps=4, num_stages=3, programs_per_sm=2, heads=8)
# Shared memory the larger configurations take (ptxas, Triton 3.6), plus a margin: a device
# with less per block takes the portable one.
SHARED_BYTES = {
    CONFIG_KV_M_SM90: 176 * 1024,
    CONFIG_HEADS_M_SM90: 104 * 1024,
    CONFIG_MULTI_SM90: 168 * 1024,
    CONFIG_MULTI_SM100: 168 * 1024,
}
CONFIG_INTERPRETER = {
    form: LaunchConfig(
        form, 16, num_warps=4, num_stages=1, programs_per_sm=1, min_chunk=16, overhead=8
    )
    for form in (FORM_KV_M, FORM_HEADS_M)
}
# Several query tokens on the CPU: 8 heads per program, like the GPU configurations.
CONFIG_INTERPRETER_MULTI = LaunchConfig(
    FORM_HEADS_M, 16, num_warps=4, num_stages=1, programs_per_sm=1, min_chunk=16, overhead=8,
    heads=8,
)  # fmt: skip


@triton.jit
def _e4m3_to_f16(raw, ASM_CVT: tl.constexpr):
    if ASM_CVT:
        # Non-pure: Triton must not sink the convert past the shared-memory round trip, or
        # every consumer of the tile would convert again.
        return tl.inline_asm_elementwise(
            asm="{ .reg .b16 lo, hi; mov.b32 {lo, hi}, $2; "
            "cvt.rn.f16x2.e4m3x2 $0, lo; cvt.rn.f16x2.e4m3x2 $1, hi; }",
            constraints="=r,=r,r",
            args=[raw],
            dtype=tl.float16,
            is_pure=False,
            pack=4,
        )
    # Triton 3.6's interpreter converts the NaN codes 0x7F/0xFF to +-480; the hardware
    # convert (above) gives NaN, as e4m3fn defines.
    value = raw.to(tl.float8e4nv, bitcast=True).to(tl.float16)
    return tl.where((raw & 0x7F) == 0x7F, float("nan"), value)


@triton.jit
def _power_of_two_scale(amax):
    """2^k with amax * 2^k in [2^14, 2^15); k in [-126, 100] keeps 2^k and 2^-k normal fp32."""
    exp_amax = ((amax.to(tl.int32, bitcast=True) >> 23) & 0xFF) - 127
    shift = tl.where(amax > 0.0, tl.minimum(tl.maximum(14 - exp_amax, -126), 100), 0)
    return ((shift + 127) << 23).to(tl.float32, bitcast=True)


@triton.jit
def _load_q(q_nope_ptr, q_pe_ptr, off_n, off_p, row_ok, qk_scale, D_PE: tl.constexpr):
    """The program's q rows (one per query token x head) as fp16 [R, D_BLK] blocks, and each
    row's score scale. `off_n`/`off_p` are the rows' element offsets in q_nope/q_pe.

    The rope block is padded to D_BLK columns with zeros, like the tile's rope block.
    """
    cols = tl.arange(0, D_BLK)[None, :]
    qn = q_nope_ptr + off_n[:, None] + cols
    mask = row_ok[:, None]
    q0 = tl.load(qn, mask=mask, other=0.0).to(tl.float32)
    q1 = tl.load(qn + D_BLK, mask=mask, other=0.0).to(tl.float32)
    q2 = tl.load(qn + 2 * D_BLK, mask=mask, other=0.0).to(tl.float32)
    q3 = tl.load(qn + 3 * D_BLK, mask=mask, other=0.0).to(tl.float32)
    pe = q_pe_ptr + off_p[:, None] + cols
    qr = tl.load(pe, mask=mask & (cols < D_PE), other=0.0).to(tl.float32)
    amax = tl.maximum(tl.max(tl.abs(q0), 1), tl.max(tl.abs(q1), 1))
    amax = tl.maximum(amax, tl.maximum(tl.max(tl.abs(q2), 1), tl.max(tl.abs(q3), 1)))
    scale = _power_of_two_scale(tl.maximum(amax, tl.max(tl.abs(qr), 1)))
    s = scale[:, None]
    q0 = (q0 * s).to(tl.float16)
    q1 = (q1 * s).to(tl.float16)
    q2 = (q2 * s).to(tl.float16)
    q3 = (q3 * s).to(tl.float16)
    qr = (qr * s).to(tl.float16)
    return q0, q1, q2, q3, qr, qk_scale / scale


@triton.jit
def _load_tile(kv_ptr, kv_indices_ptr, off, hi, n_pool_rows, stride_kv, BLOCK_N: tl.constexpr,
               D_PE: tl.constexpr, ASM_CVT: tl.constexpr):  # fmt: skip
    """Rows [off, hi) of the request's slot list as fp16 blocks, which rows are live, and how
    many of them hold a corrupt index (outside the pool: never read)."""
    pos = off + tl.arange(0, BLOCK_N)
    live = pos < hi
    slot = tl.load(kv_indices_ptr + pos, mask=live, other=0)
    valid = (slot >= 0) & (slot < n_pool_rows)
    row = kv_ptr + slot.to(tl.int64)[:, None] * stride_kv
    cols = tl.arange(0, D_BLK)[None, :]
    mask = (live & valid)[:, None]
    k0 = _e4m3_to_f16(tl.load(row + cols, mask=mask, other=0), ASM_CVT)
    k1 = _e4m3_to_f16(tl.load(row + D_BLK + cols, mask=mask, other=0), ASM_CVT)
    k2 = _e4m3_to_f16(tl.load(row + 2 * D_BLK + cols, mask=mask, other=0), ASM_CVT)
    k3 = _e4m3_to_f16(tl.load(row + 3 * D_BLK + cols, mask=mask, other=0), ASM_CVT)
    rope_mask = mask & (cols < D_PE)
    kr = _e4m3_to_f16(tl.load(row + 4 * D_BLK + cols, mask=rope_mask, other=0), ASM_CVT)
    # Counted as one scalar, so the common path needs no per-row mask beyond the length.
    corrupt = tl.sum((live & ~valid).to(tl.int32), 0)
    return k0, k1, k2, k3, kr, live, corrupt


@triton.jit
def _slot_valid(kv_indices_ptr, off, hi, n_pool_rows, BLOCK_N: tl.constexpr):
    """Which of the tile's rows hold an index inside the pool (the rare, corrupt-index path)."""
    pos = off + tl.arange(0, BLOCK_N)
    slot = tl.load(kv_indices_ptr + pos, mask=pos < hi, other=-1)
    return (slot >= 0) & (slot < n_pool_rows)


@triton.jit
def _tile_heads_m(kv_ptr, kv_indices_ptr, off, hi, n_pool_rows, stride_kv, m_i, l_i,
                  a0, a1, a2, a3, q0, q1, q2, q3, qr, row_scale, kv_start, row_limit,
                  BLOCK_N: tl.constexpr, D_PE: tl.constexpr, ASM_CVT: tl.constexpr,
                  CAUSAL: tl.constexpr):  # fmt: skip
    """Online-softmax update, q rows in M: S = q K^T [R, N], O [R, 512] += P V."""
    k0, k1, k2, k3, kr, live, corrupt = _load_tile(
        kv_ptr, kv_indices_ptr, off, hi, n_pool_rows, stride_kv, BLOCK_N, D_PE, ASM_CVT
    )
    s = tl.dot(q0, tl.trans(k0))
    s = tl.dot(q1, tl.trans(k1), s)
    s = tl.dot(q2, tl.trans(k2), s)
    s = tl.dot(q3, tl.trans(k3), s)
    s = tl.dot(qr, tl.trans(kr), s)
    s = tl.where(live[None, :], s * row_scale[:, None], float("-inf"))
    if CAUSAL:
        rel = off - kv_start + tl.arange(0, BLOCK_N)
        s = tl.where(rel[None, :] <= row_limit[:, None], s, float("-inf"))
    if corrupt > 0:
        valid = _slot_valid(kv_indices_ptr, off, hi, n_pool_rows, BLOCK_N)
        s = tl.where(valid[None, :], s, float("-inf"))
    m_new = tl.maximum(m_i, tl.max(s, 1))
    # m_new is -inf only while every score so far is masked: keep exp2 finite.
    m_safe = tl.where(m_new == float("-inf"), 0.0, m_new)
    alpha = tl.exp2(m_i - m_safe)
    p = tl.exp2(s - m_safe[:, None])
    l_i = l_i * alpha + tl.sum(p, 1)
    # P is scaled by 2^15 into fp16's normal range (exact), so small weights keep 11 bits.
    p16 = (p * P_SCALE).to(tl.float16)
    a0 = tl.dot(p16, k0, a0 * alpha[:, None])
    a1 = tl.dot(p16, k1, a1 * alpha[:, None])
    a2 = tl.dot(p16, k2, a2 * alpha[:, None])
    a3 = tl.dot(p16, k3, a3 * alpha[:, None])
    return m_new, l_i, a0, a1, a2, a3


@triton.jit
def _tile_kv_m(kv_ptr, kv_indices_ptr, off, hi, n_pool_rows, stride_kv, m_i, l_i,
               a0, a1, a2, a3, q0, q1, q2, q3, qr, row_scale, kv_start, row_limit,
               BLOCK_N: tl.constexpr, D_PE: tl.constexpr, ASM_CVT: tl.constexpr,
               CAUSAL: tl.constexpr):  # fmt: skip
    """Online-softmax update, KV rows in M: S^T = K q^T [N, R], O^T [512, R] += V^T P^T.

    q0..qr arrive transposed ([D_BLK, R]); a0..a3 are [D_BLK, R].
    """
    k0, k1, k2, k3, kr, live, corrupt = _load_tile(
        kv_ptr, kv_indices_ptr, off, hi, n_pool_rows, stride_kv, BLOCK_N, D_PE, ASM_CVT
    )
    s = tl.dot(k0, q0)
    s = tl.dot(k1, q1, s)
    s = tl.dot(k2, q2, s)
    s = tl.dot(k3, q3, s)
    s = tl.dot(kr, qr, s)
    s = tl.where(live[:, None], s * row_scale[None, :], float("-inf"))
    if CAUSAL:
        rel = off - kv_start + tl.arange(0, BLOCK_N)
        s = tl.where(rel[:, None] <= row_limit[None, :], s, float("-inf"))
    if corrupt > 0:
        valid = _slot_valid(kv_indices_ptr, off, hi, n_pool_rows, BLOCK_N)
        s = tl.where(valid[:, None], s, float("-inf"))
    m_new = tl.maximum(m_i, tl.max(s, 0))
    m_safe = tl.where(m_new == float("-inf"), 0.0, m_new)
    alpha = tl.exp2(m_i - m_safe)
    p = tl.exp2(s - m_safe[None, :])
    l_i = l_i * alpha + tl.sum(p, 0)
    p16 = (p * P_SCALE).to(tl.float16)
    a0 = tl.dot(tl.trans(k0), p16, a0 * alpha[None, :])
    a1 = tl.dot(tl.trans(k1), p16, a1 * alpha[None, :])
    a2 = tl.dot(tl.trans(k2), p16, a2 * alpha[None, :])
    a3 = tl.dot(tl.trans(k3), p16, a3 * alpha[None, :])
    return m_new, l_i, a0, a1, a2, a3


@triton.jit
def _tile(kv_ptr, kv_indices_ptr, off, hi, n_pool_rows, stride_kv, m_i, l_i, a0, a1, a2, a3,
          q0, q1, q2, q3, qr, row_scale, kv_start, row_limit, BLOCK_N: tl.constexpr,
          D_PE: tl.constexpr, FORM: tl.constexpr, ASM_CVT: tl.constexpr,
          CAUSAL: tl.constexpr):  # fmt: skip
    # Both branches are written out (no early return): Triton would compile the statement
    # after a taken `return` as well, with the other form's shapes.
    if FORM == 0:
        m_i, l_i, a0, a1, a2, a3 = _tile_heads_m(
            kv_ptr, kv_indices_ptr, off, hi, n_pool_rows, stride_kv, m_i, l_i, a0, a1, a2, a3,
            q0, q1, q2, q3, qr, row_scale, kv_start, row_limit, BLOCK_N, D_PE, ASM_CVT, CAUSAL,
        )  # fmt: skip
    else:
        m_i, l_i, a0, a1, a2, a3 = _tile_kv_m(
            kv_ptr, kv_indices_ptr, off, hi, n_pool_rows, stride_kv, m_i, l_i, a0, a1, a2, a3,
            q0, q1, q2, q3, qr, row_scale, kv_start, row_limit, BLOCK_N, D_PE, ASM_CVT, CAUSAL,
        )  # fmt: skip
    return m_i, l_i, a0, a1, a2, a3


@triton.jit
def _store_rows(dest, a0, a1, a2, a3, inv_l, row_ok, FORM: tl.constexpr):
    """Each q row's 512 outputs (a0..a3 / l) to its row pointer in `dest`."""
    d = tl.arange(0, D_BLK)
    if FORM == 0:
        ptr = dest[:, None] + d[None, :]
        mask = row_ok[:, None]
        inv = inv_l[:, None]
    else:
        ptr = dest[None, :] + d[:, None]
        mask = row_ok[None, :]
        inv = inv_l[None, :]
    ty = dest.dtype.element_ty
    tl.store(ptr, (a0 * inv).to(ty), mask=mask)
    tl.store(ptr + D_BLK, (a1 * inv).to(ty), mask=mask)
    tl.store(ptr + 2 * D_BLK, (a2 * inv).to(ty), mask=mask)
    tl.store(ptr + 3 * D_BLK, (a3 * inv).to(ty), mask=mask)


@triton.jit
def _segment(q_nope_ptr, q_pe_ptr, kv_ptr, kv_indices_ptr, out_ptr, part_out_ptr, part_lse_ptr,
             q_lo, q_len, kv_start, kv_len, kv_lo, kv_hi, whole, slot, t_row, head_row, row_ok,
             h_total, qk_scale, n_pool_rows, s_qn_b, s_qn_h, s_qp_b, s_qp_h, stride_kv, s_o_b,
             s_o_h, R: tl.constexpr, QT: tl.constexpr, BLOCK_N: tl.constexpr,
             D_PE: tl.constexpr, FORM: tl.constexpr, ASM_CVT: tl.constexpr,
             ON_CPU: tl.constexpr):  # fmt: skip
    """Attend one request's q rows over slot positions [kv_lo, kv_hi); write its output or a
    partial. Query token t of a request with q_len tokens and kv_len slots sees the slots at
    positions 0 .. kv_len - q_len + t (causal, aligned to the end; decode: every slot)."""
    token = (q_lo + t_row).to(tl.int64)
    q0, q1, q2, q3, qr, row_scale = _load_q(
        q_nope_ptr, q_pe_ptr, token * s_qn_b + head_row * s_qn_h,
        token * s_qp_b + head_row * s_qp_h, row_ok, qk_scale, D_PE,
    )  # fmt: skip
    row_limit = kv_len - q_len + t_row  # the last slot position each row may see
    m_i = tl.full([R], float("-inf"), dtype=tl.float32)
    l_i = tl.zeros([R], dtype=tl.float32)
    if FORM == 0:
        a0 = tl.zeros([R, D_BLK], dtype=tl.float32)
        a1 = tl.zeros([R, D_BLK], dtype=tl.float32)
        a2 = tl.zeros([R, D_BLK], dtype=tl.float32)
        a3 = tl.zeros([R, D_BLK], dtype=tl.float32)
    else:
        q0 = tl.trans(q0)
        q1 = tl.trans(q1)
        q2 = tl.trans(q2)
        q3 = tl.trans(q3)
        qr = tl.trans(qr)
        a0 = tl.zeros([D_BLK, R], dtype=tl.float32)
        a1 = tl.zeros([D_BLK, R], dtype=tl.float32)
        a2 = tl.zeros([D_BLK, R], dtype=tl.float32)
        a3 = tl.zeros([D_BLK, R], dtype=tl.float32)
    if ON_CPU:
        # The interpreter cannot take a device-loaded bound in range() (Triton 3.6 with
        # numpy >= 2.3); a `while` runs the same iterations over the same tile body.
        off = kv_lo
        while off < kv_hi:
            m_i, l_i, a0, a1, a2, a3 = _tile(
                kv_ptr, kv_indices_ptr, off, kv_hi, n_pool_rows, stride_kv, m_i, l_i,
                a0, a1, a2, a3, q0, q1, q2, q3, qr, row_scale, kv_start, row_limit,
                BLOCK_N, D_PE, FORM, ASM_CVT, QT > 1,
            )  # fmt: skip
            off += BLOCK_N
    else:
        # A `for` with a device-computed bound: Triton software-pipelines it, which a `while`
        # does not get. Still one launch for any length.
        for off in range(kv_lo, kv_hi, BLOCK_N):
            m_i, l_i, a0, a1, a2, a3 = _tile(
                kv_ptr, kv_indices_ptr, off, kv_hi, n_pool_rows, stride_kv, m_i, l_i,
                a0, a1, a2, a3, q0, q1, q2, q3, qr, row_scale, kv_start, row_limit,
                BLOCK_N, D_PE, FORM, ASM_CVT, QT > 1,
            )  # fmt: skip

    # Every segment holds at least one row, so l_i >= 1 unless a NaN reached it: dividing
    # without a guard keeps that NaN (a guard like `l_i > 0` would turn it into zeros).
    inv_l = 1.0 / (l_i * P_SCALE)
    if QT > 1:
        # A causal row may see no slot of a segment cut from its request's end: by position,
        # not by value (a NaN that reached l_i must stay NaN), its partial is zero with LSE -inf.
        inv_l = tl.where(row_limit >= kv_lo - kv_start, inv_l, 0.0)
    # (The row pointers are passed inline: Triton types a name bound in both branches once,
    # and these point to bf16 in one branch and to fp32 in the other.)
    if whole:
        out_rows = out_ptr + token * s_o_b + head_row * s_o_h
        _store_rows(out_rows, a0, a1, a2, a3, inv_l, row_ok, FORM)
    else:
        part_row = (slot * QT + t_row) * h_total + head_row
        _store_rows(part_out_ptr + part_row.to(tl.int64) * LATENT, a0, a1, a2, a3, inv_l,
                    row_ok, FORM)  # fmt: skip
        tl.store(part_lse_ptr + part_row, m_i + tl.log2(l_i), mask=row_ok)


@triton.jit
def _chunk_of(kv_indptr_ptr, batch, num_programs, min_chunk, overhead):
    """Cost units per program: the step's total cost (tokens + overhead per request) / grid."""
    total = tl.load(kv_indptr_ptr + batch) + batch * overhead
    return tl.maximum(tl.cdiv(total, num_programs), min_chunk), total


@triton.jit
def _queries_of(qo_indptr_ptr, req, QT: tl.constexpr):
    """(first query token, query tokens) of a request: one each in decode (QT == 1)."""
    if QT == 1:
        q_lo = req
        q_len = 1
    else:
        q_lo = tl.load(qo_indptr_ptr + req)
        q_len = tl.load(qo_indptr_ptr + req + 1) - q_lo
    return q_lo, q_len


# Lengths and counts are not specialised on (batch 1 or a multiple of 16 would each compile
# another kernel); strides are, so that 16-byte row loads stay provably aligned.
@triton.jit(do_not_specialize=["batch", "num_heads", "n_pool_rows", "min_chunk", "overhead"])
def _mla_decode_fp8_stage1(
    q_nope_ptr,
    q_pe_ptr,
    kv_ptr,  # uint8 view of the FP8 e4m3 pool, rows of 512 + D_PE bytes
    kv_indptr_ptr,
    kv_indices_ptr,
    qo_indptr_ptr,  # int32 [batch + 1]: each request's query tokens (read only when QT > 1)
    out_ptr,  # bf16 [tokens, H, 512]: requests a program covers whole
    part_out_ptr,  # fp32 [2 * programs * QT, h_total, 512]: requests cut by a chunk border
    part_lse_ptr,  # fp32 [2 * programs * QT, h_total] (log2 domain)
    qk_scale,  # sm_scale * log2(e)
    batch,
    num_heads,
    n_pool_rows,
    min_chunk,
    overhead,
    stride_qn_b,
    stride_qn_h,
    stride_qp_b,
    stride_qp_h,
    stride_kv,
    stride_o_b,
    stride_o_h,
    HP: tl.constexpr,  # heads per program
    QT: tl.constexpr,  # query tokens per request the program holds (power of two, >= q_len)
    BLOCK_N: tl.constexpr,
    D_PE: tl.constexpr,
    FORM: tl.constexpr,
    ASM_CVT: tl.constexpr,  # convert with inline PTX (GPU) instead of tl casts (interpreter)
    ON_CPU: tl.constexpr,  # running under TRITON_INTERPRET=1
):
    # Head groups vary fastest across the grid, so the programs that read one chunk's KV
    # rows for different heads run side by side and share those rows in L2.
    group = tl.program_id(0)
    prog = tl.program_id(1)
    num_programs = tl.num_programs(1)
    h_total = tl.num_programs(0) * HP
    # Row r of the program's MMA operand is (query token r // HP, head r % HP).
    rows = tl.arange(0, QT * HP)
    t_row = rows // HP
    head_row = group * HP + rows % HP
    head_ok = head_row < num_heads
    chunk, total = _chunk_of(kv_indptr_ptr, batch, num_programs, min_chunk, overhead)
    c0 = prog * chunk
    c1 = tl.minimum(c0 + chunk, total)
    if c0 < total:
        # The request whose cost range holds c0: the last b with indptr[b] + b * overhead <= c0.
        lo = 0
        hi = batch
        while hi - lo > 1:
            mid = (lo + hi) // 2
            if tl.load(kv_indptr_ptr + mid) + mid * overhead <= c0:
                lo = mid
            else:
                hi = mid
        req = lo
        kv_start = tl.load(kv_indptr_ptr + req)
        while (req < batch) & (kv_start + req * overhead < c1):
            kv_end = tl.load(kv_indptr_ptr + req + 1)
            kv_len = kv_end - kv_start
            first = kv_start + req * overhead + overhead  # cost position of its first token
            t_lo = tl.minimum(tl.maximum(c0 - first, 0), kv_len)
            t_hi = tl.minimum(tl.maximum(c1 - first, 0), kv_len)
            if t_lo < t_hi:
                q_lo, q_len = _queries_of(qo_indptr_ptr, req, QT)
                # Slot 2p: the segment starts at this chunk's start (the request began in an
                # earlier chunk); 2p + 1: it is cut at this chunk's end only.
                slot = 2 * prog + tl.where(first <= c0, 0, 1)
                _segment(
                    q_nope_ptr, q_pe_ptr, kv_ptr, kv_indices_ptr, out_ptr, part_out_ptr,
                    part_lse_ptr, q_lo, q_len, kv_start, kv_len, kv_start + t_lo,
                    kv_start + t_hi, (t_lo == 0) & (t_hi == kv_len), slot, t_row, head_row,
                    head_ok & (t_row < q_len), h_total, qk_scale, n_pool_rows, stride_qn_b,
                    stride_qn_h, stride_qp_b, stride_qp_h, stride_kv, stride_o_b, stride_o_h,
                    QT * HP, QT, BLOCK_N, D_PE, FORM, ASM_CVT, ON_CPU,
                )  # fmt: skip
            req += 1
            kv_start = kv_end


@triton.jit(do_not_specialize=["batch", "num_programs", "min_chunk", "overhead", "h_total"])
def _mla_decode_fp8_merge(
    part_out_ptr,
    part_lse_ptr,
    kv_indptr_ptr,
    qo_indptr_ptr,
    out_ptr,
    batch,
    num_programs,
    min_chunk,
    overhead,
    h_total,
    stride_o_b,
    stride_o_h,
    QT: tl.constexpr,
    BLOCK_S: tl.constexpr,
    BLOCK_D: tl.constexpr,
):
    token = tl.program_id(0)
    head = tl.program_id(1)
    d = tl.program_id(2) * BLOCK_D + tl.arange(0, BLOCK_D)
    out = out_ptr + token.to(tl.int64) * stride_o_b + head * stride_o_h + d
    if QT == 1:
        req = token
        t = 0
        q_len = 1
    else:
        # The request whose query tokens hold this one: the last b with qo_indptr[b] <= token.
        lo = 0
        hi = batch
        while hi - lo > 1:
            mid = (lo + hi) // 2
            if tl.load(qo_indptr_ptr + mid) <= token:
                lo = mid
            else:
                hi = mid
        req = lo
        t = token - tl.load(qo_indptr_ptr + req)
        q_len = tl.load(qo_indptr_ptr + req + 1) - tl.load(qo_indptr_ptr + req)
    kv_start = tl.load(kv_indptr_ptr + req)
    kv_len = tl.load(kv_indptr_ptr + req + 1) - kv_start
    if (t < q_len) & (t >= QT):
        # A request with more query tokens than the caller's bound: stage 1 never computed
        # this one. Loud, not silently wrong.
        nan = tl.full([BLOCK_D], float("nan"), dtype=tl.float32)
        tl.store(out, nan.to(out_ptr.dtype.element_ty))
    elif (kv_len == 0) | (t >= q_len):
        # An empty request, or a token past the last request (graph padding): defined as zeros.
        tl.store(out, tl.zeros([BLOCK_D], dtype=out_ptr.dtype.element_ty))
    else:
        # The same geometry as stage 1: the programs whose chunks hold this request's tokens.
        chunk, _ = _chunk_of(kv_indptr_ptr, batch, num_programs, min_chunk, overhead)
        first = kv_start + req * overhead + overhead
        p_lo = first // chunk
        n_parts = (first + kv_len - 1) // chunk - p_lo + 1
        if n_parts > 1:  # one part: stage 1 wrote the output itself
            offs = tl.arange(0, BLOCK_S)
            # Part k sits in slot 2 * (p_lo + k), except the first when it starts mid-chunk.
            odd = tl.where(first > p_lo * chunk, 1, 0)
            # One pass, rescaled online: each block's loads need nothing from the previous one.
            m = float("-inf")
            acc = tl.zeros([BLOCK_D], dtype=tl.float32)
            w_sum = 0.0
            k0 = 0
            while k0 < n_parts:
                k = k0 + offs
                used = k < n_parts
                slot = 2 * (p_lo + k) + tl.where(k == 0, odd, 0)
                row = (slot * QT + t) * h_total + head
                lse = tl.load(part_lse_ptr + row, mask=used, other=float("-inf"))
                part = tl.load(
                    part_out_ptr + row.to(tl.int64)[:, None] * LATENT + d[None, :],
                    mask=used[:, None],
                    other=0.0,
                )
                m_new = tl.maximum(m, tl.max(lse, 0))
                # A causal token may see no slot of some parts (LSE -inf, weight 0); keep the
                # exponents finite while every part so far is such a one.
                m_safe = tl.where(m_new == float("-inf"), 0.0, m_new)
                # A NaN lse is skipped by the max above but poisons its own weight below, so
                # the output is NaN, as through the upstream cast.
                w = tl.where(used, tl.exp2(lse - m_safe), 0.0)
                rescale = tl.exp2(m - m_safe)
                acc = acc * rescale + tl.sum(part * w[:, None], 0)
                w_sum = w_sum * rescale + tl.sum(w, 0)
                m = m_new
                k0 += BLOCK_S
            # The largest part has weight 1, so the sum is >= 1 unless a NaN reached it.
            tl.store(out, (acc / w_sum).to(out_ptr.dtype.element_ty))


# Compiled kernels by everything Triton specialises a compile on, so that an eager call
# launches without JITFunction.run's argument binding (decode makes 2 launches per layer per
# step whenever it runs outside a CUDA graph). Set GLMSERVE_FP8_FAST_LAUNCH=0 to bypass.
_COMPILED: dict[tuple, Any] = {}
FAST_LAUNCH = os.environ.get("GLMSERVE_FP8_FAST_LAUNCH", "1") != "0"
_SPECIALISED: dict[Any, tuple[tuple[int, ...], tuple[int, ...]]] = {}


def _specialised_args(fn: Any) -> tuple[tuple[int, ...], tuple[int, ...]]:
    """(pointer positions, positions of ints Triton specialises on) of a kernel's arguments."""
    if fn not in _SPECIALISED:
        names = fn.arg_names
        ptrs = tuple(i for i, n in enumerate(names) if n.endswith("_ptr"))
        ints = tuple(
            i for i, n in enumerate(names)
            if n.startswith("stride") and n not in fn.do_not_specialize
        )  # fmt: skip
        _SPECIALISED[fn] = (ptrs, ints)
    return _SPECIALISED[fn]


def _launch(fn: Any, grid: tuple, args: tuple, constexprs: dict, num_warps: int, stages: int,
            on_gpu: bool) -> None:  # fmt: skip
    """fn[grid](*args, **constexprs), through the cached compiled kernel once there is one.

    The cache key holds what Triton's binder derives from the arguments: 16-byte alignment of
    every pointer, and for each stride whether it is 1, a multiple of 16 or wider than int32.
    """
    if not (FAST_LAUNCH and on_gpu):
        fn[grid](*args, **constexprs, num_warps=num_warps, num_stages=stages)
        return
    ptrs, ints = _specialised_args(fn)
    key = (
        fn,
        args[0].get_device(),
        tuple(constexprs.values()),
        num_warps,
        stages,
        tuple(args[i].data_ptr() % 16 == 0 for i in ptrs),
        tuple((args[i] == 1, args[i] % 16 == 0, args[i] >= 2**31) for i in ints),
    )
    kernel = _COMPILED.get(key)
    if kernel is None:
        _COMPILED[key] = fn[grid](*args, **constexprs, num_warps=num_warps, num_stages=stages)
        return
    # The raw current stream (what Triton's own launch reads; a CUDA-graph capture's stream
    # included), without building a torch Stream object per call.
    stream = torch._C._cuda_getCurrentRawStream(key[1])
    kernel.run(*grid, stream, kernel.function, kernel.packed_metadata, None, None, None, *args,
               *constexprs.values())  # fmt: skip


_DEVICE_INFO: dict[int, tuple[int, int, int]] = {}


def _device_info(device: torch.device) -> tuple[int, int, int]:
    """(SM count, shared memory a program may use, compute capability major), cached."""
    index = device.index if device.index is not None else torch.cuda.current_device()
    if index not in _DEVICE_INFO:
        props = triton.runtime.driver.active.utils.get_device_properties(index)
        major = torch.cuda.get_device_capability(index)[0]
        _DEVICE_INFO[index] = (props["multiprocessor_count"], props["max_shared_mem"], major)
    return _DEVICE_INFO[index]


def launch_config(num_heads: int, device: torch.device, q_tokens: int = 1) -> LaunchConfig:
    """The configuration for a head count and query tokens per request (QT) on a device
    (host-side: graph-stable)."""
    multi = q_tokens > 1
    form = FORM_KV_M if num_heads <= 8 else FORM_HEADS_M
    if device.type != "cuda":
        return CONFIG_INTERPRETER_MULTI if multi else CONFIG_INTERPRETER[form]
    _, shared, major = _device_info(device)
    if multi:
        large = {9: CONFIG_MULTI_SM90, 10: CONFIG_MULTI_SM100}.get(major)
        portable = CONFIG_MULTI
    elif form == FORM_KV_M:
        large, portable = (CONFIG_KV_M_SM90 if major == 9 else None), CONFIG_KV_M
    else:
        large, portable = (CONFIG_HEADS_M_SM90 if major == 9 else None), CONFIG_HEADS_M
    return large if large is not None and shared >= SHARED_BYTES[large] else portable


def num_programs_for(device: torch.device, config: LaunchConfig) -> int:
    """Stage-1 programs per head group: fixed per device and configuration, whatever the batch."""
    sms = _device_info(device)[0] if device.type == "cuda" else INTERPRETER_SMS
    return sms * config.programs_per_sm


def query_tokens(max_q_len: int) -> int:
    """QT: the query tokens per request a program holds (a power of two >= max_q_len)."""
    return 1 << max(0, (max_q_len - 1).bit_length())


class _Workspaces:
    """Partial-result buffers, one per (device, programs, rows per slot), kept for the process.

    A CUDA graph captured with a buffer keeps its address: replacing the buffer by a larger one
    would leave the graph writing into freed memory. The size does not depend on the batch, so
    a process needs one buffer per device and row layout (decode; a multi-token path), and none
    is ever freed.
    """

    def __init__(self) -> None:
        self._buffers: dict[tuple, tuple[torch.Tensor, torch.Tensor]] = {}

    def get(self, device: torch.device, programs: int, slot_rows: int):
        key = (device.type, device.index, programs, slot_rows)
        found = self._buffers.get(key)
        if found is not None:
            return found
        if device.type == "cuda" and torch.cuda.is_current_stream_capturing():
            # Memory taken during capture belongs to the graph's private pool; the first
            # decode of a process runs eagerly, so reaching this is a bug, not a cold start.
            raise RuntimeError(
                "glmserve native fp8 decode: workspace first requested inside CUDA-graph capture"
            )
        rows = 2 * programs * slot_rows
        found = (
            torch.empty((rows, D_LATENT), dtype=torch.float32, device=device),
            torch.empty((rows,), dtype=torch.float32, device=device),
        )
        self._buffers[key] = found
        return found

    def buffers(self) -> list[tuple[torch.Tensor, torch.Tensor]]:
        """Every buffer handed out so far (all alive: none is ever replaced)."""
        return list(self._buffers.values())


WORKSPACES = _Workspaces()


def mla_decode_fp8(
    q_nope: torch.Tensor,
    q_pe: torch.Tensor,
    kv_pool: torch.Tensor,
    kv_indptr: torch.Tensor,
    kv_indices: torch.Tensor,
    sm_scale: float,
    out: torch.Tensor,
    *,
    qo_indptr: torch.Tensor | None = None,
    max_q_len: int = 1,
    config: LaunchConfig | None = None,
    num_programs: int | None = None,
) -> torch.Tensor:
    """MLA attention over an FP8 e4m3 KV pool: decode, or several causal query tokens per
    request (speculative target verify, draft extend).

    ``q_nope`` [T, H, 512] and ``q_pe`` [T, H, 64] bf16, one row per query token; ``kv_pool``
    [slots, 1, 576] (or [slots, 576]) float8_e4m3fn whose first 512 columns are the latent
    (also V) and last 64 the rope part; request ``b`` attends to slots
    ``kv_indices[kv_indptr[b]:kv_indptr[b+1]]`` (int32); ``out`` [T, H, 512] bf16 receives the
    result and is returned.

    Decode (``qo_indptr`` None): token ``b`` is request ``b``'s one query and sees every slot.
    With ``qo_indptr`` (int32 [batch + 1]), request ``b`` owns tokens
    ``qo_indptr[b]:qo_indptr[b+1]``, at most ``max_q_len`` of them (the caller's bound, known
    on the host), and its token ``t`` of ``q_len`` sees slot positions ``0 .. kv_len - q_len +
    t`` (causal, aligned to the end, as FlashInfer's causal paged plan). An empty request, or a
    token no request owns, gets zeros. No host sync and, after the first call on a device with
    a row layout, no allocation.
    """
    if kv_pool.dtype != torch.float8_e4m3fn:
        raise TypeError(f"kv_pool must be float8_e4m3fn, got {kv_pool.dtype}")
    for name, t in (("q_nope", q_nope), ("q_pe", q_pe), ("out", out)):
        if t.dtype != torch.bfloat16:
            raise TypeError(f"{name} must be bfloat16, got {t.dtype}")
        if t.dim() != 3 or t.stride(-1) != 1:
            raise ValueError(f"{name} must be [T, H, D] with contiguous D")
    tokens, heads, d_lat = q_nope.shape
    d_pe = q_pe.shape[-1]
    if d_lat != D_LATENT or d_pe != D_ROPE:
        raise ValueError(f"expects {D_LATENT}+{D_ROPE} dims, got {d_lat}+{d_pe}")
    if tuple(q_pe.shape[:2]) != (tokens, heads) or tuple(out.shape) != (tokens, heads, d_lat):
        raise ValueError("q_nope, q_pe and out disagree on [T, H]")
    n_rows = kv_pool.shape[0]
    if kv_pool.shape[1:] not in ((D_LATENT + D_ROPE,), (1, D_LATENT + D_ROPE)) or (
        kv_pool.stride(-1) != 1
    ):
        raise ValueError(f"kv_pool rows must be {D_LATENT + D_ROPE} contiguous bytes")
    if kv_indptr.dtype != torch.int32 or kv_indices.dtype != torch.int32:
        raise TypeError("kv_indptr and kv_indices must be int32")
    if qo_indptr is None:
        if max_q_len != 1:
            raise ValueError("max_q_len > 1 needs qo_indptr")
        batch = tokens
    else:
        if qo_indptr.dtype != torch.int32 or qo_indptr.dim() != 1 or qo_indptr.numel() < 1:
            raise TypeError("qo_indptr must be a 1-D int32 tensor of batch + 1 entries")
        if max_q_len < 1:
            raise ValueError(f"max_q_len must be at least 1, got {max_q_len}")
        batch = qo_indptr.numel() - 1
    if kv_indptr.numel() < batch + 1:
        raise ValueError(f"kv_indptr has {kv_indptr.numel()} entries, needs {batch + 1}")
    if batch == 0 or tokens == 0 or heads == 0:
        return out

    device = q_nope.device
    on_gpu = device.type == "cuda"
    # QT == 1 is decode (no qo_indptr read); a speculative batch holds at least two rows.
    qt = 1 if qo_indptr is None else max(2, query_tokens(max_q_len))
    cfg = config or launch_config(heads, device, qt)
    hp = cfg.heads_per_program
    groups = -(-heads // hp)
    programs = num_programs or num_programs_for(device, cfg)
    part_out, part_lse = WORKSPACES.get(device, programs, qt * groups * hp)
    pool = kv_pool.view(torch.uint8)
    # Decode reads no qo_indptr (QT == 1): any int32 pointer stands in.
    qo = kv_indptr if qo_indptr is None else qo_indptr
    _launch(
        _mla_decode_fp8_stage1,
        (groups, programs, 1),
        (q_nope, q_pe, pool, kv_indptr, kv_indices, qo, out, part_out, part_lse,
         sm_scale * LOG2E, batch, heads, n_rows, cfg.min_chunk, cfg.overhead,
         q_nope.stride(0), q_nope.stride(1), q_pe.stride(0), q_pe.stride(1), pool.stride(0),
         out.stride(0), out.stride(1)),
        dict(HP=hp, QT=qt, BLOCK_N=cfg.block_n, D_PE=D_ROPE, FORM=cfg.form, ASM_CVT=on_gpu,
             ON_CPU=not on_gpu),
        cfg.num_warps,
        cfg.num_stages,
        on_gpu,
    )  # fmt: skip
    _launch(
        _mla_decode_fp8_merge,
        (tokens, heads, D_LATENT // MERGE_BLOCK_D),
        (part_out, part_lse, kv_indptr, qo, out, batch, programs, cfg.min_chunk, cfg.overhead,
         groups * hp, out.stride(0), out.stride(1)),
        dict(QT=qt, BLOCK_S=MERGE_BLOCK_S, BLOCK_D=MERGE_BLOCK_D),
        4,
        1,
        on_gpu,
    )  # fmt: skip
    return out


def decode_mode() -> str:
    """GLMSERVE_FP8_ATTENTION: 'native' (default; also when empty or 'auto', the launcher's
    choose-for-me value when no launcher chose) or 'gather'; anything else is refused."""
    raw = os.environ.get(ENV_MODE, "").strip().lower() or DEFAULT_MODE
    if raw == "auto":
        raw = DEFAULT_MODE
    if raw not in MODES:
        raise ValueError(f"{ENV_MODE} must be one of {', '.join(MODES)}, got {raw!r}")
    return raw


def unsupported_reason(model_runner: Any) -> str | None:
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


# Speculative batches go native up to this many heads per rank. Above it the kernel holds 8 heads
# per program and reads every KV tile once per 8: on the H100 at 16 heads and 4 query tokens it
# took 1.1-1.5x the gather path's time from 8 requests up (bench/results/fp8-verify-h100-*), while
# at 8 heads (GLM-5 at TP8) it took 0.67-0.85x.
VERIFY_MAX_HEADS = 8


def speculative_tokens(model_runner: Any) -> int:
    """The most query tokens a speculative batch holds per request (target verify: the draft
    tokens; draft extend: the accepted ones plus one, no more), 1 without speculation."""
    args = getattr(model_runner, "server_args", None)
    return max(1, int(getattr(args, "speculative_num_draft_tokens", None) or 1))


class Fp8NativeDecode:
    """Per-backend state: what each wrapper was last planned with, for the native kernel.

    A decode wrapper records (kv_indptr, sm_scale, None, 1). A wrapper planned for a
    speculative batch of several causal query tokens per request (target verify, draft extend)
    records (kv_indptr, sm_scale, qo_indptr, max_q_len). A wrapper recorded as None keeps the
    gather-then-cast path, as does every other extend (prefill).
    """

    def __init__(self, max_spec_tokens: int = 1) -> None:
        self.max_spec_tokens = max_spec_tokens
        self._plans: weakref.WeakKeyDictionary[Any, tuple | None] = weakref.WeakKeyDictionary()
        # Per wrapper: device buffers that hold a speculative plan's indptrs (see note_plan).
        self._indptr_bufs: weakref.WeakKeyDictionary[Any, torch.Tensor] = (
            weakref.WeakKeyDictionary()
        )

    @classmethod
    def create(cls, model_runner: Any, patch_on: bool) -> Fp8NativeDecode | None:
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
        spec = speculative_tokens(model_runner)
        _announce(
            "glmserve FP8 KV decode: native FP8 kernel (fp8_mla_decode.py)"
            + (f", speculative verify/draft extend too (<= {spec} tokens per request)" if spec > 1
               else "")
            + "; prefill/extend: gather-then-cast + FlashInfer"
        )  # fmt: skip
        return cls(spec)

    def note_plan(
        self,
        wrapper: Any,
        kv_indptr: torch.Tensor | None,
        sm_scale: float,
        qo_indptr: torch.Tensor | None = None,
        max_q_len: int = 1,
        num_heads: int | None = None,
    ) -> None:
        """Record what `wrapper` was planned with (kv_indptr None: the gather path serves it).
        Called after every plan, outside CUDA graphs. A speculative batch with more than
        VERIFY_MAX_HEADS heads per rank (`num_heads`) is recorded for the gather path.

        Decode passes a view of a persistent kv_indptr buffer, which a captured graph reads
        as is. A speculative batch passes `qo_indptr` and the host-known bound `max_q_len`; its
        indptrs are tensors SGLang builds anew for every plan (on the host or the device), so
        they are copied into device buffers this wrapper keeps for its life, the ones a graph
        captured with it reads. The kernel writes NaN for a token past `max_q_len`."""
        if qo_indptr is not None and (num_heads or 0) > VERIFY_MAX_HEADS:
            _announce(
                f"glmserve FP8 KV speculative verify/draft extend: gather-then-cast + FlashInfer "
                f"({num_heads} heads per rank: the native kernel serves up to {VERIFY_MAX_HEADS})"
            )
            kv_indptr = None
        if kv_indptr is not None and qo_indptr is not None:
            kv_indptr, qo_indptr = self._stable_indptrs(wrapper, kv_indptr, qo_indptr)
        self._plans[wrapper] = (
            None if kv_indptr is None else (kv_indptr, sm_scale, qo_indptr, max_q_len)
        )

    def _stable_indptrs(
        self, wrapper: Any, kv_indptr: torch.Tensor, qo_indptr: torch.Tensor
    ) -> tuple[torch.Tensor, torch.Tensor]:
        n = kv_indptr.numel()
        if qo_indptr.numel() != n:
            raise ValueError(f"qo_indptr has {qo_indptr.numel()} entries, kv_indptr {n}")
        buf = self._indptr_bufs.get(wrapper)
        if buf is None or buf.shape[1] < n:
            if buf is not None and getattr(wrapper, "_use_cuda_graph", False):
                # A graph captured with this wrapper reads the old buffer: never replace it.
                raise RuntimeError(
                    f"glmserve native fp8: a CUDA-graph wrapper planned {n - 1} requests, more "
                    f"than the {buf.shape[1] - 1} it was captured with"
                )
            if torch.cuda.is_available() and torch.cuda.is_current_stream_capturing():
                raise RuntimeError("glmserve native fp8: speculative plan inside graph capture")
            device = getattr(wrapper, "device", None) or kv_indptr.device
            size = n if getattr(wrapper, "_use_cuda_graph", False) else 1 << (n - 1).bit_length()
            buf = torch.zeros((2, size), dtype=torch.int32, device=device)
            self._indptr_bufs[wrapper] = buf
        buf[0, :n].copy_(kv_indptr, non_blocking=True)
        buf[1, :n].copy_(qo_indptr, non_blocking=True)
        return buf[0, :n], buf[1, :n]

    def planned(self, wrapper: Any) -> tuple | None:
        """(kv_indptr, sm_scale, qo_indptr, max_q_len) of `wrapper`'s last plan if the native
        kernel serves it (qo_indptr None: decode)."""
        return self._plans.get(wrapper)
