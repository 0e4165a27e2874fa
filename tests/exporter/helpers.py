"""Test doubles for the exporter: SGLang-shaped SSE bodies, an httpx mock, a tiny real server."""

from __future__ import annotations

import json
import socket
import threading
import time
from collections.abc import Callable, Iterator
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Any

import httpx
from prometheus_client.parser import text_string_to_metric_families

# Key names as SGLang 0.5.12.post1's /server_info returns them (server_args flattened, plus
# scheduler_info and version); values are the GLM-5 FP8 deployment's.
SERVER_INFO: dict[str, Any] = {
    "model_path": "nvidia/GLM-5-NVFP4",
    "served_model_name": "nvidia/GLM-5-NVFP4",
    "kv_cache_dtype": "fp8_e4m3",
    "attention_backend": "flashinfer",
    "decode_attention_backend": None,
    "tp_size": 8,
    "max_total_num_tokens": 495552,
    "max_req_input_len": 202746,
    "status": "ready",
    "internal_states": [{"last_gen_throughput": 0.0}],
    "version": "0.5.12.post1",
}

BUILD_INFO = {
    "sglang_version": "0.5.12.post1",
    "patch_series": "0.5.12.post1",
    "patch_lock_sha256": "ab" * 32,
    "fp8_gather": "on",
    "source": "launcher",
}


def _event(obj: Any) -> bytes:
    return b"data: " + json.dumps(obj).encode() + b"\n\n"


def chat_events(n_tokens: int, tokens_per_chunk: int = 1, prompt_tokens: int = 12) -> list[bytes]:
    """A chat stream the way SGLang sends it with continuous_usage_stats: role chunk first."""
    out = [
        _event(
            {
                "object": "chat.completion.chunk",
                "choices": [{"index": 0, "delta": {"role": "assistant", "content": ""}}],
                "usage": {"prompt_tokens": prompt_tokens, "completion_tokens": 0},
            }
        )
    ]
    sent = 0
    while sent < n_tokens:
        k = min(tokens_per_chunk, n_tokens - sent)
        sent += k
        out.append(
            _event(
                {
                    "object": "chat.completion.chunk",
                    "choices": [{"index": 0, "delta": {"content": " tok" * k}}],
                    "usage": {"prompt_tokens": prompt_tokens, "completion_tokens": sent},
                }
            )
        )
    out.append(
        _event(
            {
                "object": "chat.completion.chunk",
                "choices": [],
                "usage": {"prompt_tokens": prompt_tokens, "completion_tokens": n_tokens},
            }
        )
    )
    out.append(b"data: [DONE]\n\n")
    return out


class StepClock:
    """A perf_counter stand-in that advances a fixed step per call: replayable timings."""

    def __init__(self, step: float = 0.005) -> None:
        self.t = 1000.0
        self.step = step

    def __call__(self) -> float:
        self.t += self.step
        return self.t


def mock_client(handler: Callable[[httpx.Request], httpx.Response]) -> httpx.Client:
    return httpx.Client(transport=httpx.MockTransport(handler))


def broken_body(events: list[bytes], keep: int) -> Iterator[bytes]:
    yield from events[:keep]
    raise httpx.RemoteProtocolError("peer closed connection without sending complete message body")


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


class FakeSGLang:
    """A real HTTP server on loopback with switchable faults (mode), restartable on its port.

    Modes: ok, http500, broken (cut mid-stream), malformed (non-JSON event), slow (stalls).
    """

    def __init__(self, port: int | None = None, tpot_s: float = 0.002, n_tokens: int = 8) -> None:
        self.port = port or free_port()
        self.tpot_s = tpot_s
        self.n_tokens = n_tokens
        self.mode = "ok"
        self.requests = 0
        self._server: ThreadingHTTPServer | None = None

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self.port}"

    def start(self) -> FakeSGLang:
        fake = self

        class Handler(BaseHTTPRequestHandler):
            protocol_version = "HTTP/1.1"

            def log_message(self, *args: Any) -> None:
                pass

            def _json(self, code: int, obj: Any) -> None:
                body = json.dumps(obj).encode()
                self.send_response(code)
                self.send_header("Content-Type", "application/json")
                self.send_header("Content-Length", str(len(body)))
                # No keep-alive: stop() must look like a killed process to every client.
                self.send_header("Connection", "close")
                self.end_headers()
                self.wfile.write(body)
                self.close_connection = True

            def do_GET(self) -> None:
                if self.path == "/server_info":
                    self._json(200, SERVER_INFO)
                else:
                    self._json(404, {"detail": "Not Found"})

            def do_POST(self) -> None:
                length = int(self.headers.get("Content-Length", 0))
                self.rfile.read(length)
                fake.requests += 1
                if fake.mode == "http500":
                    self._json(500, {"error": "internal"})
                    return
                self.send_response(200)
                self.send_header("Content-Type", "text/event-stream")
                self.send_header("Connection", "close")
                self.end_headers()
                events = chat_events(fake.n_tokens)
                if fake.mode == "malformed":
                    events = [events[0], b"data: {not json\n\n", *events[1:]]
                if fake.mode == "broken":
                    events = events[:3]
                try:
                    for i, ev in enumerate(events):
                        if fake.mode == "slow" and i == 2:
                            time.sleep(3.0)
                        self.wfile.write(ev)
                        self.wfile.flush()
                        time.sleep(fake.tpot_s)
                except (BrokenPipeError, ConnectionResetError):
                    pass  # the client gave up (the timeout case): expected
                self.close_connection = True

        self._server = ThreadingHTTPServer(("127.0.0.1", self.port), Handler)
        self._server.daemon_threads = True
        threading.Thread(target=self._server.serve_forever, daemon=True).start()
        return self

    def stop(self) -> None:
        if self._server is not None:
            self._server.shutdown()
            self._server.server_close()
            self._server = None


# --- scraping a running exporter -------------------------------------------------------


def scrape(port: int) -> dict[tuple[str, tuple], float]:
    resp = httpx.get(f"http://127.0.0.1:{port}/metrics", timeout=5)
    resp.raise_for_status()
    out = {}
    for family in text_string_to_metric_families(resp.text):
        for s in family.samples:
            out[(s.name, tuple(sorted(s.labels.items())))] = s.value
    return out


def value(samples: dict, name: str, **labels: str) -> float:
    return samples.get((name, tuple(sorted(labels.items()))), float("nan"))


def wait_for(port: int, cond: Callable[[dict], bool], timeout_s: float = 20.0) -> dict:
    deadline = time.monotonic() + timeout_s
    samples: dict = {}
    while time.monotonic() < deadline:
        samples = scrape(port)
        if cond(samples):
            return samples
        time.sleep(0.05)
    raise AssertionError(f"condition not met within {timeout_s} s; last scrape: {samples}")


def tpot_count(s: dict) -> float:
    return value(s, "glmserve_canary_tpot_seconds_count")


def failures(s: dict, reason: str) -> float:
    return value(s, "glmserve_canary_failures_total", reason=reason)
