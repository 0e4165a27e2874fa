"""The SHIPPED native FP8 decode kernel, run on the CPU by Triton's interpreter, against fp64.

The module is loaded from a real SGLang 0.5.12.post1 tree that the committed series was applied
to (never from a second copy). On the GPU the same source is checked against FlashInfer
(bench/fp8_decode.py); here it is checked against the definition of attention.
"""

from __future__ import annotations

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

from glmserve.patching import apply  # noqa: E402
from glmserve.patching.nativecheck import fp64_decode_attention  # noqa: E402
from glmserve.patching.selftest import load_kernel_module  # noqa: E402
from glmserve.patching.wheels import extract_site, fetch_wheel  # noqa: E402

REPO = Path(__file__).resolve().parents[2]
VERSION = "0.5.12.post1"
BACKEND = "sglang/srt/layers/attention/flashinfer_mla_backend.py"
NATIVE = "sglang/srt/layers/attention/fp8_mla_decode.py"
SM_SCALE = 1 / 16.0
# The bar: no worse than 1.5x the upstream path (FlashInfer on the BF16 cast), which
# on the GPU is measured against FlashInfer itself (bench/fp8_decode.py). Here upstream's
# numerics are emulated: fp32 scores, bf16 softmax weights into PV, bf16 output. Triton 3.6's
# interpreter rounds fp32 -> bf16 toward zero (the GPU rounds to nearest), so the emulation's
# output does the same. Rounding a vector to bf16 alone can cost up to 2^-8 of its norm: that
# is the floor, because with few tokens and heads both errors are that rounding.
BAR = 1.5
BF16_ROUNDING = 2.0**-8
REL_TOL = 5e-3  # for the targeted tests on well-spread (normal) pools


@pytest.fixture(scope="module")
def native(tmp_path_factory: pytest.TempPathFactory, require):
    """fp8_mla_decode from a real 0.5.12.post1 tree patched by the real apply tool."""
    require(
        os.environ.get("TRITON_INTERPRET") == "1",
        "Triton was imported before TRITON_INTERPRET=1 could be set",
    )
    site = extract_site(fetch_wheel(VERSION), tmp_path_factory.mktemp("site"), [BACKEND])
    outcome = apply(site, REPO / "patches")
    assert outcome.action == "applied", outcome.message
    return load_kernel_module(site / NATIVE)


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
    splits=st.integers(1, 4),
    block_n=st.sampled_from([16, 32]),
    duplicates=st.booleans(),
    seed=st.integers(0, 2**16),
)
def test_matches_fp64_attention_on_the_same_fp8_values(
    native, lens, heads, kind, splits, block_n, duplicates, seed
):
    """Any lengths (0 included), head counts below/above one 16-head group, split counts and
    tile sizes; radix-style duplicate slots; the last pool row in play. Output poisoned first;
    error no worse than 1.5x upstream's arithmetic on the same values (both against fp64)."""
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
    config = native.LaunchConfig(block_n, 4, 1, 1, min_chunk=16)
    got = native.mla_decode_fp8(
        q_nope, q_pe, pool, indptr, idx, SM_SCALE, out, config=config, num_splits=splits
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


def test_split_count_does_not_change_the_function(native):
    """One split (bf16 written directly) and several (LSE merge) agree with fp64 alike."""
    gen = torch.Generator().manual_seed(3)
    pool = fp8_pool(600, "normal", gen)
    lens = [500]
    indptr = torch.tensor([0, 500], dtype=torch.int32)
    idx = torch.randperm(600, generator=gen)[:500].to(torch.int32)
    q_nope = torch.randn(1, 16, 512, generator=gen).bfloat16()
    q_pe = torch.randn(1, 16, 64, generator=gen).bfloat16()
    ref = fp64_decode_attention(torch, q_nope, q_pe, pool, indptr, idx, SM_SCALE)
    config = native.LaunchConfig(32, 4, 1, 1, min_chunk=32)
    for splits in (1, 3, 16):
        out = torch.full_like(q_nope, float("nan"))
        native.mla_decode_fp8(
            q_nope, q_pe, pool, indptr, idx, SM_SCALE, out, config=config, num_splits=splits
        )
        assert float(row_errors(out, ref, lens).max()) < REL_TOL, splits


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


def test_launch_configuration_is_a_host_side_function_of_batch_and_device(native, monkeypatch):
    assert native.launch_config(1, torch.device("cpu")) is native.CONFIG_INTERPRETER
    cuda = torch.device("cuda", 0)
    monkeypatch.setitem(native._DEVICE_INFO, 0, (132, 232448))  # H200/B200: 227 KB per block
    assert native.launch_config(1, cuda) is native.CONFIG_SMALL_BATCH_WIDE
    assert native.launch_config(native.SMALL_BATCH + 1, cuda) is native.CONFIG_LARGE_BATCH
    monkeypatch.setitem(native._DEVICE_INFO, 0, (188, 101376))  # RTX PRO 6000: 99 KB
    assert native.launch_config(1, cuda) is native.CONFIG_SMALL_BATCH
    # Splits fill the GPU at batch 1 and vanish at large batches; never above MAX_SPLITS.
    big = native.num_splits_for(1, 16, cuda, native.CONFIG_LARGE_BATCH)
    assert big == min(native.MAX_SPLITS, 188 * native.CONFIG_LARGE_BATCH.programs_per_sm)
    assert native.num_splits_for(4096, 16, cuda, native.CONFIG_LARGE_BATCH) == 1


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
