"""The gather contract of the SHIPPED Triton kernel, run on the CPU by Triton's interpreter.

The kernel is imported from each line's real SGLang tree (0.5.12.post1, 0.5.17, 0.5.23) that its
committed series was applied to (never from a second copy), and checked against plain ``.to()``
on the referenced rows.
"""

from __future__ import annotations

import importlib
import os

# Must be set before Triton is imported anywhere in this process: it selects the interpreter.
os.environ.setdefault("TRITON_INTERPRET", "1")

from pathlib import Path

import pytest

torch = pytest.importorskip("torch")
pytest.importorskip("triton")
from hypothesis import HealthCheck, given, settings  # noqa: E402
from hypothesis import strategies as st  # noqa: E402

REPO = Path(__file__).resolve().parents[2]
VERSION = "0.5.12.post1"
BACKEND = "sglang/srt/layers/attention/flashinfer_mla_backend.py"

KERNEL = "sglang/srt/layers/attention/fp8_kv_gather.py"
D = 576


@pytest.fixture(scope="module")
def kernel():
    """fp8_kv_gather from its one source (every line's diff adds a generated copy of it)."""
    if os.environ.get("TRITON_INTERPRET") != "1":
        pytest.skip("Triton was imported before TRITON_INTERPRET=1 could be set")
    return importlib.import_module("glmserve.kernels.fp8_kv_gather")


def fp8_pool(rows: int, seed: int) -> torch.Tensor:
    gen = torch.Generator().manual_seed(seed)
    raw = torch.randint(0, 256, (rows, 1, D), dtype=torch.uint8, generator=gen)
    raw[(raw & 0x7F) == 0x7F] ^= 1  # no NaN patterns: NaN != NaN would hide nothing here
    return raw.view(torch.float8_e4m3fn)


POISON = -777.0  # exactly representable, never produced by an e4m3 value


def run_gather(kernel, pool: torch.Tensor, slots: list[int], count: int, grid: int | None = None):
    out = torch.full(pool.shape, POISON, dtype=torch.bfloat16)
    idx = torch.tensor(slots or [0], dtype=torch.int32)
    rows = torch.tensor([count], dtype=torch.int32)
    kernel.gather_cast(pool, idx, rows, out, grid=grid)
    return out


def expected_rows(pool_rows: int, slots: list[int], count: int) -> list[int]:
    if count >= pool_rows:
        return list(range(pool_rows))
    return sorted(set(slots[:count]))


@st.composite
def gather_case(draw):
    pool_rows = draw(st.integers(min_value=1, max_value=48))
    # Indices with many duplicates (radix prefix sharing) and the pool's edges.
    slot = st.one_of(st.integers(0, pool_rows - 1), st.sampled_from([0, pool_rows - 1]))
    slots = draw(st.lists(slot, min_size=0, max_size=2 * pool_rows + 8))
    # count 0, count < len, count == len, and count past the pool size (full-pool mode).
    count = draw(st.sampled_from([0, len(slots) // 2, len(slots), pool_rows, pool_rows + 3]))
    if count < pool_rows:
        count = min(count, len(slots))
    grid = draw(st.sampled_from([None, 1, 2, 7]))
    return pool_rows, slots, count, grid, draw(st.integers(0, 2**31 - 1))


@settings(
    max_examples=int(os.environ.get("GLMSERVE_KERNEL_EXAMPLES", "40")),
    deadline=None,
    suppress_health_check=[HealthCheck.function_scoped_fixture, HealthCheck.too_slow],
)
@given(case=gather_case())
def test_gather_matches_to_on_referenced_rows_and_writes_nothing_else(kernel, case):
    """shadow[s] == pool[s].to(bf16) bit for bit for every referenced slot; other rows untouched."""
    pool_rows, slots, count, grid, seed = case
    pool = fp8_pool(pool_rows, seed)
    out = run_gather(kernel, pool, slots, count, grid)
    want = expected_rows(pool_rows, slots, count)
    ref = pool.to(torch.bfloat16)
    assert torch.equal(out[want].view(torch.int16), ref[want].view(torch.int16))
    rest = sorted(set(range(pool_rows)) - set(want))
    assert bool((out[rest] == POISON).all())


def test_full_pool_mode_reads_no_indices(kernel):
    """At count >= pool rows the whole pool is converted, whatever the index buffer holds."""
    pool = fp8_pool(10, 1)
    out = run_gather(kernel, pool, [3, 3, 3], count=10)
    assert torch.equal(out.view(torch.int16), pool.to(torch.bfloat16).view(torch.int16))


def test_out_of_range_indices_are_never_touched(kernel):
    """Stale or garbage indices cannot make the kernel read or write outside the pool."""
    pool = fp8_pool(8, 2)
    out = run_gather(kernel, pool, [-1, 8, 1000, 5], count=4)
    assert torch.equal(out[5].view(torch.int16), pool[5].to(torch.bfloat16).view(torch.int16))
    assert bool((out[[0, 1, 2, 3, 4, 6, 7]] == POISON).all())


def test_fp16_output_is_exact_too(kernel):
    """The cast is exact for fp16 as well (the backend passes q.dtype).

    NaN encodings (S.1111.111) are left to the GPU test: Triton 3.6's interpreter decodes
    0x7F as 480.0 where the hardware convert (and torch) give NaN.
    """
    pool = fp8_pool(6, 3)
    out = torch.full(pool.shape, POISON, dtype=torch.float16)
    idx = torch.tensor([2, 4, 2], dtype=torch.int32)
    kernel.gather_cast(pool, idx, torch.tensor([3], dtype=torch.int32), out)
    ref = pool.to(torch.float16)
    assert torch.equal(out[[2, 4]].view(torch.int16), ref[[2, 4]].view(torch.int16))
    assert bool((out[[0, 1, 3, 5]] == POISON).all())


@pytest.mark.parametrize(
    ("pool_dtype", "out_dtype", "count_dtype"),
    [
        (torch.uint8, torch.bfloat16, torch.int32),
        ("fp8", torch.float32, torch.int32),
        ("fp8", torch.bfloat16, torch.int64),
    ],
)
def test_wrong_dtypes_are_refused(kernel, pool_dtype, out_dtype, count_dtype):
    pool = fp8_pool(4, 4)
    if pool_dtype != "fp8":
        pool = pool.view(pool_dtype)
    with pytest.raises((TypeError, ValueError)):
        kernel.gather_cast(
            pool,
            torch.tensor([1], dtype=torch.int32),
            torch.tensor([1], dtype=count_dtype),
            torch.empty(pool.shape, dtype=out_dtype),
        )


def test_env_switch(kernel, monkeypatch):
    """GLMSERVE_FP8_GATHER=0 gives the upstream path (no gather state); junk is refused."""
    monkeypatch.setenv("GLMSERVE_FP8_GATHER", "0")
    assert kernel.Fp8KvGather.create(torch.device("cpu")) is None
    monkeypatch.setenv("GLMSERVE_FP8_GATHER", "1")
    assert kernel.Fp8KvGather.create(torch.device("cpu")) is not None
    monkeypatch.delenv("GLMSERVE_FP8_GATHER")
    assert kernel.fp8_gather_enabled()
    monkeypatch.setenv("GLMSERVE_FP8_GATHER", "maybe")
    with pytest.raises(ValueError, match="GLMSERVE_FP8_GATHER"):
        kernel.fp8_gather_enabled()


def test_backend_state_counts_rows_and_shares_one_shadow(kernel, monkeypatch):
    """note_rows records kv_indptr[-1] (or the larger planned host count); cast reuses one shadow."""
    monkeypatch.setenv("GLMSERVE_FP8_GATHER", "1")
    state = kernel.Fp8KvGather.create(torch.device("cpu"))
    state.note_rows(torch.tensor([0, 3, 9], dtype=torch.int32))
    assert int(state.rows) == 9
    state.note_rows(torch.tensor([0, 3, 9], dtype=torch.int32), torch.tensor([0, 4, 12]))
    assert int(state.rows) == 12
    state.note_rows(torch.tensor([0, 5], dtype=torch.int32), torch.tensor([0, 1]))
    assert int(state.rows) == 5
    pool = fp8_pool(16, 5)
    idx = torch.tensor([15, 0, 7, 7, 3], dtype=torch.int32)
    first = state.cast(pool, idx, torch.bfloat16)
    second = state.cast(fp8_pool(16, 6), idx, torch.bfloat16)
    assert first.data_ptr() == second.data_ptr()  # one buffer for every layer
    # A pool that is not e4m3, or no planned indices, takes the upstream cast: EVERY row is
    # converted (not only the indexed ones) into a fresh tensor, never into the shared shadow.
    first.fill_(float("nan"))
    fp16_pool = pool.to(torch.float16)  # exact: every e4m3 value is an fp16 value
    want = pool.to(torch.bfloat16).view(torch.int16)
    for got in (state.cast(fp16_pool, idx, torch.bfloat16), state.cast(pool, None, torch.bfloat16)):
        assert got.data_ptr() != first.data_ptr()
        assert torch.equal(got.view(torch.int16), want)


def test_no_hardware_e4m3_turns_the_gather_off_with_one_log_line(kernel, monkeypatch, caplog):
    """Below compute capability 8.9 the kernel cannot compile: create() returns None (the
    backend then runs the upstream cast) and says so once, however many backends ask."""
    from support.sglang_standins import CpuForCuda

    monkeypatch.setenv("GLMSERVE_FP8_GATHER", "1")
    monkeypatch.setattr(kernel, "_unsupported_logged", False)
    cuda = torch.device("cuda")
    monkeypatch.setattr(torch.cuda, "get_device_capability", lambda device=None: (8, 0))
    with caplog.at_level("WARNING"):
        assert kernel.Fp8KvGather.create(cuda) is None
        assert kernel.Fp8KvGather.create("cuda") is None
    lines = [r.getMessage() for r in caplog.records if "fp8 gather" in r.getMessage()]
    assert lines == [
        "glmserve fp8 gather: off, compute capability 8.0 has no hardware FP8 e4m3 convert "
        "(needs 8.9); running the upstream full-pool cast"
    ]
    monkeypatch.setattr(torch.cuda, "get_device_capability", lambda device=None: (8, 9))
    with CpuForCuda():  # the state's 1-element count tensor, allocated on the CPU here
        assert kernel.Fp8KvGather.create(cuda) is not None


def test_the_launcher_and_the_patch_agree_on_the_capability_floor(kernel):
    from glmserve.selftest.runner import MIN_E4M3_CAPABILITY

    assert tuple(kernel.MIN_CAPABILITY) == MIN_E4M3_CAPABILITY == (8, 9)
