"""Prompts (synthetic or JSONL, seeded) and what the report keeps of the server's info."""

from __future__ import annotations

from pathlib import Path

import pytest

from glmserve.loadtest.options import LoadTestOptions, OptionsError
from glmserve.loadtest.prompts import load_prompt_file, user_rng
from glmserve.loadtest.serverinfo import extract
from glmserve.loadtest.workload import Workload


def prompts_of(workload: Workload, seed: int | None, stream_id: int, n: int) -> list[str]:
    rng = user_rng(seed, stream_id)
    return [workload.next_request(rng).text for _ in range(n)]


def test_synthetic_prompt_has_the_requested_word_count_and_a_fresh_prefix() -> None:
    a, b = prompts_of(Workload(LoadTestOptions(input_tokens=50)), 1, 0, 2)
    assert len(a.split()) == 50
    assert a.split()[0] != b.split()[0]  # no radix-cache hit on the prefix


def test_seed_makes_prompts_reproducible_per_stream() -> None:
    workload = Workload(LoadTestOptions(input_tokens=20))
    run1 = prompts_of(workload, 7, 3, 2)
    assert run1 == prompts_of(workload, 7, 3, 2)
    assert prompts_of(workload, 7, 4, 1)[0] != run1[0]


def test_prompt_file_lines_are_used(tmp_path: Path) -> None:
    f = tmp_path / "p.jsonl"
    f.write_text('{"prompt": "a b"}\n\n{"text": "c"}\n')
    prompts = load_prompt_file(str(f))
    assert prompts == ["a b", "c"]
    assert set(prompts_of(Workload(LoadTestOptions(), prompts), 1, 0, 20)) == {"a b", "c"}


@pytest.mark.parametrize(
    ("content", "message"),
    [("{bad\n", ":1: not JSON"), ('{"prompt": ""}\n', ":1: needs"), ("\n", "no prompts")],
)
def test_bad_prompt_file_is_one_clear_line(tmp_path: Path, content: str, message: str) -> None:
    f = tmp_path / "p.jsonl"
    f.write_text(content)
    with pytest.raises(OptionsError, match=message):
        load_prompt_file(str(f))


def test_missing_prompt_file() -> None:
    with pytest.raises(OptionsError, match="--prompt-file"):
        load_prompt_file("/nonexistent/prompts.jsonl")


def test_server_info_fields_from_sglang_shape() -> None:
    """SGLang 0.5.12.post1 /server_info: version, server args, pool size in internal_states."""
    info = {
        "version": "0.5.12.post1",
        "kv_cache_dtype": "fp8_e4m3",
        "attention_backend": "flashinfer",
        "tp_size": 8,
        "internal_states": [{"memory_usage": {"token_capacity": 495552}}],
        "unrelated": 1,
    }
    got = extract(info)
    assert got["sglang_version"] == "0.5.12.post1"
    assert got["kv_cache_dtype"] == "fp8_e4m3"
    assert got["kv_pool_tokens"] == 495552
    assert "unrelated" not in got


def test_server_info_prefers_scheduler_pool_size_and_keeps_emulator_truth() -> None:
    info = {"version": "x", "max_total_num_tokens": 1000, "glmserve_emulator": {"tpot_ms": 20}}
    got = extract(info)
    assert got["kv_pool_tokens"] == 1000
    assert got["emulator"] == {"tpot_ms": 20}
