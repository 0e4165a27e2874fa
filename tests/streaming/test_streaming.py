"""The one stream-timing definition, checked against recorded SSE fixtures with an injected clock."""

from __future__ import annotations

import json
import math
from pathlib import Path

import pytest

from glmserve.streaming import (
    Aggregate,
    SSEDecoder,
    StreamError,
    StreamRequest,
    StreamTimer,
    percentile,
    summarize,
)

HERE = Path(__file__).parent
GOLDEN = json.loads((HERE / "golden.json").read_text())
FIXTURES = sorted(name for name in GOLDEN if not name.startswith("_"))


def replay(name: str, keep_content: bool = False):
    """Feed a fixture's byte pieces at their recorded times; request sent at t=0."""
    timer = StreamTimer(
        t_request=0.0,
        clock=lambda: pytest.fail("clock must not be read"),
        keep_content=keep_content,
    )
    last_t = 0.0
    for line in (HERE / "fixtures" / name).read_text().splitlines():
        piece = json.loads(line)
        last_t = piece["t"]
        timer.feed(piece["bytes"].encode(), now=last_t)
    return timer.finish(now=last_t)


@pytest.mark.parametrize("name", FIXTURES)
def test_fixture_matches_golden_timing(name: str) -> None:
    """Each recorded stream yields exactly the hand-computed ack/TTFT/TPOT/ITL/e2e/tokens."""
    want = GOLDEN[name]
    if "error" in want:
        with pytest.raises(StreamError) as err:
            replay(name)
        assert err.value.reason == want["error"]
        return
    got = replay(name)
    for key in ("ack_s", "ttft_s", "tpot_s", "e2e_s"):
        assert getattr(got, key) == pytest.approx(want[key], abs=1e-9), key
    assert list(got.itl_s) == pytest.approx(want["itl_s"], abs=1e-9)
    assert got.output_tokens == want["output_tokens"]
    assert got.prompt_tokens == want["prompt_tokens"]
    assert got.token_events == want["token_events"]


@pytest.mark.parametrize("name", [n for n in FIXTURES if "error" not in GOLDEN[n]])
def test_mean_itl_equals_tpot(name: str) -> None:
    """ITL splits multi-token gaps evenly, so its mean is TPOT and its length is N_out - 1."""
    got = replay(name)
    assert len(got.itl_s) == got.output_tokens - 1
    assert sum(got.itl_s) / len(got.itl_s) == pytest.approx(got.tpot_s)


def test_ack_is_not_ttft_when_role_chunk_comes_first() -> None:
    """A role-only first delta is the ack; TTFT waits for the first token-carrying event."""
    got = replay("chat_multitoken_chunks.jsonl")
    assert got.ack_s < got.ttft_s


def test_decoder_handles_arbitrary_splits_and_crlf() -> None:
    raw = b'data: {"a": 1}\r\n\r\n: keepalive\n\ndata: [DONE]\n\n'
    whole = SSEDecoder().feed(raw)
    dec = SSEDecoder()
    pieces = [p for i in range(len(raw)) for p in dec.feed(raw[i : i + 1])]
    assert whole == pieces == ['{"a": 1}', "[DONE]"]


def test_single_token_has_no_tpot() -> None:
    timer = StreamTimer(0.0)
    timer.feed(b'data: {"choices":[{"delta":{"content":"x"}}]}\n\ndata: [DONE]\n\n', now=0.5)
    got = timer.finish(now=0.5)
    assert got.output_tokens == 1 and got.tpot_s is None and got.itl_s == ()


def test_stream_without_tokens_is_a_failure() -> None:
    timer = StreamTimer(0.0)
    timer.feed(b'data: {"choices":[{"delta":{"role":"assistant","content":""}}]}\n\n', now=0.1)
    timer.feed(b"data: [DONE]\n\n", now=0.2)
    with pytest.raises(StreamError) as err:
        timer.finish(now=0.2)
    assert err.value.reason == "no_tokens"


def test_unknown_failure_reason_is_refused() -> None:
    with pytest.raises(ValueError):
        StreamError("flaky")


def test_request_payloads_ask_for_exact_token_counts() -> None:
    chat = StreamRequest(route="chat", max_tokens=32).payload()
    assert chat["stream_options"] == {"include_usage": True, "continuous_usage_stats": True}
    assert chat["ignore_eos"] is True and chat["max_tokens"] == 32
    gen = StreamRequest(route="generate", max_tokens=7).payload()
    assert gen["sampling_params"]["max_new_tokens"] == 7 and gen["stream"] is True
    assert StreamRequest(route="completions").path == "/v1/completions"


def test_generate_payload_sends_token_ids_instead_of_text_when_given() -> None:
    ids = StreamRequest(route="generate", input_ids=(5, 6, 7)).payload()
    assert ids["input_ids"] == [5, 6, 7] and "text" not in ids
    assert StreamRequest(route="generate", prompt="hi").payload()["text"] == "hi"
    with pytest.raises(ValueError, match="generate route"):
        StreamRequest(route="chat", input_ids=(1,)).payload()


def test_percentile_matches_linear_interpolation() -> None:
    values = [4.0, 1.0, 3.0, 2.0]
    assert percentile(values, 50) == 2.5
    assert percentile(values, 0) == 1.0 and percentile(values, 100) == 4.0
    assert percentile(values, 90) == pytest.approx(3.7)
    assert math.isnan(percentile([], 50))
    s = summarize([1.0, 2.0, 3.0])
    assert (s.count, s.mean, s.p50) == (3, 2.0, 2.0)


def test_goodput_counts_requests_meeting_both_slos() -> None:
    agg = Aggregate()
    for name in ("chat_continuous_usage.jsonl", "chat_multitoken_chunks.jsonl"):
        agg.add(replay(name))  # TTFT 0.25 / TPOT 0.01 and TTFT 0.2 / TPOT 0.0075
    assert agg.goodput(1.0, slo_ttft_s=0.3, slo_tpot_s=0.02) == 2
    assert agg.goodput(1.0, slo_ttft_s=0.22, slo_tpot_s=0.02) == 1
    assert agg.goodput(2.0, slo_ttft_s=None, slo_tpot_s=0.008) == 0.5
    assert agg.output_tokens_per_s(2.0) == 7.0


def test_valid_json_of_the_wrong_shape_is_malformed_sse() -> None:
    timer = StreamTimer(0.0)
    with pytest.raises(StreamError) as err:
        timer.feed(b'data: {"choices": "x"}\n\n', now=0.1)
    assert err.value.reason == "malformed_sse"


def test_the_stream_content_is_kept_for_callers_that_compare_outputs() -> None:
    """/generate repeats its text and ids cumulatively: the last ones are the output. The chat
    route sends deltas: they are joined. Only on request (keep_content): the load test keeps
    thousands of timings. The timings themselves do not change."""
    native = replay("generate_native.jsonl", keep_content=True)
    assert native.text == "a b c d" and native.output_ids == (0, 1, 2, 3)
    plain = replay("generate_native.jsonl")
    assert plain.text == "" and plain.output_ids == ()
    assert (plain.ttft_s, plain.tpot_s, plain.itl_s) == (native.ttft_s, native.tpot_s, native.itl_s)
    chat = replay("chat_multitoken_chunks.jsonl", keep_content=True)
    deltas = []
    for line in (HERE / "fixtures" / "chat_multitoken_chunks.jsonl").read_text().splitlines():
        for data in SSEDecoder().feed(json.loads(line)["bytes"].encode()):
            if data.strip() != "[DONE]":
                for choice in json.loads(data).get("choices") or ():
                    deltas.append((choice.get("delta") or {}).get("content") or "")
    assert chat.text == "".join(deltas) and len(chat.text) > 3
    assert chat.output_ids == ()


def stream_at(times: list[float]):
    """A chat stream with one token per event at the given times (request sent at t=0)."""
    timer = StreamTimer(0.0)
    for t in times:
        timer.feed(b'data: {"choices":[{"delta":{"content":"x"}}]}\n\n', now=t)
    timer.feed(b"data: [DONE]\n\n", now=times[-1])
    return timer.finish(now=times[-1])


def test_tail_tpot_is_the_steady_decode_of_the_last_part_of_a_stream() -> None:
    """First half slowed by other streams' prefills (30 ms gaps), second half steady (10 ms):
    the whole-stream TPOT mixes both, the tail TPOT is the steady 10 ms."""
    times = [0.1 + 0.030 * i for i in range(11)]
    times += [times[-1] + 0.010 * (i + 1) for i in range(10)]
    got = stream_at(times)
    assert got.tpot_s == pytest.approx(0.020)
    assert got.tail_tpot_s() == pytest.approx(0.010)
    assert got.tail_tpot_s(1.0) == pytest.approx(got.tpot_s)
    assert stream_at([0.1, 0.2]).tail_tpot_s() is None  # one gap: no steady part to speak of
    with pytest.raises(ValueError, match="fraction"):
        got.tail_tpot_s(0.0)


@pytest.mark.parametrize("name", [n for n in FIXTURES if "tokens_per_step" in GOLDEN[n]])
def test_tokens_per_step_and_acceptance_length(name: str) -> None:
    """Tokens per decode step leave out the first token-carrying event (the prefill's); the
    acceptance length is SGLang's own, output tokens / meta_info.spec_verify_ct, and only
    where the server sent that count."""
    want, got = GOLDEN[name], replay(name)
    assert got.tokens_per_step == pytest.approx(want["tokens_per_step"])
    if want["accept_length"] is None:
        assert got.accept_length is None and got.spec_verify_ct is None
    else:
        assert got.accept_length == pytest.approx(want["accept_length"])


def test_over_many_requests_both_are_ratios_of_sums() -> None:
    """A long request weighs by its steps: (8 + 3) tokens over (3 + 2) steps, not the mean of
    8/3 and 3/2; the acceptance length only over the requests that carried a verify count."""
    agg = Aggregate()
    agg.add(replay("generate_mtp.jsonl"))
    agg.add(replay("generate_native.jsonl"))
    assert agg.tokens_per_step() == pytest.approx(11 / 5)
    assert agg.accept_length() == pytest.approx(9 / 3)
    assert Aggregate().tokens_per_step() is None and Aggregate().accept_length() is None
