"""The Locust user: one streaming request at a time, timed by glmserve.streaming.

Locust's FastHttpUser client sends the request over a keep-alive connection; the body is then
read from the socket as it arrives and every read is fed to a StreamTimer with its arrival
time. Locust's own request time with stream=True stops at the headers (the body is not read
yet), so the HTTP entry's time is replaced with the full request time before it is reported.
"""

from __future__ import annotations

import importlib.metadata
import logging
import socket
import time
from collections.abc import Callable
from typing import Any

import gevent
from geventhttpclient.response import HTTPConnectionClosed, HTTPParseError
from locust import FastHttpUser, constant, task
from locust.contrib.fasthttp import LocustBadStatusCode

from glmserve.loadtest.openloop import OpenLoop
from glmserve.loadtest.prompts import user_rng
from glmserve.loadtest.session import session_of
from glmserve.loadtest.stages import backoff_s
from glmserve.loadtest.workload import Request
from glmserve.streaming import StreamError, StreamRequest, StreamTimer, StreamTiming

log = logging.getLogger(__name__)

# Locust stats names for the stream metrics: their own request type, so they never mix with
# the HTTP entry (which shows the whole request, its failures and their reasons).
STATS_TYPE = "STREAM"
STAT_NAMES = {"ack": "ack", "ttft": "TTFT", "tpot": "TPOT", "itl": "ITL", "e2e": "e2e"}

ITL_BATCH = 32
# An open-loop sender with no step to send for (a closed-loop step, or between steps) looks
# again this often.
IDLE_POLL_S = 0.02


# _read_available and _discard read geventhttpclient's response internals (_body_buffer,
# message_complete, _sock, _pool, block_size, feed), which no release promises to keep; they are
# known to hold in this one, the pin in constraints.txt (a test keeps the two equal).
GEVENTHTTPCLIENT_VERSION = "2.6.1"


def check_geventhttpclient(found: str | None = None) -> None:
    """Refuse, with one line, a geventhttpclient other than the release the reader was made for."""
    found = found or importlib.metadata.version("geventhttpclient")
    if found != GEVENTHTTPCLIENT_VERSION:
        raise SystemExit(
            f"locust decode suite: needs geventhttpclient=={GEVENTHTTPCLIENT_VERSION} (the stream "
            f"reader uses that release's internals), found {found}; install with "
            "pip install -c constraints.txt -e '.[loadtest]'"
        )


HEADERS = {
    "Accept": "text/event-stream",
    # Compressed SSE would reach the timer as gzip bytes; ask for the plain stream.
    "Accept-Encoding": "identity",
}


def classify(error: BaseException) -> StreamError:
    """Map a transport exception to one of streaming.FAILURE_REASONS."""
    if isinstance(error, StreamError):
        return error
    original = getattr(error, "original", None)  # geventhttpclient's RetriesExceeded wraps it
    if isinstance(original, BaseException):
        return classify(original)
    if isinstance(error, LocustBadStatusCode):
        return StreamError("http_status", f"HTTP {error.code}")
    if isinstance(error, (TimeoutError, socket.timeout, gevent.Timeout)):
        return StreamError("timeout", str(error) or type(error).__name__)
    if isinstance(error, (HTTPParseError, HTTPConnectionClosed, ConnectionResetError)):
        return StreamError("broken_stream", str(error) or type(error).__name__)
    return StreamError("connect", f"{type(error).__name__}: {error}")


def read_stream(
    response: Any,
    timer: StreamTimer,
    deadline: float,
    clock: Callable[[], float] = time.perf_counter,
) -> StreamTiming:
    """Read a Locust FastResponse to the end, feeding each piece at its arrival time."""
    raw = getattr(response, "_response", None)  # geventhttpclient's socket response
    error = getattr(response, "error", None)
    if error is not None:
        _discard(raw)
        raise classify(error)
    try:
        while True:
            piece = _read_available(raw)
            now = clock()
            if not piece:
                break
            timer.feed(piece, now)
            if now > deadline:
                raise StreamError("timeout", "request exceeded --request-timeout-s")
        return timer.finish(now)
    except StreamError:
        _discard(raw)
        raise
    except (OSError, HTTPParseError) as exc:  # socket timeouts/resets, truncated chunking
        _discard(raw)
        raise classify(exc) from exc


def _read_available(raw: Any) -> bytes:
    """Whatever body bytes one socket read brought; b"" at the end of the message.

    geventhttpclient's public read(n) waits for n bytes and readline() costs a call per line;
    at thousands of events per second the client's CPU time becomes timing error, so this
    reads the parser's body buffer directly (geventhttpclient is pinned in constraints.txt).
    A complete message hands the connection back to the keep-alive pool by itself.
    """
    buf = raw._body_buffer
    while not buf and not raw.message_complete:
        sock = raw._sock
        if sock is None:
            raise HTTPConnectionClosed("connection closed")
        raw.feed(sock.recv(raw.block_size))  # b"" at EOF: the parser raises "Incomplete"
        buf = raw._body_buffer
    out = bytes(buf)
    del buf[:]
    return out


def _discard(raw: Any) -> None:
    """Close an abandoned connection instead of returning it, half read, to the pool."""
    sock, pool = getattr(raw, "_sock", None), getattr(raw, "_pool", None)
    if sock is None:
        return
    raw._sock = raw._pool = None
    if pool is not None:
        pool.release_socket(sock)  # closes it and frees the pool slot
    else:
        sock.close()


def failure_label(err: StreamError) -> str:
    """What Locust's failure table shows for a failed stream: the reason, and for a refused
    request its status (`http_status: HTTP 503`): one row per code, never one per body."""
    if err.reason == "http_status" and err.detail:
        return f"{err.reason}: {err.detail.split(':', 1)[0]}"
    return err.reason


class DecodeUser(FastHttpUser):
    """One stream: send, read to [DONE], report, repeat (no think time). In an open-loop step
    a sender instead: it takes the next due arrival, waits for its time, sends it."""

    host = "http://127.0.0.1:30000"
    wait_time = constant(0)
    # Streams of several minutes are normal; per-read silence is bounded by --read-timeout-s.
    network_timeout = 60.0
    connection_timeout = 10.0

    def __init__(self, environment: Any) -> None:
        self.session = session_of(environment)
        opts = self.session.options
        self.network_timeout = opts.read_timeout_s
        super().__init__(environment)
        self.rng = user_rng(opts.seed, self.session.next_stream_id())
        self.failures_in_a_row = 0  # of any reason: each one backs off longer (backoff_s)

    def _request(self) -> tuple[StreamRequest, Request]:
        opts = self.session.options
        assert self.session.workload is not None
        req = self.session.workload.next_request(self.rng)
        chat = opts.route == "chat"
        sreq = StreamRequest(
            route=opts.route,  # type: ignore[arg-type]
            model=opts.model,
            prompt="" if chat else req.text,
            max_tokens=req.max_tokens,
            ignore_eos=True,
            messages=req.messages if chat else None,
        )
        return sreq, req

    @task
    def stream(self) -> None:
        open_loop = self.session.open_loop
        if open_loop is not None and open_loop.dispatcher is not None:
            self._send_arrival(open_loop)
            return
        if self._send() is None:
            self.failures_in_a_row = 0
            return
        self.failures_in_a_row += 1
        gevent.sleep(backoff_s(self.failures_in_a_row))

    def _send_arrival(self, open_loop: OpenLoop) -> None:
        """Open loop: no back-off after a failure (the arrivals keep their schedule)."""
        claimed = open_loop.claim()
        if claimed is None:
            gevent.sleep(IDLE_POLL_S)
            return
        dispatcher, slot = claimed
        while (wait := slot.due - time.perf_counter()) > 0:
            gevent.sleep(wait)
        if not open_loop.send(dispatcher, slot):
            return
        try:
            self._send()
        finally:
            open_loop.done()

    def _send(self) -> StreamError | None:
        """Send one request, read it to the end, record it; the failure, or None."""
        sreq, req = self._request()
        opts = self.session.options
        started_at = time.time()
        t0 = time.perf_counter()
        timer = StreamTimer(t0, keep_content=req.conversation is not None)
        failed: StreamError | None = None
        with self.client.request(
            "POST",
            sreq.path,
            json=sreq.payload(),
            headers=HEADERS,
            stream=True,
            catch_response=True,
        ) as resp:
            try:
                timing = read_stream(resp, timer, t0 + opts.request_timeout_s)
            except StreamError as err:
                failed = err
                elapsed = time.perf_counter() - t0
                resp.request_meta["response_time"] = elapsed * 1e3
                resp.failure(failure_label(err))
                log.debug("stream failed: %s", err)
                self.session.record_failure(started_at, started_at + elapsed, err.reason)
            else:
                resp.request_meta["response_time"] = timing.e2e_s * 1e3
                resp.request_meta["response_length"] = timing.output_tokens
                resp.success()
        assert self.session.workload is not None
        self.session.workload.finished(req, None if failed else timing.text)
        if failed is not None:
            return failed
        self.session.record_success(started_at, timing, req.turn)
        self._fire(timing)
        return None

    def _fire(self, timing: StreamTiming) -> None:
        fire = self.environment.events.request.fire

        def one(key: str, seconds: float, length: int = 0) -> None:
            fire(
                request_type=STATS_TYPE,
                name=STAT_NAMES[key],
                response_time=seconds * 1e3,
                response_length=length,
                exception=None,
                context={},
            )

        one("ack", timing.ack_s)
        one("ttft", timing.ttft_s)
        if timing.tpot_s is not None:
            one("tpot", timing.tpot_s)
        if self.session.options.itl_stats:
            for i, gap in enumerate(timing.itl_s, 1):
                one("itl", gap)
                if i % ITL_BATCH == 0:
                    # Hundreds of stats calls in one go would hold the hub long enough to delay
                    # other streams' timestamps; let them run in between.
                    gevent.sleep(0)
        one("e2e", timing.e2e_s, timing.output_tokens)
