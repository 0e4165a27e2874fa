"""MTP through the exporter: the info series says what the deployment asked of speculative
decoding, and SGLang's acceptance gauges are re-exported (glmserve_server_spec_accept_length /
_rate) while the server runs it, never stale and never a zero from a server without MTP.

Regenerate the golden file after an intended change with UPDATE_GOLDEN=1 and review the diff.
"""

from __future__ import annotations

from pathlib import Path

import httpx
import pytest
from prometheus_client import CollectorRegistry, disable_created_metrics, generate_latest
from support.exporter import BUILD_INFO, mock_client
from support.sse import SERVER_INFO
from test_info_and_golden import TARGET, check_golden

from glmserve import buildinfo
from glmserve.exporter.info import TargetInfoCollector, spec_gauges, summarize

MTP_INFO = {
    **SERVER_INFO,
    "speculative_algorithm": "EAGLE",
    "speculative_num_steps": 3,
    "speculative_eagle_topk": 1,
    "speculative_num_draft_tokens": 4,
}
# Two scheduler ranks reporting (--enable-metrics-for-all-schedulers), among other series.
LABELS = 'engine_type="unified",model_name="glm-5",moe_ep_rank="0",pp_rank="0"'
SGLANG_METRICS = f"""\
# HELP sglang:spec_accept_length Mean acceptance length of speculative decoding (accepted drafts + bonus token per forward).
# TYPE sglang:spec_accept_length gauge
sglang:spec_accept_length{{{LABELS},tp_rank="0"}} 3.2
sglang:spec_accept_length{{{LABELS},tp_rank="1"}} 3.0
# HELP sglang:spec_accept_rate Speculative acceptance rate (`accepted drafts / proposed drafts` in batch).
# TYPE sglang:spec_accept_rate gauge
sglang:spec_accept_rate{{{LABELS},tp_rank="0"}} 0.7333
sglang:spec_accept_rate{{{LABELS},tp_rank="1"}} 0.6667
# HELP sglang:num_running_reqs The number of running requests.
# TYPE sglang:num_running_reqs gauge
sglang:num_running_reqs{{{LABELS},tp_rank="0"}} 12.0
"""


@pytest.fixture(autouse=True)
def _no_created_series():
    disable_created_metrics()


def collector(tmp_path: Path, info: dict, metrics: str | None = SGLANG_METRICS, asked=None):
    """A probe of a target answering `info` and `metrics` (None: /metrics is 404), with a
    build-info file whose MTP fields are `asked`; also the paths it requested."""
    seen: list[str] = []

    def handler(req: httpx.Request) -> httpx.Response:
        seen.append(req.url.path)
        if req.url.path == "/server_info":
            return httpx.Response(200, json=info)
        if req.url.path == "/metrics" and metrics is not None:
            return httpx.Response(200, text=metrics)
        return httpx.Response(404)

    path = tmp_path / "build-info.json"
    buildinfo.write_build_info(path, {**BUILD_INFO, **(asked or {})})
    registry = CollectorRegistry()
    return registry, TargetInfoCollector(TARGET, mock_client(handler), registry, path), seen


def info_line(registry: CollectorRegistry) -> str:
    text = generate_latest(registry).decode()
    return next(line for line in text.splitlines() if line.startswith("glmserve_server_info{"))


def test_golden_metrics_of_an_mtp_target(tmp_path):
    registry, probe, _ = collector(tmp_path, MTP_INFO)
    assert probe.refresh()
    check_golden("metrics_mtp.prom", generate_latest(registry).decode())


def test_the_gauges_are_the_mean_of_the_reporting_ranks(tmp_path):
    registry, probe, seen = collector(tmp_path, MTP_INFO)
    probe.refresh()
    assert seen == ["/server_info", "/metrics"]
    assert registry.get_sample_value("glmserve_server_spec_accept_length") == pytest.approx(3.1)
    assert registry.get_sample_value("glmserve_server_spec_accept_rate") == pytest.approx(0.7)
    line = info_line(registry)
    assert 'speculative_algorithm="EAGLE"' in line and 'speculative_num_draft_tokens="4"' in line
    assert "MTP 4-token verify" in line


def test_a_server_without_mtp_is_not_asked_and_exports_no_acceptance(tmp_path):
    """Its gauges read 0 in SGLang: re-exported they would look like a collapse."""
    registry, probe, seen = collector(tmp_path, SERVER_INFO)
    probe.refresh()
    assert seen == ["/server_info"]
    assert registry.get_sample_value("glmserve_server_spec_accept_length") is None
    assert 'speculative_algorithm=""' in info_line(registry)


def test_unreadable_metrics_leave_no_line_and_the_target_up(tmp_path):
    registry, probe, _ = collector(tmp_path, MTP_INFO, metrics=None)
    assert probe.refresh()
    assert registry.get_sample_value("glmserve_target_up") == 1.0
    assert registry.get_sample_value("glmserve_server_spec_accept_length") is None


def test_no_stale_acceptance_while_the_target_is_down(tmp_path):
    registry, probe, _ = collector(tmp_path, MTP_INFO)
    probe.refresh()
    probe.client = mock_client(lambda req: httpx.Response(503))
    assert not probe.refresh()
    assert registry.get_sample_value("glmserve_server_spec_accept_length") is None
    # ... while the info keeps saying what ran (the alert still knows MTP was asked).
    assert 'speculative_algorithm="EAGLE"' in info_line(registry)


def test_what_the_profile_asked_shows_before_the_server_answers(tmp_path):
    asked = {"speculative_algorithm": "EAGLE", "speculative_num_draft_tokens": "4"}
    registry, _, _ = collector(tmp_path, MTP_INFO, asked=asked)
    # No probe yet: only the build info speaks.
    line = info_line(registry)
    assert 'speculative_algorithm="EAGLE"' in line and 'speculative_num_draft_tokens="4"' in line


def test_only_the_two_gauges_are_read_from_the_exposition():
    assert spec_gauges(SGLANG_METRICS) == {
        "sglang:spec_accept_length": pytest.approx(3.1),
        "sglang:spec_accept_rate": pytest.approx(0.7),
    }
    assert spec_gauges("sglang:num_running_reqs 3\n") == {}


def test_summary_names_mtp_only_when_asked():
    base = {"kv_cache_dtype": "fp8_e4m3", "attention_backend": "nsa", "patch_in_use": "no"}
    assert "MTP" not in summarize(base, True)
    mtp = {**base, "speculative_algorithm": "EAGLE", "speculative_num_draft_tokens": "4"}
    assert summarize(mtp, True) == "FP8 KV, nsa attention, patch not in use, MTP 4-token verify"
