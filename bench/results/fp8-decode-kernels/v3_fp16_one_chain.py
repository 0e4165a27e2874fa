"""Native FP8 MLA decode attention (added by the glmserve patch series).

FlashInfer's fa2 MLA kernel (SM120's family) reads only 16-bit KV, so with an FP8 KV cache
the gather-then-cast path (``fp8_kv_gather.py``) must first write a BF16 copy of every row
the step reads and FlashInfer then reads it again: 5 bytes moved per KV element against 2
for a BF16 pool. This kernel reads the FP8 e4m3 pool itself, 1 byte per element, through
the step's ``kv_indptr``/``kv_indices`` (the buffers FlashInfer plans with), converts each
tile in registers, keeps q in BF16 and accumulates in fp32.

Design (flash-decoding):
  * stage 1, grid (head groups, requests, splits): each program owns BLOCK_H heads of one
    request and one contiguous slice of its KV. MLA's latent row is shared by every head,
    so one FP8 tile load feeds all BLOCK_H heads' QK and PV products (tensor-core dots);
    online softmax in fp32 (exp2 domain). One split per request writes the bf16 output
    directly; otherwise each split writes its normalised partial output and log-sum-exp;
  * stage 2, grid (requests, heads, 512 / BLOCK_D): merges the splits by their log-sum-exp.

Why it is safe inside CUDA graphs: the grid depends only on the batch size and head count
(fixed per captured graph); each request's length and each split's slice are computed on
the device from ``kv_indptr``; the partial-result workspace is allocated once per device,
never inside a capture; nothing is allocated per call and nothing syncs with the host.

The split count is chosen on the host from the batch size (enough programs to fill the GPU);
on the device, a split never gets fewer than MIN_CHUNK tokens, so short requests use fewer
splits and the unused programs exit at once.

Numerics: the FP8 values are converted exactly (every e4m3 value is a bf16 value); the
differences to FlashInfer on the BF16 cast are the usual ones between two flash-attention
kernels (the order of fp32 accumulation, where P is rounded to bf16).
"""

from __future__ import annotations

import torch
import triton
import triton.language as tl

D_LATENT = 512  # kv_lora_rank: the latent part, which is also V
D_ROPE = 64  # qk_rope_head_dim
LOG2E = 1.4426950408889634
P_SCALE = tl.constexpr(32768.0)  # softmax weights are in (0, 1]: x 2^15 stays below fp16's max

# Launch shape (tuned on an H200 with bench/native_decode.py; correct for any value).
BLOCK_H = 16  # heads per program: the smallest tensor-core M; fewer heads are masked
BLOCK_N = 32  # KV rows per tile
NUM_WARPS = 8
NUM_STAGES = 2
SPLIT_PROGRAMS_PER_SM = 2  # stage-1 programs aimed for when choosing the split count
MIN_CHUNK = 64  # fewest KV rows one split takes (a split is per request)
MAX_SPLITS = 256
MERGE_BLOCK_D = 128
MERGE_BLOCK_S = 16
# Programs used for the split count when the tensors are not on a CUDA device (interpreter).
INTERPRETER_SMS = 4


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
    acc,
    q_nope,
    q_pe,
    kv_ptr,
    kv_indices_ptr,
    kv_start,
    n_pool_rows,
    stride_kv,
    qk_scale,
    BLOCK_H: tl.constexpr,
    BLOCK_N: tl.constexpr,
    D_LAT: tl.constexpr,
    D_PE: tl.constexpr,
    SCORES_T: tl.constexpr,
    ASM_CVT: tl.constexpr,
    ON_CPU: tl.constexpr,
):
    """One BLOCK_N-row tile of one request's KV: the online-softmax update for BLOCK_H heads."""
    pos = off + tl.arange(0, BLOCK_N)
    live = pos < hi
    slot = tl.load(kv_indices_ptr + kv_start + pos, mask=live, other=0)
    # Never read outside the pool, whatever the index buffer holds.
    live = live & (slot >= 0) & (slot < n_pool_rows)
    row = kv_ptr + slot.to(tl.int64)[:, None] * stride_kv
    d_lat = tl.arange(0, D_LAT)
    d_pe = tl.arange(0, D_PE)
    raw_pe = tl.load(row + D_LAT + d_pe[None, :], mask=live[:, None], other=0)
    k_pe = _e4m3_to_f16(raw_pe, ASM_CVT)
    raw_lat = tl.load(row + d_lat[None, :], mask=live[:, None], other=0)
    # e4m3 -> fp16 is exact and one instruction per two values (bf16 would need a second
    # conversion per value); one conversion per tile serves every head, for QK and for PV.
    k_lat = _e4m3_to_f16(raw_lat, ASM_CVT)
    if SCORES_T:
        # Scores as [BLOCK_N, BLOCK_H] = K q^T: the KV tile is the A operand in its stored
        # (row-major) order, so the tile needs only one shared-memory copy for both products.
        st = tl.zeros([BLOCK_N, BLOCK_H], dtype=tl.float32)
        st = tl.dot(k_lat, tl.trans(q_nope), st)
        st = tl.dot(k_pe, tl.trans(q_pe), st)
        st = tl.where(live[:, None], st * qk_scale[None, :], float("-inf"))
        m_new = tl.maximum(m_i, tl.max(st, 0))
        m_safe = tl.where(m_new == float("-inf"), 0.0, m_new)
        alpha = tl.exp2(m_i - m_safe)
        pt = tl.exp2(st - m_safe[None, :])
        l_i = l_i * alpha + tl.sum(pt, 0)
        acc = acc * alpha[:, None]
        p = tl.trans(pt)
    else:
        qk = tl.zeros([BLOCK_H, BLOCK_N], dtype=tl.float32)
        qk = tl.dot(q_nope, tl.trans(k_lat), qk)
        qk = tl.dot(q_pe, tl.trans(k_pe), qk)
        qk = tl.where(live[None, :], qk * qk_scale[:, None], float("-inf"))
        m_new = tl.maximum(m_i, tl.max(qk, 1))
        # m_new is -inf only while every score so far is masked: keep exp2 finite.
        m_safe = tl.where(m_new == float("-inf"), 0.0, m_new)
        alpha = tl.exp2(m_i - m_safe)
        p = tl.exp2(qk - m_safe[:, None])
        l_i = l_i * alpha + tl.sum(p, 1)
        acc = acc * alpha[:, None]
    # P is scaled by 2^15 into fp16's normal range (exact), so small weights keep 11 bits.
    acc = tl.dot((p * P_SCALE).to(tl.float16), k_lat, acc)
    return m_new, l_i, acc


@triton.jit
def _mla_decode_fp8_stage1(
    q_nope_ptr,
    q_pe_ptr,
    kv_ptr,  # uint8 view of the FP8 e4m3 pool, rows of D_LAT + D_PE bytes
    kv_indptr_ptr,
    kv_indices_ptr,
    out_ptr,  # bf16 [B, H, D_LAT]: written when there is one split
    part_out_ptr,  # fp32 [B, H_PAD, num_splits, D_LAT]: written when there are several
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
    D_LAT: tl.constexpr,
    D_PE: tl.constexpr,
    SPLIT: tl.constexpr,  # num_splits > 1
    SCORES_T: tl.constexpr,
    ASM_CVT: tl.constexpr,
    ON_CPU: tl.constexpr,  # running under TRITON_INTERPRET=1 (see _dot and the loop below)
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
    d_lat = tl.arange(0, D_LAT)
    d_pe = tl.arange(0, D_PE)

    # Splits past the end of a short request have nothing to do (the merge skips them).
    if lo < hi or split == 0:
        q_nope = tl.load(
            q_nope_ptr + req * stride_qn_b + heads[:, None] * stride_qn_h + d_lat[None, :],
            mask=head_ok[:, None],
            other=0.0,
        ).to(tl.float32)
        q_pe = tl.load(
            q_pe_ptr + req * stride_qp_b + heads[:, None] * stride_qp_h + d_pe[None, :],
            mask=head_ok[:, None],
            other=0.0,
        ).to(tl.float32)
        # q goes to the tensor cores as fp16, each (request, head) row first scaled by a power
        # of two that puts its largest |value| in [2^14, 2^15): every bf16 value within 2^31
        # of that maximum is then exact in fp16, so q is not quantized; the scale is undone
        # in the softmax exponent.
        amax = tl.maximum(tl.max(tl.abs(q_nope), 1), tl.max(tl.abs(q_pe), 1))
        exp_amax = ((amax.to(tl.int32, bitcast=True) >> 23) & 0xFF) - 127
        shift = tl.minimum(tl.maximum(14 - exp_amax, -100), 100)
        shift = tl.where(amax > 0.0, shift, 0)
        q_scale = ((shift + 127) << 23).to(tl.float32, bitcast=True)
        q_nope = (q_nope * q_scale[:, None]).to(tl.float16)
        q_pe = (q_pe * q_scale[:, None]).to(tl.float16)
        row_qk_scale = qk_scale / q_scale
        m_i = tl.full([BLOCK_H], float("-inf"), dtype=tl.float32)
        l_i = tl.zeros([BLOCK_H], dtype=tl.float32)
        acc = tl.zeros([BLOCK_H, D_LAT], dtype=tl.float32)
        if ON_CPU:
            # The interpreter cannot take a device-loaded bound in range() (Triton 3.6 with
            # numpy >= 2.3); a `while` runs the same iterations over the same tile body.
            off = lo
            while off < hi:
                m_i, l_i, acc = _attend_tile(
                    off, hi, m_i, l_i, acc, q_nope, q_pe, kv_ptr, kv_indices_ptr, kv_start,
                    n_pool_rows, stride_kv, row_qk_scale, BLOCK_H, BLOCK_N, D_LAT, D_PE, SCORES_T, ASM_CVT, ON_CPU,
                )  # fmt: skip
                off += BLOCK_N
        else:
            # A `for` with a device-computed bound: Triton software-pipelines it (the next
            # tile's index and row loads go to shared memory asynchronously while this tile
            # computes), which a `while` does not get. Still one launch for any length.
            for off in range(lo, hi, BLOCK_N):
                m_i, l_i, acc = _attend_tile(
                    off, hi, m_i, l_i, acc, q_nope, q_pe, kv_ptr, kv_indices_ptr, kv_start,
                    n_pool_rows, stride_kv, row_qk_scale, BLOCK_H, BLOCK_N, D_LAT, D_PE, SCORES_T, ASM_CVT, ON_CPU,
                )  # fmt: skip

        # An empty request (kv_len 0) has l_i == 0: its output is defined as zeros.
        has_mass = l_i > 0.0
        inv_l = tl.where(has_mass, 1.0 / tl.where(has_mass, l_i * P_SCALE, 1.0), 0.0)
        o = acc * inv_l[:, None]
        if SPLIT:
            lse = tl.where(has_mass, m_i + tl.log2(tl.where(has_mass, l_i, 1.0)), float("-inf"))
            h_pad = tl.num_programs(0) * BLOCK_H
            part_row = (req * h_pad + heads) * num_splits + split
            tl.store(part_out_ptr + part_row.to(tl.int64)[:, None] * D_LAT + d_lat[None, :], o)
            tl.store(part_lse_ptr + part_row, lse)
        else:
            tl.store(
                out_ptr + req * stride_o_b + heads[:, None] * stride_o_h + d_lat[None, :],
                o.to(out_ptr.dtype.element_ty),
                mask=head_ok[:, None],
            )


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


_SM_COUNT: dict[int, int] = {}


def _sm_count(device: torch.device) -> int:
    if device.type != "cuda":
        return INTERPRETER_SMS
    index = device.index if device.index is not None else torch.cuda.current_device()
    if index not in _SM_COUNT:
        _SM_COUNT[index] = torch.cuda.get_device_properties(index).multi_processor_count
    return _SM_COUNT[index]


def num_splits_for(batch: int, num_heads: int, device: torch.device) -> int:
    """Host-side split count: a fixed function of the batch shape (graph-stable)."""
    groups = triton.cdiv(num_heads, BLOCK_H)
    target = _sm_count(device) * SPLIT_PROGRAMS_PER_SM
    return max(1, min(MAX_SPLITS, triton.cdiv(target, max(batch, 1) * groups)))


# Partial results, one buffer per device, shared by every layer and call (layers run one
# after another on one stream; a call's merge consumes its partials before the next call).
_WORKSPACES: dict[tuple, tuple[torch.Tensor, torch.Tensor]] = {}


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
    # Sized for the largest split layout any batch gets (see num_splits_for): with more than
    # one split, batch * groups < target, so batch * splits * groups < 2 * target.
    cap = max(rows, 2 * _sm_count(device) * SPLIT_PROGRAMS_PER_SM * BLOCK_H)
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
    num_splits: int | None = None,
    block_n: int | None = None,
    num_warps: int | None = None,
    num_stages: int | None = None,
    min_chunk: int | None = None,
    scores_t: bool = False,
    asm_cvt: bool = False,
) -> torch.Tensor:
    """MLA decode attention over an FP8 e4m3 KV pool, one query token per request.

    ``q_nope`` [B, H, 512] and ``q_pe`` [B, H, 64] bf16; ``kv_pool`` [slots, 1, 576] (or
    [slots, 576]) float8_e4m3fn whose first 512 columns are the latent (also V) and last 64
    the rope part; request ``b`` attends to slots ``kv_indices[kv_indptr[b]:kv_indptr[b+1]]``
    (int32); ``out`` [B, H, 512] bf16 receives the result and is returned. An empty request
    gets zeros. No host sync, no allocation after the first call: CUDA-graph safe.
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

    groups = triton.cdiv(heads, BLOCK_H)
    splits = num_splits or num_splits_for(batch, heads, q_nope.device)
    bn = block_n or BLOCK_N
    chunk_floor = min_chunk or MIN_CHUNK
    h_pad = groups * BLOCK_H
    part_out, part_lse = _workspace(q_nope.device, batch * h_pad * splits)
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
        chunk_floor,
        q_nope.stride(0),
        q_nope.stride(1),
        q_pe.stride(0),
        q_pe.stride(1),
        pool.stride(0),
        out.stride(0),
        out.stride(1),
        BLOCK_H=BLOCK_H,
        BLOCK_N=bn,
        D_LAT=D_LATENT,
        D_PE=D_ROPE,
        SPLIT=splits > 1,
        SCORES_T=scores_t,
        ASM_CVT=asm_cvt and q_nope.device.type == "cuda",
        ON_CPU=q_nope.device.type != "cuda",
        num_warps=num_warps or NUM_WARPS,
        num_stages=num_stages or NUM_STAGES,
    )
    if splits > 1:
        _mla_decode_fp8_merge[(batch, heads, D_LATENT // MERGE_BLOCK_D)](
            part_out,
            part_lse,
            kv_indptr,
            out,
            h_pad,
            splits,
            chunk_floor,
            out.stride(0),
            out.stride(1),
            BLOCK_N=bn,
            BLOCK_S=MERGE_BLOCK_S,
            BLOCK_D=MERGE_BLOCK_D,
            D_LAT=D_LATENT,
        )
    return out


def reference_mla_decode(
    q_nope: torch.Tensor,
    q_pe: torch.Tensor,
    kv_pool: torch.Tensor,
    kv_indptr: torch.Tensor,
    kv_indices: torch.Tensor,
    sm_scale: float,
    dtype: torch.dtype = torch.float64,
) -> torch.Tensor:
    """The same function in ``dtype`` (fp64 by default) with torch ops, for tests."""
    n_rows = kv_pool.shape[0]
    kv = kv_pool.reshape(n_rows, -1).to(dtype)
    indptr = kv_indptr.tolist()
    out = torch.zeros(q_nope.shape, dtype=dtype, device=q_nope.device)
    for b in range(q_nope.shape[0]):
        rows = kv[kv_indices[indptr[b] : indptr[b + 1]].long()]
        if rows.shape[0] == 0:
            continue
        q = torch.cat([q_nope[b], q_pe[b]], dim=-1).to(dtype)  # [H, 576]
        scores = (q @ rows.T) * sm_scale
        out[b] = torch.softmax(scores, dim=-1) @ rows[:, :D_LATENT]
    return out
