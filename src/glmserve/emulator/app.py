"""The HTTP surface: Starlette routes that answer like the pinned SGLang's http_server."""

from __future__ import annotations

import asyncio
import contextlib
import dataclasses
import time
from collections.abc import AsyncIterator, Awaitable, Callable
from typing import Any

from prometheus_client.exposition import CONTENT_TYPE_LATEST, generate_latest
from starlette.applications import Starlette
from starlette.exceptions import HTTPException
from starlette.middleware import Middleware
from starlette.requests import Request
from starlette.responses import JSONResponse, Response
from starlette.routing import Route
from starlette.types import Receive, Scope, Send

from glmserve import sglang_api
from glmserve.emulator import protocol as P
from glmserve.emulator.config import EmulatorConfig
from glmserve.emulator.engine import Engine, GenRequest, OutputBatch
from glmserve.emulator.metrics import MetricsState, make_registry
from glmserve.emulator.prefix import PrefixCache

SSE_HEADERS = [(b"content-type", b"text/event-stream; charset=utf-8")]
JSON_HEADERS = [(b"content-type", b"application/json")]
TOKEN_ID_BASE = 1000  # output_ids are fake but stable: TOKEN_ID_BASE + word index


class Disconnected(Exception):
    pass


def _json(obj: Any, status: int = 200) -> Response:
    return Response(P.dumps(obj), status_code=status, media_type="application/json")


async def _wait_disconnect(receive: Receive) -> None:
    while True:
        message = await receive()
        if message["type"] == "http.disconnect":
            return


# ---- renderers: engine output batches -> wire bytes, per route -------------------------------


class ChatRenderer:
    def __init__(self, parsed: P.ParsedRequest, req: GenRequest, config: EmulatorConfig) -> None:
        self.p, self.req, self.cfg = parsed, req, config
        self.first = True
        # Hot path (one chunk per token per stream): the chunk's constant parts are rendered
        # once; equal to protocol.chat_chunk byte for byte (tests/emulator check it).
        self._pre = f'data: {{"id":"{req.rid}","object":"chat.completion.chunk","created":'
        self._mid = (
            f',"model":{P.dumps(parsed.model)},"choices":[{{"index":0,"delta":'
            '{"reasoning_content":null,"content":'
        )
        self._tail = '},"logprobs":null,"finish_reason":null,"matched_stop":null}]'

    def content_chunk(self, completion_tokens: int, new_tokens: int) -> bytes:
        text = P.dumps(P.tokens_text(completion_tokens - new_tokens, new_tokens))
        if self.p.continuous_usage:
            u = P.usage_json(self.req.prompt_tokens, completion_tokens)
            end = f',"usage":{u}}}\n\n'
        else:
            end = "}\n\n"
        created = int(time.time())
        return f"{self._pre}{created}{self._mid}{text}{self._tail}{end}".encode()

    def batch(self, b: OutputBatch) -> list[bytes]:
        out = []
        if self.first:
            self.first = False
            if self.cfg.role_chunk:
                delta = {"role": "assistant", "content": ""}
                out.append(P.chat_chunk(self.req.rid, self.p.model, delta))
        if b.new_tokens:
            out.append(self.content_chunk(b.completion_tokens, b.new_tokens))
        return out

    def end(self) -> list[bytes]:
        rid, model = self.req.rid, self.p.model
        out = [P.chat_chunk(rid, model, {}, self.req.finish, P.matched_stop(self.req, self.cfg))]
        if self.p.include_usage:
            u = P.usage(self.req.prompt_tokens, self.req.generated)
            out.append(P.chat_usage_chunk(rid, model, _cache_report(u, self.req, self.cfg)))
        return out

    def full(self) -> dict[str, Any]:
        return P.chat_response(self.req, self.p, self.cfg)


class CompletionRenderer:
    def __init__(self, parsed: P.ParsedRequest, req: GenRequest, config: EmulatorConfig) -> None:
        self.p, self.req, self.cfg = parsed, req, config
        self.created = int(time.time())
        # Hot path, see ChatRenderer: equal to protocol.completion_chunk byte for byte.
        self._pre = (
            f'data: {{"id":"{req.rid}","object":"text_completion","created":{self.created},'
            f'"model":{P.dumps(parsed.model)},"choices":[{{"index":0,"text":'
        )

    def batch(self, b: OutputBatch) -> list[bytes]:
        text = P.dumps(P.tokens_text(b.completion_tokens - b.new_tokens, b.new_tokens))
        if b.finished:
            finish = P.dumps(self.req.finish)
            matched = P.dumps(P.matched_stop(self.req, self.cfg))
        else:
            finish = matched = "null"
        u = (
            P.usage_json(self.req.prompt_tokens, b.completion_tokens)
            if self.p.continuous_usage
            else "null"
        )
        return [
            (
                f'{self._pre}{text},"logprobs":null,"finish_reason":{finish},'
                f'"matched_stop":{matched}}}],"usage":{u}}}\n\n'
            ).encode()
        ]

    def end(self) -> list[bytes]:
        if not self.p.include_usage:
            return []
        u = _cache_report(P.usage(self.req.prompt_tokens, self.req.generated), self.req, self.cfg)
        return [P.completion_usage_chunk(self.req.rid, self.p.model, self.created, u)]

    def full(self) -> dict[str, Any]:
        return P.completion_response(self.req, self.p, self.cfg)


def _cache_report(usage: dict[str, Any], req: GenRequest, config: EmulatorConfig) -> dict[str, Any]:
    """usage with the prefix-cache hit, as SGLang's --enable-cache-report writes it
    (UsageProcessor: prompt_tokens_details only when some tokens were cached)."""
    if config.enable_cache_report and req.cached_tokens > 0:
        usage["prompt_tokens_details"] = {"cached_tokens": req.cached_tokens}
    return usage


class GenerateRenderer:
    def __init__(self, parsed: P.ParsedRequest, req: GenRequest, config: EmulatorConfig) -> None:
        self.p, self.req, self.cfg = parsed, req, config

    def _obj(self, completion_tokens: int, finished: bool, now: float) -> dict[str, Any]:
        # Non-incremental streaming (the default): text and output_ids are cumulative.
        ids = [TOKEN_ID_BASE + i % len(P.WORDS) for i in range(completion_tokens)]
        return {
            "text": P.tokens_text(0, completion_tokens),
            "output_ids": ids,
            "meta_info": P.generate_meta(self.req, self.cfg, completion_tokens, finished, now),
        }

    def batch(self, b: OutputBatch) -> list[bytes]:
        return [P.sse(self._obj(b.completion_tokens, b.finished, b.t))]

    def end(self) -> list[bytes]:
        return []

    def full(self) -> dict[str, Any]:
        return self._obj(self.req.generated, True, time.monotonic())


Renderer = ChatRenderer | CompletionRenderer | GenerateRenderer


class GenerationResponse:
    """Runs one generation inside the ASGI call, so a client disconnect aborts it.

    OpenAI routes hold the HTTP headers until the first output exists (SGLang kick-starts its
    generator to be able to answer errors with a real status), /generate sends them at once.
    """

    def __init__(
        self,
        engine: Engine,
        req: GenRequest,
        renderer: Renderer,
        stream: bool,
        headers_first: bool,
    ) -> None:
        self.engine, self.req, self.renderer = engine, req, renderer
        self.stream, self.headers_first = stream, headers_first

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        watcher = asyncio.ensure_future(_wait_disconnect(receive))
        gen = self.engine.generate(self.req)
        try:
            if self.stream:
                await self._stream(gen, watcher, send)
            else:
                await self._whole(gen, watcher, send)
        except Disconnected:
            pass
        finally:
            watcher.cancel()
            await gen.aclose()

    async def _first(
        self, gen: AsyncIterator[OutputBatch], watcher: asyncio.Future[None]
    ) -> OutputBatch:
        """The first output (queue wait + TTFT), abandoned if the client goes away meanwhile."""
        nxt = asyncio.ensure_future(gen.__anext__())
        await asyncio.wait({nxt, watcher}, return_when=asyncio.FIRST_COMPLETED)
        if nxt.done():
            return nxt.result()
        nxt.cancel()
        with contextlib.suppress(asyncio.CancelledError, StopAsyncIteration):
            await nxt
        raise Disconnected

    async def _stream(
        self, gen: AsyncIterator[OutputBatch], watcher: asyncio.Future[None], send: Send
    ) -> None:
        r = self.renderer
        if self.headers_first:
            await send({"type": "http.response.start", "status": 200, "headers": SSE_HEADERS})
        first = await self._first(gen, watcher)
        if not self.headers_first:
            await send({"type": "http.response.start", "status": 200, "headers": SSE_HEADERS})
        for body in r.batch(first):
            await send({"type": "http.response.body", "body": body, "more_body": True})
        async for batch in gen:
            if watcher.done():
                raise Disconnected
            for body in r.batch(batch):
                await send({"type": "http.response.body", "body": body, "more_body": True})
        for body in r.end():
            await send({"type": "http.response.body", "body": body, "more_body": True})
        await send({"type": "http.response.body", "body": P.DONE, "more_body": False})

    async def _whole(
        self, gen: AsyncIterator[OutputBatch], watcher: asyncio.Future[None], send: Send
    ) -> None:
        await self._first(gen, watcher)
        async for _ in gen:
            if watcher.done():
                raise Disconnected
        body = P.dumps(self.renderer.full()).encode()
        await send({"type": "http.response.start", "status": 200, "headers": JSON_HEADERS})
        await send({"type": "http.response.body", "body": body, "more_body": False})


class HttpMetricsMiddleware:
    """SGLang's track_http_status_code middleware (on with --enable-metrics): count requests by
    route template and method, responses by status when the response starts, and the requests
    in flight until then (the real one decrements when call_next returns, i.e. at the headers).
    """

    def __init__(self, app: Any, metrics: MetricsState) -> None:
        self.app = app
        self.metrics = metrics

    def _endpoint(self, scope: Scope) -> str:
        from starlette.routing import Match

        for route in scope["app"].routes:
            match, _ = route.matches(scope)
            if match == Match.FULL:
                return route.path
        return scope["path"]

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] != "http":
            await self.app(scope, receive, send)
            return
        m = self.metrics
        endpoint, method = self._endpoint(scope), scope["method"]
        m.http_request_started(endpoint, method)
        active = True

        async def counting_send(message: Any) -> None:
            nonlocal active
            if active and message["type"] == "http.response.start":
                active = False
                m.http_response_started(endpoint, method, message["status"])
                m.http_request_left(endpoint, method)
            await send(message)

        try:
            await self.app(scope, receive, counting_send)
        finally:
            if active:
                m.http_request_left(endpoint, method)


class StreamedError:
    """/generate with stream=true answers engine errors inside a 200 stream."""

    def __init__(self, message: str) -> None:
        self.message = message

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        await send({"type": "http.response.start", "status": 200, "headers": SSE_HEADERS})
        body = P.sse({"error": {"message": self.message}}) + P.DONE
        await send({"type": "http.response.body", "body": body, "more_body": False})


# ---- the application --------------------------------------------------------------------------


@dataclasses.dataclass
class EmulatorState:
    config: EmulatorConfig
    metrics: MetricsState
    engine: Engine
    started: float
    prefix_cache: PrefixCache = dataclasses.field(default_factory=PrefixCache)


def create_app(config: EmulatorConfig) -> Starlette:
    """A fresh app with its own engine and metrics (several may live in one process)."""
    metrics = MetricsState(model_name=config.model_name)
    state = EmulatorState(config, metrics, Engine(config, metrics), time.monotonic())
    app = Starlette(
        routes=[*_generation_routes(state), *_info_routes(state, make_registry(metrics))],
        lifespan=_lifespan(state.engine),
        exception_handlers={HTTPException: _http_error},
        middleware=[Middleware(HttpMetricsMiddleware, metrics=metrics)],
    )
    app.state.emulator = state
    return app


def _api(fn: Callable[[Request], Awaitable[Any]]) -> Callable[[Request], Awaitable[Any]]:
    """A route whose protocol errors (P.ApiError) become their own JSON answer."""

    async def wrapped(request: Request) -> Any:
        try:
            return await fn(request)
        except P.ApiError as err:
            return _json(err.body, err.status)

    return wrapped


def _generation_routes(state: EmulatorState) -> list[Route]:
    """The routes that generate: OpenAI chat and completions, and SGLang's native /generate."""
    config, engine = state.config, state.engine

    async def openai_route(request: Request, route: str) -> Any:
        raw = await request.body()
        body = P.parse_json_body(raw, request.headers.get("content-type"), require_json_type=True)
        parsed = (
            P.parse_chat(body, config) if route == "chat" else P.parse_completions(body, config)
        )
        try:
            req = parsed.to_gen_request(config)
        except P.EngineValueError as exc:
            raise P.openai_error(str(exc)) from exc
        req.cached_tokens = state.prefix_cache.lookup_and_insert(
            parsed.prompt_key, parsed.prompt_tokens
        )
        cls = ChatRenderer if route == "chat" else CompletionRenderer
        renderer = cls(parsed, req, config)
        return GenerationResponse(engine, req, renderer, parsed.stream, headers_first=False)

    @_api
    async def chat(request: Request) -> Any:
        return await openai_route(request, "chat")

    @_api
    async def completions(request: Request) -> Any:
        return await openai_route(request, "completions")

    @_api
    async def generate(request: Request) -> Any:
        raw = await request.body()
        body = P.parse_json_body(raw, request.headers.get("content-type"), require_json_type=False)
        stream = isinstance(body, dict) and body.get("stream") in (True, "true", "True", 1)
        try:
            parsed = P.parse_generate(body)
            req = parsed.to_gen_request(config)
        except P.EngineValueError as exc:
            if stream:
                return StreamedError(str(exc))
            return _json({"error": {"message": str(exc)}}, 400)
        req.cached_tokens = state.prefix_cache.lookup_and_insert(
            parsed.prompt_key, parsed.prompt_tokens
        )
        renderer = GenerateRenderer(parsed, req, config)
        return GenerationResponse(engine, req, renderer, parsed.stream, headers_first=True)

    return [
        Route(sglang_api.CHAT_COMPLETIONS, chat, methods=["POST"]),
        Route(sglang_api.COMPLETIONS, completions, methods=["POST"]),
        Route(sglang_api.GENERATE, generate, methods=["POST", "PUT"]),
    ]


def _info_routes(state: EmulatorState, registry: Any) -> list[Route]:
    """The routes that describe the server: health, model and server info, models, /metrics."""
    config = state.config

    async def health(request: Request) -> Response:
        if time.monotonic() - state.started < config.startup_delay_s:
            return Response(status_code=503)
        await asyncio.sleep(config.health_delay_s)
        return Response(status_code=200)

    async def model_info(request: Request) -> Response:
        return _json(
            {
                "model_path": config.model_path,
                "tokenizer_path": config.model_path,
                "is_generation": True,
                "preferred_sampling_params": None,
                "weight_version": "default",
                "has_image_understanding": False,
                "has_audio_understanding": False,
                # GLM-5's HF config (architecture GlmMoeDsaForCausalLM); model_type assumed.
                "model_type": "glm_moe_dsa",
                "architectures": ["GlmMoeDsaForCausalLM"],
            }
        )

    async def server_info(request: Request) -> Response:
        return _json(server_info_dict(state))

    async def models(request: Request) -> Response:
        return _json({"object": "list", "data": [model_card(config)]})

    async def retrieve_model(request: Request) -> Response:
        model = request.path_params["model"]
        if model != config.model_name:
            return _json(
                {
                    "error": {
                        "message": f"The model '{model}' does not exist",
                        "type": "invalid_request_error",
                        "param": "model",
                        "code": "model_not_found",
                    }
                },
                404,
            )
        return _json(model_card(config, model))

    async def metrics_route(request: Request) -> Response:
        return Response(generate_latest(registry), media_type=CONTENT_TYPE_LATEST)

    return [
        Route(sglang_api.HEALTH, health, methods=["GET"]),
        Route(sglang_api.HEALTH_GENERATE, health, methods=["GET"]),
        *(Route(path, model_info, methods=["GET"]) for path in sglang_api.MODEL_INFO_PATHS),
        *(Route(path, server_info, methods=["GET"]) for path in sglang_api.SERVER_INFO_PATHS),
        Route(sglang_api.MODELS, models, methods=["GET"]),
        Route(sglang_api.MODELS + "/{model:path}", retrieve_model, methods=["GET"]),
        Route(sglang_api.METRICS, metrics_route, methods=["GET"]),
        Route(sglang_api.METRICS + "/", metrics_route, methods=["GET"]),
    ]


async def _http_error(request: Request, exc: Exception) -> Response:
    # FastAPI's default body for routing errors: {"detail": ...}
    assert isinstance(exc, HTTPException)
    return JSONResponse({"detail": exc.detail}, status_code=exc.status_code)


def _lifespan(
    engine: Engine,
) -> Callable[[Starlette], contextlib.AbstractAsyncContextManager[None]]:
    @contextlib.asynccontextmanager
    async def lifespan(app: Starlette) -> AsyncIterator[None]:
        engine.start()
        try:
            yield
        finally:
            await engine.stop()

    return lifespan


def model_card(config: EmulatorConfig, model_id: str | None = None) -> dict[str, Any]:
    name = model_id or config.model_name
    return {
        "id": name,
        "object": "model",
        "created": int(time.time()),
        "owned_by": "sglang",
        "root": name,
        "parent": None,
        "max_model_len": config.context_length,
    }


def speculative_args(c: EmulatorConfig) -> dict[str, Any]:
    """The speculative server args of /server_info (None where SGLang runs none)."""
    on = c.speculative
    return {
        "speculative_algorithm": "EAGLE" if on else None,
        "speculative_num_steps": c.spec_num_draft_tokens - 1 if on else None,
        "speculative_eagle_topk": 1 if on else None,
        "speculative_num_draft_tokens": c.spec_num_draft_tokens if on else None,
    }


def server_info_dict(state: EmulatorState) -> dict[str, Any]:
    """The keys of the real /server_info that tools read (server args + scheduler info)."""
    c = state.config
    args = {
        "model_path": c.model_path,
        "tokenizer_path": c.model_path,
        "served_model_name": c.model_name,
        "host": c.host,
        "port": c.port,
        "dtype": "auto",
        "quantization": "modelopt_fp4",
        "kv_cache_dtype": c.kv_cache_dtype,
        "attention_backend": c.attention_backend,
        "tp_size": c.tp_size,
        "pp_size": 1,
        "dp_size": 1,
        "ep_size": 1,
        "context_length": c.context_length,
        "max_running_requests": c.max_concurrency,
        "max_total_tokens": c.max_total_tokens,
        "page_size": 1,
        "stream_interval": 1,
        "decode_log_interval": c.decode_log_interval,
        "enable_metrics": True,
        "weight_version": "default",
        # As SGLang resolves them: EAGLE (NEXTN's name there), topk 1, draft tokens = steps + 1.
        **speculative_args(c),
        "disable_cuda_graph": False,
        "cuda_graph_max_bs": c.graph_max_bs,
        "enable_cache_report": c.enable_cache_report,
    }
    engine = state.engine
    internal = {
        **args,
        "last_gen_throughput": engine.last_gen_throughput,
        **engine.spec_internal_state(),
        "memory_usage": {
            "weight": 0.0,
            "kvcache": 0.0,
            "token_capacity": c.max_total_tokens,
            "graph": 0.0,
        },
        "effective_max_running_requests_per_dp": c.max_concurrency,
    }
    return {
        **args,
        "status": "ready",
        "max_total_num_tokens": c.max_total_tokens,
        "max_req_input_len": c.context_length - 1,
        "internal_states": [internal],
        "version": sglang_api.SGLANG_VERSION,
        # Not in the real answer: says plainly that this is the emulator, and how it is timed.
        "glmserve_emulator": {
            "tpot_ms": c.tpot_ms,
            "ttft_ms": c.ttft_ms,
            "tokens_per_chunk": c.tokens_per_chunk,
            "spec_accept_length": c.spec_accept_length,
            "cost_model": c.cost_model.mode,
            "cost_model_layers": c.cost_model.layers,
            "cost_model_pool_rows": c.cost_model.pool_rows,
            "fp8_gather": c.fp8_gather,
        },
    }
