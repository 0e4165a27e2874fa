"""Per-request records and measurement windows -> per-step summaries (no Locust needed).

Records carry wall-clock start/end times so that records from several Locust processes can be
placed in the master's windows. A record belongs to a step when it started after the step
began (its stream never saw the previous concurrency) and ended inside the step's measured
window; failures are counted by the time they ended.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import asdict, dataclass, field
from typing import Any

from glmserve.streaming import Aggregate, StreamTiming, percentile, summarize

STAT_KEYS = ("ack", "ttft", "tpot", "itl", "e2e")


@dataclass(frozen=True)
class RequestRecord:
    started_at: float  # wall clock, s
    ended_at: float
    timing: StreamTiming | None
    reason: str | None = None  # a streaming.FAILURE_REASONS entry when timing is None
    turn: int | None = None  # multi-turn runs: the turn of its conversation (1-based)

    def to_wire(self) -> list[Any]:
        """Compact form sent from a Locust worker to the master."""
        t = self.timing
        if t is None:
            return [self.started_at, self.ended_at, self.reason]
        timing = {k: v for k, v in asdict(t).items() if k not in _NOT_ON_THE_WIRE}
        return [self.started_at, self.ended_at, None, timing, self.turn]

    @classmethod
    def from_wire(cls, row: list[Any]) -> RequestRecord:
        if row[2] is not None:
            return cls(row[0], row[1], None, row[2])
        raw = dict(row[3])
        raw["itl_s"] = tuple(raw["itl_s"])
        return cls(row[0], row[1], StreamTiming(**raw), turn=row[4] if len(row) > 4 else None)


# What a stream said (StreamTiming.text/output_ids, for the smoke test and the conversations of
# multi-turn runs) is no load-test data: workers send the master the timing fields only (the
# server's cached-token count is one: multi-turn reports show it).
_NOT_ON_THE_WIRE = ("text", "output_ids")


@dataclass
class Window:
    step: int
    streams: int
    start: float
    measure_start: float | None = None
    end: float | None = None
    # The server's own figures read as the window closed (under MTP: SGLang's acceptance
    # gauges, glmserve.loadtest.serverinfo.fetch_spec_metrics); None when not read.
    server: dict[str, float] | None = None

    def measured_s(self) -> float:
        if self.measure_start is None or self.end is None:
            return 0.0
        return max(0.0, self.end - self.measure_start)

    def holds(self, rec: RequestRecord) -> bool:
        if self.measure_start is None or self.end is None:
            return False
        return rec.started_at >= self.start and self.measure_start <= rec.ended_at <= self.end

    def saw_failure(self, rec: RequestRecord) -> bool:
        if self.measure_start is None or self.end is None:
            return False
        return self.measure_start <= rec.ended_at <= self.end


@dataclass
class StepResult:
    step: int
    streams: int
    window_s: float
    aggregate: Aggregate
    server: dict[str, float] | None = None  # Window.server

    def latency_ms(self, key: str) -> list[float]:
        timings = self.aggregate.timings
        if key == "itl":
            return [g * 1e3 for t in timings for g in t.itl_s]
        values = [getattr(t, f"{key}_s") for t in timings]
        return [v * 1e3 for v in values if v is not None]


def window_of(rec: RequestRecord, windows: Sequence[Window]) -> Window | None:
    """The step window a record counts in, or None: a timed stream where the window holds it
    (started in the step, ended in its measurement), a failure where the window saw it end.
    Measurement windows do not overlap, so there is at most one."""
    for w in windows:
        if w.holds(rec) if rec.timing is not None else w.saw_failure(rec):
            return w
    return None


def split_steps(windows: list[Window], records: list[RequestRecord]) -> list[StepResult]:
    aggregates = {id(w): Aggregate() for w in windows}
    for rec in records:
        w = window_of(rec, windows)
        if w is None:
            continue
        if rec.timing is not None:
            aggregates[id(w)].add(rec.timing)
        else:
            aggregates[id(w)].fail(rec.reason or "unknown")
    return [
        StepResult(w.step, w.streams, w.measured_s(), aggregates[id(w)], w.server) for w in windows
    ]


@dataclass(frozen=True)
class SLO:
    ttft_ms: float | None
    tpot_ms: float | None
    percentile: float

    def check(self, step: StepResult) -> list[str]:
        """Breaches of this step, as readable lines; empty when the SLO holds."""
        out = []
        for key, limit in (("ttft", self.ttft_ms), ("tpot", self.tpot_ms)):
            if limit is None:
                continue
            values = step.latency_ms(key)
            if not values:
                out.append(f"step {step.step} ({step.streams} streams): no {key.upper()} samples")
                continue
            got = percentile(values, self.percentile)
            if got > limit:
                out.append(
                    f"step {step.step} ({step.streams} streams): p{self.percentile:g} "
                    f"{key.upper()} {got:.2f} ms > SLO {limit:g} ms"
                )
        return out


def step_summary(step: StepResult, slo: SLO | None) -> dict[str, Any]:
    agg = step.aggregate
    n = len(agg.timings)
    window = step.window_s
    out: dict[str, Any] = {
        "step": step.step,
        "streams": step.streams,
        "window_s": round(window, 3),
        "requests": n,
        "failures": dict(sorted(agg.failures.items())),
        "output_tokens_total": sum(t.output_tokens for t in agg.timings),
        "output_tokens_per_s": agg.output_tokens_per_s(window),
        "requests_per_s": n / window if window > 0 else 0.0,
        "output_tokens_per_request": _clean(summarize(t.output_tokens for t in agg.timings)),
        "prompt_tokens_per_request": _clean(
            summarize(t.prompt_tokens for t in agg.timings if t.prompt_tokens is not None)
        ),
    }
    for key in STAT_KEYS:
        out[f"{key}_ms"] = _clean(summarize(step.latency_ms(key)))
    out.update(speculative_summary(step))
    if slo is not None:
        ttft = None if slo.ttft_ms is None else slo.ttft_ms / 1e3
        tpot = None if slo.tpot_ms is None else slo.tpot_ms / 1e3
        out["goodput_rps"] = agg.goodput(window, ttft, tpot)
        breaches = slo.check(step)
        out["slo_passed"] = not breaches
        out["slo_breaches"] = breaches
    return out


def speculative_summary(step: StepResult) -> dict[str, Any]:
    """Where the speed comes from, next to TPOT (glmserve.streaming defines both figures):
    tokens per decode step as the client saw them, and the acceptance length, from each
    request's meta_info where the server sent it (/generate), else SGLang's gauge read as the
    window closed ("server metrics"); None without speculative decoding."""
    agg, server = step.aggregate, step.server or {}
    per_request = agg.accept_length()
    if per_request is not None:
        accept, source = per_request, "meta_info"
    elif "accept_length" in server:
        accept, source = server["accept_length"], "server metrics"
    else:
        accept, source = None, None
    return {
        "tokens_per_step": agg.tokens_per_step(),
        "accept_length": accept,
        "accept_length_source": source,
        "accept_rate": server.get("accept_rate"),
    }


def _clean(summary: Any) -> dict[str, float | int | None]:
    # JSON has no NaN: an empty sample set reports nulls instead.
    return {k: (None if isinstance(v, float) and math.isnan(v) else v)
            for k, v in summary.as_dict().items()}  # fmt: skip


@dataclass
class Collector:
    """Everything one run produced: records (from every process) and the master's windows."""

    records: list[RequestRecord] = field(default_factory=list)
    windows: list[Window] = field(default_factory=list)
    pending: list[RequestRecord] = field(default_factory=list)  # worker side, not yet sent

    def add(self, rec: RequestRecord, *, is_worker: bool = False) -> None:
        (self.pending if is_worker else self.records).append(rec)

    def take_pending(self) -> list[list[Any]]:
        rows = [r.to_wire() for r in self.pending]
        self.pending = []
        return rows

    def add_wire(self, rows: list[list[Any]]) -> None:
        self.records.extend(RequestRecord.from_wire(r) for r in rows)

    def phase(self, step: int, streams: int, phase: str, at: float) -> None:
        current = self.windows[-1] if self.windows else None
        if current is None or current.step != step:
            if current is not None and current.end is None:
                current.end = at
            current = Window(step, streams, at)
            self.windows.append(current)
        if phase == "measure" and current.measure_start is None:
            current.measure_start = at

    def clear(self) -> None:
        self.records.clear()
        self.windows.clear()
        self.pending.clear()

    def close(self, at: float) -> None:
        if self.windows and self.windows[-1].end is None:
            self.windows[-1].end = at

    def steps(self) -> list[StepResult]:
        return split_steps(self.windows, self.records)

    def step_of(self, rec: RequestRecord) -> int | None:
        """The step `rec` counts in (the same rule as steps()), None if in no measurement."""
        w = window_of(rec, self.windows)
        return None if w is None else w.step

    def failures_total(self) -> dict[str, int]:
        out: dict[str, int] = {}
        for rec in self.records:
            if rec.timing is None:
                out[rec.reason or "unknown"] = out.get(rec.reason or "unknown", 0) + 1
        return dict(sorted(out.items()))
