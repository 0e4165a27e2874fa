"""Load shapes as small stage tables; `LoadTestShape.tick()` only looks the time up.

A stage is one concurrency level: `warmup_s` to let the new streams reach steady state, then
`measure_s` of measurement. The table is data, so tests check it (and tick) without Locust.
"""

from __future__ import annotations

import math
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass

from locust import LoadTestShape

from glmserve.loadtest.options import LoadTestOptions


@dataclass(frozen=True)
class Stage:
    streams: int
    warmup_s: float
    measure_s: float  # math.inf: until stopped

    @property
    def duration_s(self) -> float:
        return self.warmup_s + self.measure_s


@dataclass(frozen=True)
class Tick:
    """Where a run is at one moment: the stage index, its phase, and the users to hold."""

    step: int
    phase: str  # "warmup" | "measure"
    users: int
    spawn_rate: float


def sweep_levels(max_streams: int) -> list[int]:
    """1, 2, 4, ... up to max_streams, ending exactly on max_streams."""
    levels, n = [], 1
    while n < max_streams:
        levels.append(n)
        n *= 2
    levels.append(max_streams)
    return levels


def plan(shape: str, streams: int, warmup_s: float, measure_s: float) -> list[Stage]:
    measure = math.inf if measure_s == 0 else measure_s
    if shape == "single":
        return [Stage(1, warmup_s, measure)]
    if shape == "concurrent":
        return [Stage(streams, warmup_s, measure)]
    if shape == "sweep":
        return [Stage(n, warmup_s, measure_s) for n in sweep_levels(streams)]
    raise ValueError(f"unknown shape {shape!r}")


def tick_at(stages: Sequence[Stage], run_time: float) -> Tick | None:
    """The tick for `run_time` seconds into the run; None once every stage is over."""
    start = 0.0
    for i, stage in enumerate(stages):
        end = start + stage.duration_s
        if run_time < end:
            phase = "warmup" if run_time < start + stage.warmup_s else "measure"
            # Ramp a step's new streams within about a second: the warm-up absorbs the burst.
            return Tick(i, phase, stage.streams, float(max(stage.streams, 1)))
        start = end
    return None


class DecodeShape(LoadTestShape):
    """Drives the run from the options' stage table and tells the session about phase changes.

    Locust calls tick() about once a second on the master (or the only process). The phase
    change is reported with the wall time at which it was observed, and the session uses those
    times as the measurement windows, so a late tick only shortens a window, never blurs it.
    """

    # -u/--users is the stream count: read it instead of Locust warning that it is ignored.
    use_common_options = True

    def __init__(self) -> None:
        super().__init__()
        self._stages: list[Stage] | None = None
        self._last: tuple[int, str] | None = None
        self.on_phase: Callable[[Tick, float], None] | None = None
        self.on_end: Callable[[float], None] | None = None
        self.on_reset: Callable[[], None] | None = None
        self.wall: Callable[[], float] = time.time

    def configure(self, options: LoadTestOptions) -> None:
        self._stages = plan(options.shape, options.streams, options.warmup_s, options.measure_s)
        self._last = None

    @property
    def stages(self) -> list[Stage]:
        if self._stages is None:
            raise RuntimeError("DecodeShape.configure() was not called (plugin not registered?)")
        return self._stages

    def reset_time(self) -> None:
        # Locust calls this when a shape run starts (each start in the web UI, too).
        super().reset_time()
        self._last = None
        if self.on_reset is not None:
            self.on_reset()

    def tick(self) -> tuple[int, float] | None:
        now = self.get_run_time()
        current = tick_at(self.stages, now)
        if current is None:
            if self._last is not None and self.on_end is not None:
                self.on_end(self.wall())
            self._last = None
            return None
        key = (current.step, current.phase)
        if key != self._last:
            self._last = key
            if self.on_phase is not None:
                self.on_phase(current, self.wall())
        return current.users, current.spawn_rate
