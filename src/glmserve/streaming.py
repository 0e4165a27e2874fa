"""The one definition of stream timing: SSE parsing, ack, TTFT, TPOT, ITL, e2e and tok/s.

The exporter's canary, the Locust suite, the emulator's accuracy benchmark and the end-to-end
harness all time streams through this module, so a TPOT on the dashboard and a TPOT in a Locust
report are the same quantity. Definitions (see docs/metrics.md for how other tools differ):

- ack: the first SSE event of any kind. SGLang's chat stream opens with a role-only delta that
  carries no token, so the ack is *not* the first token.
- TTFT: request sent -> first event that carries at least one output token.
- TPOT: (t_last_token_event - t_first_token_event) / (N_out - 1), with N_out from the server's
  `usage` (not from counting chunks, which undercounts multi-token chunks).
- ITL: one entry per output token after the first. An event that carries k tokens contributes
  k entries of gap/k, where gap is the time since the previous token-carrying event; tokens that
  arrive together with the first token contribute zero gaps. Hence mean(ITL) == TPOT exactly.
- e2e: request sent -> end of stream.
- decode tok/s of one stream: 1 / TPOT.  output tok/s of one stream: N_out / e2e.
- per-user tok/s of a window: the mean of 1 / TPOT over its requests; output tok/s of a
  window: its requests' N_out summed over the window's length (Aggregate).
- goodput: requests per second that met every SLO set (Aggregate.goodput).
- tokens per step: output tokens after the first token-carrying event / token-carrying events
  after it: what one decode step delivered to the client. 1 without speculative decoding (at
  SGLang's default --stream-interval 1); with MTP, the accepted drafts + 1 of each verify pass,
  so about the acceptance length. Over many requests: sum of those tokens / sum of those events.
- acceptance length: SGLang's own per-request figure, completion tokens / verify passes
  (meta_info.spec_verify_ct, sent by /generate at the end of a request under speculative
  decoding; the OpenAI routes carry no such field). Over many requests: sum / sum. The server's
  gauge sglang:spec_accept_length is the same ratio over its last decode-log interval (without
  the prefill's token, so about (N_out - 1) / verify passes).
  TPOT alone hides where the speed comes from: at a fixed verify-pass time, TPOT falls as
  1 / acceptance length.

Token counts per event come from cumulative counters when the server sends them
(`stream_options.continuous_usage_stats` for the OpenAI routes, `meta_info.completion_tokens`
for /generate); otherwise from usage, spread evenly over the events that carried text.
"""

from __future__ import annotations

import json
import math
import time
from collections.abc import Callable, Iterable, Sequence
from dataclasses import dataclass, field
from typing import Any, Literal

from glmserve import sglang_api

Route = Literal["chat", "completions", "generate"]
ROUTE_PATHS: dict[str, str] = {
    "chat": sglang_api.CHAT_COMPLETIONS,
    "completions": sglang_api.COMPLETIONS,
    "generate": sglang_api.GENERATE,
}

# Failure reasons are a closed set so that exporters and reports can label by them.
FAILURE_REASONS = (
    "connect",  # the target refused or could not be reached
    "timeout",  # no byte within the read timeout, or the whole request ran too long
    "http_status",  # a non-2xx status before the stream began
    "stream_error",  # the server sent an error object inside the stream
    "malformed_sse",  # an event that is not JSON (and not [DONE])
    "broken_stream",  # the connection ended before [DONE]
    "no_tokens",  # a complete stream that carried no output token
)


class StreamError(Exception):
    """A request that did not yield a usable timing; `reason` is one of FAILURE_REASONS."""

    def __init__(self, reason: str, detail: str = "") -> None:
        if reason not in FAILURE_REASONS:
            raise ValueError(f"unknown failure reason {reason!r}")
        super().__init__(f"{reason}: {detail}" if detail else reason)
        self.reason = reason
        self.detail = detail


@dataclass(frozen=True)
class StreamRequest:
    """What to send. `ignore_eos` + `max_tokens` make the output length deterministic."""

    route: Route = "chat"
    model: str = "default"
    prompt: str = "Hello"
    max_tokens: int = 64
    ignore_eos: bool = True
    temperature: float = 0.0
    # Token ids instead of text (the generate route only): exact prompt lengths for benchmarks.
    input_ids: tuple[int, ...] | None = None
    # A whole conversation, (role, content) oldest first, instead of `prompt` (the chat route
    # only): a multi-turn load test's turn carries every turn before it.
    messages: tuple[tuple[str, str], ...] | None = None

    @property
    def path(self) -> str:
        return ROUTE_PATHS[self.route]

    def payload(self) -> dict[str, Any]:
        if self.input_ids is not None and self.route != "generate":
            raise ValueError("input_ids need the generate route")
        if self.messages is not None and self.route != "chat":
            raise ValueError("messages need the chat route")
        if self.route == "generate":
            prompt: dict[str, Any] = (
                {"text": self.prompt}
                if self.input_ids is None
                else {"input_ids": list(self.input_ids)}
            )
            return {
                **prompt,
                "stream": True,
                "sampling_params": {
                    "max_new_tokens": self.max_tokens,
                    "ignore_eos": self.ignore_eos,
                    "temperature": self.temperature,
                },
            }
        body: dict[str, Any] = {
            "model": self.model,
            "stream": True,
            "max_tokens": self.max_tokens,
            "temperature": self.temperature,
            "ignore_eos": self.ignore_eos,
            "stream_options": {"include_usage": True, "continuous_usage_stats": True},
        }
        if self.route == "chat":
            turns = self.messages if self.messages is not None else (("user", self.prompt),)
            body["messages"] = [{"role": role, "content": text} for role, text in turns]
        else:
            body["prompt"] = self.prompt
        return body


@dataclass(frozen=True)
class StreamTiming:
    """Per-request result. Times are in seconds; None where undefined (e.g. TPOT of 1 token)."""

    ack_s: float
    ttft_s: float
    tpot_s: float | None
    itl_s: tuple[float, ...]
    e2e_s: float
    output_tokens: int
    prompt_tokens: int | None
    events: int
    token_events: int
    # What the stream said, for callers that compare outputs (the smoke test): the generated
    # text and the token ids (/generate sends them; () elsewhere), kept only with
    # keep_content=True; and the prompt tokens the server served from its prefix cache
    # (/generate meta_info.cached_tokens; OpenAI routes only with --enable-cache-report).
    # Not part of any timing.
    text: str = ""
    output_ids: tuple[int, ...] = ()
    cached_tokens: int | None = None
    # Tokens the first token-carrying event brought (the prefill's token, usually 1), and
    # SGLang's verify passes for this request (/generate meta_info.spec_verify_ct; None where
    # the server sent none: no speculative decoding, or an OpenAI route).
    first_event_tokens: int = 1
    spec_verify_ct: int | None = None

    def tail_tpot_s(self, fraction: float = 0.5) -> float | None:
        """TPOT of the stream's last `fraction` of output tokens: the mean inter-token latency
        there (steady decode, once the prefills of streams started beside it are done).
        None with fewer than two inter-token gaps in that part."""
        if not 0.0 < fraction <= 1.0:
            raise ValueError(f"fraction must be in (0, 1], got {fraction}")
        tail = self.itl_s[len(self.itl_s) - int(len(self.itl_s) * fraction) :]
        return sum(tail) / len(tail) if len(tail) >= 2 else None

    @property
    def decode_tokens_per_s(self) -> float | None:
        return None if not self.tpot_s else 1.0 / self.tpot_s

    @property
    def decode_steps(self) -> int:
        """Token-carrying events after the first: the decode steps the client saw."""
        return max(self.token_events - 1, 0)

    @property
    def decode_tokens(self) -> int:
        """Output tokens after the first token-carrying event."""
        return self.output_tokens - self.first_event_tokens

    @property
    def tokens_per_step(self) -> float | None:
        """Tokens one decode step delivered to the client (module docstring); None with no
        decode step."""
        return self.decode_tokens / self.decode_steps if self.decode_steps else None

    @property
    def accept_length(self) -> float | None:
        """SGLang's acceptance length of this request, output tokens / verify passes; None
        where the server sent no verify count."""
        return self.output_tokens / self.spec_verify_ct if self.spec_verify_ct else None

    @property
    def output_tokens_per_s(self) -> float:
        return self.output_tokens / self.e2e_s if self.e2e_s > 0 else math.inf


@dataclass
class _TokenEvent:
    t: float
    tokens: int | None  # exact count when the server reported a cumulative counter


class SSEDecoder:
    """Incremental Server-Sent Events decoder: bytes in any split -> `data:` payloads."""

    def __init__(self) -> None:
        self._buf = b""
        self._data: list[bytes] = []

    def feed(self, chunk: bytes) -> list[str]:
        self._buf += chunk
        out: list[str] = []
        while True:
            nl = self._buf.find(b"\n")
            if nl < 0:
                return out
            line, self._buf = self._buf[:nl].rstrip(b"\r"), self._buf[nl + 1 :]
            if not line:  # a blank line dispatches the event
                if self._data:
                    out.append(b"\n".join(self._data).decode("utf-8", "replace"))
                    self._data = []
            elif line.startswith(b"data:"):
                value = line[5:]
                self._data.append(value[1:] if value.startswith(b" ") else value)
            # comments (":"), event:, id: and retry: lines carry nothing we time


class StreamTimer:
    """Feed it the response body as it arrives; `finish()` returns the StreamTiming.

    The clock is injected so recorded fixtures replay to golden timings.
    """

    def __init__(
        self,
        t_request: float,
        clock: Callable[[], float] = time.perf_counter,
        keep_content: bool = False,
    ) -> None:
        # keep_content: also keep the text and token ids (the smoke test compares outputs; the
        # load test and the canary only time, and keep thousands of timings in memory).
        self.keep_content = keep_content
        self.t_request = t_request
        self._clock = clock
        self._sse = SSEDecoder()
        self._t_ack: float | None = None
        self._t_end: float | None = None
        self._events = 0
        self._token_events: list[_TokenEvent] = []
        self._cumulative = 0  # last cumulative completion-token counter seen
        self._usage_total: int | None = None
        self._prompt_tokens: int | None = None
        self._text = ""  # /generate: the latest cumulative text
        self._deltas: list[str] = []  # OpenAI routes: the text pieces, joined once at the end
        self._output_ids: tuple[int, ...] = ()
        self._cached_tokens: int | None = None
        self._spec_verify_ct: int | None = None
        self.done = False  # saw [DONE]

    def feed(self, chunk: bytes, now: float | None = None) -> None:
        t = self._clock() if now is None else now
        for data in self._sse.feed(chunk):
            self._on_event(data, t)

    def finish(self, now: float | None = None) -> StreamTiming:
        t = self._clock() if now is None else now
        # Whatever is left unterminated is the tail of a cut connection: not an event to parse.
        if not self.done:
            raise StreamError("broken_stream", f"ended after {self._events} events without [DONE]")
        return self._timing(self._t_end if self._t_end is not None else t)

    def _on_event(self, data: str, t: float) -> None:
        if self._t_ack is None:
            self._t_ack = t
        if data.strip() == "[DONE]":
            self.done = True
            self._t_end = t
            return
        if self.done:
            raise StreamError("malformed_sse", "data after [DONE]")
        try:
            obj = json.loads(data)
        except ValueError as exc:
            raise StreamError("malformed_sse", f"non-JSON event: {data[:80]!r}") from exc
        if not isinstance(obj, dict):
            raise StreamError("malformed_sse", f"event is not an object: {data[:80]!r}")
        if "error" in obj or obj.get("object") == "error":
            raise StreamError("stream_error", json.dumps(obj.get("error", obj))[:200])
        self._events += 1
        try:
            text, cumulative = _extract(obj)
        except (TypeError, AttributeError, ValueError) as exc:  # valid JSON, wrong shape
            raise StreamError("malformed_sse", f"unexpected event shape: {data[:80]!r}") from exc
        usage = obj.get("usage")
        meta = obj.get("meta_info")
        if isinstance(meta, dict):
            self._prompt_tokens = meta.get("prompt_tokens", self._prompt_tokens)
            self._cached_tokens = meta.get("cached_tokens", self._cached_tokens)
            verify = meta.get("spec_verify_ct")
            if isinstance(verify, int) and not isinstance(verify, bool) and verify > 0:
                self._spec_verify_ct = verify  # sent once, with the finished request
            # /generate repeats the whole text and id list so far (SGLang's default,
            # non-incremental streaming; intermediate events may carry text null).
            if self.keep_content:
                if text:
                    self._text = text
                ids = obj.get("output_ids")
                if isinstance(ids, list):
                    self._output_ids = tuple(int(i) for i in ids)
        elif text and self.keep_content:
            self._deltas.append(text)
        if isinstance(usage, dict):
            self._prompt_tokens = usage.get("prompt_tokens", self._prompt_tokens)
            details = usage.get("prompt_tokens_details")
            if isinstance(details, dict) and details.get("cached_tokens") is not None:
                self._cached_tokens = details["cached_tokens"]
            if not obj.get("choices"):  # the final usage-only chunk holds the total
                self._usage_total = usage.get("completion_tokens", self._usage_total)
        if cumulative is not None:
            delta = cumulative - self._cumulative
            self._cumulative = max(cumulative, self._cumulative)
            if delta > 0:
                self._token_events.append(_TokenEvent(t, delta))
        elif text:
            self._token_events.append(_TokenEvent(t, None))

    def _timing(self, t_end: float) -> StreamTiming:
        events = self._token_events
        if not events:
            raise StreamError("no_tokens", f"{self._events} events, none carried a token")
        counts = _token_counts(events, self._usage_total)
        n_out = sum(counts)
        t_first, t_last = events[0].t, events[-1].t
        tpot = (t_last - t_first) / (n_out - 1) if n_out > 1 else None
        itl: list[float] = [0.0] * (counts[0] - 1)
        for prev, ev, k in zip(events, events[1:], counts[1:], strict=False):
            itl.extend([(ev.t - prev.t) / k] * k)
        assert self._t_ack is not None
        return StreamTiming(
            ack_s=self._t_ack - self.t_request,
            ttft_s=t_first - self.t_request,
            tpot_s=tpot,
            itl_s=tuple(itl),
            e2e_s=t_end - self.t_request,
            output_tokens=n_out,
            prompt_tokens=self._prompt_tokens,
            events=self._events,
            token_events=len(events),
            text=self._text or "".join(self._deltas),
            output_ids=self._output_ids,
            cached_tokens=self._cached_tokens,
            first_event_tokens=counts[0],
            spec_verify_ct=self._spec_verify_ct,
        )


def _extract(obj: dict[str, Any]) -> tuple[str, int | None]:
    """(text carried by this event, cumulative completion-token counter if the event has one)."""
    meta = obj.get("meta_info")
    if isinstance(meta, dict):  # SGLang native /generate: text is cumulative, so is the counter
        return str(obj.get("text") or ""), meta.get("completion_tokens")
    text = ""
    for choice in obj.get("choices") or ():
        delta = choice.get("delta")
        if isinstance(delta, dict):
            text += (delta.get("content") or "") + (delta.get("reasoning_content") or "")
        else:
            text += choice.get("text") or ""
    usage = obj.get("usage")
    cumulative = None
    if isinstance(usage, dict) and obj.get("choices"):  # continuous_usage_stats
        cumulative = usage.get("completion_tokens")
    return text, cumulative


def _token_counts(events: Sequence[_TokenEvent], usage_total: int | None) -> list[int]:
    if all(ev.tokens is not None for ev in events):
        return [ev.tokens or 0 for ev in events]
    # No per-event counter: spread the usage total over the text-carrying events; without a
    # usage total, each such event counts one token (the best a chunk count can do).
    n = len(events)
    total = usage_total if usage_total and usage_total >= n else n
    base, extra = divmod(total, n)
    return [base + (1 if i < extra else 0) for i in range(n)]


def percentile(values: Sequence[float], q: float) -> float:
    """Linear-interpolated percentile (q in 0..100), numpy's default method, stdlib only."""
    if not values:
        return math.nan
    s = sorted(values)
    pos = (len(s) - 1) * q / 100.0
    lo = math.floor(pos)
    hi = min(lo + 1, len(s) - 1)
    return s[lo] + (s[hi] - s[lo]) * (pos - lo)


@dataclass(frozen=True)
class Summary:
    count: int
    mean: float
    p50: float
    p90: float
    p99: float

    def as_dict(self) -> dict[str, float]:
        return {"count": self.count, "mean": self.mean, "p50": self.p50, "p90": self.p90,
                "p99": self.p99}  # fmt: skip


def summarize(values: Iterable[float]) -> Summary:
    vals = [v for v in values if v is not None and not math.isnan(v)]
    mean = sum(vals) / len(vals) if vals else math.nan
    return Summary(
        len(vals), mean, percentile(vals, 50), percentile(vals, 90), percentile(vals, 99)
    )


@dataclass
class Aggregate:
    """Aggregates over a window of requests: what a load-test step or report line shows."""

    timings: list[StreamTiming] = field(default_factory=list)
    failures: dict[str, int] = field(default_factory=dict)

    def add(self, timing: StreamTiming) -> None:
        self.timings.append(timing)

    def fail(self, reason: str) -> None:
        self.failures[reason] = self.failures.get(reason, 0) + 1

    def tokens_per_step(self) -> float | None:
        """Tokens per decode step over the window's requests: sum of their decode tokens /
        sum of their decode steps (a long request weighs by its steps); None without any."""
        steps = sum(t.decode_steps for t in self.timings)
        return sum(t.decode_tokens for t in self.timings) / steps if steps else None

    def accept_length(self) -> float | None:
        """SGLang's acceptance length over the requests that carried a verify count: sum of
        their output tokens / sum of their verify passes; None without any."""
        counted = [t for t in self.timings if t.spec_verify_ct]
        passes = sum(t.spec_verify_ct or 0 for t in counted)
        return sum(t.output_tokens for t in counted) / passes if passes else None

    def output_tokens_per_s(self, window_s: float) -> float:
        """Throughput over a wall-clock window: total output tokens / window."""
        return sum(t.output_tokens for t in self.timings) / window_s if window_s > 0 else 0.0

    def goodput(self, window_s: float, slo_ttft_s: float | None, slo_tpot_s: float | None) -> float:
        """Requests per second that met both SLOs (an unset SLO always holds)."""
        good = self.good(slo_ttft_s, slo_tpot_s)
        return good / window_s if window_s > 0 else 0.0

    def good(self, slo_ttft_s: float | None, slo_tpot_s: float | None) -> int:
        """How many timed requests met both SLOs (an unset SLO always holds)."""
        return sum(
            1
            for t in self.timings
            if (slo_ttft_s is None or t.ttft_s <= slo_ttft_s)
            and (slo_tpot_s is None or (t.tpot_s or 0.0) <= slo_tpot_s)
        )

    def per_user_tokens_per_s(self) -> float:
        """Decode speed one user sees: the mean over requests of 1 / TPOT (requests with one
        output token have no TPOT and are left out); nan with none. The y axis of the Pareto
        plot, against output_tokens_per_s, the whole server's."""
        speeds = [t.decode_tokens_per_s for t in self.timings if t.decode_tokens_per_s]
        return sum(speeds) / len(speeds) if speeds else math.nan


def t_quantile(p: float, df: int) -> float:
    """Student's t quantile (stdlib only): the x with P(T <= x) = p, by bisection on the CDF,
    which is 1/2 plus the density integrated from 0 (Simpson's rule; 1e-6 is plenty here)."""
    if not 0.5 <= p < 1 or df < 1:
        raise ValueError(f"need 0.5 <= p < 1 and df >= 1, got p={p}, df={df}")
    log_c = math.lgamma((df + 1) / 2) - math.lgamma(df / 2) - 0.5 * math.log(df * math.pi)

    def density(x: float) -> float:
        return math.exp(log_c - (df + 1) / 2 * math.log1p(x * x / df))

    def cdf(x: float, n: int = 2000) -> float:
        h = x / n
        total = density(0.0) + density(x)
        total += sum((4 if i % 2 else 2) * density(i * h) for i in range(1, n))
        return 0.5 + total * h / 3

    lo, hi = 0.0, 1.0
    while cdf(hi) < p:
        lo, hi = hi, hi * 2
    for _ in range(60):
        mid = (lo + hi) / 2
        lo, hi = (mid, hi) if cdf(mid) < p else (lo, mid)
    return (lo + hi) / 2


def confidence_interval(values: Sequence[float], level: float = 0.95) -> tuple[float, float] | None:
    """Two-sided Student-t interval for the mean of independent repeats (None below two):
    mean +- t(level, n-1) x sd / sqrt(n). The report puts it on each level's headline figures
    across --repeats runs."""
    vals = [v for v in values if v is not None and not math.isnan(v)]
    n = len(vals)
    if n < 2:
        return None
    mean = sum(vals) / n
    sd = math.sqrt(sum((v - mean) ** 2 for v in vals) / (n - 1))
    half = t_quantile(0.5 + level / 2, n - 1) * sd / math.sqrt(n)
    return mean - half, mean + half


def time_stream(
    base_url: str,
    request: StreamRequest,
    *,
    client: Any = None,
    timeout_s: float = 60.0,
    clock: Callable[[], float] = time.perf_counter,
    keep_content: bool = False,
    max_bytes: int | None = None,
) -> StreamTiming:
    """Send one streaming request with httpx (sync) and time it. Raises StreamError.

    `client` is an `httpx.Client`; injected so callers share connections and tests can mock.
    `max_bytes` caps the body: a stream far longer than the request asked for is malformed, and
    reading it whole would grow the caller's memory until the deadline.
    """
    import httpx  # imported here: the core package stays stdlib-only

    own = client is None
    http = client or httpx.Client(timeout=httpx.Timeout(timeout_s))
    deadline = clock() + timeout_s
    try:
        t0 = clock()
        timer = StreamTimer(t0, clock, keep_content=keep_content)
        with http.stream("POST", base_url.rstrip("/") + request.path, json=request.payload()) as r:
            if r.status_code >= 300:
                body = r.read().decode("utf-8", "replace")[:200]
                raise StreamError("http_status", f"HTTP {r.status_code}: {body}")
            received = 0
            for chunk in r.iter_raw():
                received += len(chunk)
                if max_bytes is not None and received > max_bytes:
                    raise StreamError("malformed_sse", f"stream over {max_bytes} bytes")
                timer.feed(chunk)
                if clock() > deadline:
                    raise StreamError("timeout", f"stream exceeded {timeout_s:g} s")
        return timer.finish()
    except httpx.TimeoutException as exc:
        raise StreamError("timeout", str(exc) or type(exc).__name__) from exc
    except httpx.ConnectError as exc:
        raise StreamError("connect", str(exc)) from exc
    except httpx.TransportError as exc:  # read, write or protocol errors mid-stream
        raise StreamError("broken_stream", str(exc) or type(exc).__name__) from exc
    finally:
        if own:
            http.close()
