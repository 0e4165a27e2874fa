"""What a first-come-first-served server with `servers` slots should have done with a given
sequence of arrivals: the expectation an open-loop load test is checked against.

The emulator admits a request when fewer than --max-concurrency run and holds its slot for a
fixed time (TTFT + (N - 1) x TPOT with its cost model off): an M/D/c queue. Instead of the
M/D/c formulas (an average over all possible arrival sequences), this replays the arrivals the
test actually sent, so the expected waits are those of that very sample path, and a test can
hold the measured TTFT to them tightly.
"""

from __future__ import annotations

import heapq
from collections.abc import Sequence


def fcfs_waits(arrivals: Sequence[float], service_s: float, servers: int) -> list[float]:
    """Each arrival's wait for a free slot (s), in the order given (sorted by time)."""
    if servers < 1:
        raise ValueError("servers must be >= 1")
    free_at = [float("-inf")] * servers  # when each slot frees, as a min-heap
    waits = []
    for t in sorted(arrivals):
        earliest = heapq.heappop(free_at)
        start = max(t, earliest)
        waits.append(start - t)
        heapq.heappush(free_at, start + service_s)
    return waits
