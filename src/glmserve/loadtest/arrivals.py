"""Open-loop arrivals: when requests are due, and which of them went out on time (no Locust).

A closed-loop user sends its next request when its last one ends, so a slow server slows the
load down and queueing never shows. Open loop decouples the two: arrivals follow a schedule of
their own (constant, Poisson or bursty gamma gaps at `rate` requests/s, seeded), and Locust's
users are only *senders* that take the next due arrival. An arrival whose time passed while
every sender was busy is not sent late: it is counted as `missed` (a client shortfall the
report shows), so the arrivals that were sent still follow the schedule.

Time here is a monotonic clock in seconds (the caller's), so tests drive it by hand.
"""

from __future__ import annotations

import math
import random
from collections.abc import Callable, Iterator
from dataclasses import dataclass

ARRIVALS = ("poisson", "constant", "gamma")
# An arrival taken later than this after its due time was not sent on time: it is missed, not
# sent late. Wide enough for a busy gevent hub's wake-up jitter (a few ms at thousands of
# events/s, docs/loadtest.md), far below any TTFT worth measuring.
MAX_SEND_LAG_S = 0.05


def gaps(kind: str, rate: float, rng: random.Random, burstiness: float = 1.0) -> Iterator[float]:
    """Inter-arrival gaps (s) with mean 1/rate.

    constant: exactly 1/rate. poisson: exponential (coefficient of variation 1). gamma: shape
    `burstiness`, scale 1/(rate*burstiness), so the mean stays 1/rate and the coefficient of
    variation is 1/sqrt(burstiness): below 1 burstier than Poisson, 1 is Poisson (vLLM's
    --burstiness has the same meaning).
    """
    if not (rate > 0 and math.isfinite(rate)):
        raise ValueError(f"rate must be > 0 and finite, got {rate}")
    mean = 1.0 / rate
    if kind == "constant":
        while True:
            yield mean
    elif kind == "poisson":
        while True:
            yield rng.expovariate(rate)
    elif kind == "gamma":
        if not burstiness > 0:
            raise ValueError(f"burstiness must be > 0, got {burstiness}")
        while True:
            yield rng.gammavariate(burstiness, mean / burstiness)
    else:
        raise ValueError(f"unknown arrival process {kind!r} (one of {', '.join(ARRIVALS)})")


def offsets(
    kind: str, rate: float, seed: int | str | None, burstiness: float = 1.0
) -> Iterator[float]:
    """Offsets (s from the step's start) of the step's arrivals, in order, without end.

    A constant process starts half a gap in, so a window of whole seconds holds exactly
    rate x seconds arrivals; a random one starts with a random gap. The same seed gives the
    same arrivals, so a run can be replayed arrival for arrival.
    """
    rng = random.Random(seed)
    it = gaps(kind, rate, rng, burstiness)
    t = 0.5 / rate if kind == "constant" else next(it)
    while True:
        yield t
        t += next(it)


@dataclass(frozen=True)
class Slot:
    """One arrival handed to a sender: its index in the step and when it is due (clock s)."""

    index: int
    due: float


class Dispatcher:
    """Hands a step's arrivals to senders in order, and counts those nobody could send.

    `claim(now)` gives the next arrival not yet taken (its sender then sleeps until it is due);
    one already more than `max_lag_s` overdue when a sender comes for it is skipped and
    reported to `on_missed` instead. `close(now)` ends the step: arrivals due by then that were
    never taken are missed too (every sender was busy to the end); later ones belong to no step.
    """

    def __init__(
        self,
        start: float,
        arrivals: Iterator[float],
        on_missed: Callable[[int, float], None],
        max_lag_s: float = MAX_SEND_LAG_S,
    ) -> None:
        self.start = start  # clock time of offset 0
        self.max_lag_s = max_lag_s
        self.on_missed = on_missed
        self.closed_at: float | None = None
        self._arrivals = arrivals
        self._index = 0
        self._next_due = start + next(arrivals)

    def _pop(self) -> Slot:
        slot = Slot(self._index, self._next_due)
        self._index += 1
        self._next_due = self.start + next(self._arrivals)
        return slot

    def claim(self, now: float) -> Slot | None:
        """The next arrival to send, or None once the step is closed."""
        while self.closed_at is None:
            slot = self._pop()
            if now - slot.due <= self.max_lag_s:
                return slot
            self.on_missed(slot.index, slot.due)
        return None

    def still_open_for(self, slot: Slot) -> bool:
        """Whether a claimed slot may still be sent: its step has not ended before it was due.
        A slot due before the close but not sent by then counts as missed."""
        if self.closed_at is None or slot.due > self.closed_at:
            return self.closed_at is None
        self.on_missed(slot.index, slot.due)
        return False

    def close(self, now: float) -> None:
        if self.closed_at is not None:
            return
        while self._next_due <= now:
            slot = self._pop()
            self.on_missed(slot.index, slot.due)
        self.closed_at = now


def sweep_rates(sync_rps: float, max_rps: float, count: int) -> list[float]:
    """`count` rates evenly spaced strictly between the synchronous and the throughput rate
    (GuideLLM's sweep: synchronous, throughput, then rates in between). Empty when the two
    measured rates leave no room (the server is no faster with more streams)."""
    if count < 1 or not (sync_rps > 0 and max_rps > sync_rps):
        return []
    step = (max_rps - sync_rps) / (count + 1)
    return [sync_rps + step * (i + 1) for i in range(count)]
