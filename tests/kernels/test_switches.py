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


@pytest.fixture(scope="module")
def patched(tmp_path_factory: pytest.TempPathFactory, require) -> Path:
    require(
        os.environ.get("TRITON_INTERPRET") == "1",
        "Triton was imported before TRITON_INTERPRET=1 could be set",
    )
    site = tmp_path_factory.mktemp("site")
    extract_site(fetch_wheel(VERSION), site, [ATTENTION + "flashinfer_mla_backend.py"])
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
