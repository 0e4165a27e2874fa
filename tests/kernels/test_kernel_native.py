"""The SHIPPED native FP8 decode kernel, run on the CPU by Triton's interpreter, against fp64.

The module is imported from its one source, src/glmserve/kernels/ (each line's diff adds a
generated copy of it, checked byte for byte by tests/series/test_kernels.py). On the GPU the same source is checked against FlashInfer
(bench/fp8_decode.py); here it is checked against the definition of attention.
"""

from __future__ import annotations

import importlib
import os

# Must be set before Triton is imported anywhere in this process: it selects the interpreter.
os.environ.setdefault("TRITON_INTERPRET", "1")

from pathlib import Path
from types import SimpleNamespace

import pytest

torch = pytest.importorskip("torch")
pytest.importorskip("triton")
from hypothesis import HealthCheck, given, settings  # noqa: E402
from hypothesis import strategies as st  # noqa: E402

from glmserve.selftest.nativecheck import fp64_decode_attention  # noqa: E402

REPO = Path(__file__).resolve().parents[2]
NATIVE = "sglang/srt/layers/attention/fp8_mla_decode.py"
SM_SCALE = 1 / 16.0
# The bar: no worse than 1.5x the upstream path (FlashInfer on the BF16 cast), which
# on the GPU is measured against FlashInfer itself (bench/fp8_decode.py). Here upstream's
# numerics are emulated: fp32 scores, bf16 softmax weights into PV, bf16 output. Triton 3.6's
# interpreter rounds fp32 -> bf16 toward zero (the GPU rounds to nearest), so the emulation's
# output does the same. Rounding toward zero can cost a whole bf16 ulp, 2^-7 of a value (an
# fp32 result a hair below an exactly representable one, as in a one-hot softmax over e4m3
# values, drops to the next bf16 down): that is the floor, because with few tokens and heads
# both errors are that rounding. (The GPU rounds to nearest: 2^-8 there, in bench/ and the
# self-test.)
BAR = 1.5
BF16_ROUNDING = 2.0**-7
REL_TOL = 5e-3  # for the targeted tests on well-spread (normal) pools


@pytest.fixture(scope="module")
def native(require):
    """fp8_mla_decode from its one source (every line's diff carries a generated copy of it:
    tests/series/test_kernels.py)."""
    require(
        os.environ.get("TRITON_INTERPRET") == "1",
        "Triton was imported before TRITON_INTERPRET=1 could be set",
    )
    return importlib.import_module("glmserve.kernels.fp8_mla_decode")


def fp8_pool(rows: int, kind: str, gen: torch.Generator) -> torch.Tensor:
    if kind == "wide":  # every e4m3 byte but NaN: +-448 and subnormals, very spread scores
        raw = torch.randint(0, 256, (rows, 1, 576), dtype=torch.uint8, generator=gen)
        raw[(raw & 0x7F) == 0x7F] ^= 1
        return raw.view(torch.float8_e4m3fn)
    scale = {"normal": 1.0, "tiny": 0.01}[kind]  # tiny: mostly e4m3 subnormals
    return (torch.randn((rows, 1, 576), generator=gen) * scale).to(torch.float8_e4m3fn)


def bf16_toward_zero(x: torch.Tensor) -> torch.Tensor:
    """fp32 -> bf16 the way the interpreter does it (drop the low 16 bits)."""
    return (x.float().view(torch.int32) & -65536).view(torch.float32).bfloat16()


def upstream_numerics(q_nope, q_pe, pool, indptr, idx) -> torch.Tensor:
    """FlashInfer's BF16-KV decode as arithmetic: fp32 scores, bf16 P into PV, bf16 out."""
    kv = pool.reshape(pool.shape[0], -1).float()
    out = torch.zeros(q_nope.shape, dtype=torch.bfloat16)
    bounds = indptr.tolist()
    for b in range(q_nope.shape[0]):
        rows = kv[idx[bounds[b] : bounds[b + 1]].long()]
        if rows.shape[0]:
            q = torch.cat([q_nope[b], q_pe[b]], dim=-1).float()
            s = (q @ rows.T) * SM_SCALE
            p = torch.exp(s - s.max(dim=-1, keepdim=True).values)
            pv = p.bfloat16().float() @ rows[:, :512]
            out[b] = bf16_toward_zero(pv / p.sum(dim=-1, keepdim=True))
    return out


def row_errors(out: torch.Tensor, ref: torch.Tensor, lens: list[int]) -> torch.Tensor:
    live = torch.tensor(lens) > 0
    o, r = out.double()[live], ref[live]
    return (o - r).norm(dim=-1) / r.norm(dim=-1)


@settings(
    max_examples=20, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture]
)
@given(
    lens=st.lists(st.integers(0, 200), min_size=1, max_size=3),
    heads=st.sampled_from([1, 8, 16, 20]),
    kind=st.sampled_from(["normal", "wide", "tiny"]),
    programs=st.integers(1, 6),
    form=st.sampled_from(["kv-m", "heads-m"]),
    block_n=st.sampled_from([16, 32]),
    duplicates=st.booleans(),
    seed=st.integers(0, 2**16),
)
def test_matches_fp64_attention_on_the_same_fp8_values(
    native, lens, heads, kind, programs, form, block_n, duplicates, seed
):
    """Any lengths (0 included), head counts below/above one head group, both tile forms, any
    grid (so any cut of requests into chunks) and tile size; radix-style duplicate slots; the
    last pool row in play. Output poisoned first; error no worse than 1.5x upstream's
    arithmetic on the same values (both against fp64)."""
    gen = torch.Generator().manual_seed(seed)
    pool_rows = 257
    pool = fp8_pool(pool_rows, kind, gen)
    total = sum(lens)
    indptr = torch.tensor([0, *torch.tensor(lens).cumsum(0).tolist()], dtype=torch.int32)
    hot = pool_rows if not duplicates else 7  # duplicates: every request reads the same 7 slots
    idx = torch.randint(0, hot, (max(total, 1),), dtype=torch.int32, generator=gen)
    idx[total // 2] = pool_rows - 1
    q_scale = 30.0 if kind == "tiny" else 1.0
    q_nope = (torch.randn(len(lens), heads, 512, generator=gen) * q_scale).bfloat16()
    q_pe = (torch.randn(len(lens), heads, 64, generator=gen) * q_scale).bfloat16()
    out = torch.full((len(lens), heads, 512), float("nan"), dtype=torch.bfloat16)
    config = tiny_config(native, form, block_n)
    got = native.mla_decode_fp8(
        q_nope, q_pe, pool, indptr, idx, SM_SCALE, out, config=config, num_programs=programs
    )
    assert got is out
    assert not torch.isnan(out).any(), "an output element was never written"
    empty = torch.tensor(lens) == 0
    assert (out[empty] == 0).all(), "an empty request must give zeros"
    if total:
        ref = fp64_decode_attention(torch, q_nope, q_pe, pool, indptr, idx, SM_SCALE)
        upstream = upstream_numerics(q_nope, q_pe, pool, indptr, idx)
        worst = float(row_errors(out, ref, lens).max())
        worst_upstream = float(row_errors(upstream, ref, lens).max())
        assert worst <= max(BAR * worst_upstream, BF16_ROUNDING), (worst, worst_upstream)


def tiny_config(native, form: str, block_n: int = 16):
    """An interpreter-sized configuration of either tile form: small chunks, so that requests
    are cut across programs and the partial/merge path runs as well as the direct one."""
    code = native.FORM_KV_M if form == "kv-m" else native.FORM_HEADS_M
    return native.LaunchConfig(code, block_n, 4, 1, 1, min_chunk=16, overhead=8)


def test_program_count_does_not_change_the_function(native):
    """One program (bf16 written directly) and several (requests cut, LSE merge) agree with
    fp64 alike, in both tile forms."""
    gen = torch.Generator().manual_seed(3)
    pool = fp8_pool(600, "normal", gen)
    lens = [500]
    indptr = torch.tensor([0, 500], dtype=torch.int32)
    idx = torch.randperm(600, generator=gen)[:500].to(torch.int32)
    q_nope = torch.randn(1, 16, 512, generator=gen).bfloat16()
    q_pe = torch.randn(1, 16, 64, generator=gen).bfloat16()
    ref = fp64_decode_attention(torch, q_nope, q_pe, pool, indptr, idx, SM_SCALE)
    for form in ("kv-m", "heads-m"):
        for programs in (1, 3, 16):
            out = torch.full_like(q_nope, float("nan"))
            native.mla_decode_fp8(
                q_nope, q_pe, pool, indptr, idx, SM_SCALE, out,
                config=tiny_config(native, form, 32), num_programs=programs,
            )  # fmt: skip
            assert float(row_errors(out, ref, lens).max()) < REL_TOL, (form, programs)


def test_slots_outside_the_pool_are_never_read(native):
    """A corrupt index counts as absent (no out-of-bounds read): the rest is still attended."""
    gen = torch.Generator().manual_seed(5)
    pool = fp8_pool(64, "normal", gen)
    idx = torch.tensor([3, 64, 10, -1, 63], dtype=torch.int32)
    valid = torch.tensor([3, 10, 63], dtype=torch.int32)
    q_nope = torch.randn(1, 8, 512, generator=gen).bfloat16()
    q_pe = torch.randn(1, 8, 64, generator=gen).bfloat16()
    out = torch.empty_like(q_nope)
    native.mla_decode_fp8(
        q_nope, q_pe, pool, torch.tensor([0, 5], dtype=torch.int32), idx, SM_SCALE, out
    )
    ref = fp64_decode_attention(
        torch, q_nope, q_pe, pool, torch.tensor([0, 3], dtype=torch.int32), valid, SM_SCALE
    )
    assert float(row_errors(out, ref, [3]).max()) < REL_TOL


@pytest.mark.parametrize(
    ("change", "message"),
    [
        ({"pool_dtype": torch.bfloat16}, "float8_e4m3fn"),
        ({"q_dtype": torch.float16}, "bfloat16"),
        ({"latent": 256}, r"expects 512\+64"),
        ({"indptr_dtype": torch.int64}, "int32"),
        ({"indptr_len": 1}, "needs 3"),
    ],
)
def test_bad_inputs_are_refused_with_one_clear_error(native, change, message):
    q_nope = torch.zeros(
        2, 4, change.get("latent", 512), dtype=change.get("q_dtype", torch.bfloat16)
    )
    q_pe = torch.zeros(2, 4, 64, dtype=torch.bfloat16)
    pool = torch.zeros(8, 1, 576).to(change.get("pool_dtype", torch.float8_e4m3fn))
    indptr = torch.zeros(change.get("indptr_len", 3), dtype=change.get("indptr_dtype", torch.int32))
    out = torch.zeros(2, 4, 512, dtype=torch.bfloat16)
    with pytest.raises((TypeError, ValueError), match=message):
        native.mla_decode_fp8(
            q_nope, q_pe, pool, indptr, torch.zeros(1, dtype=torch.int32), 1.0, out
        )


def test_launch_configuration_is_a_host_side_function_of_heads_and_device(native, monkeypatch):
    cpu = torch.device("cpu")
    assert native.launch_config(8, cpu) is native.CONFIG_INTERPRETER[native.FORM_KV_M]
    assert native.launch_config(16, cpu) is native.CONFIG_INTERPRETER[native.FORM_HEADS_M]
    cuda = torch.device("cuda", 0)
    monkeypatch.setitem(native._DEVICE_INFO, 0, (132, 232448, 9))  # H200: 227 KB per block
    assert native.launch_config(8, cuda) is native.CONFIG_KV_M_SM90  # GLM-5 at TP8
    assert native.launch_config(16, cuda) is native.CONFIG_HEADS_M_SM90
    assert native.launch_config(64, cuda) is native.CONFIG_HEADS_M_SM90
    for blackwell in ((148, 232448, 10), (188, 101376, 12)):  # B200, RTX PRO 6000 (99 KB)
        monkeypatch.setitem(native._DEVICE_INFO, 0, blackwell)
        assert native.launch_config(8, cuda) is native.CONFIG_KV_M
        assert native.launch_config(16, cuda) is native.CONFIG_HEADS_M
    # The grid is fixed per device, whatever the batch: SMs x programs per SM.
    config = native.CONFIG_KV_M
    assert native.num_programs_for(cuda, config) == 188 * config.programs_per_sm


def test_nan_in_q_or_in_a_row_read_reaches_that_output_as_upstream(native):
    """NaN must never become zeros: a NaN in one head's q makes that head NaN (the others stay
    finite); a NaN e4m3 code (0x7F, 0xFF) in a row one request reads makes that request NaN,
    on the direct path (one program) and on the cut path (partials merged)."""
    gen = torch.Generator().manual_seed(11)
    pool = fp8_pool(300, "normal", gen)
    lens = [40, 200]
    indptr = torch.tensor([0, 40, 240], dtype=torch.int32)
    idx = torch.randperm(300, generator=gen)[:240].to(torch.int32)
    q_nope = torch.randn(2, 8, 512, generator=gen).bfloat16()
    q_pe = torch.randn(2, 8, 64, generator=gen).bfloat16()
    raw = pool.view(torch.uint8).clone()
    raw[int(idx[5]), 0, 100] = 0x7F  # request 0
    raw[int(idx[40 + 150]), 0, 540] = 0xFF  # request 1, in its rope part
    bad_pool = raw.view(torch.float8_e4m3fn)
    bad_q = q_nope.clone()
    bad_q[1, 3, 17] = float("nan")
    for form in ("kv-m", "heads-m"):
        for programs in (1, 7):  # 7: request 1 is cut across programs
            config = tiny_config(native, form)
            out = torch.empty_like(q_nope)
            native.mla_decode_fp8(
                q_nope, q_pe, bad_pool, indptr, idx, SM_SCALE, out, config=config,
                num_programs=programs,
            )  # fmt: skip
            assert torch.isnan(out).all(), (form, programs)
            native.mla_decode_fp8(
                bad_q, q_pe, pool, indptr, idx, SM_SCALE, out, config=config,
                num_programs=programs,
            )  # fmt: skip
            assert torch.isnan(out[1, 3]).all(), (form, programs)
            others = torch.ones(2, 8, dtype=torch.bool)
            others[1, 3] = False
            assert torch.isfinite(out[others]).all(), (form, programs)
    assert lens == [40, 200]


def test_q_scaling_stays_finite_over_the_whole_bf16_range(native):
    """Rows of q with one element at 2^126 (near bf16's largest) and rows scaled to 2^100 or
    down to 2^-100: the power-of-two scale keeps every fp16 operand finite, so the output is
    finite wherever fp32 scores are (the one-hot / uniform limits included)."""
    gen = torch.Generator().manual_seed(13)
    pool = fp8_pool(128, "normal", gen)
    indptr = torch.tensor([0, 50, 100], dtype=torch.int32)
    idx = torch.randperm(128, generator=gen)[:100].to(torch.int32)
    base = torch.randn(2, 8, 512, generator=gen)
    q_pe = torch.randn(2, 8, 64, generator=gen).bfloat16()
    spike = base.clone()
    spike[:, :, 9] = 2.0**126
    cases = {"spike 2^126": spike, "rows 2^100": base * 2.0**100, "rows 2^-100": base * 2.0**-100}
    for name, q in cases.items():
        for form in ("kv-m", "heads-m"):
            out = torch.full((2, 8, 512), float("nan"), dtype=torch.bfloat16)
            native.mla_decode_fp8(
                q.bfloat16(), q_pe, pool, indptr, idx, SM_SCALE, out,
                config=tiny_config(native, form), num_programs=3,
            )  # fmt: skip
            assert torch.isfinite(out).all(), (name, form)
    # The scale itself: every exponent from bf16's smallest normal to its largest maps the
    # row maximum into [2^14, 2^15) without overflow.
    ref = fp64_decode_attention(torch, spike.bfloat16(), q_pe, pool, indptr, idx, SM_SCALE)
    out = torch.empty((2, 8, 512), dtype=torch.bfloat16)
    native.mla_decode_fp8(spike.bfloat16(), q_pe, pool, indptr, idx, SM_SCALE, out,
                          config=tiny_config(native, "kv-m"), num_programs=2)  # fmt: skip
    assert float(row_errors(out, ref, [50, 50]).max()) < REL_TOL


def test_the_workspace_depends_on_device_and_heads_only_and_is_never_replaced(native):
    """A captured CUDA graph keeps the workspace's address: calls of any batch (larger ones
    included) reuse the same buffer, and a new head layout adds one without dropping any."""
    gen = torch.Generator().manual_seed(17)
    pool = fp8_pool(200, "normal", gen)
    before = native.WORKSPACES.buffers()
    seen = []
    for batch in (1, 4, 33):
        indptr = torch.arange(batch + 1, dtype=torch.int32) * 3
        idx = torch.randint(0, 200, (batch * 3,), dtype=torch.int32, generator=gen)
        q_nope = torch.randn(batch, 8, 512, generator=gen).bfloat16()
        q_pe = torch.randn(batch, 8, 64, generator=gen).bfloat16()
        out = torch.empty_like(q_nope)
        native.mla_decode_fp8(q_nope, q_pe, pool, indptr, idx, SM_SCALE, out)
        seen.append(native.WORKSPACES.get(torch.device("cpu"), *workspace_key(native, 8)))
    assert all(w[0].data_ptr() == seen[0][0].data_ptr() for w in seen)
    after = native.WORKSPACES.buffers()
    assert all(any(b[0] is a[0] for a in after) for b in before), "a buffer was dropped"


def workspace_key(native, heads: int) -> tuple[int, int]:
    config = native.launch_config(heads, torch.device("cpu"))
    return native.num_programs_for(torch.device("cpu"), config), config.heads_per_program


def runner(kv_dtype, lora=512, rope=64, device="cpu"):
    cfg = SimpleNamespace(kv_lora_rank=lora, qk_rope_head_dim=rope)
    return SimpleNamespace(kv_cache_dtype=kv_dtype, model_config=cfg, device=device)


def test_backend_state_says_which_decode_path_runs_and_why(native, monkeypatch, caplog):
    caplog.set_level("INFO", logger=native.logger.name)
    monkeypatch.setattr(native, "_ANNOUNCED", set())
    monkeypatch.delenv(native.ENV_MODE, raising=False)
    # A 16-bit pool or the series switched off: nothing FP8 to decide, nothing logged.
    assert native.Fp8NativeDecode.create(runner(torch.bfloat16), patch_on=True) is None
    assert native.Fp8NativeDecode.create(runner(torch.float8_e4m3fn), patch_on=False) is None
    assert caplog.records == []
    # FP8 but unsupported here: gather, with the reason in one line.
    assert native.Fp8NativeDecode.create(runner(torch.float8_e5m2), patch_on=True) is None
    assert native.Fp8NativeDecode.create(runner(torch.float8_e4m3fn, lora=256), True) is None
    monkeypatch.setenv(native.ENV_MODE, "gather")
    assert native.Fp8NativeDecode.create(runner(torch.float8_e4m3fn), patch_on=True) is None
    lines = [r.getMessage() for r in caplog.records]
    assert any("float8_e5m2" in ln for ln in lines)
    assert any("MLA dims 256+64" in ln for ln in lines)
    assert any("GLMSERVE_FP8_ATTENTION=gather" in ln for ln in lines)
    assert all(ln.startswith("glmserve FP8 KV decode: gather-then-cast") for ln in lines)
    monkeypatch.setenv(native.ENV_MODE, "fast")
    with pytest.raises(ValueError, match="GLMSERVE_FP8_ATTENTION must be one of native, gather"):
        native.Fp8NativeDecode.create(runner(torch.float8_e4m3fn), patch_on=True)


class Wrapper:
    """Stands in for FlashInfer's wrapper: the state keys on it weakly, like SGLang's objects."""


def test_a_wrapper_runs_native_only_after_a_plain_decode_plan(native):
    state = native.Fp8NativeDecode()
    wrapper, draft = Wrapper(), Wrapper()
    assert state.planned(wrapper) is None  # never planned: gather
    indptr = torch.zeros(3, dtype=torch.int32)
    state.note_plan(wrapper, indptr, 0.1)
    state.note_plan(draft, None, 0.1)  # a speculative batch: gather
    assert state.planned(wrapper) == (indptr, 0.1)
    assert state.planned(draft) is None
