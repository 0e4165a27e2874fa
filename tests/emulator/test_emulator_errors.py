"""Bad input gets the real server's HTTP status and error JSON shape (0.5.12.post1)."""

from __future__ import annotations

import pytest
from support.sse import sse_events

OPENAI_ERROR_KEYS = {"object", "message", "type", "param", "code"}


def assert_openai_error(r, err_type: str, status: int = 400) -> str:
    assert r.status_code == status, r.text
    assert r.headers["content-type"].startswith("application/json")
    body = r.json()
    assert set(body) == OPENAI_ERROR_KEYS
    assert body["object"] == "error"
    assert body["type"] == err_type
    assert body["code"] == status
    assert body["param"] is None
    return body["message"]


@pytest.mark.parametrize("path", ["/v1/chat/completions", "/v1/completions"])
def test_bad_json_is_400_bad_request(emu, client, path):
    """FastAPI's RequestValidationError, turned into 400 by SGLang's handler."""
    r = client.post(
        emu.url + path, content=b"{not json", headers={"content-type": "application/json"}
    )
    msg = assert_openai_error(r, "Bad Request")
    assert "json_invalid" in msg


def test_bad_json_on_generate_is_400_bad_request(emu, client):
    r = client.post(
        emu.url + "/generate", content=b"[1,", headers={"content-type": "application/json"}
    )
    assert_openai_error(r, "Bad Request")


def test_wrong_content_type_is_400(emu, client):
    r = client.post(
        emu.url + "/v1/chat/completions", content=b"{}", headers={"content-type": "text/plain"}
    )
    assert "Unsupported Media Type" in assert_openai_error(r, "Bad Request")


def test_missing_messages_is_400(emu, client):
    r = client.post(emu.url + "/v1/chat/completions", json={"model": "x"})
    assert "messages" in assert_openai_error(r, "Bad Request")


def test_empty_messages_is_engine_error(emu, client):
    r = client.post(emu.url + "/v1/chat/completions", json={"messages": []})
    assert assert_openai_error(r, "BadRequestError") == "Messages cannot be empty."


@pytest.mark.parametrize("max_tokens", [0, -5])
def test_completions_max_tokens_not_positive_is_validation_error(emu, client, max_tokens):
    """CompletionRequest has a pydantic validator: max_tokens must be positive."""
    r = client.post(emu.url + "/v1/completions", json={"prompt": "x", "max_tokens": max_tokens})
    assert "max_tokens must be positive" in assert_openai_error(r, "Bad Request")


@pytest.mark.parametrize("stream", [False, True])
def test_chat_negative_max_tokens_is_engine_error(emu, client, stream):
    """Chat has no validator: SamplingParams.verify rejects it, before any stream starts."""
    body = {"messages": [{"role": "user", "content": "x"}], "max_tokens": -1, "stream": stream}
    r = client.post(emu.url + "/v1/chat/completions", json=body)
    assert assert_openai_error(r, "BadRequestError") == "max_new_tokens must be at least 0, got -1."


@pytest.mark.parametrize("stream", [False, True])
def test_context_too_long_is_400_on_openai_routes(emu, client, stream):
    long_text = "word " * 200_000  # 1,000,000 bytes -> 250,000 tokens > 202,752
    body = {"messages": [{"role": "user", "content": long_text}], "stream": stream}
    r = client.post(emu.url + "/v1/chat/completions", json=body)
    msg = assert_openai_error(r, "BadRequestError")
    assert "is longer than the model's context length (202752 tokens)" in msg


def test_input_plus_max_tokens_over_context_is_400(emu, client):
    body = {"prompt": list(range(200_000)), "max_tokens": 5000}
    r = client.post(emu.url + "/v1/completions", json=body)
    msg = assert_openai_error(r, "BadRequestError")
    assert msg.startswith("Requested token count exceeds the model's maximum context length")
    assert "205000 tokens" in msg


def test_generate_errors_non_stream_and_stream(emu, client):
    body = {"input_ids": list(range(300_000))}
    r = client.post(emu.url + "/generate", json=body)
    assert r.status_code == 400
    assert set(r.json()) == {"error"}
    assert "context length" in r.json()["error"]["message"]
    # streaming /generate reports engine errors inside a 200 stream, then [DONE]
    r = client.post(emu.url + "/generate", json={**body, "stream": True})
    assert r.status_code == 200
    events = sse_events(r.content)
    assert events[-1] == "[DONE]"
    assert '"error"' in events[0]


def test_unknown_model_is_served_like_the_real_server(emu, client):
    """0.5.12.post1 does not check the model name on the OpenAI routes; it echoes it back."""
    body = {
        "model": "no-such-model",
        "messages": [{"role": "user", "content": "x"}],
        "max_tokens": 2,
    }
    r = client.post(emu.url + "/v1/chat/completions", json=body)
    assert r.status_code == 200
    assert r.json()["model"] == "no-such-model"


def test_lora_syntax_model_is_400(emu, client):
    body = {"model": "base:adapter", "messages": [{"role": "user", "content": "x"}]}
    r = client.post(emu.url + "/v1/chat/completions", json=body)
    assert "LoRA adapter 'adapter' was requested" in assert_openai_error(r, "BadRequestError")


def test_retrieve_unknown_model_is_404_model_not_found(emu, client):
    r = client.get(emu.url + "/v1/models/no-such-model")
    assert r.status_code == 404
    assert r.json()["error"]["code"] == "model_not_found"
    assert r.json()["error"]["param"] == "model"


def test_unknown_route_is_fastapi_404(emu, client):
    r = client.get(emu.url + "/no/such/route")
    assert r.status_code == 404
    assert r.json() == {"detail": "Not Found"}


def test_booleans_are_read_like_pydantic(emu, client):
    """'false' is False (lax mode), not a truthy string; garbage is a validation error."""
    body = {"prompt": "x", "max_tokens": 2, "stream": "false", "ignore_eos": "true"}
    r = client.post(emu.url + "/v1/completions", json=body)
    assert r.status_code == 200 and r.json()["usage"]["completion_tokens"] == 2
    r = client.post(emu.url + "/v1/completions", json={**body, "stream": "maybe"})
    assert "boolean" in assert_openai_error(r, "Bad Request")
