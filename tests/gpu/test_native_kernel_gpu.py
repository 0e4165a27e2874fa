"""GPU proof of the native FP8 decode kernel's memory safety and NaN/range rules (H200; CI skips).

Run against the installed (patched) fp8_mla_decode.py, on the real hardware convert:

* a CUDA graph captured before a larger eager call must, when replayed, write nowhere but its
  own buffers: a sentinel allocated after the eager call (where a freed workspace would be
  handed out again) must stay intact, and the replay must still be right;
* NaN in q, and the NaN e4m3 codes 0x7F / 0xFF in a row a request reads, reach that output
  (the upstream cast gives NaN there), for a request one program covers and one cut across
  programs, at 8 heads (kv-M form) and 16 (heads-M form);
* q at the ends of the bf16 range keeps the output finite wherever fp32 scores are.
"""

from __future__ import annotations

import math

import pytest

pytestmark = pytest.mark.gpu

torch = pytest.importorskip("torch")

from glmserve.selftest import runner  # noqa: E402
from glmserve.selftest.nativecheck import fp64_decode_attention  # noqa: E402

SM_SCALE = 1.0 / math.sqrt(192 + 64)
DEV = torch.device("cuda")


@pytest.fixture(scope="module")
def native():
    path = runner.installed_kernel_path()
    if path is None or not (path.parent / "fp8_mla_decode.py").is_file():
        pytest.fail("no patched SGLang with fp8_mla_decode.py on sys.path")
    return runner.load_kernel_module(path.parent / "fp8_mla_decode.py")


def pool_of(rows: int, gen: torch.Generator) -> torch.Tensor:
    return torch.randn((rows, 1, 576), device=DEV, generator=gen).to(torch.float8_e4m3fn)


def batch_of(lens: list[int], heads: int, rows: int, gen: torch.Generator):
    indptr = torch.zeros(len(lens) + 1, dtype=torch.int32, device=DEV)
    indptr[1:] = torch.tensor(lens, device=DEV).cumsum(0)
    idx = torch.randint(0, rows, (max(sum(lens), 1),), dtype=torch.int32, device=DEV, generator=gen)
    q_nope = torch.randn(len(lens), heads, 512, device=DEV, generator=gen).bfloat16()
    q_pe = torch.randn(len(lens), heads, 64, device=DEV, generator=gen).bfloat16()
    return indptr, idx, q_nope, q_pe


def worst_error(out, ref, lens) -> float:
    live = torch.tensor(lens, device=DEV) > 0
    o, r = out.double()[live], ref[live]
    return float(((o - r).norm(dim=-1) / r.norm(dim=-1)).max())


@pytest.mark.parametrize("heads", [8, 16])
def test_a_graph_replayed_after_a_larger_eager_call_writes_only_its_own_memory(native, heads):
    gen = torch.Generator(device=DEV).manual_seed(heads)
    rows = 60_000
    pool = pool_of(rows, gen)
    lens = [700, 3, 2000, 50]
    indptr, idx, q_nope, q_pe = batch_of(lens, heads, rows, gen)
    out = torch.empty_like(q_nope)

    def step():
        native.mla_decode_fp8(q_nope, q_pe, pool, indptr, idx, SM_SCALE, out)

    step()  # eager first: the Triton compile and the workspace, outside the capture
    torch.cuda.synchronize()
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        step()
    # Larger eager calls than the capture saw: many more requests (above any captured batch),
    # and four times the heads (a new head layout).
    for big_batch, big_heads, big_len in ((2048, heads, 40), (64, 4 * heads, 300)):
        big = batch_of([big_len] * big_batch, big_heads, rows, gen)
        big_out = torch.empty_like(big[2])
        native.mla_decode_fp8(big[2], big[3], pool, big[0], big[1], SM_SCALE, big_out)
        del big, big_out
    torch.cuda.synchronize()
    # Where a freed workspace would be handed out again (the caching allocator reuses freed
    # blocks): 256 MB of sentinels, more than any workspace.
    sentinels = [torch.full((1 << 20,), 7.0, device=DEV) for _ in range(64)]
    out.fill_(float("nan"))
    graph.replay()
    torch.cuda.synchronize()
    assert all(bool((s == 7.0).all()) for s in sentinels), "a replay wrote into freed memory"
    ref = fp64_decode_attention(torch, q_nope, q_pe, pool, indptr, idx, SM_SCALE)
    assert worst_error(out, ref, lens) < 4e-3


@pytest.mark.parametrize("heads", [8, 16])
def test_nan_in_q_or_in_a_row_read_reaches_that_output(native, heads):
    gen = torch.Generator(device=DEV).manual_seed(100 + heads)
    rows = 50_000
    pool = pool_of(rows, gen)
    lens = [37, 40_000, 900]  # one program, cut across many, one program
    indptr, idx, q_nope, q_pe = batch_of(lens, heads, rows, gen)
    raw = pool.view(torch.uint8).clone()
    # Slots read by request 0 (latent part) and request 1 (rope part), each read by no other.
    only = torch.bincount(idx.long(), minlength=rows) == 1
    starts = indptr.tolist()
    s0 = next(int(s) for s in idx[starts[0] : starts[1]] if only[int(s)])
    s1 = next(int(s) for s in idx[starts[1] : starts[2]] if only[int(s)])
    raw[s0, 0, 100] = 0x7F
    raw[s1, 0, 540] = 0xFF
    out = torch.empty_like(q_nope)
    native.mla_decode_fp8(q_nope, q_pe, raw.view(torch.float8_e4m3fn), indptr, idx, SM_SCALE, out)
    assert bool(torch.isnan(out[0]).all()) and bool(torch.isnan(out[1]).all())
    assert bool(torch.isfinite(out[2]).all())
    bad_q = q_nope.clone()
    bad_q[1, heads - 1, 3] = float("nan")
    native.mla_decode_fp8(bad_q, q_pe, pool, indptr, idx, SM_SCALE, out)
    assert bool(torch.isnan(out[1, heads - 1]).all())
    rest = torch.ones(len(lens), heads, dtype=torch.bool, device=DEV)
    rest[1, heads - 1] = False
    assert bool(torch.isfinite(out[rest]).all())


@pytest.mark.parametrize("heads", [8, 16])
def test_q_at_the_ends_of_the_bf16_range_keeps_the_output_finite(native, heads):
    gen = torch.Generator(device=DEV).manual_seed(200 + heads)
    rows = 20_000
    pool = pool_of(rows, gen)
    lens = [5000, 64, 1]
    indptr, idx, q_nope, q_pe = batch_of(lens, heads, rows, gen)
    spike = q_nope.clone()
    spike[:, :, 11] = 2.0**126
    cases = {
        "one element at 2^126": (spike, q_pe),
        "rows at 2^100": ((q_nope.float() * 2.0**100).bfloat16(), (q_pe.float() * 2.0**100).bfloat16()),
        "rows at 2^-100": ((q_nope.float() * 2.0**-100).bfloat16(), (q_pe.float() * 2.0**-100).bfloat16()),
    }  # fmt: skip
    out = torch.empty_like(q_nope)
    for name, (qn, qp) in cases.items():
        out.fill_(float("nan"))
        native.mla_decode_fp8(qn, qp, pool, indptr, idx, SM_SCALE, out)
        assert bool(torch.isfinite(out).all()), name
        ref = fp64_decode_attention(torch, qn, qp, pool, indptr, idx, SM_SCALE)
        assert worst_error(out, ref, lens) < 4e-3, name


def test_each_head_count_takes_its_tile_form_and_both_agree_with_fp64(native):
    """8 heads run the kv-M form, 16 the heads-M form (what GLM-5 at TP8 / TP4 gets), over
    mixed lengths with empty requests; a 12-head model pads the 16-head form."""
    assert native.launch_config(8, DEV).form == native.FORM_KV_M
    assert native.launch_config(16, DEV).form == native.FORM_HEADS_M
    for heads in (8, 12, 16, 32):
        gen = torch.Generator(device=DEV).manual_seed(300 + heads)
        rows = 80_000
        pool = pool_of(rows, gen)
        lens = [0, 1, 63, 64, 65, 5000, 0, 30_000, 129]
        indptr, idx, q_nope, q_pe = batch_of(lens, heads, rows, gen)
        out = torch.full_like(q_nope, float("nan"))
        native.mla_decode_fp8(q_nope, q_pe, pool, indptr, idx, SM_SCALE, out)
        empty = torch.tensor(lens, device=DEV) == 0
        assert bool((out[empty] == 0).all()) and bool(torch.isfinite(out).all()), heads
        ref = fp64_decode_attention(torch, q_nope, q_pe, pool, indptr, idx, SM_SCALE)
        assert worst_error(out, ref, lens) < 4e-3, heads
