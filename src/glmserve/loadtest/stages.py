"""Load shapes as small stage tables, and the player that walks one (no Locust import).

A stage is one concurrency level: `warmup_s` to let the new streams reach steady state, then
`measure_s` of measurement. The table is data, so tests check it without Locust (importing
Locust monkey-patches the whole process with gevent, which other code must not inherit).
"""

from __future__ import annotations

import math
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field, replace


@dataclass(frozen=True)
class Stage:
    streams: int  # closed loop: the streams; open loop: the senders (most requests in flight)
    warmup_s: float
    measure_s: float  # math.inf: until stopped
    spawn_rate: float = 0.0  # users/s; 0 = derive from the warm-up (see ramp_rate)
    # Open loop: arrivals per second (glmserve.loadtest.arrivals); None: closed loop;
    # RATE_PENDING: a rate sweep's rate, decided once its first two steps are measured.
    rate: float | None = None
    role: str = ""  # a rate sweep's "synchronous" or "throughput" step
    level: int = 0  # the step's place in one pass of the plan (repeats share levels)
    repeat: int = 0  # which pass (--repeats)

    @property
    def duration_s(self) -> float:
        return self.warmup_s + self.measure_s

    @property
    def pending(self) -> bool:
        return self.rate is not None and math.isnan(self.rate)

    @property
    def label(self) -> str:
        if self.role == "synchronous":
            return "synchronous (1 stream)"
        if self.role == "throughput":
            return f"throughput ({self.streams} streams)"
        if self.rate is not None:
            return "rate pending" if self.pending else f"{self.rate:.3g} req/s"
        return f"{self.streams} stream" + ("" if self.streams == 1 else "s")


RATE_PENDING = math.nan
MAX_SPAWN_RATE = 100


@dataclass(frozen=True)
class Tick:
    """Where a run is at one moment: the stage index, its phase, and the users to hold."""

    step: int
    phase: str  # "warmup" | "measure"
    users: int
    spawn_rate: float
    rate: float | None = None  # open loop: arrivals per second (Stage.rate)


def sweep_levels(max_streams: int) -> list[int]:
    """1, 2, 4, ... up to max_streams, ending exactly on max_streams."""
    levels, n = [], 1
    while n < max_streams:
        levels.append(n)
        n *= 2
    levels.append(max_streams)
    return levels


def ramp_rate(added: int, warmup_s: float) -> float:
    """Start a step's new streams evenly over the first half of its warm-up.

    Streams of equal length that start together stay in lock-step: every request of the step
    would then be sent in the same instant, and the burst (the client building and the server
    parsing 128 requests at once) lands in TTFT. Spread starts keep arrivals spread; with no
    warm-up the streams start at once (about a second).
    """
    if added <= 0:
        return 1.0
    if warmup_s <= 0:
        return float(max(added, 1))
    return max(added / (warmup_s / 2.0), 0.1)


# A sick server fails requests in microseconds, whatever the failure: a refused connect, a 5xx,
# a 200 whose stream is malformed or closed at once (measured before this rule: 4,014 failed
# requests/s from 8 users against malformed SSE, 1,747/s against accept-and-close). Without a
# pause every user retries in a tight loop: a huge report, and the CPU the live streams need.
# So every failure waits twice as long as the one before it in a row, from 0.1 s up to 5 s
# (at most 2 failed requests/s per user over any 10 s); a timed stream resets it.
BACKOFF_FIRST_S = 0.1
BACKOFF_MAX_S = 5.0


def backoff_s(consecutive: int) -> float:
    """Pause after the `consecutive`-th failure in a row (0: none)."""
    if consecutive <= 0:
        return 0.0
    return min(BACKOFF_FIRST_S * 2 ** (consecutive - 1), BACKOFF_MAX_S)


def plan(shape: str, streams: int, warmup_s: float, measure_s: float) -> list[Stage]:
    measure = math.inf if measure_s == 0 else measure_s
    if shape == "single":
        levels, measure = [1], measure
    elif shape == "concurrent":
        levels = [streams]
    elif shape == "sweep":
        levels, measure = sweep_levels(streams), measure_s
    else:
        raise ValueError(f"unknown shape {shape!r}")
    stages, prev = [], 0
    for n in levels:
        stages.append(Stage(n, warmup_s, measure, ramp_rate(n - prev, warmup_s)))
        prev = n
    return stages


def plan_run(
    shape: str,
    streams: int,
    warmup_s: float,
    measure_s: float,
    *,
    rates: Sequence[float] = (),
    senders: int = 1,
    sweep_count: int = 0,
    repeats: int = 1,
) -> list[Stage]:
    """The whole run: one pass of the shape, `repeats` times over (each pass's steps share
    their levels, so the report can put a confidence interval on each level).

    Open loop (`rates` given, or the rate-sweep shape): each rate is one step of `senders`
    users that send arrivals (glmserve.loadtest.arrivals). The rate sweep without rates is
    GuideLLM's: a synchronous step (one stream), a throughput step (`senders` streams, closed
    loop), then `sweep_count` rates between the two, decided once those are measured.
    """
    if shape == "rate-sweep" or rates:
        one = _plan_open(shape, warmup_s, measure_s, rates, senders, sweep_count)
    else:
        one = plan(shape, streams, warmup_s, measure_s)
    one = [replace(stage, level=i) for i, stage in enumerate(one)]
    return [replace(stage, repeat=r) for r in range(max(repeats, 1)) for stage in one]


def _plan_open(
    shape: str,
    warmup_s: float,
    measure_s: float,
    rates: Sequence[float],
    senders: int,
    sweep_count: int,
) -> list[Stage]:
    measure = math.inf if measure_s == 0 else measure_s
    # Senders wait for arrivals, so they all start within a second or two: spreading them
    # (ramp_rate) would only leave early arrivals without a sender. Past 100/s Locust warns
    # that its spawning may misbehave.
    spawn = float(min(max(senders, 1), MAX_SPAWN_RATE))
    if shape != "rate-sweep" or rates:
        return [Stage(senders, warmup_s, measure, spawn, rate=r) for r in rates]
    return [
        Stage(1, warmup_s, measure, ramp_rate(1, warmup_s), role="synchronous"),
        Stage(senders, warmup_s, measure, ramp_rate(senders - 1, warmup_s), role="throughput"),
        *(Stage(senders, warmup_s, measure, spawn, rate=RATE_PENDING) for _ in range(sweep_count)),
    ]


def tick_at(stages: Sequence[Stage], run_time: float) -> Tick | None:
    """The tick for `run_time` seconds into the run; None once every stage is over."""
    start = 0.0
    for i, stage in enumerate(stages):
        end = start + stage.duration_s
        if run_time < end:
            phase = "warmup" if run_time < start + stage.warmup_s else "measure"
            rate = stage.spawn_rate or float(max(stage.streams, 1))
            return Tick(i, phase, stage.streams, rate, stage.rate)
        start = end
    return None


@dataclass
class StagePlayer:
    """Turns run times into Locust ticks and announces each phase change once.

    Phase changes carry the wall time at which they were observed; the measurement windows
    are those times, so a late tick only shortens a window, never blurs two steps together.
    """

    stages: list[Stage]
    on_phase: Callable[[Tick, float], None] | None = None
    on_end: Callable[[float], None] | None = None
    wall: Callable[[], float] = time.time
    # Locust's -t/--run-time: the run ends there even if steps remain (cut_short says so).
    limit_s: float | None = None
    finished: bool = False  # the run reached its end (every step, or the limit)
    cut_short: bool = False  # ... and that end was the limit, with steps left
    reached_last: bool = False  # the last step has begun
    # A rate sweep's pending rates: called with the stages when the first pending step
    # begins; returns the stages with every rate decided, or why the sweep cannot go on.
    resolve: Callable[[list[Stage]], list[Stage] | str] | None = None
    stop_reason: str | None = None  # why the run ended early when it was not --run-time
    _last: tuple[int, str] | None = field(default=None, repr=False)

    def reset(self) -> None:
        self._last = None
        self.finished = self.cut_short = self.reached_last = False
        self.stop_reason = None

    def tick(self, run_time: float) -> tuple[int, float] | None:
        current = tick_at(self.stages, run_time)
        if current is not None and current.rate is not None and math.isnan(current.rate):
            resolved = self.resolve(self.stages) if self.resolve else "no rate for this step"
            if isinstance(resolved, str):
                current, self.cut_short, self.stop_reason = None, True, resolved
            else:
                self.stages = resolved
                current = tick_at(self.stages, run_time)
        if current is not None and self.limit_s is not None and run_time >= self.limit_s:
            current, self.cut_short = None, True
        if current is None:
            self.finished = True
            if self._last is not None and self.on_end is not None:
                self.on_end(self.wall())
            self._last = None
            return None
        self.reached_last = self.reached_last or current.step == len(self.stages) - 1
        key = (current.step, current.phase)
        if key != self._last:
            self._last = key
            if self.on_phase is not None:
                self.on_phase(current, self.wall())
        return current.users, current.spawn_rate
