"""Target health + info metric, and the full /metrics text against golden files.

Regenerate the golden files after an intended change with UPDATE_GOLDEN=1 and review the diff.
"""

from __future__ import annotations

import json
import os
from pathlib import Path

import httpx
import pytest
from prometheus_client import CollectorRegistry, disable_created_metrics, generate_latest
from support.exporter import BUILD_INFO, StepClock, mock_client
from support.sse import SERVER_INFO, chat_events

from glmserve import buildinfo
from glmserve.exporter.canary import Canary, CanaryMetrics
from glmserve.exporter.info import TargetInfoCollector, summarize
from glmserve.streaming import StreamRequest

GOLDEN = Path(__file__).parent / "golden"
TARGET = "http://127.0.0.1:30000"


@pytest.fixture(autouse=True)
def _no_created_series():
    disable_created_metrics()  # what the exporter does at start; keeps the text reproducible


def info_handler(state: dict):
    def handler(req: httpx.Request) -> httpx.Response:
        if state.get("down"):
            raise httpx.ConnectError("Connection refused")
        if req.url.path == "/server_info":
            if state.get("old_server"):
                return httpx.Response(404, json={"detail": "Not Found"})
            return httpx.Response(200, json=SERVER_INFO)
        if req.url.path == "/get_server_info":
            return httpx.Response(200, json=SERVER_INFO)
        if req.url.path == "/v1/chat/completions":
            return httpx.Response(200, content=iter(chat_events(6, tokens_per_chunk=2)))
        return httpx.Response(404)

    return handler


def build(tmp_path: Path, state: dict, build_info: dict | None = BUILD_INFO):
    registry = CollectorRegistry()
    path = tmp_path / "build-info.json"
    if build_info is not None:
        buildinfo.write_build_info(path, build_info)
    client = mock_client(info_handler(state))
    collector = TargetInfoCollector(TARGET, client, registry, path)
    canary = Canary(
        TARGET,
        StreamRequest(max_tokens=6),
        CanaryMetrics(registry),
        client,
        clock=StepClock(0.004),
        wall_clock=lambda: 1_750_000_000.0,
    )
    return registry, collector, canary


def check_golden(name: str, text: str) -> None:
    path = GOLDEN / name
    if os.environ.get("UPDATE_GOLDEN") == "1":
        path.write_text(text)
    assert path.exists(), f"missing golden file {path}; run with UPDATE_GOLDEN=1"
    assert text == path.read_text(), f"/metrics differs from {path}"


def test_golden_metrics_healthy_target(tmp_path):
    """A healthy, patched FP8 target after one canary run: the full exposition is pinned."""
    registry, collector, canary = build(tmp_path, {})
    assert collector.refresh()
    assert canary.run_once() is None
    text = generate_latest(registry).decode()
    # Prometheus scrapes SGLang directly: nothing of SGLang's own is re-exported here.
    assert "sglang:" not in text
    assert all(ln.startswith(("# ", "glmserve_")) for ln in text.splitlines())
    check_golden("metrics_healthy.prom", text)


def test_golden_metrics_target_down_after_it_was_up(tmp_path):
    """Down: up 0, a counted probe failure and canary failure, and the last known info kept."""
    state: dict = {}
    registry, collector, canary = build(tmp_path, state)
    assert collector.refresh()  # one good probe while up
    state["down"] = True
    assert canary.run_once() == "connect"
    assert not collector.refresh()
    check_golden("metrics_target_down.prom", generate_latest(registry).decode())


def test_up_follows_the_target_and_recovers(tmp_path):
    state: dict = {"down": True}
    registry, collector, _ = build(tmp_path, state, build_info=None)
    assert registry.get_sample_value("glmserve_target_up") == 0  # before the first probe
    assert not collector.refresh()
    assert registry.get_sample_value("glmserve_target_up") == 0
    # Nothing known yet (no server info, no build file): no info series at all.
    assert registry.get_sample_value("glmserve_server_info", {"summary": ""}) is None
    text = generate_latest(registry).decode()
    assert "glmserve_server_info" not in text
    state["down"] = False
    assert collector.refresh()
    assert registry.get_sample_value("glmserve_target_up") == 1
    reasons = {"reason": "connect"}
    assert registry.get_sample_value("glmserve_target_probe_failures_total", reasons) >= 1


def test_falls_back_to_deprecated_get_server_info(tmp_path):
    registry, collector, _ = build(tmp_path, {"old_server": True})
    assert collector.probe() == SERVER_INFO
    assert collector.refresh()
    assert registry.get_sample_value("glmserve_target_up") == 1


@pytest.mark.parametrize(
    ("response", "reason"),
    [
        (httpx.Response(500, text="boom"), "http_status"),
        (httpx.Response(200, text="<html>"), "malformed"),
        (httpx.Response(200, json=[1, 2]), "malformed"),
    ],
)
def test_probe_failures_are_counted_by_reason(response, reason):
    registry = CollectorRegistry()
    collector = TargetInfoCollector(TARGET, mock_client(lambda req: response), registry, None)
    assert not collector.refresh()
    assert registry.get_sample_value("glmserve_target_up") == 0
    count = registry.get_sample_value("glmserve_target_probe_failures_total", {"reason": reason})
    assert count is not None and count >= 1


def test_probe_timeout_is_its_own_reason():
    def handler(req: httpx.Request) -> httpx.Response:
        raise httpx.ReadTimeout("timed out")

    registry = CollectorRegistry()
    TargetInfoCollector(TARGET, mock_client(handler), registry, None).refresh()
    assert registry.get_sample_value("glmserve_target_up") == 0
    assert registry.get_sample_value("glmserve_target_probe_failures_total", {"reason": "timeout"})


def test_corrupt_build_info_file_is_not_fatal(tmp_path):
    path = tmp_path / "build-info.json"
    path.write_text("{not json")
    registry = CollectorRegistry()
    TargetInfoCollector(TARGET, mock_client(info_handler({})), registry, path).refresh()
    text = generate_latest(registry).decode()
    assert 'summary="FP8 KV, patch unknown, pool 495k"' in text


@pytest.mark.parametrize(
    ("labels", "build_present", "expected"),
    [
        (
            {"kv_cache_dtype": "fp8_e4m3", "patch_series": "0.5.12.post1", "fp8_gather": "on",
             "max_total_num_tokens": "495552"},
            True,
            "FP8 KV, patched, pool 495k",
        ),
        (
            {"kv_cache_dtype": "fp8_e4m3", "patch_series": "0.5.12.post1", "fp8_gather": "off"},
            True,
            "FP8 KV, patched, gather off",
        ),
        ({"kv_cache_dtype": "fp8_e4m3", "patch_series": ""}, True, "FP8 KV, unpatched"),
        ({"kv_cache_dtype": "bfloat16", "max_total_num_tokens": "8000"}, False,
         "BF16 KV, patch unknown, pool 8000"),
        ({"kv_cache_dtype": "auto"}, False, "KV auto, patch unknown"),
        # DSA: the image carries the series, the path does not run it.
        ({"kv_cache_dtype": "fp8_e4m3", "attention_backend": "nsa", "patch_series": "0.5.12.post1",
          "fp8_gather": "", "max_total_num_tokens": "960000"}, True,
         "FP8 KV, nsa attention, patch not in use, pool 960k"),
        ({"kv_cache_dtype": "fp8_e4m3", "attention_backend": "flashinfer",
          "patch_series": "0.5.12.post1", "fp8_gather": "on"}, True, "FP8 KV, patched"),
        # SGLang 0.5.17: fa3 is patched too (the launcher says so); DSA is not.
        ({"kv_cache_dtype": "fp8_e4m3", "attention_backend": "fa3", "patch_series": "0.5.17",
          "fp8_gather": "on", "fp8_attention": "gather", "patch_in_use": "yes"}, True,
         "FP8 KV, fa3 attention, patched, gather decode"),
        ({"kv_cache_dtype": "fp8_e4m3", "attention_backend": "dsa", "patch_series": "0.5.17",
          "fp8_gather": "", "patch_in_use": "no"}, True, "FP8 KV, dsa attention, patch not in use"),
        ({"kv_cache_dtype": "fp8_e4m3", "attention_backend": "", "patch_series": "0.5.17",
          "patch_in_use": "no"}, True, "FP8 KV, default attention, patch not in use"),
    ],
)  # fmt: skip
def test_summary_line(labels, build_present, expected):
    assert summarize(labels, build_present) == expected


def test_info_labels_come_from_server_info_and_build_file(tmp_path):
    registry, collector, _ = build(tmp_path, {})
    collector.refresh()
    text = generate_latest(registry).decode()
    line = next(ln for ln in text.splitlines() if ln.startswith("glmserve_server_info{"))
    for key, value in [
        ("kv_cache_dtype", "fp8_e4m3"),
        ("attention_backend", "flashinfer"),
        ("tp_size", "8"),
        ("max_total_num_tokens", "495552"),
        ("sglang_version", "0.5.12.post1"),
        ("patch_series", BUILD_INFO["patch_series"]),
        ("patch_lock_sha256", BUILD_INFO["patch_lock_sha256"]),
        ("fp8_gather", "on"),
        ("build_source", "launcher"),
    ]:
        assert f"{key}={json.dumps(value)}" in line, key


def test_a_dsa_build_is_not_summarised_as_patched_even_with_the_server_down(tmp_path):
    """With no server answer yet, the build file's attention backend alone decides."""
    path = tmp_path / "build-info.json"
    buildinfo.write_build_info(
        path,
        {"sglang_version": "0.5.12.post1", "patch_series": "0.5.12.post1", "fp8_gather": "",
         "attention_backend": "nsa", "source": "launcher"},
    )  # fmt: skip
    registry = CollectorRegistry()

    def down(request):
        raise httpx.ConnectError("refused", request=request)

    TargetInfoCollector(TARGET, httpx.Client(transport=httpx.MockTransport(down)), registry, path)
    text = generate_latest(registry).decode()
    assert 'summary="KV unknown, nsa attention, patch not in use"' in text
    assert 'attention_backend="nsa"' in text


def test_a_launch_refusal_is_exported_and_replaces_the_summary(tmp_path):
    """The launcher held on a refusal (compose): the exporter, which shares its folder, shows the
    one line, so the dashboard says why nothing serves."""
    path = tmp_path / "build-info.json"
    buildinfo.write_launch_error(path, "unknown profile 'glm5-h100'; available: ...", 1.0)

    def down(request):
        raise httpx.ConnectError("refused", request=request)

    registry = CollectorRegistry()
    TargetInfoCollector(TARGET, httpx.Client(transport=httpx.MockTransport(down)), registry, path)
    text = generate_latest(registry).decode()
    assert (
        "glmserve_launch_refused{error=\"unknown profile 'glm5-h100'; available: ...\"} 1.0" in text
    )
    assert "summary=\"LAUNCH REFUSED: unknown profile 'glm5-h100'; available: ...\"" in text
    buildinfo.clear_launch_error(path)
    assert "glmserve_launch_refused" not in generate_latest(registry).decode()
