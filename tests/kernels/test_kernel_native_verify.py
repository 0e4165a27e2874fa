"""The native kernel with several causal query tokens per request (MTP target verify, draft
extend), run on the CPU by Triton's interpreter, against the fp64 definition.

Token t of a request with q_len query tokens and kv_len slots sees its slot positions
0 .. kv_len - q_len + t, as FlashInfer's causal paged plan that SGLang uses for these batches.
"""

from __future__ import annotations

import importlib
import os

os.environ.setdefault("TRITON_INTERPRET", "1")

import pytest

torch = pytest.importorskip("torch")
pytest.importorskip("triton")
from hypothesis import HealthCheck, given, settings  # noqa: E402
from hypothesis import strategies as st  # noqa: E402

from glmserve.selftest.nativecheck import fp64_causal_attention  # noqa: E402

SM_SCALE = 1 / 16.0
REL_TOL = 6e-3  # e4m3 values, fp16 operands, the interpreter's bf16 rounding toward zero
PAD = 2  # tokens past the last request (a CUDA graph's padding): defined as zeros


@pytest.fixture(scope="module")
def native(require):
    require(
        os.environ.get("TRITON_INTERPRET") == "1",
        "Triton was imported before TRITON_INTERPRET=1 could be set",
    )
    return importlib.import_module("glmserve.kernels.fp8_mla_decode")


def config(native, form: str, block_n: int = 16):
    """Interpreter-sized tiles and chunks: requests are cut across programs, so the partial and
    merge path runs as well as the direct one; either form, 8 heads per program."""
    code = native.FORM_KV_M if form == "kv-m" else native.FORM_HEADS_M
    return native.LaunchConfig(code, block_n, 4, 1, 1, min_chunk=16, overhead=8, heads=8)


def batch(native, kv_lens, q_lens, heads, gen, pool_rows=700, duplicates=False):
    pool = (torch.randn((pool_rows, 1, 576), generator=gen)).to(torch.float8_e4m3fn)
    kv_indptr = torch.tensor([0, *torch.tensor(kv_lens).cumsum(0).tolist()], dtype=torch.int32)
    qo_indptr = torch.tensor([0, *torch.tensor(q_lens).cumsum(0).tolist()], dtype=torch.int32)
    total = int(kv_indptr[-1])
    if duplicates:  # radix prefix sharing: the same slots in several requests
        idx = torch.randint(0, 16, (total,), generator=gen, dtype=torch.int32)
    else:
        idx = torch.randperm(pool_rows, generator=gen)[:total].to(torch.int32)
    tokens = int(qo_indptr[-1]) + PAD
    q_nope = torch.randn(tokens, heads, 512, generator=gen).bfloat16()
    q_pe = torch.randn(tokens, heads, 64, generator=gen).bfloat16()
    return pool, kv_indptr, qo_indptr, idx, q_nope, q_pe


def run(native, inputs, max_q_len, cfg, programs):
    pool, kv_indptr, qo_indptr, idx, q_nope, q_pe = inputs
    out = torch.full(q_nope.shape, float("nan"), dtype=torch.bfloat16)
    got = native.mla_decode_fp8(
        q_nope, q_pe, pool, kv_indptr, idx, SM_SCALE, out, qo_indptr=qo_indptr,
        max_q_len=max_q_len, config=cfg, num_programs=programs,
    )  # fmt: skip
    assert got is out
    return out


def worst_error(out, ref) -> float:
    live = ref.norm(dim=-1) > 0
    return float(((out.double() - ref).norm(dim=-1) / ref.norm(dim=-1))[live].max())


@st.composite
def verify_case(draw):
    n = draw(st.integers(1, 3))
    q_lens = draw(st.lists(st.integers(0, 4), min_size=n, max_size=n))
    # A request holds at least its own query tokens (they are written before attention).
    kv_lens = [draw(st.integers(q, 120)) for q in q_lens]
    return kv_lens, q_lens


@settings(
    max_examples=16, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture]
)
@given(
    case=verify_case(),
    heads=st.sampled_from([1, 8, 16, 12]),
    programs=st.integers(1, 7),
    form=st.sampled_from(["kv-m", "heads-m"]),
    duplicates=st.booleans(),
    seed=st.integers(0, 2**16),
)
def test_causal_multi_token_attention_matches_fp64(
    native, case, heads, programs, form, duplicates, seed
):
    kv_lens, q_lens = case
    gen = torch.Generator().manual_seed(seed)
    inputs = batch(native, kv_lens, q_lens, heads, gen, duplicates=duplicates)
    out = run(native, inputs, max(4, max(q_lens)), config(native, form), programs)
    pool, kv_indptr, qo_indptr, idx, q_nope, q_pe = inputs
    ref = fp64_causal_attention(torch, q_nope, q_pe, pool, qo_indptr, kv_indptr, idx, SM_SCALE)
    assert not torch.isnan(out).any(), "an output element was never written"
    assert (out[int(qo_indptr[-1]) :] == 0).all(), "tokens no request owns must be zeros"
    if ref.abs().sum() > 0:
        assert worst_error(out, ref) < REL_TOL


def test_a_token_never_sees_a_later_slot(native):
    """Causality by position: rewriting the last slot (only the last token may see it) to
    e4m3's largest value changes that token alone; the others stay bit for bit, on the direct
    and the cut path. (A NaN code there would reach the earlier tokens too, through 0 x NaN in
    the PV product of the tile, as in any tiled kernel, FlashInfer's included.)"""
    gen = torch.Generator().manual_seed(7)
    inputs = batch(native, [90], [4], 8, gen)
    pool = inputs[0]
    idx = inputs[3]
    for form in ("kv-m", "heads-m"):
        for programs in (1, 6):
            clean = run(native, inputs, 4, config(native, form), programs)
            raw = pool.view(torch.uint8).clone()
            raw[int(idx[89]), 0, :] = 0x7E  # 448 in every column
            moved = (raw.view(torch.float8_e4m3fn), *inputs[1:])
            out = run(native, moved, 4, config(native, form), programs)
            assert torch.equal(out[:3], clean[:3]), (form, programs)
            assert not torch.equal(out[3], clean[3]), (form, programs)


def test_nan_in_one_tokens_q_stays_in_that_token_and_head(native):
    gen = torch.Generator().manual_seed(9)
    inputs = batch(native, [60, 30], [4, 2], 8, gen)
    pool, kv_indptr, qo_indptr, idx, q_nope, q_pe = inputs
    bad = q_nope.clone()
    bad[5, 2, 100] = float("nan")  # request 1, token 1, head 2
    for form in ("kv-m", "heads-m"):
        for programs in (1, 5):
            out = run(native, (pool, kv_indptr, qo_indptr, idx, bad, q_pe), 4,
                      config(native, form), programs)  # fmt: skip
            assert torch.isnan(out[5, 2]).all()
            others = torch.ones(out.shape[:2], dtype=torch.bool)
            others[5, 2] = False
            assert torch.isfinite(out[others]).all(), (form, programs)


def test_program_count_and_form_do_not_change_the_function(native):
    gen = torch.Generator().manual_seed(3)
    inputs = batch(native, [300, 17, 64], [4, 4, 1], 16, gen)
    pool, kv_indptr, qo_indptr, idx, q_nope, q_pe = inputs
    ref = fp64_causal_attention(torch, q_nope, q_pe, pool, qo_indptr, kv_indptr, idx, SM_SCALE)
    for form in ("kv-m", "heads-m"):
        for programs in (1, 4, 16):
            out = run(native, inputs, 4, config(native, form, 32), programs)
            assert worst_error(out, ref) < REL_TOL, (form, programs)


def test_one_token_per_request_equals_decode(native):
    """A verify batch whose requests hold one token each is decode: the same outputs."""
    gen = torch.Generator().manual_seed(4)
    inputs = batch(native, [50, 80], [1, 1], 8, gen)
    pool, kv_indptr, _, idx, q_nope, q_pe = inputs
    multi = run(native, inputs, 1, config(native, "kv-m"), 3)[:2]
    decode = torch.empty_like(multi)
    native.mla_decode_fp8(
        q_nope[:2], q_pe[:2], pool, kv_indptr, idx, SM_SCALE, decode,
        config=config(native, "kv-m"), num_programs=3,
    )  # fmt: skip
    assert torch.equal(multi, decode)


def test_bad_multi_token_inputs_are_refused(native):
    gen = torch.Generator().manual_seed(5)
    pool, kv_indptr, qo_indptr, idx, q_nope, q_pe = batch(native, [10], [2], 8, gen)
    out = torch.empty_like(q_nope)
    with pytest.raises(TypeError, match="qo_indptr"):
        native.mla_decode_fp8(q_nope, q_pe, pool, kv_indptr, idx, 1.0, out,
                              qo_indptr=qo_indptr.long(), max_q_len=2)  # fmt: skip
    with pytest.raises(ValueError, match="needs qo_indptr"):
        native.mla_decode_fp8(q_nope, q_pe, pool, kv_indptr, idx, 1.0, out, max_q_len=2)


def test_multi_token_configurations_per_device(native, monkeypatch):
    """Several query tokens take 8 heads per program on every device; the large-tile
    configurations only where their shared memory fits."""
    cpu = torch.device("cpu")
    assert native.launch_config(8, cpu, 4) is native.CONFIG_INTERPRETER_MULTI
    cuda = torch.device("cuda", 0)
    for info, want in (
        ((132, 232448, 9), native.CONFIG_MULTI_SM90),  # H100 / H200
        ((148, 232448, 10), native.CONFIG_MULTI_SM100),  # B200
        ((188, 101376, 12), native.CONFIG_MULTI),  # RTX PRO 6000: ~99 KB per block
    ):
        monkeypatch.setitem(native._DEVICE_INFO, 0, info)
        assert native.launch_config(8, cuda, 4) is want
        assert native.launch_config(16, cuda, 4).heads_per_program == 8
    assert native.query_tokens(1) == 1 and native.query_tokens(3) == 4
    assert native.query_tokens(4) == 4 and native.query_tokens(5) == 8


def test_a_token_past_the_callers_bound_is_nan_not_silently_wrong(native):
    """max_q_len is the host's bound (SGLang's draft tokens); a request holding more tokens
    than that gets NaN for the tokens the programs never held, the others stay right."""
    gen = torch.Generator().manual_seed(6)
    inputs = batch(native, [70], [5], 8, gen)
    pool, kv_indptr, qo_indptr, idx, q_nope, q_pe = inputs
    ref = fp64_causal_attention(torch, q_nope, q_pe, pool, qo_indptr, kv_indptr, idx, SM_SCALE)
    for programs in (1, 5):
        out = run(native, inputs, 4, config(native, "heads-m"), programs)
        assert torch.isnan(out[4]).all(), programs
        assert worst_error(out[:4], ref[:4]) < REL_TOL, programs
