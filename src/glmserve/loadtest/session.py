"""One run's state in one Locust process: options, prompts, records and windows; and the lookup
from a Locust Environment to its Session (the plugin attaches it, the users find it)."""

from __future__ import annotations

import itertools
import logging
import time
import weakref
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

from glmserve.loadtest.options import LoadTestOptions
from glmserve.loadtest.results import Collector, RequestRecord
from glmserve.loadtest.stages import Tick
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
    # Reads the server's own figures as a measured window closes (set on the master when the
    # target runs MTP: its acceptance gauges); None: nothing to read.
    server_sampler: Callable[[], dict[str, float] | None] | None = None
    _ids: itertools.count = field(default_factory=itertools.count)

    def next_stream_id(self) -> int:
        return next(self._ids)

    def record_success(self, started_at: float, timing: StreamTiming) -> None:
        rec = RequestRecord(started_at, started_at + timing.e2e_s, timing)
        self.collector.add(rec, is_worker=self.is_worker)

    def record_failure(self, started_at: float, ended_at: float, reason: str) -> None:
        self.collector.add(
            RequestRecord(started_at, ended_at, None, reason), is_worker=self.is_worker
        )

    def on_phase(self, tick: Tick, at: float, environment: Any) -> None:
        log.info("step %d: %d streams, %s", tick.step, tick.users, tick.phase)
        windows = self.collector.windows
        if windows and windows[-1].step != tick.step:
            self.sample_server()  # the step's window closes now
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
        """The run's last window closes (end of the shape, a stop, quitting)."""
        self.sample_server()
        self.collector.close(at)


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
