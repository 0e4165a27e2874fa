"""Request parsing, validation and response bodies in the pinned SGLang's shapes.

Shapes are copied from the wheel's behaviour (entrypoints/http_server.py, openai/serving_*.py,
openai/protocol.py, usage_processor.py), serialised compactly like msgspec/pydantic/orjson do:

- Chat stream chunks: {"id","object":"chat.completion.chunk","created","model","choices":[
  {"index","delta":{"reasoning_content":null,...},"logprobs","finish_reason","matched_stop"}]}
  plus "usage" only when continuous_usage_stats is on. The first output of a request is
  preceded by a role-only delta {"role":"assistant","content":""}; after the last content chunk
  comes a separate chunk with the finish_reason; then the usage chunk (choices: []) when
  include_usage is set; then `data: [DONE]`.
- Completion stream chunks carry finish_reason on the last text chunk (no separate chunk), always
  have "usage" (null unless continuous_usage_stats), and the final usage chunk drops null keys.
- /generate streams cumulative text/output_ids with meta_info (completion_tokens cumulative).

Errors (status, JSON shape):
- body that is not JSON, a missing required field, a wrong content-type, or completions
  max_tokens <= 0 (pydantic validator): 400 {"object":"error","message":...,"type":"Bad Request",
  "param":null,"code":400} (FastAPI RequestValidationError handler).
- engine-side ValueErrors on the OpenAI routes (context too long, max_new_tokens < 0,
  LoRA adapter requested, empty messages/prompt): 400 {"object":"error","message":...,
  "type":"BadRequestError","param":null,"code":400}.
- the same on /generate: 400 {"error":{"message":...}}; when streaming, HTTP 200 with a
  `data: {"error":{"message":...}}` event before [DONE] (the real route streams it that way).
- The model name is NOT checked (like the real server) except the LoRA syntax "base:adapter".
Messages are the real ones for the engine-side errors; the validation-error message text only
approximates FastAPI's rendering.
"""

from __future__ import annotations

import json
import math
import time
import zlib
from dataclasses import dataclass
from typing import Any

from glmserve.emulator.config import EmulatorConfig
from glmserve.emulator.engine import GenRequest

# The emulator has no tokenizer: text is counted as ceil(UTF-8 bytes / 4) tokens (a common BPE
# average), token-id prompts exactly, and each chat message adds 4 template tokens, plus 2 for
# the assistant turn's prefix.
BYTES_PER_TOKEN = 4
CHAT_MESSAGE_OVERHEAD = 4
CHAT_ASSISTANT_PREFIX = 2
# Without ignore_eos an output stops "naturally" after 16..256 tokens, chosen by a CRC of the
# prompt: deterministic per prompt, varied across prompts.
NATURAL_MIN, NATURAL_SPAN = 16, 241
WORDS = (
    " The", " emulator", " streams", " tokens", " at", " a", " fixed", " pace", ",", " one",
    " deadline", " after", " another", ".", " Each", " word", " is", " one", " token", " here",
)  # fmt: skip
DEFAULT_MAX_NEW_TOKENS = 128  # SamplingParams default (chat without max_tokens, /generate)
COMPLETIONS_DEFAULT_MAX_TOKENS = 16  # CompletionRequest.max_tokens default


def dumps(obj: Any) -> str:
    return json.dumps(obj, separators=(",", ":"), ensure_ascii=False)


class ApiError(Exception):
    """An error the real server answers with `status` and `body` before any stream starts."""

    def __init__(self, status: int, body: dict[str, Any]) -> None:
        super().__init__(body)
        self.status = status
        self.body = body


def validation_error(errors: list[str]) -> ApiError:
    """FastAPI RequestValidationError -> SGLang's handler: 400, type 'Bad Request'."""
    message = "[" + ", ".join(errors) + "]"
    return ApiError(
        400,
        {"object": "error", "message": message, "type": "Bad Request", "param": None, "code": 400},
    )


def openai_error(message: str, err_type: str = "BadRequestError", status: int = 400) -> ApiError:
    """OpenAIServingBase.create_error_response."""
    return ApiError(
        status,
        {"object": "error", "message": message, "type": err_type, "param": None, "code": status},
    )


class EngineValueError(ValueError):
    """A ValueError the real tokenizer manager raises; each route renders it its own way."""


def parse_json_body(raw: bytes, content_type: str | None, require_json_type: bool) -> Any:
    if require_json_type:
        media = (content_type or "").lower().split(";", 1)[0].strip()
        if media != "application/json":
            raise validation_error(
                [
                    "{'loc': ['header', 'content-type'], 'msg': \"Unsupported Media Type: Only "
                    "'application/json' is allowed\", 'type': 'value_error'}"
                ]
            )
    try:
        return json.loads(raw)
    except ValueError as exc:
        msg = getattr(exc, "msg", str(exc))
        pos = getattr(exc, "pos", 0)
        raise validation_error(
            [
                f"{{'type': 'json_invalid', 'loc': ('body', {pos}), 'msg': 'JSON decode error', "
                f"'input': {{}}, 'ctx': {{'error': '{msg}'}}}}"
            ]
        ) from exc


def _missing(field: str) -> ApiError:
    return validation_error(
        [f"{{'type': 'missing', 'loc': ('body', '{field}'), 'msg': 'Field required'}}"]
    )


def _type_error(field: str, expected: str, value: Any) -> ApiError:
    return validation_error(
        [
            f"{{'type': '{expected}_type', 'loc': ('body', '{field}'), "
            f"'msg': 'Input should be a valid {expected}', 'input': {value!r}}}"
        ]
    )


def count_text_tokens(text: str) -> int:
    return math.ceil(len(text.encode("utf-8")) / BYTES_PER_TOKEN) if text else 0


def token_text(index: int) -> str:
    return WORDS[index % len(WORDS)]


def tokens_text(start: int, count: int) -> str:
    return "".join(token_text(i) for i in range(start, start + count))


def natural_length(key: str) -> int:
    return NATURAL_MIN + zlib.crc32(key.encode("utf-8")) % NATURAL_SPAN


@dataclass
class ParsedRequest:
    """What a route needs after validation."""

    route: str  # chat | completions | generate
    model: str
    stream: bool
    prompt_tokens: int
    prompt_key: str
    max_new_tokens: int | None
    ignore_eos: bool
    include_usage: bool = False
    continuous_usage: bool = False
    rid: str | None = None

    def to_gen_request(self, config: EmulatorConfig) -> GenRequest:
        """Decide the output length and finish reason; raise EngineValueError like the engine."""
        if self.route != "generate":
            _check_lora(self.model)
        _validate_context(config, self.prompt_tokens, self.max_new_tokens)
        if self.max_new_tokens is not None and self.max_new_tokens < 0:
            raise EngineValueError(f"max_new_tokens must be at least 0, got {self.max_new_tokens}.")
        if self.max_new_tokens is None:
            # No limit: the real server runs to EOS or the context end.
            limit = config.context_length - self.prompt_tokens
        else:
            limit = self.max_new_tokens
        if self.ignore_eos:
            n, finish = limit, "length"
        else:
            natural = natural_length(self.prompt_key)
            n, finish = (natural, "stop") if natural < limit else (limit, "length")
        req = GenRequest(prompt_tokens=self.prompt_tokens, output_tokens=n, finish=finish)
        if self.rid:
            req.rid = self.rid
        return req


def _validate_context(config: EmulatorConfig, input_tokens: int, max_new: int | None) -> None:
    """TokenizerManager._validate_one_request, messages verbatim."""
    ctx = config.context_length
    if input_tokens >= ctx:
        raise EngineValueError(
            f"The input ({input_tokens} tokens) is longer than the model's context length "
            f"({ctx} tokens)."
        )
    if max_new is not None and max_new + input_tokens > ctx:
        total = max_new + input_tokens
        raise EngineValueError(
            f"Requested token count exceeds the model's maximum context length of {ctx} tokens. "
            f"You requested a total of {total} tokens: {input_tokens} tokens from the input "
            f"messages and {max_new} tokens for the completion. Please reduce the number of "
            f"tokens in the input messages or the completion to fit within the limit."
        )


def _check_lora(model: str) -> None:
    """'base:adapter' asks for a LoRA adapter; LoRA is not enabled in this deployment."""
    if ":" in model:
        adapter = model.split(":", 1)[1].strip() or None
        if adapter:
            raise EngineValueError(
                f"LoRA adapter '{adapter}' was requested, but LoRA is not enabled. Please launch "
                "the server with --enable-lora flag and preload adapters using --lora-paths or "
                "/load_lora_adapter endpoint."
            )


def _stream_options(body: dict[str, Any]) -> tuple[bool, bool]:
    opts = body.get("stream_options")
    if not isinstance(opts, dict):
        return False, False
    return bool(opts.get("include_usage")), bool(opts.get("continuous_usage_stats"))


def _opt_int(body: dict[str, Any], key: str) -> int | None:
    value = body.get(key)
    if value is None:
        return None
    if isinstance(value, bool) or not isinstance(value, int):
        raise _type_error(key, "int", value)
    return value


def _flag(body: dict[str, Any], key: str) -> bool:
    """A boolean field, read the way pydantic's lax mode reads it ("false" is False)."""
    value = body.get(key, False)
    if isinstance(value, bool):
        return value
    if isinstance(value, str) and value.lower() in (
        "true",
        "1",
        "yes",
        "on",
        "false",
        "0",
        "no",
        "off",
    ):
        return value.lower() in ("true", "1", "yes", "on")
    if isinstance(value, int) and value in (0, 1):
        return bool(value)
    if value is None:
        return False
    raise _type_error(key, "boolean", value)


def _require_object(body: Any) -> dict[str, Any]:
    if not isinstance(body, dict):
        raise validation_error(
            [
                "{'type': 'model_attributes_type', 'loc': ('body',), 'msg': 'Input should be a "
                f"valid dictionary or object to extract fields from', 'input': {body!r}}}"
            ]
        )
    return body


def _single(value: Any, what: str) -> Any:
    # n > 1 and batched prompts are real SGLang features the emulator leaves out on purpose.
    if isinstance(value, list) and value and isinstance(value[0], (list, str)):
        if len(value) != 1:
            raise openai_error(f"the emulator serves one {what} per request, got {len(value)}")
        return value[0]
    return value


def parse_chat(body: Any, config: EmulatorConfig) -> ParsedRequest:
    body = _require_object(body)
    if "messages" not in body:
        raise _missing("messages")
    messages = body["messages"]
    if not isinstance(messages, list):
        raise _type_error("messages", "list", messages)
    if body.get("n", 1) != 1:
        raise openai_error("the emulator serves n=1 only")
    max_tokens = _opt_int(body, "max_tokens")
    max_completion = _opt_int(body, "max_completion_tokens")
    if not messages:
        raise openai_error("Messages cannot be empty.")
    max_new = max_completion or max_tokens
    if max_new and max_new > config.context_length:
        raise openai_error(
            f"max_completion_tokens is too large: {max_new}.This model supports at most "
            f"{config.context_length} completion tokens."
        )
    texts = []
    prompt_tokens = CHAT_ASSISTANT_PREFIX
    for msg in messages:
        content = msg.get("content") if isinstance(msg, dict) else None
        if isinstance(content, list):
            content = " ".join(str(p.get("text", "")) for p in content if isinstance(p, dict))
        text = str(content or "")
        texts.append(text)
        prompt_tokens += count_text_tokens(text) + CHAT_MESSAGE_OVERHEAD
    include, continuous = _stream_options(body)
    return ParsedRequest(
        route="chat",
        model=str(body.get("model", "default")),
        stream=_flag(body, "stream"),
        prompt_tokens=prompt_tokens,
        prompt_key="\n".join(texts),
        max_new_tokens=max_new,
        ignore_eos=_flag(body, "ignore_eos"),
        include_usage=include,
        continuous_usage=continuous,
        rid=body.get("rid") if isinstance(body.get("rid"), str) else None,
    )


def _prompt_tokens(prompt: Any, field: str) -> tuple[int, str]:
    if isinstance(prompt, str):
        return count_text_tokens(prompt), prompt
    if isinstance(prompt, list) and all(isinstance(t, int) for t in prompt):
        return len(prompt), ",".join(map(str, prompt))
    raise _type_error(field, "string", prompt)


def parse_completions(body: Any, config: EmulatorConfig) -> ParsedRequest:
    body = _require_object(body)
    if "prompt" not in body:
        raise _missing("prompt")
    max_tokens = _opt_int(body, "max_tokens")
    if max_tokens is not None and max_tokens <= 0:
        raise validation_error(
            [
                "{'type': 'value_error', 'loc': ('body', 'max_tokens'), 'msg': 'Value error, "
                f"max_tokens must be positive', 'input': {max_tokens}, 'ctx': {{'error': "
                "ValueError('max_tokens must be positive')}}"
            ]
        )
    if body.get("n", 1) != 1:
        raise openai_error("the emulator serves n=1 only")
    prompt = _single(body["prompt"], "prompt")
    if not prompt:
        raise openai_error("Prompt cannot be empty")
    tokens, key = _prompt_tokens(prompt, "prompt")
    include, continuous = _stream_options(body)
    return ParsedRequest(
        route="completions",
        model=str(body.get("model", "default")),
        stream=_flag(body, "stream"),
        prompt_tokens=tokens,
        prompt_key=key,
        max_new_tokens=COMPLETIONS_DEFAULT_MAX_TOKENS if max_tokens is None else max_tokens,
        ignore_eos=_flag(body, "ignore_eos"),
        include_usage=include,
        continuous_usage=continuous,
        rid=body.get("rid") if isinstance(body.get("rid"), str) else None,
    )


def parse_generate(body: Any) -> ParsedRequest:
    """/generate. Engine-side problems raise EngineValueError (rendered by the route)."""
    body = _require_object(body)
    params = body.get("sampling_params") or {}
    if not isinstance(params, dict):
        raise _type_error("sampling_params", "dictionary", params)
    if body.get("text") is not None:
        tokens, key = _prompt_tokens(_single(body["text"], "text"), "text")
    elif body.get("input_ids") is not None:
        tokens, key = _prompt_tokens(_single(body["input_ids"], "input_ids"), "input_ids")
    else:
        raise EngineValueError("Either text, input_ids or input_embeds should be provided.")
    max_new = params.get("max_new_tokens", DEFAULT_MAX_NEW_TOKENS)
    if max_new is not None and (isinstance(max_new, bool) or not isinstance(max_new, int)):
        raise EngineValueError(f"max_new_tokens must be an integer, got {max_new!r}.")
    return ParsedRequest(
        route="generate",
        model="",
        stream=_flag(body, "stream"),
        prompt_tokens=tokens,
        prompt_key=key,
        max_new_tokens=max_new,
        ignore_eos=_flag(params, "ignore_eos"),
        rid=body.get("rid") if isinstance(body.get("rid"), str) else None,
    )


# ---- response bodies ------------------------------------------------------------------------


def usage(prompt: int, completion: int) -> dict[str, Any]:
    """UsageInfo.model_dump()."""
    return {
        "prompt_tokens": prompt,
        "total_tokens": prompt + completion,
        "completion_tokens": completion,
        "prompt_tokens_details": None,
        "reasoning_tokens": 0,
    }


def usage_json(prompt: int, completion: int) -> str:
    """dumps(usage(prompt, completion)) without building the dict (hot path)."""
    return (
        f'{{"prompt_tokens":{prompt},"total_tokens":{prompt + completion},'
        f'"completion_tokens":{completion},"prompt_tokens_details":null,"reasoning_tokens":0}}'
    )


def finish_reason_json(req: GenRequest, config: EmulatorConfig) -> dict[str, Any]:
    if req.finish == "stop":
        return {"type": "stop", "matched": config.eos_token_id}
    return {"type": "length", "length": req.output_tokens}


def matched_stop(req: GenRequest, config: EmulatorConfig) -> int | None:
    return config.eos_token_id if req.finish == "stop" else None


def sse(obj: Any) -> bytes:
    return b"data: " + dumps(obj).encode() + b"\n\n"


DONE = b"data: [DONE]\n\n"


def chat_chunk(
    rid: str,
    model: str,
    delta: dict[str, Any],
    finish_reason: str | None = None,
    matched: int | None = None,
    usage_obj: dict[str, Any] | None = None,
) -> bytes:
    chunk: dict[str, Any] = {
        "id": rid,
        "object": "chat.completion.chunk",
        "created": int(time.time()),
        "model": model,
        "choices": [
            {
                "index": 0,
                "delta": {"reasoning_content": None, **delta},
                "logprobs": None,
                "finish_reason": finish_reason,
                "matched_stop": matched,
            }
        ],
    }
    if usage_obj is not None:
        chunk["usage"] = usage_obj
    return sse(chunk)


def chat_usage_chunk(rid: str, model: str, usage_obj: dict[str, Any]) -> bytes:
    return sse(
        {
            "id": rid,
            "object": "chat.completion.chunk",
            "created": int(time.time()),
            "model": model,
            "choices": [],
            "usage": usage_obj,
        }
    )


def completion_chunk(
    rid: str,
    model: str,
    created: int,
    text: str,
    finish_reason: str | None,
    matched: int | None,
    usage_obj: dict[str, Any] | None,
) -> bytes:
    return sse(
        {
            "id": rid,
            "object": "text_completion",
            "created": created,
            "model": model,
            "choices": [
                {
                    "index": 0,
                    "text": text,
                    "logprobs": None,
                    "finish_reason": finish_reason,
                    "matched_stop": matched,
                }
            ],
            "usage": usage_obj,
        }
    )


def completion_usage_chunk(rid: str, model: str, created: int, usage_obj: dict[str, Any]) -> bytes:
    # model_dump_json(exclude_none=True): null keys vanish, also inside usage
    return sse(
        {
            "id": rid,
            "object": "text_completion",
            "created": created,
            "model": model,
            "choices": [],
            "usage": {k: v for k, v in usage_obj.items() if v is not None},
        }
    )


def generate_meta(
    req: GenRequest, config: EmulatorConfig, completion_tokens: int, finished: bool, now: float
) -> dict[str, Any]:
    meta: dict[str, Any] = {
        "id": req.rid,
        "finish_reason": finish_reason_json(req, config) if finished else None,
        "prompt_tokens": req.prompt_tokens,
        "weight_version": "default",
        "num_retractions": 0,
        "reasoning_tokens": 0,
        "completion_tokens": completion_tokens,
        "cached_tokens": req.cached_tokens,
    }
    if finished:
        meta["e2e_latency"] = now - req.arrival
        if config.speculative and req.spec_verify_ct > 0:
            meta.update(spec_meta(req, config, completion_tokens))
    return meta


def spec_meta(req: GenRequest, config: EmulatorConfig, completion_tokens: int) -> dict[str, Any]:
    """What SGLang adds to a finished request's meta_info under speculative decoding
    (TokenizerManager._calculate_spec_decoding_metrics), names and aliases as there."""
    proposed = req.spec_verify_ct * (config.spec_num_draft_tokens - 1)
    correct = sum(i * n for i, n in enumerate(req.spec_correct_drafts_histogram))
    return {
        "spec_accept_rate": correct / proposed,
        "spec_accept_length": completion_tokens / req.spec_verify_ct,  # the bonus tokens too
        "spec_num_correct_drafts": correct,
        "spec_num_proposed_drafts": proposed,
        "spec_verify_ct": req.spec_verify_ct,
        "spec_accepted_drafts": correct,
        "spec_proposed_drafts": proposed,
        "spec_correct_drafts_histogram": list(req.spec_correct_drafts_histogram),
        "spec_accept_histogram": list(req.spec_correct_drafts_histogram),
    }


def chat_response(req: GenRequest, parsed: ParsedRequest, config: EmulatorConfig) -> dict[str, Any]:
    text = tokens_text(0, req.output_tokens)
    return {
        "id": req.rid,
        "object": "chat.completion",
        "created": int(time.time()),
        "model": parsed.model,
        "choices": [
            {
                "index": 0,
                "message": {
                    "role": "assistant",
                    "content": text or None,
                    "reasoning_content": None,
                    "tool_calls": None,
                },
                "logprobs": None,
                "finish_reason": req.finish,
                "matched_stop": matched_stop(req, config),
            }
        ],
        "usage": usage(req.prompt_tokens, req.output_tokens),
        "metadata": {"weight_version": "default"},
    }


def completion_response(
    req: GenRequest, parsed: ParsedRequest, config: EmulatorConfig
) -> dict[str, Any]:
    return {
        "id": req.rid,
        "object": "text_completion",
        "created": int(time.time()),
        "model": parsed.model,
        "choices": [
            {
                "index": 0,
                "text": tokens_text(0, req.output_tokens),
                "logprobs": None,
                "finish_reason": req.finish,
                "matched_stop": matched_stop(req, config),
            }
        ],
        "usage": usage(req.prompt_tokens, req.output_tokens),
        "metadata": {"weight_version": "default"},
    }
