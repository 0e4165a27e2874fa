"""The emulator speaks SGLang 0.5.12.post1's wire protocol (shapes read from the wheel)."""

from __future__ import annotations

import json

import httpx
import pytest
from support.sse import json_events

from glmserve.emulator.protocol import NATURAL_MIN, NATURAL_SPAN, natural_length, tokens_text
from glmserve.streaming import StreamRequest, StreamTimer
from glmserve.testing.emulator import emulator_thread

CHAT = {
    "model": "glm",
    "messages": [{"role": "user", "content": "Hello there"}],
    "max_tokens": 6,
    "ignore_eos": True,
    "stream": True,
}


def test_chat_stream_framing_role_chunk_finish_usage_done(emu, client):
    """Role-only first delta, one content chunk per token, a separate finish chunk, the usage
    chunk (choices: []) when include_usage is set, and `data: [DONE]` last."""
    body = {**CHAT, "stream_options": {"include_usage": True}}
    r = client.post(emu.url + "/v1/chat/completions", json=body)
    assert r.status_code == 200
    assert r.headers["content-type"] == "text/event-stream; charset=utf-8"
    events, last = json_events(r.content)
    assert last == "[DONE]"
    role, *content, finish, usage_chunk = events
    assert role["choices"][0]["delta"] == {
        "reasoning_content": None,
        "role": "assistant",
        "content": "",
    }
    assert "usage" not in role  # omitted, not null, like msgspec's omit_defaults
    assert len(content) == 6
    assert all(c["choices"][0]["delta"]["content"] for c in content)
    assert all(c["choices"][0]["finish_reason"] is None for c in content)
    assert finish["choices"][0]["delta"] == {"reasoning_content": None}
    assert finish["choices"][0]["finish_reason"] == "length"
    assert finish["choices"][0]["matched_stop"] is None
    assert usage_chunk["choices"] == []
    assert usage_chunk["usage"]["completion_tokens"] == 6
    assert usage_chunk["usage"]["total_tokens"] == usage_chunk["usage"]["prompt_tokens"] + 6
    assert {e["id"] for e in events} == {role["id"]}
    assert {e["object"] for e in events} == {"chat.completion.chunk"}
    assert {e["model"] for e in events} == {"glm"}  # the request's model is echoed


def test_chat_stream_without_usage_or_role_chunk():
    with emulator_thread(tpot_ms=1.0, ttft_ms=1.0, role_chunk=False) as e:
        r = httpx.post(e.url + "/v1/chat/completions", json=CHAT, timeout=30)
    events, last = json_events(r.content)
    assert last == "[DONE]"
    assert "role" not in events[0]["choices"][0]["delta"]
    assert events[0]["choices"][0]["delta"]["content"]
    assert len(events) == 6 + 1  # content chunks + finish chunk, no usage chunk
    assert all("usage" not in ev for ev in events)


def test_continuous_usage_is_cumulative_per_chunk(emu, client):
    body = {**CHAT, "stream_options": {"include_usage": True, "continuous_usage_stats": True}}
    events, _ = json_events(client.post(emu.url + "/v1/chat/completions", json=body).content)
    content = [e for e in events if e["choices"] and e["choices"][0]["delta"].get("content")]
    assert [e["usage"]["completion_tokens"] for e in content] == [1, 2, 3, 4, 5, 6]
    assert content[0]["usage"]["prompt_tokens_details"] is None
    assert content[0]["usage"]["reasoning_tokens"] == 0


def test_multi_token_chunks_like_speculative_decoding(client):
    """K tokens per chunk after the first (prefill) token; the last chunk may be partial."""
    body = {
        **CHAT,
        "max_tokens": 10,
        "stream_options": {"include_usage": True, "continuous_usage_stats": True},
    }
    with emulator_thread(tpot_ms=1.0, ttft_ms=1.0, tokens_per_chunk=4) as e:
        raw = client.post(e.url + "/v1/chat/completions", json=body).content
    events, _ = json_events(raw)
    content = [ev for ev in events if ev["choices"] and ev["choices"][0]["delta"].get("content")]
    assert [ev["usage"]["completion_tokens"] for ev in content] == [1, 5, 9, 10]
    texts = [ev["choices"][0]["delta"]["content"] for ev in content]
    assert texts == [tokens_text(0, 1), tokens_text(1, 4), tokens_text(5, 4), tokens_text(9, 1)]
    # the project's stream timer counts the tokens exactly from the cumulative usage
    timer = StreamTimer(0.0)
    timer.feed(raw, now=1.0)
    assert timer.finish(now=1.0).output_tokens == 10


def test_completions_stream_shapes(emu, client):
    body = {
        "prompt": "Once upon",
        "max_tokens": 3,
        "ignore_eos": True,
        "stream": True,
        "stream_options": {"include_usage": True},
    }
    events, last = json_events(client.post(emu.url + "/v1/completions", json=body).content)
    assert last == "[DONE]"
    *chunks, usage_chunk = events
    assert len(chunks) == 3
    assert all(c["object"] == "text_completion" for c in events)
    assert all(c["usage"] is None for c in chunks)  # present and null without continuous stats
    assert [c["choices"][0]["finish_reason"] for c in chunks] == [None, None, "length"]
    assert usage_chunk["choices"] == []
    # the final completions usage chunk is dumped with exclude_none
    assert usage_chunk["usage"] == {
        "prompt_tokens": usage_chunk["usage"]["prompt_tokens"],
        "total_tokens": usage_chunk["usage"]["prompt_tokens"] + 3,
        "completion_tokens": 3,
        "reasoning_tokens": 0,
    }


def test_completions_token_id_prompt_counts_exactly(emu, client):
    body = {"prompt": list(range(37)), "max_tokens": 2, "ignore_eos": True}
    out = client.post(emu.url + "/v1/completions", json=body).json()
    assert out["usage"]["prompt_tokens"] == 37
    assert out["usage"]["completion_tokens"] == 2
    assert out["choices"][0]["finish_reason"] == "length"
    assert out["metadata"] == {"weight_version": "default"}


def test_generate_stream_is_cumulative_with_meta_info(emu, client):
    body = {"text": "abc", "sampling_params": {"max_new_tokens": 4, "ignore_eos": True}}
    r = client.post(emu.url + "/generate", json={**body, "stream": True})
    events, last = json_events(r.content)
    assert last == "[DONE]"
    assert [e["meta_info"]["completion_tokens"] for e in events] == [1, 2, 3, 4]
    assert [len(e["output_ids"]) for e in events] == [1, 2, 3, 4]
    assert events[2]["text"].startswith(events[1]["text"])
    assert events[-1]["meta_info"]["finish_reason"] == {"type": "length", "length": 4}
    assert all(e["meta_info"]["finish_reason"] is None for e in events[:-1])
    assert "e2e_latency" in events[-1]["meta_info"]
    whole = client.post(emu.url + "/generate", json=body).json()
    assert whole["text"] == events[-1]["text"]
    assert whole["meta_info"]["completion_tokens"] == 4


def test_non_streaming_chat_shape(emu, client):
    body = {**CHAT, "stream": False}
    out = client.post(emu.url + "/v1/chat/completions", json=body).json()
    assert out["object"] == "chat.completion"
    choice = out["choices"][0]
    assert choice["message"]["role"] == "assistant"
    assert choice["message"]["content"] == tokens_text(0, 6)
    assert choice["finish_reason"] == "length"
    assert out["usage"]["completion_tokens"] == 6


def test_without_ignore_eos_length_is_deterministic_per_prompt(emu, client):
    """A 'natural' stop: same prompt, same length; the stop reports the EOS id."""
    body = {"messages": [{"role": "user", "content": "tell me"}], "max_tokens": 1000}
    a = client.post(emu.url + "/v1/chat/completions", json=body).json()
    b = client.post(emu.url + "/v1/chat/completions", json=body).json()
    assert a["usage"]["completion_tokens"] == b["usage"]["completion_tokens"]
    assert NATURAL_MIN <= a["usage"]["completion_tokens"] < NATURAL_MIN + NATURAL_SPAN
    assert a["choices"][0]["finish_reason"] == "stop"
    assert isinstance(a["choices"][0]["matched_stop"], int)
    capped = client.post(emu.url + "/v1/chat/completions", json={**body, "max_tokens": 3}).json()
    assert capped["usage"]["completion_tokens"] == 3
    assert capped["choices"][0]["finish_reason"] == "length"


@pytest.mark.parametrize("prompt", ["a", "b", "another prompt"])
def test_natural_length_range(prompt):
    assert NATURAL_MIN <= natural_length(prompt) < NATURAL_MIN + NATURAL_SPAN


def test_info_endpoints(emu, client):
    info = client.get(emu.url + "/get_server_info").json()
    for key in (
        "version",
        "kv_cache_dtype",
        "attention_backend",
        "tp_size",
        "max_total_num_tokens",
        "model_path",
        "served_model_name",
        "internal_states",
    ):
        assert key in info, key
    assert info["version"] == "0.5.12.post1"
    assert info["kv_cache_dtype"] == "fp8_e4m3"
    assert info["max_total_num_tokens"] == 495_552
    assert info["served_model_name"] == info["model_path"]  # SGLang's default
    model_info = client.get(emu.url + "/get_model_info").json()
    assert model_info["model_path"] == info["model_path"]
    assert model_info["is_generation"] is True
    models = client.get(emu.url + "/v1/models").json()
    assert models["object"] == "list"
    assert models["data"][0]["id"] == info["served_model_name"]
    assert models["data"][0]["owned_by"] == "sglang"
    assert client.get(emu.url + "/health").status_code == 200
    assert client.get(emu.url + "/health_generate").status_code == 200


def test_health_is_503_while_starting():
    with emulator_thread(tpot_ms=1.0, ttft_ms=1.0, startup_delay_s=60.0) as e:
        assert httpx.get(e.url + "/health", timeout=10).status_code == 503
        assert httpx.get(e.url + "/health_generate", timeout=10).status_code == 503


def test_stream_request_payload_from_streaming_module_is_served(emu, client):
    """The shared client's request body (all three routes) is accepted and timed."""
    for route in ("chat", "completions", "generate"):
        req = StreamRequest(route=route, max_tokens=5)
        raw = client.post(emu.url + req.path, json=req.payload()).content
        timer = StreamTimer(0.0)
        timer.feed(raw, now=0.5)
        timing = timer.finish(now=0.5)
        assert timing.output_tokens == 5, route


@pytest.mark.parametrize("continuous", [False, True])
@pytest.mark.parametrize("model", ["glm", 'odd "name" \u00e9'])
def test_hot_path_chunks_equal_the_reference_builders(continuous, model):
    """The pre-rendered chunks are byte-identical to the generic (dict -> JSON) builders."""
    from glmserve.emulator import protocol as P
    from glmserve.emulator.app import ChatRenderer, CompletionRenderer
    from glmserve.emulator.config import EmulatorConfig
    from glmserve.emulator.engine import GenRequest, OutputBatch

    cfg = EmulatorConfig()
    parsed = P.ParsedRequest("chat", model, True, 12, "k", 9, True, True, continuous)
    req = GenRequest(prompt_tokens=12, output_tokens=9, finish="stop")
    u = P.usage(12, 5) if continuous else None
    chat = ChatRenderer(parsed, req, cfg).content_chunk(5, 3)
    ref = P.chat_chunk(req.rid, model, {"content": P.tokens_text(2, 3)}, usage_obj=u)
    assert _drop_created(chat) == _drop_created(ref)
    comp = CompletionRenderer(parsed, req, cfg)
    for batch, finish in (
        (OutputBatch(3, 5, False, 0.0), None),
        (OutputBatch(4, 9, True, 0.0), "stop"),
    ):
        got = comp.batch(batch)[0]
        u = P.usage(12, batch.completion_tokens) if continuous else None
        matched = cfg.eos_token_id if finish else None
        text = P.tokens_text(batch.completion_tokens - batch.new_tokens, batch.new_tokens)
        want = P.completion_chunk(req.rid, model, comp.created, text, finish, matched, u)
        assert got == want


def _drop_created(chunk: bytes) -> bytes:
    import re

    return re.sub(rb'"created":\d+', b'"created":0', chunk)


@pytest.mark.parametrize("route", ["chat", "completions"])
def test_cache_report_puts_prefix_hits_in_usage_like_sglang(route):
    """--enable-cache-report: a prompt that repeats an earlier one reports its cached prefix in
    usage.prompt_tokens_details (omitted at 0, as SGLang's UsageProcessor); without the flag
    the field stays null, and the client's timer reads it either way."""
    long = "The conversation so far, long enough to fill several prefix pages. " * 8
    if route == "chat":
        body = {**CHAT, "messages": [{"role": "user", "content": long}]}
        path = "/v1/chat/completions"
    else:
        body = {"model": "glm", "prompt": long, "max_tokens": 4, "ignore_eos": True, "stream": True}
        path = "/v1/completions"
    body["stream_options"] = {"include_usage": True}
    seen = {}
    for report in (True, False):
        with emulator_thread(tpot_ms=1.0, ttft_ms=1.0, enable_cache_report=report) as e:
            usages = []
            for _ in range(2):
                events, _ = json_events(httpx.post(e.url + path, json=body, timeout=30).content)
                usages.append(events[-1]["usage"])
            seen[report] = usages
    first, second = seen[True]
    # Null keys are dropped from the completions usage chunk (exclude_none), kept in chat's.
    assert first.get("prompt_tokens_details") is None  # nothing cached yet
    cached = second["prompt_tokens_details"]["cached_tokens"]
    assert 0 < cached < second["prompt_tokens"]
    assert [u.get("prompt_tokens_details") for u in seen[False]] == [None, None]
    timer = StreamTimer(0.0)
    content = {"choices": [{"index": 0, "delta": {"content": "x"}}]}
    timer.feed(f"data: {json.dumps(content)}\n\n".encode(), 0.1)
    final = {"choices": [], "usage": second}
    timer.feed(f"data: {json.dumps(final)}\n\ndata: [DONE]\n\n".encode(), 0.2)
    assert timer.finish(0.2).cached_tokens == cached
