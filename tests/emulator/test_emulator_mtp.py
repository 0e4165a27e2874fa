"""The emulator's MTP mode (--speculative-accept-length A): every decode step delivers a whole
number of tokens that averages A, as one output (several tokens per SSE chunk, as SGLang does
under speculative decoding), and the server says so the way SGLang 0.5.12.post1 does: the
sglang:spec_accept_length / sglang:spec_accept_rate gauges with the scheduler's labels, the
speculative server args in /server_info, and the spec_* fields of a finished request's
meta_info on /generate."""

from __future__ import annotations

import json

import httpx
import pytest
from test_emulator_metrics import BY_NAME, sample, scrape

from glmserve import sglang_api
from glmserve.emulator.config import EmulatorConfig, parse_config
from glmserve.streaming import StreamRequest, time_stream
from glmserve.testing.emulator import emulator_thread

MTP = {"tpot_ms": 1.0, "ttft_ms": 1.0, "spec_accept_length": 2.5, "decode_log_interval": 2}


@pytest.mark.parametrize(
    ("accept", "first_steps"),
    [(1.0, [1, 1, 1, 1]), (2.5, [2, 3, 2, 3]), (3.4, [3, 3, 4, 3, 4]), (4.0, [4, 4, 4])],
)
def test_steps_accept_whole_tokens_that_average_the_acceptance_length(accept, first_steps):
    cfg = EmulatorConfig(spec_accept_length=accept)
    steps = [cfg.step_tokens(i) for i in range(1000)]
    assert steps[: len(first_steps)] == first_steps
    assert all(1 <= n <= cfg.spec_num_draft_tokens for n in steps)
    assert sum(steps) / len(steps) == pytest.approx(accept, abs=1e-3)


def test_without_mtp_a_step_is_the_chunk_size():
    assert [EmulatorConfig(tokens_per_chunk=3).step_tokens(i) for i in range(3)] == [3, 3, 3]


@pytest.mark.parametrize(
    ("argv", "fragment"),
    [
        (["--speculative-accept-length", "5"], "between 1 and --speculative-num-draft-tokens (4)"),
        (["--speculative-accept-length", "0.5"], "between 1 and"),
        (["--speculative-accept-length", "nan"], "between 1 and"),
        (["--speculative-accept-length", "2", "--tokens-per-chunk", "2"], "give one of them"),
        (["--speculative-num-draft-tokens", "1"], "must be >= 2"),
    ],
)
def test_a_bad_mtp_setting_is_one_line(capsys, argv, fragment):
    with pytest.raises(SystemExit) as info:
        parse_config(["--tpot-ms", "20", "--ttft-ms", "100", *argv])
    err = capsys.readouterr().err.strip().splitlines()
    assert info.value.code == 2 and len(err) == 1 and fragment in err[0], err


def test_the_stream_carries_each_steps_tokens_in_one_chunk():
    """/v1/completions with continuous usage: after the prefill's token, chunk sizes are the
    steps' 2, 3, 2, 3 ... and glmserve.streaming counts tokens per step from them."""
    with emulator_thread(**MTP) as e:
        body = {"prompt": "x", "max_tokens": 21, "ignore_eos": True, "stream": True,
                "stream_options": {"include_usage": True, "continuous_usage_stats": True}}  # fmt: skip
        text = httpx.post(e.url + "/v1/completions", json=body, timeout=30).text
        timing = time_stream(e.url, StreamRequest(route="completions", max_tokens=21))
    counts = [
        json.loads(line[6:])["usage"]["completion_tokens"]
        for line in text.splitlines()
        if line.startswith("data: {") and json.loads(line[6:]).get("choices")
        and json.loads(line[6:])["choices"][0]["text"]
    ]  # fmt: skip
    deltas = [b - a for a, b in zip([0, *counts], counts, strict=False)]
    assert deltas == [1, 2, 3, 2, 3, 2, 3, 2, 3]  # 1 + 20 tokens in 8 steps
    assert timing.output_tokens == 21 and timing.token_events == 9
    assert timing.tokens_per_step == pytest.approx(20 / 8)


def test_generate_reports_the_spec_fields_of_a_finished_request():
    """Names as TokenizerManager._calculate_spec_decoding_metrics writes them; accept length
    counts the bonus tokens (completion tokens / verify passes), the rate only the drafts."""
    with emulator_thread(**MTP) as e:
        body = {"text": "x", "sampling_params": {"max_new_tokens": 21, "ignore_eos": True}}
        meta = httpx.post(e.url + "/generate", json=body, timeout=30).json()["meta_info"]
        timing = time_stream(e.url, StreamRequest(route="generate", max_tokens=21))
    assert meta["spec_verify_ct"] == 8
    assert meta["spec_accept_length"] == pytest.approx(21 / 8)
    assert meta["spec_num_proposed_drafts"] == meta["spec_proposed_drafts"] == 8 * 3
    assert meta["spec_num_correct_drafts"] == meta["spec_accepted_drafts"] == 20 - 8
    assert meta["spec_accept_rate"] == pytest.approx(12 / 24)
    assert meta["spec_correct_drafts_histogram"] == [0, 4, 4]  # 4 steps of 2, 4 of 3
    assert meta["spec_accept_histogram"] == meta["spec_correct_drafts_histogram"]
    # The streaming client reads it off the last event: SGLang's acceptance per request.
    assert timing.spec_verify_ct == 8 and timing.accept_length == pytest.approx(21 / 8)


def test_without_mtp_generate_has_no_spec_fields():
    with emulator_thread(tpot_ms=1.0, ttft_ms=1.0, tokens_per_chunk=3) as e:
        body = {"text": "x", "sampling_params": {"max_new_tokens": 7, "ignore_eos": True}}
        meta = httpx.post(e.url + "/generate", json=body, timeout=30).json()["meta_info"]
    assert not [k for k in meta if k.startswith("spec_")]


def test_the_spec_gauges_carry_sglangs_names_labels_and_values():
    with emulator_thread(**MTP) as e:
        for _ in range(3):
            time_stream(e.url, StreamRequest(route="completions", max_tokens=41))
        fams = scrape(e.url)
        info = httpx.get(e.url + "/server_info", timeout=10).json()
    for name in (sglang_api.SPEC_ACCEPT_LENGTH, sglang_api.SPEC_ACCEPT_RATE):
        (series,) = fams[name].samples
        assert fams[name].type == BY_NAME[name]["type"] == "gauge"
        assert sorted(series.labels) == sorted(BY_NAME[name]["labelnames"])
    # Steps of 2 and 3 tokens: each interval of the decode log averages 2 to 3.
    assert 2.0 <= sample(fams, sglang_api.SPEC_ACCEPT_LENGTH) <= 3.0
    assert 1 / 3 <= sample(fams, sglang_api.SPEC_ACCEPT_RATE) <= 2 / 3
    assert info["speculative_algorithm"] == "EAGLE"
    assert (info["speculative_num_steps"], info["speculative_eagle_topk"]) == (3, 1)
    assert info["speculative_num_draft_tokens"] == 4
    # SGLang's own lifetime figure: 40 decode tokens in 16 steps per request.
    assert info["internal_states"][0]["avg_spec_accept_length"] == pytest.approx(2.5)


def test_without_mtp_the_gauges_read_zero_as_sglangs_do():
    """A server without speculative decoding reports 0 for both, also with multi-token chunks
    (--tokens-per-chunk is SGLang's --stream-interval, not MTP)."""
    with emulator_thread(tpot_ms=1.0, ttft_ms=1.0, tokens_per_chunk=4, decode_log_interval=2) as e:
        time_stream(e.url, StreamRequest(route="completions", max_tokens=41))
        fams = scrape(e.url)
        info = httpx.get(e.url + "/server_info", timeout=10).json()
    assert sample(fams, sglang_api.SPEC_ACCEPT_LENGTH) == 0.0
    assert sample(fams, sglang_api.SPEC_ACCEPT_RATE) == 0.0
    assert info["speculative_algorithm"] is None
    assert "avg_spec_accept_length" not in info["internal_states"][0]


def test_the_build_info_records_what_the_emulated_deployment_asked(tmp_path):
    from glmserve import buildinfo
    from glmserve.emulator.server import write_build_info

    path = tmp_path / "b.json"
    write_build_info(EmulatorConfig(spec_accept_length=3.0, build_info_file=str(path)))
    info = buildinfo.read_build_info(path)
    assert info is not None
    assert (info["speculative_algorithm"], info["speculative_num_draft_tokens"]) == ("EAGLE", "4")


def test_zero_is_off_as_compose_passes_it():
    """compose.yaml passes --speculative-accept-length=${EMULATOR_SPEC_ACCEPT_LENGTH:-0}."""
    cfg, _ = parse_config(["--tpot-ms", "20", "--ttft-ms", "100", "--speculative-accept-length=0"])
    assert not cfg.speculative and cfg.step_tokens(0) == 1
    cfg, _ = parse_config(["--tpot-ms", "20", "--ttft-ms", "100", "--speculative-accept-length=3"])
    assert cfg.speculative and cfg.spec_num_draft_tokens == 4
