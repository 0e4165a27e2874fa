"""SGLang-shaped SSE for tests: stream bodies, a framing checker, and ONE fault-injecting server.

The server speaks HTTP/1.1 on 127.0.0.1 the way uvicorn does in front of SGLang: chunked transfer
encoding, and `Connection: close`, so that stop() looks like a killed process to every client.
It answers GET /server_info with SERVER_INFO and every POST with a chat stream, unless a fault
mode says otherwise. Modes are named after the failure reason a client must report for them
(glmserve.streaming.FAILURE_REASONS):

    ok             a well-formed stream: role chunk, n_tokens content chunks, usage, [DONE]
    http_status    503 with a JSON body, before any stream
    broken_stream  the connection closes after two tokens, without the terminating chunk
    malformed_sse  a non-JSON event after two tokens
    stream_error   an SGLang error object inside the stream after two tokens
    timeout        a stall of `stall_s` after two tokens, then the rest of the stream

Several modes are taken in turn, one per POST. As a process (the Locust tests run it apart from
pytest): `python tests/support/sse.py PORT_FILE [MODE...]` (default: every mode in turn).
"""

from __future__ import annotations

import contextlib
import itertools
import json
import sys
import threading
import time
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from typing import Any

MODES = ("ok", "http_status", "broken_stream", "malformed_sse", "stream_error", "timeout")
FAULT_AFTER_TOKENS = 2

# Key names as SGLang 0.5.12.post1's /server_info returns them (server_args flattened, plus
# scheduler_info and version); values are the GLM-5 FP8 deployment's.
SERVER_INFO: dict[str, Any] = {
    "model_path": "nvidia/GLM-5-NVFP4",
    "served_model_name": "nvidia/GLM-5-NVFP4",
    "kv_cache_dtype": "fp8_e4m3",
    "attention_backend": "flashinfer",
    "decode_attention_backend": None,
    "tp_size": 8,
    "cuda_graph_max_bs": 64,
    "max_running_requests": 64,
    "max_total_num_tokens": 495552,
    "max_req_input_len": 202746,
    "status": "ready",
    "internal_states": [{"last_gen_throughput": 0.0}],
    "version": "0.5.12.post1",
}


def event(obj: Any) -> bytes:
    return b"data: " + json.dumps(obj).encode() + b"\n\n"


def chat_events(n_tokens: int, tokens_per_chunk: int = 1, prompt_tokens: int = 12) -> list[bytes]:
    """A chat stream the way SGLang sends it with continuous_usage_stats: role chunk first."""

    def chunk(delta: dict[str, str] | None, done: int) -> bytes:
        choices = [] if delta is None else [{"index": 0, "delta": delta}]
        usage = {"prompt_tokens": prompt_tokens, "completion_tokens": done}
        return event({"object": "chat.completion.chunk", "choices": choices, "usage": usage})

    out = [chunk({"role": "assistant", "content": ""}, 0)]
    sent = 0
    while sent < n_tokens:
        k = min(tokens_per_chunk, n_tokens - sent)
        sent += k
        out.append(chunk({"content": " tok" * k}, sent))
    out.append(chunk(None, n_tokens))  # the usage-only chunk holds the total
    out.append(b"data: [DONE]\n\n")
    return out


def sse_events(raw: bytes) -> list[str]:
    """Every `data:` payload, checking the framing: each event is `data: ...\\n\\n`."""
    from glmserve.streaming import SSEDecoder  # not needed by the server process

    assert raw.endswith(b"\n\n"), raw[-40:]
    for block in raw.split(b"\n\n")[:-1]:
        assert block.startswith(b"data: "), block[:80]
        assert b"\n" not in block, "one data line per event"
    return SSEDecoder().feed(raw)


def json_events(raw: bytes) -> tuple[list[dict[str, Any]], str]:
    """The JSON events of a stream, and its last payload (normally `[DONE]`)."""
    events = sse_events(raw)
    return [json.loads(e) for e in events[:-1]], events[-1]


def _chunked(data: bytes) -> bytes:
    return b"%x\r\n%s\r\n" % (len(data), data)


class SSEServer:
    """The fault-injecting server (see the module docstring); restartable on its port."""

    def __init__(
        self,
        *modes: str,
        port: int = 0,
        tpot_s: float = 0.002,
        n_tokens: int = 8,
        stall_s: float = 30.0,
    ) -> None:
        self.port = port
        self.tpot_s = tpot_s
        self.n_tokens = n_tokens
        self.stall_s = stall_s
        self.requests = 0
        self.set_modes(*(modes or ("ok",)))
        self._server: ThreadingHTTPServer | None = None

    def set_modes(self, *modes: str) -> None:
        unknown = sorted(set(modes) - set(MODES))
        if unknown or not modes:
            raise ValueError(f"unknown SSE test server modes {unknown}; known: {MODES}")
        self._modes = itertools.cycle(modes)
        self._lock = threading.Lock()

    def _next_mode(self) -> str:
        with self._lock:
            self.requests += 1
            return next(self._modes)

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self.port}"

    def start(self) -> SSEServer:
        self._server = ThreadingHTTPServer(("127.0.0.1", self.port), _handler(self))
        self._server.daemon_threads = True  # a stalled stream never holds up stop()
        self.port = self._server.server_address[1]
        threading.Thread(target=self._server.serve_forever, daemon=True).start()
        return self

    def stop(self) -> None:
        if self._server is not None:
            self._server.shutdown()
            self._server.server_close()
            self._server = None

    def __enter__(self) -> SSEServer:
        return self.start()

    def __exit__(self, *exc: object) -> None:
        self.stop()


def _handler(server: SSEServer) -> type[BaseHTTPRequestHandler]:
    class Handler(BaseHTTPRequestHandler):
        protocol_version = "HTTP/1.1"

        def log_message(self, *args: Any) -> None:
            pass

        def _json(self, code: int, obj: Any) -> None:
            body = json.dumps(obj).encode()
            self.send_response(code)
            self.send_header("Content-Type", "application/json")
            self.send_header("Content-Length", str(len(body)))
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
            self.rfile.read(int(self.headers.get("Content-Length", 0)))
            mode = server._next_mode()
            self.close_connection = True
            if mode == "http_status":
                self._json(503, {"error": "overloaded"})
                return
            self.send_response(200)
            self.send_header("Content-Type", "text/event-stream")
            self.send_header("Transfer-Encoding", "chunked")
            self.send_header("Connection", "close")
            self.end_headers()
            # The client may give up first (the timeout case): expected.
            with contextlib.suppress(BrokenPipeError, ConnectionResetError):
                self._stream(mode)

        def _stream(self, mode: str) -> None:
            events = chat_events(server.n_tokens)
            for i, data in enumerate(events):
                if i == 1 + FAULT_AFTER_TOKENS:  # after the role chunk and two tokens
                    if mode == "broken_stream":
                        return  # close without the terminating chunk
                    if mode == "malformed_sse":
                        self.wfile.write(_chunked(b"data: {not json\n\n"))
                        break
                    if mode == "stream_error":
                        error = {"message": "boom", "code": 500}
                        self.wfile.write(_chunked(event({"error": error})))
                        break
                    if mode == "timeout":
                        time.sleep(server.stall_s)
                self.wfile.write(_chunked(data))
                self.wfile.flush()
                time.sleep(server.tpot_s)
            self.wfile.write(b"0\r\n\r\n")
            self.wfile.flush()

    return Handler


def main(argv: list[str]) -> None:
    port_file, modes = Path(argv[0]), argv[1:]
    server = SSEServer(*(modes or MODES), tpot_s=0.01).start()
    port_file.write_text(str(server.port))
    threading.Event().wait()  # until the test terminates the process


if __name__ == "__main__":
    main(sys.argv[1:])
