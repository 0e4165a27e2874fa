"""/metrics: the wheel's names, types, labels and buckets, with values that follow what was served.

The reference list (data/sglang-0.5.12.post1-metrics.json) was extracted from the wheel's
metrics_collector.py by sglang_reference.py; test_emulator_reference.py re-derives it from the
wheel when one is available. These tests download nothing.
"""

from __future__ import annotations

import json
from pathlib import Path

import httpx
import pytest
from prometheus_client.parser import text_string_to_metric_families

from glmserve.testing.emulator import emulator_thread

REFERENCE = json.loads(
    (Path(__file__).parent / "data" / "sglang-0.5.12.post1-metrics.json").read_text()
)["metrics"]
BY_NAME = {m["name"]: m for m in REFERENCE}
REQUIRED = {
    "sglang:time_to_first_token_seconds": "histogram",
    "sglang:inter_token_latency_seconds": "histogram",
    "sglang:e2e_request_latency_seconds": "histogram",
    "sglang:gen_throughput": "gauge",
    "sglang:num_running_reqs": "gauge",
    "sglang:num_queue_reqs": "gauge",
    "sglang:token_usage": "gauge",
    "sglang:max_total_num_tokens": "gauge",
    "sglang:prompt_tokens_total": "counter",
    "sglang:generation_tokens_total": "counter",
}


def scrape(url: str) -> dict[str, object]:
    text = httpx.get(url + "/metrics", timeout=10).text
    families = {}
    for fam in text_string_to_metric_families(text):
        # the parser strips _total from counter family names; the reference keeps it
        name = fam.name + "_total" if fam.type == "counter" else fam.name
        families[name] = fam
    return families


def sample(fams, name: str, suffix: str = "", **labels: str) -> float:
    fam = fams[name]
    sample_name = name + suffix
    for s in fam.samples:
        if s.name == sample_name and all(s.labels.get(k) == v for k, v in labels.items()):
            return s.value
    raise KeyError(f"{sample_name} {labels}")


def test_reference_list_is_the_wheels(emu):
    """Sanity of the committed list: it holds the metrics the issue names, with their types."""
    for name, kind in REQUIRED.items():
        assert BY_NAME[name]["type"] == kind


def test_every_exposed_metric_matches_the_wheel(emu):
    fams = scrape(emu.url)
    assert set(REQUIRED) <= set(fams)
    for name, fam in fams.items():
        assert name.startswith("sglang:"), name
        ref = BY_NAME.get(name)
        assert ref is not None, f"{name} is not a metric of SGLang 0.5.12.post1"
        assert fam.type == ref["type"], name
        for s in fam.samples:
            labels = set(s.labels) - {"le"}
            expected = set(ref["labelnames"])
            if ref.get("multiprocess_mode") == "all":
                expected.add("pid")  # multiprocess exposition of mode-"all" gauges
            assert labels == expected, (name, s.labels)
            assert not s.name.endswith("_created"), "multiprocess mode has no _created series"
        if fam.type == "histogram":
            les = [s.labels["le"] for s in fam.samples if s.name.endswith("_bucket")]
            assert les[-1] == "+Inf"
            assert [float(x) for x in les[:-1]] == pytest.approx(ref["buckets"]), name


def test_label_values_follow_served_model_name():
    with emulator_thread(tpot_ms=1.0, ttft_ms=1.0, served_model_name="glm-5") as e:
        fams = scrape(e.url)
    labels = fams["sglang:num_running_reqs"].samples[0].labels
    assert labels == {
        "model_name": "glm-5",
        "engine_type": "unified",
        "tp_rank": "0",
        "pp_rank": "0",
        "moe_ep_rank": "0",
    }
    assert fams["sglang:prompt_tokens_total"].samples[0].labels == {
        "model_name": "glm-5",
        "engine_type": "unified",
    }
    assert sample(fams, "sglang:max_total_num_tokens") == 495_552


@pytest.mark.parametrize("k", [1, 4])
def test_values_follow_what_was_served(k):
    """Counters and histogram counts after R requests of N tokens. inter_token_latency counts
    one observation per token after the first, also when chunks carry K tokens."""
    r_count, n, prompt_ids = 3, 9, list(range(50))
    with emulator_thread(tpot_ms=1.0, ttft_ms=1.0, tokens_per_chunk=k) as e:
        for _ in range(r_count):
            body = {"prompt": prompt_ids, "max_tokens": n, "ignore_eos": True, "stream": True}
            assert httpx.post(e.url + "/v1/completions", json=body, timeout=30).status_code == 200
        fams = scrape(e.url)
    assert sample(fams, "sglang:generation_tokens_total", "") == r_count * n
    assert sample(fams, "sglang:prompt_tokens_total", "") == r_count * 50
    assert sample(fams, "sglang:num_requests_total", "") == r_count
    assert sample(fams, "sglang:time_to_first_token_seconds", "_count") == r_count
    assert sample(fams, "sglang:e2e_request_latency_seconds", "_count") == r_count
    assert sample(fams, "sglang:inter_token_latency_seconds", "_count") == r_count * (n - 1)
    itl_sum = sample(fams, "sglang:inter_token_latency_seconds", "_sum")
    e2e_sum = sample(fams, "sglang:e2e_request_latency_seconds", "_sum")
    ttft_sum = sample(fams, "sglang:time_to_first_token_seconds", "_sum")
    # ITL sums whole intervals: first token + all gaps = e2e for each request
    assert itl_sum + ttft_sum == pytest.approx(e2e_sum, rel=1e-6)
    assert sample(fams, "sglang:queue_time_seconds", "_count") == r_count
    assert sample(fams, "sglang:realtime_tokens_total", "", mode="decode") == r_count * n


def test_pid_label_only_on_mode_all_gauges(emu):
    fams = scrape(emu.url)
    assert "pid" in fams["sglang:num_retracted_reqs"].samples[0].labels
    assert "pid" not in fams["sglang:num_running_reqs"].samples[0].labels


def test_http_middleware_metrics_count_by_route_template_and_status():
    with emulator_thread(tpot_ms=1.0, ttft_ms=1.0) as e:
        httpx.post(e.url + "/v1/chat/completions", json={"messages": []}, timeout=10)
        httpx.get(e.url + "/v1/models/some/model", timeout=10)
        body = {"prompt": "x", "max_tokens": 2, "stream": True}
        httpx.post(e.url + "/v1/completions", json=body, timeout=10)
        fams = scrape(e.url)
    post, get = {"method": "POST"}, {"method": "GET"}
    responses = "sglang:http_responses_total"
    assert sample(fams, responses, endpoint="/v1/chat/completions", status_code="400", **post) == 1
    assert (
        sample(fams, responses, endpoint="/v1/models/{model:path}", status_code="404", **get) == 1
    )
    assert sample(fams, responses, endpoint="/v1/completions", status_code="200", **post) == 1
    assert sample(fams, "sglang:http_requests_total", endpoint="/v1/completions", **post) == 1
    # the scrape itself is in flight while it renders; everything else has answered
    assert sample(fams, "sglang:http_requests_active", endpoint="/metrics", **get) == 1
    assert sample(fams, "sglang:http_requests_active", endpoint="/v1/completions", **post) == 0


@pytest.mark.parametrize(("graph_max_bs", "eager"), [(None, False), (2, False), (1, True)])
def test_decode_passes_count_as_eager_when_the_batch_outgrows_the_cuda_graphs(graph_max_bs, eager):
    """Two streams at once: with --cuda-graph-max-bs 1 their decode steps are decode_none
    passes (the series appears only then, as in SGLang); within the graphs they are not.
    /server_info reports the limit the exporter exports."""
    import threading

    with emulator_thread(
        tpot_ms=1.0, ttft_ms=1.0, decode_log_interval=5, cuda_graph_max_bs=graph_max_bs
    ) as e:
        assert httpx.get(e.url + "/server_info", timeout=10).json()["cuda_graph_max_bs"] == (
            graph_max_bs or 256
        )
        body = {"prompt": "x", "max_tokens": 400, "ignore_eos": True}
        threads = [
            threading.Thread(target=httpx.post, args=(e.url + "/v1/completions",),
                             kwargs={"json": body, "timeout": 30})
            for _ in range(2)
        ]  # fmt: skip
        for t in threads:
            t.start()
        for t in threads:
            t.join()
        fams = scrape(e.url)
    modes = {s.labels["mode"]: s.value for s in fams["sglang:cuda_graph_passes_total"].samples
             if s.name.endswith("_total")}  # fmt: skip
    assert sum(modes.values()) >= 5
    assert ("decode_none" in modes) is eager
    if eager:
        assert modes["decode_none"] >= 5  # at least one whole logged interval with both running
