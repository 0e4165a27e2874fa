"""The paged gather (FlashAttention's absorbed-MLA path, SGLang 0.5.17+) run on the CPU by Triton's
interpreter, from its one source (the 0.5.17 and 0.5.23 diffs add generated copies of it).

`cast_pages` must leave every row FlashAttention can read through the page table equal to the
upstream cast, bit for bit: every row of every page `page_table[b, :ceil(len_b / page_size)]`
names (whole pages, so a page's tail equals the upstream cast too), and write nothing else.
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
from support.series_lines import source_lines  # noqa: E402

KERNEL = "sglang/srt/layers/attention/fp8_kv_gather.py"
D = 576
POISON = -777.0
# The lines whose series patches flashattention_backend.py, and so ship the paged gather.
PAGED_LINES = [v for v in source_lines() if v not in ("0.5.12.post1",)]


@pytest.fixture(scope="module")
def kernel():
    """fp8_kv_gather from its one source (every line's diff adds a generated copy of it)."""
    if os.environ.get("TRITON_INTERPRET") != "1":
        pytest.skip("Triton was imported before TRITON_INTERPRET=1 could be set")
    return importlib.import_module("glmserve.kernels.fp8_kv_gather")


def fp8_pool(rows: int, seed: int) -> torch.Tensor:
    gen = torch.Generator().manual_seed(seed)
    raw = torch.randint(0, 256, (rows, 1, D), dtype=torch.uint8, generator=gen)
    raw[(raw & 0x7F) == 0x7F] ^= 1  # no NaN patterns (the interpreter decodes them as 480)
    return raw.view(torch.float8_e4m3fn)


def expected_rows(rows: int, table: list[list[int]], lens: list[int] | None, page: int):
    """The test's own statement of what FlashAttention may read (independent of the kernel)."""
    cols = len(table[0])
    if lens is None:
        per_request = [cols * page] * len(table)
    else:
        per_request = [-(-n // page) * page for n in lens]
    if sum(per_request) >= rows:
        return set(range(rows))  # past one row per slot the pool is converted whole
    want = set()
    for b, n_rows in enumerate(per_request):
        for c in range(min(n_rows // page, cols)):
            want |= {table[b][c] * page + k for k in range(page)}
    return {r for r in want if 0 <= r < rows}


@st.composite
def paged_case(draw):
    page = draw(st.sampled_from([1, 2, 4, 16]))
    pages = draw(st.integers(1, 10))
    batch = draw(st.integers(1, 5))
    cols = draw(st.integers(1, 6))
    page_id = st.one_of(st.integers(0, pages - 1), st.sampled_from([-1, pages, 10**6]))
    table = [[draw(page_id) for _ in range(cols)] for _ in range(batch)]
    lens = draw(
        st.one_of(st.none(), st.lists(st.integers(0, cols * page), min_size=batch, max_size=batch))
    )
    programs = draw(st.sampled_from([None, 1, 3]))
    return page, pages * page, table, lens, programs, draw(st.integers(0, 2**31 - 1))


@settings(
    max_examples=int(os.environ.get("GLMSERVE_KERNEL_EXAMPLES", "40")),
    deadline=None,
    suppress_health_check=[HealthCheck.function_scoped_fixture, HealthCheck.too_slow],
)
@given(case=paged_case())
def test_paged_gather_matches_to_on_every_readable_row_and_writes_nothing_else(kernel, case):
    page, rows, table, lens, programs, seed = case
    pool = fp8_pool(rows, seed)
    out = torch.full(pool.shape, POISON, dtype=torch.bfloat16)
    t = torch.tensor(table, dtype=torch.int32)
    seqlens = None if lens is None else torch.tensor(lens, dtype=torch.int32)
    kernel.gather_cast_pages(pool, t, seqlens, page, out, programs=programs)
    want = sorted(expected_rows(rows, table, lens, page))
    ref = pool.to(torch.bfloat16)
    assert torch.equal(out[want].view(torch.int16), ref[want].view(torch.int16))
    rest = sorted(set(range(rows)) - set(want))
    assert bool((out[rest] == POISON).all())


def test_a_sliced_page_table_reads_its_own_rows_only(kernel):
    """SGLang slices the graph's persistent table ([:bs, :max_pages] of a wider buffer): the row
    stride is the buffer's, and columns past the length are stale."""
    pool = fp8_pool(32, 7)
    wide = torch.full((4, 9), 31, dtype=torch.int32)  # stale entries everywhere
    wide[0, :2] = torch.tensor([3, 5])
    wide[1, :1] = torch.tensor([6])
    table = wide[:2, :4]
    out = torch.full(pool.shape, POISON, dtype=torch.bfloat16)
    kernel.gather_cast_pages(pool, table, torch.tensor([7, 3], dtype=torch.int32), 4, out)
    want = [*range(12, 16), *range(20, 24), *range(24, 28)]
    assert torch.equal(out[want].view(torch.int16), pool[want].to(torch.bfloat16).view(torch.int16))
    assert bool((out[sorted(set(range(32)) - set(want))] == POISON).all())


def test_backend_state_casts_pages_into_the_shared_shadow_or_falls_back(kernel, monkeypatch):
    monkeypatch.setenv("GLMSERVE_FP8_GATHER", "1")
    state = kernel.Fp8KvGather.create(torch.device("cpu"))
    pool = fp8_pool(8, 3)
    table = torch.tensor([[1, 0]], dtype=torch.int32)
    lens = torch.tensor([3], dtype=torch.int32)
    paged = state.cast_pages(pool, table, lens, 2, torch.bfloat16)
    flat = state.cast(pool, torch.tensor([0], dtype=torch.int32), torch.bfloat16)
    assert paged.data_ptr() == flat.data_ptr()  # one shadow for every layer and both paths
    want = pool.to(torch.bfloat16).view(torch.int16)
    for got in (
        state.cast_pages(pool, None, lens, 2, torch.bfloat16),  # no table: the upstream cast
        state.cast_pages(pool.to(torch.float16), table, lens, 2, torch.bfloat16),  # 16-bit pool
    ):
        assert got.data_ptr() != paged.data_ptr() and torch.equal(got.view(torch.int16), want)


@pytest.mark.parametrize(
    ("change", "message"),
    [
        ({"table": torch.zeros(3, dtype=torch.int32)}, "2-D int32"),
        ({"table": torch.zeros((1, 2), dtype=torch.int64)}, "2-D int32"),
        ({"lens": torch.zeros(1, dtype=torch.int64)}, "cache_seqlens"),
        ({"page": 0}, "page_size"),
    ],
)
def test_bad_inputs_are_refused_with_one_clear_error(kernel, change, message):
    args = {
        "table": torch.zeros((2, 2), dtype=torch.int32),
        "lens": torch.zeros(2, dtype=torch.int32),
        "page": 1,
        **change,
    }
    pool = fp8_pool(4, 1)
    with pytest.raises(ValueError, match=message):
        kernel.gather_cast_pages(
            pool,
            args["table"],
            args["lens"],
            args["page"],
            torch.empty(pool.shape, dtype=torch.bfloat16),
        )


def test_the_wrappers_plan_a_backend_that_reads_the_gathered_indices(kernel, monkeypatch):
    """From 0.5.23 (FlashInfer 0.7) the patched wrappers name their backend: fa3 on SM90, fa2
    elsewhere, only names the rules accept as reading `_kv_indices_buf`. (0.5.17's backend
    keeps "auto": FlashInfer 0.6.15.post1's run() always reads the wrapper's indices.)"""
    from glmserve.preflight.rules import GATHER_WRAPPER_BACKENDS

    assert set(kernel.WRAPPER_BACKENDS) == GATHER_WRAPPER_BACKENDS
    assert kernel.indexed_wrapper_backend(torch.device("cpu")) == "fa2"
    for capability, want in (((9, 0), "fa3"), ((10, 0), "fa2"), ((12, 0), "fa2")):
        monkeypatch.setattr(torch.cuda, "get_device_capability", lambda d=None, c=capability: c)
        assert kernel.indexed_wrapper_backend(torch.device("cuda")) == want
