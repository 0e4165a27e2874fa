"""Gather-then-cast of the FP8 MLA KV pool (added by the glmserve patch series).

Upstream ``flashinfer_mla_backend`` feeds FlashInfer's MLA kernel a BF16 copy of the KV
pool made with ``get_key_buffer(layer_id).to(q.dtype)``: with ``--kv-cache-dtype fp8_e4m3``
that converts the WHOLE pool (every slot, used or not) for every layer of every step,
because FlashInfer's fa2 MLA kernel (the SM120 family) only reads 16-bit KV.

This module converts only the slots the current step references. The result goes into a
"shadow" buffer shaped like one layer's pool (the same memory the upstream cast allocates
transiently), at the SAME slot positions: ``shadow[s] = pool[s].to(bf16)`` for every slot
``s`` in FlashInfer's ``kv_indices``. FlashInfer then runs with its own, unchanged
``kv_indices`` and plan, so there is no replan and no second index array. Rows FlashInfer
does not read may hold stale values from another layer; it never reads them.

Why this is safe inside CUDA graphs:
  * the number of referenced slots is read ON THE DEVICE from a 1-element buffer
    (``Fp8KvGather.rows``), which the backend refreshes outside the graph whenever it plans;
  * the grid is fixed (a multiple of the SM count) and each program walks tiles with a
    grid stride, so one captured launch covers any count;
  * the indices are FlashInfer's own ``kv_indices`` buffer, which is the capture-stable
    ``cuda_graph_kv_indices`` buffer when the wrapper was built for graphs;
  * the shadow is allocated once, never inside a capture, and nothing is allocated per call.

Exactness: every FP8 e4m3 value is exactly representable in bf16 and fp16, so the rows
FlashInfer reads are bit-identical to the upstream cast. Duplicate slots (radix-cache
prefix sharing) write the same value twice. When the count reaches the pool size the
kernel converts the pool contiguously instead (decided on the device), so the cost is
O(min(referenced rows, pool rows)).

FlashAttention's absorbed-MLA path (``flashattention_backend.py``, fa3) reads KV through a page
table instead: ``cast_pages`` converts every row of every page that ``page_table[b]`` maps for
``cache_seqlens[b]`` tokens (whole pages, so even a page's tail rows equal the upstream cast),
reading the lengths and the table on the device. The grid depends only on the batch size, which
is fixed per captured graph, and both tensors are the graph's persistent metadata buffers.

``GLMSERVE_FP8_GATHER=0`` restores the upstream full-pool cast (A/B runs, escape hatch). So does a
GPU without a hardware e4m3 convert (compute capability below 8.9, e.g. A100): the kernel cannot
compile there, so the gather turns itself off, says so in one log line, and the upstream cast runs.
"""

from __future__ import annotations

import logging
import os

import torch
import triton
import triton.language as tl

ENV_SWITCH = "GLMSERVE_FP8_GATHER"
# Hardware e4m3 -> f32 convert (Ada, Hopper, Blackwell): the kernel's float8e4nv needs it.
MIN_CAPABILITY = (8, 9)

# Launch shape. Tuned on an H200 (bench/gather_cast.py); the kernel is correct for any value.
BLOCK_ROWS = 8
NUM_WARPS = 4
PROGRAMS_PER_SM = 8
# Grid used when the tensors are not on a CUDA device (TRITON_INTERPRET=1 tests).
INTERPRETER_PROGRAMS = 3

# FlashInfer MLA backends whose plan writes the wrapper's _kv_indices_buf, the buffer the gather
# reads (FlashInfer 0.7.x; trtllm-gen, cute-dsl, xqa, cutlass and cutile keep their own copy).
WRAPPER_BACKENDS = ("fa2", "fa3")

_TRUE = ("1", "true", "on", "yes")
_FALSE = ("0", "false", "off", "no")

_logger = logging.getLogger(__name__)
_unsupported_logged = False


def fp8_gather_enabled() -> bool:
    """Whether the patched path is on (default) or the upstream full cast is requested."""
    raw = os.environ.get(ENV_SWITCH, "1").strip().lower()
    if raw in _TRUE:
        return True
    if raw in _FALSE:
        return False
    raise ValueError(f"{ENV_SWITCH} must be 0 or 1, got {raw!r}")


def fp8_gather_supported(device: torch.device) -> bool:
    """Whether this device can run the kernel; logs once per process when it cannot."""
    global _unsupported_logged
    device = torch.device(device)
    if device.type != "cuda":
        return True  # the Triton interpreter (TRITON_INTERPRET=1) converts in software
    major, minor = torch.cuda.get_device_capability(device)
    if (major, minor) >= MIN_CAPABILITY:
        return True
    if not _unsupported_logged:
        _unsupported_logged = True
        _logger.warning(
            "glmserve fp8 gather: off, compute capability %d.%d has no hardware FP8 e4m3 "
            "convert (needs %d.%d); running the upstream full-pool cast",
            major,
            minor,
            *MIN_CAPABILITY,
        )
    return False


@triton.jit
def _fp8_gather_cast_kernel(
    src_ptr,  # uint8 view of the FP8 e4m3 pool: n_pool_rows rows of D bytes, row stride src_stride
    dst_ptr,  # 16-bit shadow with the same rows (row stride dst_stride elements)
    idx_ptr,  # slot ids FlashInfer will read (its kv_indices)
    count_ptr,  # int32[1]: how many entries of idx_ptr are live; read on the device
    n_pool_rows,
    src_stride,
    dst_stride,
    D: tl.constexpr,
    BLOCK_R: tl.constexpr,
    BLOCK_A: tl.constexpr,  # largest power of two <= D
    BLOCK_B: tl.constexpr,  # power of two covering D - BLOCK_A (0 when D is a power of two)
):
    pid = tl.program_id(0)
    nprog = tl.num_programs(0)
    count = tl.load(count_ptr)
    # At or past one row per pool slot, converting the pool contiguously is never slower
    # than gathering (and reads no indices); decided here so a captured graph adapts.
    full = count >= n_pool_rows
    limit = tl.where(full, n_pool_rows, count)
    n_tiles = tl.cdiv(limit, BLOCK_R)
    offs_r = tl.arange(0, BLOCK_R)
    cols_a = tl.arange(0, BLOCK_A)
    # A `while` on a device-loaded bound: it compiles to a dynamic loop on the GPU (CUDA-graph
    # safe) and also runs under TRITON_INTERPRET=1, where `range(pid, <loaded>, nprog)` fails.
    tile = pid
    while tile < n_tiles:
        pos = tile * BLOCK_R + offs_r
        live = pos < limit
        slot = tl.load(idx_ptr + pos, mask=live & (count < n_pool_rows), other=0)
        slot = tl.where(full, pos, slot).to(tl.int64)
        # Never touch memory outside the pool, whatever the index buffer holds.
        ok = live & (slot >= 0) & (slot < n_pool_rows)
        src_row = src_ptr + slot[:, None] * src_stride
        dst_row = dst_ptr + slot[:, None] * dst_stride
        raw = tl.load(src_row + cols_a[None, :], mask=ok[:, None])
        # Hardware e4m3 -> f32 convert; f32 -> 16-bit is exact for every e4m3 value.
        val = raw.to(tl.float8e4nv, bitcast=True).to(tl.float32)
        tl.store(dst_row + cols_a[None, :], val.to(dst_ptr.dtype.element_ty), mask=ok[:, None])
        if BLOCK_B > 0:
            cols_b = BLOCK_A + tl.arange(0, BLOCK_B)
            mask_b = ok[:, None] & (cols_b[None, :] < D)
            raw_b = tl.load(src_row + cols_b[None, :], mask=mask_b)
            val_b = raw_b.to(tl.float8e4nv, bitcast=True).to(tl.float32)
            tl.store(dst_row + cols_b[None, :], val_b.to(dst_ptr.dtype.element_ty), mask=mask_b)
        tile += nprog


_SM_COUNT: dict[int, int] = {}


def default_grid(device: torch.device) -> int:
    """Fixed number of programs: a few per SM, independent of the row count."""
    if device.type != "cuda":
        return INTERPRETER_PROGRAMS
    index = device.index if device.index is not None else torch.cuda.current_device()
    if index not in _SM_COUNT:
        _SM_COUNT[index] = torch.cuda.get_device_properties(index).multi_processor_count
    return _SM_COUNT[index] * PROGRAMS_PER_SM


def _pow2_floor(n: int) -> int:
    return 1 << (n.bit_length() - 1)


def gather_cast(
    pool: torch.Tensor,
    kv_indices: torch.Tensor,
    rows: torch.Tensor,
    out: torch.Tensor,
    *,
    grid: int | None = None,
    block_rows: int | None = None,
    num_warps: int | None = None,
) -> torch.Tensor:
    """``out[s] = pool[s].to(out.dtype)`` for each slot ``s`` in ``kv_indices[:rows[0]]``.

    When ``rows[0] >= pool rows`` every row of the pool is converted instead. ``pool`` is the
    FP8 e4m3 pool of one layer (``[slots, 1, D]`` or ``[slots, D]``), ``out`` a 16-bit tensor
    of the same shape, ``rows`` an int32 device tensor with one element. No host sync, no
    allocation: safe to call inside CUDA-graph capture.
    """
    if pool.dtype != torch.float8_e4m3fn:
        raise TypeError(f"pool must be float8_e4m3fn, got {pool.dtype}")
    if out.dtype not in (torch.bfloat16, torch.float16):
        raise TypeError(f"out must be bfloat16 or float16, got {out.dtype}")
    if out.shape != pool.shape:
        raise ValueError(f"out shape {tuple(out.shape)} != pool shape {tuple(pool.shape)}")
    if rows.dtype != torch.int32 or rows.numel() != 1:
        raise ValueError("rows must be a one-element int32 tensor")
    n_pool_rows = pool.shape[0]
    d = pool[0].numel() if n_pool_rows else 0
    src = pool.view(torch.uint8).reshape(n_pool_rows, d)
    dst = out.view(n_pool_rows, d)
    if src.stride(1) != 1 or dst.stride(1) != 1:
        raise ValueError("pool and out rows must be contiguous")
    if n_pool_rows == 0 or d == 0:
        return out
    block_a = _pow2_floor(d)
    block_b = triton.next_power_of_2(d - block_a) if d > block_a else 0
    _fp8_gather_cast_kernel[(grid or default_grid(pool.device),)](
        src,
        dst,
        kv_indices,
        rows,
        n_pool_rows,
        src.stride(0),
        dst.stride(0),
        D=d,
        BLOCK_R=block_rows or BLOCK_ROWS,
        BLOCK_A=block_a,
        BLOCK_B=block_b,
        num_warps=num_warps or NUM_WARPS,
    )
    return out


@triton.jit
def _fp8_gather_pages_kernel(
    src_ptr,  # uint8 view of the FP8 e4m3 pool: n_pool_rows rows of D bytes
    dst_ptr,  # 16-bit shadow with the same rows
    table_ptr,  # int32 page table [batch, table_cols]: page ids, row stride table_stride
    lens_ptr,  # int32 [batch]: KV tokens of each request (read on the device); unused if ALL_COLS
    batch,
    table_cols,
    table_stride,
    n_pool_rows,
    src_stride,
    dst_stride,
    PAGE: tl.constexpr,
    D: tl.constexpr,
    BLOCK_R: tl.constexpr,
    BLOCK_A: tl.constexpr,
    BLOCK_B: tl.constexpr,
    BATCH_P2: tl.constexpr,  # power of two >= batch
    ALL_COLS: tl.constexpr,  # convert every column of the table (no lengths)
):
    b = tl.program_id(0)
    j = tl.program_id(1)
    n_prog_b = tl.num_programs(1)
    if ALL_COLS:
        n_rows = table_cols * PAGE
        total = batch * table_cols * PAGE
    else:
        n_rows = tl.cdiv(tl.load(lens_ptr + b), PAGE) * PAGE  # whole pages
        offs_b = tl.arange(0, BATCH_P2)
        lens = tl.load(lens_ptr + offs_b, mask=offs_b < batch, other=0)
        total = tl.sum(tl.cdiv(lens, PAGE) * PAGE, axis=0)
    offs_r = tl.arange(0, BLOCK_R)
    cols_a = tl.arange(0, BLOCK_A)
    # At or past one row per pool slot (radix prefix sharing repeats rows), converting the
    # pool contiguously is never slower; decided on the device, so a captured graph adapts.
    full = total >= n_pool_rows
    limit = tl.where(full, n_pool_rows, tl.minimum(n_rows, table_cols * PAGE))
    tile = tl.where(full, b * n_prog_b + j, j)
    step = tl.where(full, batch * n_prog_b, n_prog_b)
    n_tiles = tl.cdiv(limit, BLOCK_R)
    while tile < n_tiles:
        pos = tile * BLOCK_R + offs_r
        live = pos < limit
        page = tl.load(
            table_ptr + b * table_stride + pos // PAGE, mask=live & (total < n_pool_rows), other=0
        )
        slot = page.to(tl.int64) * PAGE + pos % PAGE
        slot = tl.where(full, pos.to(tl.int64), slot)
        ok = live & (slot >= 0) & (slot < n_pool_rows)
        src_row = src_ptr + slot[:, None] * src_stride
        dst_row = dst_ptr + slot[:, None] * dst_stride
        raw = tl.load(src_row + cols_a[None, :], mask=ok[:, None])
        val = raw.to(tl.float8e4nv, bitcast=True).to(tl.float32)
        tl.store(dst_row + cols_a[None, :], val.to(dst_ptr.dtype.element_ty), mask=ok[:, None])
        if BLOCK_B > 0:
            cols_b = BLOCK_A + tl.arange(0, BLOCK_B)
            mask_b = ok[:, None] & (cols_b[None, :] < D)
            raw_b = tl.load(src_row + cols_b[None, :], mask=mask_b)
            val_b = raw_b.to(tl.float8e4nv, bitcast=True).to(tl.float32)
            tl.store(dst_row + cols_b[None, :], val_b.to(dst_ptr.dtype.element_ty), mask=mask_b)
        tile += step


def gather_cast_pages(
    pool: torch.Tensor,
    page_table: torch.Tensor,
    cache_seqlens: torch.Tensor | None,
    page_size: int,
    out: torch.Tensor,
    *,
    programs: int | None = None,
    block_rows: int | None = None,
    num_warps: int | None = None,
) -> torch.Tensor:
    """``out[r] = pool[r].to(out.dtype)`` for every row ``r`` of every page that
    ``page_table[b, : ceil(cache_seqlens[b] / page_size)]`` names (every column of the table
    when ``cache_seqlens`` is None); the whole pool once the rows reach its size.

    ``page_table`` is int32 ``[batch, cols]`` of page ids (pool rows ``page * page_size`` ..
    ``+ page_size - 1``). No host sync and no allocation: safe inside CUDA-graph capture.
    """
    if pool.dtype != torch.float8_e4m3fn:
        raise TypeError(f"pool must be float8_e4m3fn, got {pool.dtype}")
    if out.dtype not in (torch.bfloat16, torch.float16):
        raise TypeError(f"out must be bfloat16 or float16, got {out.dtype}")
    if out.shape != pool.shape:
        raise ValueError(f"out shape {tuple(out.shape)} != pool shape {tuple(pool.shape)}")
    if page_table.dim() != 2 or page_table.dtype != torch.int32:
        raise ValueError("page_table must be a 2-D int32 tensor")
    if page_table.shape[1] and page_table.stride(1) != 1:
        raise ValueError("page_table rows must be contiguous")
    batch = page_table.shape[0]
    if cache_seqlens is not None and (
        cache_seqlens.dtype != torch.int32 or cache_seqlens.numel() < batch
    ):
        raise ValueError("cache_seqlens must be int32 with one entry per page-table row")
    if page_size < 1:
        raise ValueError(f"page_size must be at least 1, got {page_size}")
    n_pool_rows = pool.shape[0]
    d = pool[0].numel() if n_pool_rows else 0
    if n_pool_rows == 0 or d == 0 or batch == 0 or page_table.shape[1] == 0:
        return out
    src = pool.view(torch.uint8).reshape(n_pool_rows, d)
    dst = out.view(n_pool_rows, d)
    if src.stride(1) != 1 or dst.stride(1) != 1:
        raise ValueError("pool and out rows must be contiguous")
    block_a = _pow2_floor(d)
    block_b = triton.next_power_of_2(d - block_a) if d > block_a else 0
    per_request = programs or max(1, -(-default_grid(pool.device) // batch))
    lens = cache_seqlens if cache_seqlens is not None else page_table  # any int32 pointer
    _fp8_gather_pages_kernel[(batch, per_request)](
        src,
        dst,
        page_table,
        lens,
        batch,
        page_table.shape[1],
        page_table.stride(0),
        n_pool_rows,
        src.stride(0),
        dst.stride(0),
        PAGE=page_size,
        D=d,
        BLOCK_R=block_rows or BLOCK_ROWS,
        BLOCK_A=block_a,
        BLOCK_B=block_b,
        BATCH_P2=triton.next_power_of_2(batch),
        ALL_COLS=cache_seqlens is None,
        num_warps=num_warps or NUM_WARPS,
    )
    return out


# One shadow per (device, pool shape, dtype), shared by every layer and every backend of the
# process: layers run one after another on one stream, and each layer refreshes exactly the
# rows its attention call reads before that call.
_SHADOWS: dict[tuple, torch.Tensor] = {}


def shadow_for(pool: torch.Tensor, dtype: torch.dtype) -> torch.Tensor:
    """The process-wide 16-bit shadow for pools shaped like ``pool`` (allocated once)."""
    key = (pool.device, tuple(pool.shape), dtype)
    shadow = _SHADOWS.get(key)
    if shadow is None:
        if pool.device.type == "cuda" and torch.cuda.is_current_stream_capturing():
            # Memory taken during capture belongs to the graph pool and may be handed to
            # another graph; SGLang's eager warm-up runs before capture, so this is a bug.
            raise RuntimeError(
                "glmserve fp8 gather: shadow buffer first requested inside CUDA-graph capture"
            )
        shadow = torch.empty(pool.shape, dtype=dtype, device=pool.device)
        _SHADOWS[key] = shadow
    return shadow


def indexed_wrapper_backend(device: torch.device) -> str:
    """The FlashInfer MLA backend a patched wrapper plans with: fa3 on SM90 (what FlashInfer's
    own "auto" picks first there), fa2 everywhere else (SM120's choice, and on SM100 the one
    that reads the wrapper's indices)."""
    device = torch.device(device)
    if device.type == "cuda" and torch.cuda.get_device_capability(device)[0] == 9:
        return "fa3"
    return "fa2"


class Fp8KvGather:
    """Per-attention-backend state: the device-side count of slots FlashInfer will read."""

    def __init__(self, device: torch.device) -> None:
        self.rows = torch.zeros(1, dtype=torch.int32, device=device)
        self.wrapper_backend = indexed_wrapper_backend(device)

    @classmethod
    def create(cls, device: torch.device) -> Fp8KvGather | None:
        """The gather state, or None for the upstream cast: ``GLMSERVE_FP8_GATHER=0``, or a GPU
        without a hardware e4m3 convert."""
        if not fp8_gather_enabled() or not fp8_gather_supported(device):
            return None
        return cls(device)

    def note_rows(
        self, kv_indptr: torch.Tensor, planned_kv_indptr_cpu: torch.Tensor | None = None
    ) -> None:
        """Record ``kv_indptr[-1]`` on the device; called next to every ``plan()``.

        Runs outside CUDA graphs (where SGLang plans), so replays see the count of the step
        being replayed. ``planned_kv_indptr_cpu`` is the host indptr a fast replay plan hands
        FlashInfer; the count covers whichever of the two is larger, so every position
        FlashInfer may read has been refreshed.
        """
        last = kv_indptr[-1:]
        if planned_kv_indptr_cpu is not None and planned_kv_indptr_cpu.numel():
            torch.clamp(last, min=int(planned_kv_indptr_cpu[-1]), out=self.rows)
        else:
            self.rows.copy_(last, non_blocking=True)

    @torch.compiler.disable
    def cast(
        self, pool: torch.Tensor, kv_indices: torch.Tensor | None, dtype: torch.dtype
    ) -> torch.Tensor:
        """The 16-bit KV that FlashInfer reads: exact in every row it will touch."""
        if (
            kv_indices is None
            or pool.dtype != torch.float8_e4m3fn
            or dtype not in (torch.bfloat16, torch.float16)
        ):
            return pool.to(dtype)
        return gather_cast(pool, kv_indices, self.rows, shadow_for(pool, dtype))

    @torch.compiler.disable
    def cast_pages(
        self,
        pool: torch.Tensor,
        page_table: torch.Tensor | None,
        cache_seqlens: torch.Tensor | None,
        page_size: int,
        dtype: torch.dtype,
    ) -> torch.Tensor:
        """The 16-bit KV FlashAttention reads through ``page_table``: exact in every row of
        every page it maps for ``cache_seqlens`` tokens (None: every column of the table)."""
        if (
            page_table is None
            or pool.dtype != torch.float8_e4m3fn
            or dtype not in (torch.bfloat16, torch.float16)
        ):
            return pool.to(dtype)
        return gather_cast_pages(
            pool, page_table, cache_seqlens, page_size, shadow_for(pool, dtype)
        )
