"""GPU proof of the native kernel's multi-token form (MTP target verify; the lab GPU, CI skips).

Against the installed (patched) fp8_mla_decode.py, on the real hardware convert:

* causal verify (4 query tokens per request) against fp64, no worse than 1.5x what FlashInfer's
  causal fa2 plan gives on the BF16 cast (the upstream path), at 8 and 16 heads, mixed lengths;
* the backend's record (`Fp8NativeDecode.note_plan`) copies each step's speculative indptrs into
  buffers its wrapper keeps, so ONE captured graph replays every later plan right, and a later
  plan of another size is refused rather than written past what the graph holds;
* NaN in one token's q reaches that token and head only.
"""

from __future__ import annotations

import math

import pytest

pytestmark = pytest.mark.gpu

torch = pytest.importorskip("torch")

from glmserve.selftest import runner  # noqa: E402
from glmserve.selftest.nativecheck import fp64_causal_attention  # noqa: E402

SM_SCALE = 1.0 / math.sqrt(192 + 64)
DEV = torch.device("cuda")
TOKENS = 4


@pytest.fixture(scope="module")
def native():
    path = runner.installed_kernel_path()
    if path is None or not (path.parent / "fp8_mla_decode.py").is_file():
        pytest.fail("no patched SGLang with fp8_mla_decode.py on sys.path")
    return runner.load_kernel_module(path.parent / "fp8_mla_decode.py")


def indptr(values: list[int]) -> torch.Tensor:
    out = torch.zeros(len(values) + 1, dtype=torch.int32, device=DEV)
    out[1:] = torch.tensor(values, device=DEV).cumsum(0)
    return out


def verify_batch(lens, heads, rows, gen):
    q_lens = [min(TOKENS, n) for n in lens]
    kv, qo = indptr(lens), indptr(q_lens)
    idx = torch.randint(0, rows, (sum(lens),), dtype=torch.int32, device=DEV, generator=gen)
    q = torch.randn(sum(q_lens), heads, 512, device=DEV, generator=gen).bfloat16()
    qpe = torch.randn(sum(q_lens), heads, 64, device=DEV, generator=gen).bfloat16()
    return kv, qo, idx, q, qpe


class GraphWrapper:
    """Stands in for a FlashInfer wrapper made for CUDA graphs: the state keys its records
    by weak reference to the wrapper (a SimpleNamespace cannot be weakly referenced)."""

    _use_cuda_graph = True
    device = DEV


def worst(out, ref) -> float:
    live = ref.norm(dim=-1) > 0
    return float(((out.double() - ref).norm(dim=-1) / ref.norm(dim=-1))[live].max())


@pytest.mark.parametrize("heads", [8, 16])
def test_verify_matches_fp64_within_the_upstream_bar(native, heads):
    import flashinfer.mla

    gen = torch.Generator(device=DEV).manual_seed(heads)
    rows = 300_007
    pool = torch.randn((rows, 1, 576), device=DEV, generator=gen).to(torch.float8_e4m3fn)
    cast = pool.to(torch.bfloat16)
    ws = torch.empty(128 << 20, dtype=torch.uint8, device=DEV)
    for lens in ([TOKENS], [9000], [33, 4096, 2, 700, 12000, TOKENS]):
        kv, qo, idx, q, qpe = verify_batch(lens, heads, rows, gen)
        out = torch.full_like(q, float("nan"))
        native.mla_decode_fp8(q, qpe, pool, kv, idx, SM_SCALE, out, qo_indptr=qo,
                              max_q_len=TOKENS)  # fmt: skip
        wrapper = flashinfer.mla.BatchMLAPagedAttentionWrapper(ws, backend="fa2")
        wrapper.plan(qo, kv, idx, kv[1:] - kv[:-1], heads, 512, 64, 1, True, SM_SCALE,
                     torch.bfloat16, torch.bfloat16)  # fmt: skip
        upstream = torch.empty_like(q)
        wrapper.run(q, qpe, cast[:, :, :512], cast[:, :, 512:], out=upstream)
        ref = fp64_causal_attention(torch, q, qpe, pool, qo, kv, idx, SM_SCALE)
        assert torch.isfinite(out).all(), lens
        assert worst(out, ref) <= max(1.5 * worst(upstream, ref), 2.0**-8), lens


def test_one_graph_replays_every_later_plan_through_the_recorded_copies(native):
    """SGLang builds a verify batch's indptrs anew for every plan: the record copies them into
    the wrapper's own buffers, which the captured graph reads."""
    gen = torch.Generator(device=DEV).manual_seed(7)
    rows, heads, bs = 100_003, 8, 6
    pool = torch.randn((rows, 1, 576), device=DEV, generator=gen).to(torch.float8_e4m3fn)
    state = native.Fp8NativeDecode(TOKENS)
    wrapper = GraphWrapper()
    idx = torch.randint(0, rows, (bs * 8000,), dtype=torch.int32, device=DEV, generator=gen)
    q = torch.randn(bs * TOKENS, heads, 512, device=DEV, generator=gen).bfloat16()
    qpe = torch.randn(bs * TOKENS, heads, 64, device=DEV, generator=gen).bfloat16()
    out = torch.empty_like(q)

    def plan(lens):
        state.note_plan(wrapper, indptr(lens), SM_SCALE, indptr([TOKENS] * bs), TOKENS)

    def step():
        kv, scale, qo, max_q = state.planned(wrapper)
        native.mla_decode_fp8(q, qpe, pool, kv, idx, scale, out, qo_indptr=qo, max_q_len=max_q)

    plan([300] * bs)
    step()
    torch.cuda.synchronize()
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        step()
    for lens in ([8000, 5, 77, 4096, 1000, 9], [TOKENS] * bs, [2500] * bs):
        plan(lens)  # fresh tensors, as SGLang's plans: copied where the graph reads
        out.fill_(float("nan"))
        graph.replay()
        torch.cuda.synchronize()
        ref = fp64_causal_attention(
            torch, q, qpe, pool, indptr([TOKENS] * bs), indptr(lens), idx, SM_SCALE
        )
        assert worst(out, ref) < 1e-2, lens
    with pytest.raises(RuntimeError, match="more than the"):
        state.note_plan(wrapper, indptr([10] * (bs + 1)), SM_SCALE, indptr([TOKENS] * (bs + 1)))


def test_nan_in_one_tokens_q_stays_in_that_token_and_head(native):
    gen = torch.Generator(device=DEV).manual_seed(9)
    rows = 50_021
    pool = torch.randn((rows, 1, 576), device=DEV, generator=gen).to(torch.float8_e4m3fn)
    kv, qo, idx, q, qpe = verify_batch([3000, 40], 8, rows, gen)
    q[5, 2, 100] = float("nan")  # request 1, its second token, head 2
    out = torch.empty_like(q)
    native.mla_decode_fp8(q, qpe, pool, kv, idx, SM_SCALE, out, qo_indptr=qo, max_q_len=TOKENS)
    assert torch.isnan(out[5, 2]).all()
    others = torch.ones(out.shape[:2], dtype=torch.bool, device=DEV)
    others[5, 2] = False
    assert torch.isfinite(out[others]).all()
