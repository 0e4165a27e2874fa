"""The patched SGLang cannot import glmserve, so its two modules keep their own copy of the FP8
switches. Here the copies meet the one definition (glmserve.switches): the same names, the same
default, and every value glmserve accepts means the same thing to the patched module."""

from __future__ import annotations

import os

os.environ.setdefault("TRITON_INTERPRET", "1")

from pathlib import Path

import pytest

pytest.importorskip("torch")
pytest.importorskip("triton")

from glmserve import switches
from glmserve.selftest.runner import load_kernel_module
from glmserve.series import apply
from glmserve.series.wheels import extract_site, fetch_wheel

REPO = Path(__file__).resolve().parents[2]
VERSION = "0.5.12.post1"
ATTENTION = "sglang/srt/layers/attention/"
POOL = "sglang/srt/mem_cache/memory_pool.py"  # the series patches its FP8 store too


@pytest.fixture(scope="module")
def patched(tmp_path_factory: pytest.TempPathFactory, require) -> Path:
    require(
        os.environ.get("TRITON_INTERPRET") == "1",
        "Triton was imported before TRITON_INTERPRET=1 could be set",
    )
    site = tmp_path_factory.mktemp("site")
    extract_site(fetch_wheel(VERSION), site, [ATTENTION + "flashinfer_mla_backend.py", POOL])
    outcome = apply(site, REPO / "patches")
    assert outcome.action == "applied", outcome.message
    return site / ATTENTION


def _env_cases(switch: switches.Choice) -> list[dict[str, str]]:
    cases: list[dict[str, str]] = [{}]  # unset
    cases += [{switch.name: value} for value in switch.values]
    cases += [{switch.name: f"  {value.upper()} "} for value in switch.values]
    if switch.empty is not None:
        cases.append({switch.name: ""})
    return cases


def test_the_gather_switch_agrees(patched: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    gather = load_kernel_module(patched / "fp8_kv_gather.py")
    assert switches.FP8_GATHER.name == gather.ENV_SWITCH
    for env in _env_cases(switches.FP8_GATHER):
        monkeypatch.delenv(switches.FP8_GATHER.name, raising=False)
        for name, value in env.items():
            monkeypatch.setenv(name, value)
        assert gather.fp8_gather_enabled() == switches.fp8_gather_on(env), env
    for refused in ("", "2"):  # refused by both
        monkeypatch.setenv(switches.FP8_GATHER.name, refused)
        with pytest.raises(ValueError):
            gather.fp8_gather_enabled()
        with pytest.raises(switches.SwitchError):
            switches.fp8_gather_on({switches.FP8_GATHER.name: refused})


def test_the_decode_switch_agrees(patched: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    native = load_kernel_module(patched / "fp8_mla_decode.py")
    assert switches.FP8_ATTENTION.name == native.ENV_MODE
    assert native.MODES == switches.FP8_PATHS
    assert native.DEFAULT_MODE == switches.PATCHED_MODULE_AUTO
    for env in _env_cases(switches.FP8_ATTENTION):
        monkeypatch.delenv(switches.FP8_ATTENTION.name, raising=False)
        for name, value in env.items():
            monkeypatch.setenv(name, value)
        assert native.decode_mode() == switches.fp8_attention_path(env), env
    monkeypatch.setenv(switches.FP8_ATTENTION.name, "fast")
    with pytest.raises(ValueError):
        native.decode_mode()
    with pytest.raises(switches.SwitchError):
        switches.fp8_attention_path({switches.FP8_ATTENTION.name: "fast"})


def test_the_fused_fp8_store_follows_the_series_switch(monkeypatch):
    """Only an FP8 e4m3 pool fed 16-bit values on a GPU, with the series on, converts inside
    the scatter; everything else keeps SGLang's own store."""
    import importlib

    torch = importlib.import_module("torch")
    gather = importlib.import_module("glmserve.kernels.fp8_kv_gather")
    cpu = torch.zeros(2, 512, dtype=torch.bfloat16)
    assert not gather.fused_fp8_kv_store(torch.float8_e4m3fn, cpu)  # not on a GPU
    monkeypatch.setattr(gather, "fp8_gather_supported", lambda device: True)
    monkeypatch.setattr(gather.torch.Tensor, "device", property(lambda t: torch.device("cuda", 0)))
    monkeypatch.setenv(gather.ENV_SWITCH, "1")
    assert gather.fused_fp8_kv_store(torch.float8_e4m3fn, cpu)
    assert not gather.fused_fp8_kv_store(torch.bfloat16, cpu)
    assert not gather.fused_fp8_kv_store(torch.float8_e5m2, cpu)
    assert not gather.fused_fp8_kv_store(torch.float8_e4m3fn, cpu.float())
    monkeypatch.setenv(gather.ENV_SWITCH, "0")
    assert not gather.fused_fp8_kv_store(torch.float8_e4m3fn, cpu)
    monkeypatch.setenv(gather.ENV_SWITCH, "1")
    monkeypatch.setenv(gather.FUSED_STORE_SWITCH, "0")
    assert not gather.fused_fp8_kv_store(torch.float8_e4m3fn, cpu)
