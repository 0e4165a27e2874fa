"""GPU proof of the gather-then-cast patch (run on the H200 by bench/device_run.sh; CI skips).

(a) the shipped kernel vs ``.to()`` bit for bit, eager and inside one CUDA graph captured once
    and replayed with other slots and counts;
(b) FlashInfer's fa2 MLA attention (the SM120 kernel family) fed by the patched path vs the
    upstream full cast: ``torch.equal``, plus relative error against an fp64 reference;
(c) the patched SGLang ``FlashInferMLAAttnBackend`` itself: test_classcheck_gpu.py.

Needs the patched SGLang tree (with FlashInfer) on sys.path, e.g. the overlay from
bench/bundle.sh after ``patches/apply.py``.
"""

from __future__ import annotations

import math

import pytest

pytestmark = pytest.mark.gpu

torch = pytest.importorskip("torch")

from glmserve.selftest import runner  # noqa: E402

D, CKV, KPE, HEADS = 576, 512, 64, 16
SM_SCALE = 1.0 / math.sqrt(192 + 64)
DEV = torch.device("cuda")


@pytest.fixture(scope="module")
def kernel():
    path = runner.installed_kernel_path()
    if path is None:
        pytest.skip("no patched SGLang (sglang/srt/layers/attention/fp8_kv_gather.py) on sys.path")
    return runner.load_kernel_module(path)


@pytest.fixture(scope="module")
def flashinfer():
    return pytest.importorskip("flashinfer.mla")


def fp8_pool(rows: int, seed: int, nan_slots: int = 0) -> torch.Tensor:
    gen = torch.Generator(device=DEV).manual_seed(seed)
    raw = torch.randint(0, 256, (rows, 1, D), dtype=torch.uint8, device=DEV, generator=gen)
    raw[(raw & 0x7F) == 0x7F] ^= 1
    if nan_slots:
        raw[torch.randint(0, rows, (nan_slots,), device=DEV, generator=gen), 0, 5] = 0x7F
    return raw.view(torch.float8_e4m3fn)


def same_bits(a: torch.Tensor, b: torch.Tensor) -> bool:
    """Bitwise equality that also accepts NaN == NaN (whatever the payload)."""
    nan_a, nan_b = torch.isnan(a), torch.isnan(b)
    if not torch.equal(nan_a, nan_b):
        return False
    return torch.equal(
        torch.where(nan_a, 0, a).view(torch.int16), torch.where(nan_b, 0, b).view(torch.int16)
    )


def pool_rows_as(pool: torch.Tensor, rows: torch.Tensor, dtype: torch.dtype) -> torch.Tensor:
    """pool[rows].to(dtype), indexing through uint8 (advanced indexing of fp8 is not universal)."""
    return pool.view(torch.uint8)[rows].view(torch.float8_e4m3fn).to(dtype)


def check_rows(out, pool, slots, count, poison) -> None:
    p = pool.shape[0]
    want = torch.arange(p, device=DEV) if count >= p else torch.unique(slots[:count].long())
    assert same_bits(out[want], pool_rows_as(pool, want, out.dtype))
    untouched = torch.ones(p, dtype=torch.bool, device=DEV)
    untouched[want] = False
    assert bool((out[untouched] == poison).all()), "rows outside the referenced set were written"


# ---------------------------------------------------------------------------------------- (a)


@pytest.mark.parametrize("seed", range(6))
def test_a_kernel_bitwise_random_sizes(kernel, seed):
    gen = torch.Generator().manual_seed(seed)
    p = int(torch.randint(1, 200_000, (1,), generator=gen))
    n = int(torch.randint(0, 2 * p, (1,), generator=gen))
    pool = fp8_pool(p, seed, nan_slots=3)
    # Many duplicates: draw slots from a small subset, and always include the last row.
    hot = torch.randint(0, p, (max(1, n // 4),), generator=gen)
    slots = hot[torch.randint(0, len(hot), (max(n, 1),), generator=gen)].to(torch.int32)
    slots[0] = p - 1
    slots = slots.to(DEV)
    for dtype in (torch.bfloat16, torch.float16):
        out = torch.full(pool.shape, -777.0, dtype=dtype, device=DEV)
        kernel.gather_cast(pool, slots, torch.tensor([n], dtype=torch.int32, device=DEV), out)
        check_rows(out, pool, slots, n, -777.0)


def test_a_kernel_count_zero_and_full_pool(kernel):
    p = 495_552
    pool = fp8_pool(p, 99)
    slots = torch.randint(0, p, (1024,), dtype=torch.int32, device=DEV)
    for count in (0, p, p + 7):
        out = torch.full(pool.shape, -777.0, dtype=torch.bfloat16, device=DEV)
        kernel.gather_cast(pool, slots, torch.tensor([count], dtype=torch.int32, device=DEV), out)
        check_rows(out, pool, slots, count, -777.0)


def test_a_one_graph_replayed_with_other_counts(kernel):
    """Captured once; indices and count change in place between replays (as in SGLang)."""
    p = 300_001
    pool = fp8_pool(p, 7)
    idx_buf = torch.zeros(2 * p, dtype=torch.int32, device=DEV)
    rows = torch.zeros(1, dtype=torch.int32, device=DEV)
    out = torch.empty(pool.shape, dtype=torch.bfloat16, device=DEV)
    kernel.gather_cast(pool, idx_buf, rows, out)  # compile outside capture
    torch.cuda.synchronize()
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        kernel.gather_cast(pool, idx_buf, rows, out)
    gen = torch.Generator(device=DEV).manual_seed(3)
    for count in (1, 0, 513, 65_536, p - 1, p, 2 * p):
        slots = torch.randint(0, p, (2 * p,), dtype=torch.int32, device=DEV, generator=gen)
        slots[count // 2] = p - 1
        idx_buf.copy_(slots)
        rows.fill_(count)
        out.fill_(-777.0)
        graph.replay()
        torch.cuda.synchronize()
        check_rows(out, pool, slots, count, -777.0)


# ---------------------------------------------------------------------------------------- (b)


def mla_fp64(q_nope, q_pe, kv, kv_indptr, kv_indices):
    """Decode MLA attention in float64 (one query token per request)."""
    outs = []
    for b in range(len(kv_indptr) - 1):
        rows = kv[kv_indices[int(kv_indptr[b]) : int(kv_indptr[b + 1])].long(), 0].double()
        logits = q_nope[b].double() @ rows[:, :CKV].T + q_pe[b].double() @ rows[:, CKV:].T
        outs.append((logits * SM_SCALE).softmax(-1) @ rows[:, :CKV])
    return torch.stack(outs)


@pytest.mark.parametrize(("bs", "ctx", "shared"), [(1, 512, 0), (8, 4096, 1024), (64, 2048, 0)])
def test_b_fa2_attention_patched_equals_upstream(kernel, flashinfer, bs, ctx, shared):
    p = 495_552
    gen = torch.Generator(device=DEV).manual_seed(bs * 7 + ctx)
    # Values as the model writes them: real-valued latents quantized with .to(fp8), no scale.
    exact = torch.randn(p, 1, D, device=DEV, generator=gen)
    pool = exact.to(torch.float8_e4m3fn)
    prefix = torch.randperm(p, device=DEV, generator=gen)[:shared]
    lists = [
        torch.cat([prefix, torch.randperm(p, device=DEV, generator=gen)[: ctx - shared]])
        for _ in range(bs)
    ]
    kv_indices = torch.cat(lists).to(torch.int32)
    kv_indices[0] = p - 1
    kv_indptr = torch.arange(bs + 1, device=DEV, dtype=torch.int32) * ctx
    qo_indptr = torch.arange(bs + 1, device=DEV, dtype=torch.int32)
    q_nope = torch.randn(bs, HEADS, CKV, device=DEV, generator=gen).bfloat16()
    q_pe = torch.randn(bs, HEADS, KPE, device=DEV, generator=gen).bfloat16()
    ws = torch.empty(128 << 20, dtype=torch.uint8, device=DEV)
    wrapper = flashinfer.BatchMLAPagedAttentionWrapper(ws, backend="fa2")
    wrapper.plan(
        qo_indptr, kv_indptr, kv_indices, kv_indptr[1:] - kv_indptr[:-1], HEADS, CKV, KPE, 1,
        False, SM_SCALE, torch.bfloat16, torch.bfloat16,
    )  # fmt: skip

    def run(kv):
        out = torch.full_like(q_nope, float("nan"))
        wrapper.run(q_nope, q_pe, kv[:, :, :CKV], kv[:, :, CKV:], out=out)
        return out

    upstream = run(pool.to(torch.bfloat16))
    shadow = torch.full(pool.shape, float("nan"), dtype=torch.bfloat16, device=DEV)
    kernel.gather_cast(pool, kv_indices, kv_indptr[-1:].clone(), shadow)
    patched = run(shadow)
    assert bool(torch.isfinite(upstream).all())
    assert torch.equal(patched, upstream)

    ref_fp8 = mla_fp64(q_nope, q_pe, pool.float(), kv_indptr, kv_indices)
    ref_exact = mla_fp64(q_nope, q_pe, exact, kv_indptr, kv_indices)
    err_fp8 = ((patched.double() - ref_fp8).norm() / ref_fp8.norm()).item()
    err_exact = ((patched.double() - ref_exact).norm() / ref_exact.norm()).item()
    print(f"\n[b] {bs}x{ctx} shared={shared}: torch.equal(patched, upstream)=True, "
          f"rel err vs fp64 of the FP8 values {err_fp8:.2e}, vs fp64 of the unquantized values "
          f"{err_exact:.2e}")  # fmt: skip
    assert err_fp8 < 1e-2
    assert err_exact < 5e-2


def test_b_selftest_passes_and_catches_off_by_one(tmp_path, kernel):
    report = runner.run_selftest(timeout_s=30)
    print(f"\n[selftest] {report.status}: {report.detail}")
    assert report.status == "passed", report.detail
    source = runner.installed_kernel_path().read_text()
    old = "tl.load(idx_ptr + pos,"
    assert source.count(old) == 1
    broken = tmp_path / "fp8_kv_gather_off_by_one.py"
    broken.write_text(source.replace(old, "tl.load(idx_ptr + pos + 1,"))
    caught = runner.run_selftest(timeout_s=30, module_path=str(broken))
    print(f"[selftest, off-by-one kernel] {caught.status}: {caught.detail[:300]}")
    assert caught.status == "failed"


# ---------------------------------------------------------------------------------------- (c)
# The patched FlashInferMLAAttnBackend itself: tests/gpu/test_classcheck_gpu.py.
