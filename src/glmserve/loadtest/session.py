"""One run's state in one Locust process: options, prompts, records and windows; and the lookup
from a Locust Environment to its Session (the plugin attaches it, the users find it)."""

from __future__ import annotations

import itertools
import logging
import time
import weakref
from collections.abc import Callable
from dataclasses import dataclass, field, replace
from typing import Any

from glmserve.loadtest.openloop import OpenLoop
from glmserve.loadtest.options import LoadTestOptions
from glmserve.loadtest.results import Collector, RequestRecord
from glmserve.loadtest.stages import Stage, StagePlayer, Tick
from glmserve.loadtest.workload import Workload
from glmserve.streaming import StreamTiming

log = logging.getLogger(__name__)


@dataclass
class Session:
    """State of one Locust run in this process (kept per Environment, never module-global)."""

    options: LoadTestOptions
    is_worker: bool = False
    prompts: list[str] | None = None
    collector: Collector = field(default_factory=Collector)
    server: dict[str, Any] | None = None
    started_at: float = field(default_factory=time.time)
    # How the run ended when it did not run every step: set by the plugin ("SIGTERM") or from
    # the shape's player (--run-time, or stopped before its end: Ctrl-C, a web-UI stop).
    stopped_by: str | None = None
    complete: bool = True
    # Request contents (lengths, datasets, conversations); None: PromptSource per user.
    workload: Workload | None = None
    # The arrivals of open-loop steps (set by the plugin when a step has a rate).
    open_loop: OpenLoop | None = None
    player: StagePlayer | None = None  # the shape's steps, rates decided as the run goes
    # Reads the server's own figures as a measured window closes (set on the master when the
    # target runs MTP: its acceptance gauges); None: nothing to read.
    server_sampler: Callable[[], dict[str, float] | None] | None = None
    _ids: itertools.count = field(default_factory=itertools.count)

    def next_stream_id(self) -> int:
        return next(self._ids)

    @property
    def stages(self) -> list[Stage]:
        return self.player.stages if self.player is not None else []

    def record_success(
        self, started_at: float, timing: StreamTiming, turn: int | None = None
    ) -> None:
        rec = RequestRecord(started_at, started_at + timing.e2e_s, timing, turn=turn)
        self.collector.add(rec, is_worker=self.is_worker)

    def record_failure(self, started_at: float, ended_at: float, reason: str) -> None:
        self.collector.add(
            RequestRecord(started_at, ended_at, None, reason), is_worker=self.is_worker
        )

    def on_phase(self, tick: Tick, at: float, environment: Any) -> None:
        if tick.rate is None:
            log.info("step %d: %d streams, %s", tick.step, tick.users, tick.phase)
        else:
            log.info("step %d: %.3g requests/s, %d senders, %s", tick.step, tick.rate, tick.users,
                     tick.phase)  # fmt: skip
        windows = self.collector.windows
        current = windows[-1].step if windows else None
        if windows and current != tick.step:
            self.sample_server()  # the step's window closes now
        if self.open_loop is not None and tick.step != current:
            # A step's arrivals start with its first tick (its warm-up, or its measurement when
            # --warmup-s is 0) and end where the next step begins.
            if tick.rate is None:
                self.open_loop.end()
            else:
                self.open_loop.begin(tick.step, tick.rate)
        self.collector.phase(tick.step, tick.users, tick.phase, at)
        if tick.phase == "measure" and environment.runner is not None:
            # Locust's own table then shows this step's steady state only.
            environment.runner.stats.reset_all()

    def sample_server(self) -> None:
        """Record the server's figures on the open window, if it has been measured."""
        windows = self.collector.windows
        if self.server_sampler is None or not windows:
            return
        window = windows[-1]
        if window.end is None and window.measure_start is not None:
            window.server = self.server_sampler()

    def close(self, at: float) -> None:
        """The run's last window closes (end of the shape, a stop, quitting), and with it the
        last step's arrivals."""
        if self.open_loop is not None:
            self.open_loop.end()
        self.sample_server()
        self.collector.close(at)

    def resolve_rates(self, stages: list[Stage]) -> list[Stage] | str:
        """A rate sweep's rates, from its measured synchronous and throughput steps (the first
        pass's, so every repeat runs the same rates): glmserve.loadtest.arrivals.sweep_rates.
        Each of the two steps' rate is its streams / mean e2e (Little's law, which holds for
        closed-loop streams with no think time and needs no whole request in the window)."""
        from glmserve.loadtest.arrivals import sweep_rates

        self.sample_server()  # the throughput step ends here
        self.collector.close(time.time())
        measured = {}
        for step in self.collector.steps():
            stage = stages[step.step] if step.step < len(stages) else None
            if (
                stage is None
                or stage.repeat != 0
                or stage.role not in ("synchronous", "throughput")
            ):
                continue
            e2e = [t.e2e_s for t in step.aggregate.timings]
            if e2e:
                measured[stage.role] = stage.streams / (sum(e2e) / len(e2e))
        sync, top = measured.get("synchronous"), measured.get("throughput")
        if sync is None or top is None:
            return "rate sweep: the synchronous or throughput step timed no request, so no rates"
        pending = sorted({s.level for s in stages if s.pending})
        rates = sweep_rates(sync, top, len(pending))
        if not rates:
            return (
                f"rate sweep: throughput ({top:.3g} req/s) is no higher than synchronous "
                f"({sync:.3g} req/s), so there are no rates in between"
            )
        by_level = dict(zip(pending, rates, strict=True))
        log.info("rate sweep: synchronous %.3g req/s, throughput %.3g req/s; rates %s", sync,
                 top, ", ".join(f"{r:.3g}" for r in rates))  # fmt: skip
        return [replace(s, rate=by_level[s.level]) if s.pending else s for s in stages]


# Keyed by the Environment object (weakly: a finished Environment takes its session with it),
# so several runs in one process never share state and nothing is module-global per run.
_SESSIONS: weakref.WeakKeyDictionary[Any, Session] = weakref.WeakKeyDictionary()


def attach(environment: Any, session: Session) -> Session:
    _SESSIONS[environment] = session
    return session


def find_session(environment: Any) -> Session | None:
    """The environment's session, or None (e.g. an Environment built by hand)."""
    return _SESSIONS.get(environment)


def sessions() -> list[tuple[Any, Session]]:
    """Every live (environment, session) pair of this process (Locust's report events name a
    runner's client id, not an environment)."""
    return list(_SESSIONS.items())


def session_of(environment: Any) -> Session:
    """The environment's session; a user started without the plugin is a programming error."""
    session = _SESSIONS.get(environment)
    if session is None:
        raise RuntimeError("glmserve.loadtest.plugin.register() was not called")
    return session
