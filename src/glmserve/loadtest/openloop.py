"""One process's open-loop ledger: the current step's arrivals, what the senders did with them,
and what a step's arrivals say (rate achieved, send lag, whether the queue grew). No Locust.

Every arrival ends as one ArrivalRecord: sent (with its send lag, the time from its due time
to the moment the request went out) or missed (no sender was free within MAX_SEND_LAG_S).
`in_flight` is how many of this process's requests were outstanding at that moment: below
capacity it hovers around rate x latency; above capacity it climbs for as long as the step
lasts, which is how the report tells "the server keeps up" from "the queue grows".
"""

from __future__ import annotations

import math
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Any

from glmserve.loadtest.arrivals import MAX_SEND_LAG_S, Dispatcher, Slot, offsets
from glmserve.streaming import summarize


@dataclass(frozen=True)
class ArrivalRecord:
    step: int
    due_at: float  # wall clock, s
    lag_s: float | None  # None: missed (not sent)
    in_flight: int  # this process's outstanding requests when it was sent or missed


class OpenLoop:
    """The arrivals of the step being run, and the record of every arrival so far."""

    def __init__(
        self,
        kind: str,
        seed: int | str,
        burstiness: float = 1.0,
        *,
        max_lag_s: float = MAX_SEND_LAG_S,
        clock: Callable[[], float] = time.perf_counter,
        wall: Callable[[], float] = time.time,
    ) -> None:
        self.kind, self.seed, self.burstiness = kind, seed, burstiness
        self.max_lag_s = max_lag_s
        self.clock, self.wall = clock, wall
        self.records: list[ArrivalRecord] = []
        self.in_flight = 0
        self.step: int | None = None
        self.rate: float | None = None
        self.dispatcher: Dispatcher | None = None
        self._wall_minus_clock = 0.0

    def begin(self, step: int, rate: float) -> None:
        """Start a step's arrivals now (the previous step's, if any, end here)."""
        self.end()
        now = self.clock()
        self._wall_minus_clock = self.wall() - now
        self.step, self.rate = step, rate
        # One seed per step: each step's arrivals are reproducible on their own.
        arrivals = offsets(self.kind, rate, f"{self.seed}:{step}", self.burstiness)
        self.dispatcher = Dispatcher(now, arrivals, self._missed, self.max_lag_s)

    def end(self) -> None:
        """Close the current step: arrivals due by now that nobody took are missed."""
        if self.dispatcher is not None:
            self.dispatcher.close(self.clock())
            self.dispatcher = None

    def claim(self) -> tuple[Dispatcher, Slot] | None:
        d = self.dispatcher
        if d is None:
            return None
        slot = d.claim(self.clock())
        return None if slot is None else (d, slot)

    def send(self, dispatcher: Dispatcher, slot: Slot) -> bool:
        """Called by the sender at the moment it sends `slot`'s request: False when its step
        ended meanwhile (do not send). The request counts as in flight until done()."""
        if not dispatcher.still_open_for(slot):
            return False
        lag = max(0.0, self.clock() - slot.due)
        self.records.append(self._record(slot.due, lag))
        self.in_flight += 1
        return True

    def done(self) -> None:
        self.in_flight -= 1

    def clear(self) -> None:
        self.end()
        self.records.clear()

    def _missed(self, index: int, due: float) -> None:
        self.records.append(self._record(due, None))

    def _record(self, due: float, lag: float | None) -> ArrivalRecord:
        assert self.step is not None
        return ArrivalRecord(self.step, due + self._wall_minus_clock, lag, self.in_flight)


# The queue grows when this process's outstanding requests rise by more than this share of the
# offered rate (requests/s per s), and by more than NOISE_REQUESTS + a quarter of the mean in
# flight over the window: a stable queue's count wanders, a growing one climbs steadily
# (above capacity it climbs at rate - capacity, e.g. 0.75 x rate at four times capacity).
GROWTH_SHARE_OF_RATE = 0.05
NOISE_REQUESTS = 4.0
# Once every sender is busy the count cannot climb any more, and arrivals are turned away
# instead: more than this share of them missed is the same verdict.
MISSED_SHARE_OVERLOADED = 0.25


def growth_per_s(records: Sequence[ArrivalRecord]) -> float:
    """Least-squares slope of in-flight requests over time (requests per second)."""
    if len(records) < 3:
        return 0.0
    ts = [r.due_at for r in records]
    ys = [float(r.in_flight) for r in records]
    t_mean, y_mean = sum(ts) / len(ts), sum(ys) / len(ys)
    var = sum((t - t_mean) ** 2 for t in ts)
    if var <= 0:
        return 0.0
    return sum((t - t_mean) * (y - y_mean) for t, y in zip(ts, ys, strict=True)) / var


def arrival_summary(
    records: Sequence[ArrivalRecord],
    step: int,
    measure_start: float,
    end: float,
    rate: float,
    senders: int | None = None,
) -> dict[str, Any]:
    """What a step's arrivals did in its measured window [measure_start, end]."""
    mine = [r for r in records if r.step == step and measure_start <= r.due_at <= end]
    window = max(0.0, end - measure_start)
    sent = [r for r in mine if r.lag_s is not None]
    missed = len(mine) - len(sent)
    slope = growth_per_s(mine)
    mean_in_flight = sum(r.in_flight for r in mine) / len(mine) if mine else 0.0
    grows = missed > MISSED_SHARE_OVERLOADED * len(mine) or (
        slope > GROWTH_SHARE_OF_RATE * rate
        and slope * window > NOISE_REQUESTS + 0.25 * mean_in_flight
    )
    lags = summarize(r.lag_s * 1e3 for r in sent if r.lag_s is not None)
    first = mine[: max(1, len(mine) // 10)]
    last = mine[-max(1, len(mine) // 10) :]
    return {
        "rate_rps": rate,
        "senders": senders,
        "scheduled": len(mine),
        "sent": len(sent),
        "missed": missed,
        "arrival_rps": len(sent) / window if window > 0 else 0.0,
        "send_lag_ms": {
            k: (None if isinstance(v, float) and math.isnan(v) else v)
            for k, v in lags.as_dict().items()
        },
        "in_flight": {
            "first_tenth_mean": _mean(r.in_flight for r in first) if mine else None,
            "last_tenth_mean": _mean(r.in_flight for r in last) if mine else None,
            "mean": mean_in_flight,
            "growth_per_s": slope,
        },
        "queue_grows": grows,
    }


def _mean(values: Any) -> float:
    vals = list(values)
    return sum(vals) / len(vals) if vals else math.nan


def capacity_line(step_label: str, summary: dict[str, Any]) -> str | None:
    """One line for a step above the server's capacity (its queue grew), or whose arrivals
    found every sender busy; None for a step that kept up."""
    f, missed = summary["in_flight"], summary["missed"]
    senders = summary.get("senders")
    busy = (
        f"{missed} of {summary['scheduled']} arrivals found all "
        f"{senders if senders is not None else ''} senders busy".replace("  ", " ")
    )
    if summary.get("queue_grows"):
        detail = (
            f"requests in flight grew {f['first_tenth_mean']:.0f} -> {f['last_tenth_mean']:.0f}"
            f" ({f['growth_per_s']:+.2f}/s)" + (f", {busy}" if missed else "")
        )
        return (
            f"{step_label}: above capacity at {summary['rate_rps']:.3g} requests/s: the queue "
            f"grows ({detail}); latencies of this step keep rising with its length"
        )
    if missed:
        return (
            f"{step_label}: {busy} (-u): they were not sent, the others kept their schedule; "
            "raise -u, or the rate is near what the server sustains"
        )
    return None
