"""Deadline-driven timing, queueing above --max-concurrency, and aborts on disconnect.

Timing rules are checked on the engine with an injected clock (no wall-clock asserts); the
measured accuracy from outside is bench/emulator_accuracy.py's job.
"""

from __future__ import annotations

import asyncio
import itertools
import random
import socket
import time
from urllib.parse import urlsplit

import httpx
import pytest

from glmserve.emulator.config import EmulatorConfig
from glmserve.emulator.costmodel import DecodeCostModel
from glmserve.emulator.engine import Engine, GenRequest
from glmserve.emulator.metrics import MetricsState
from glmserve.testing.emulator import emulator_thread


class FakeClock:
    def __init__(self) -> None:
        self.t = 1000.0

    def __call__(self) -> float:
        return self.t


def run_engine(config: EmulatorConfig, n: int, lateness: list[float]) -> tuple[list, list, Engine]:
    """Generate n tokens; every sleep overshoots its deadline by the next lateness value."""
    clock = FakeClock()
    engine = Engine(config, MetricsState(model_name="m"), clock=clock)
    deadlines: list[float] = []
    late = iter(lateness)

    async def fake_sleep_until(deadline: float) -> None:
        deadlines.append(deadline)
        clock.t = max(clock.t, deadline) + next(late, 0.0)

    engine._sleep_until = fake_sleep_until  # type: ignore[method-assign]

    async def main() -> list:
        req = GenRequest(prompt_tokens=10, output_tokens=n, finish="length")
        return [b async for b in engine.generate(req)]

    return asyncio.run(main()), deadlines, engine


@pytest.mark.parametrize("k", [1, 3, 4])
def test_deadlines_are_absolute_and_late_wakeups_do_not_accumulate(k):
    """Token e >= 1 is due at t_first + e*tpot (t_first: when token 0 really left), whatever
    the later wake-ups' lateness; a chunk is sent when its last token is due."""
    cfg = EmulatorConfig(tpot_ms=20.0, ttft_ms=200.0, tokens_per_chunk=k)
    rng = random.Random(7)
    lateness = [rng.uniform(0, 0.015) for _ in range(100)]
    n = 11
    batches, deadlines, _ = run_engine(cfg, n, lateness)
    t_admit = 1000.0
    ends = [0, *range(k, n - 1, k), n - 1] if (n - 1) % k else [0, *range(k, n, k)]
    # later tokens count from the first token's real departure (deadline + its lateness)
    t_first = t_admit + 0.2 + lateness[0]
    expected = [t_admit + 0.2] + [t_first + e * 0.02 for e in ends[1:]]
    assert deadlines == pytest.approx(expected, abs=1e-9)
    assert [b.new_tokens for b in batches] == [1] + [e2 - e1 for e1, e2 in itertools.pairwise(ends)]
    assert batches[-1].completion_tokens == n and batches[-1].finished


def test_zero_token_request_finishes_at_ttft():
    batches, deadlines, engine = run_engine(EmulatorConfig(tpot_ms=5, ttft_ms=50), 0, [])
    assert [(b.new_tokens, b.finished) for b in batches] == [(0, True)]
    assert deadlines == [pytest.approx(1000.05)]
    assert not engine.running


def test_cost_model_lengthens_steps_with_active_tokens():
    """With a cost model, one step = tpot + layers * per-layer cost of the active tokens."""
    base = EmulatorConfig(tpot_ms=10.0, ttft_ms=0.0)
    engines = {}
    for mode in ("off", "bf16", "patched", "upstream"):
        cfg = EmulatorConfig(tpot_ms=10.0, ttft_ms=0.0, cost_model=DecodeCostModel(mode=mode))
        e = Engine(cfg, MetricsState(model_name="m"), clock=FakeClock())
        e.used_tokens = 448_000
        engines[mode] = e.step_s()
    assert engines["off"] == pytest.approx(base.tpot_s)
    assert engines["off"] < engines["bf16"] < engines["patched"] < engines["upstream"]
    # 78 layers x (1087 us lab value at 64 x 7000) ~ 84.8 ms on top of tpot
    assert engines["upstream"] - base.tpot_s == pytest.approx(78 * 1087e-6, rel=0.02)


def _raw_request(url: str, body: bytes) -> socket.socket:
    parts = urlsplit(url)
    sock = socket.create_connection((parts.hostname, parts.port), timeout=10)
    sock.sendall(
        b"POST /v1/chat/completions HTTP/1.1\r\nHost: x\r\nContent-Type: application/json\r\n"
        + f"Content-Length: {len(body)}\r\n\r\n".encode()
        + body
    )
    return sock


def wait_for(cond, timeout: float = 10.0) -> None:
    """Poll a condition (a readiness wait, not a timing assertion)."""
    deadline = time.monotonic() + timeout
    while not cond():
        if time.monotonic() > deadline:
            raise AssertionError("condition not reached")
        time.sleep(0.01)


def metric(url: str, name: str) -> float:
    for line in httpx.get(url + "/metrics", timeout=10).text.splitlines():
        if line.startswith(name + "{"):
            return float(line.rsplit(" ", 1)[1])
    raise KeyError(name)


def test_requests_above_max_concurrency_queue_fcfs_and_show_in_metrics():
    body = (
        b'{"messages":[{"role":"user","content":"q"}],"max_tokens":400,'
        b'"ignore_eos":true,"stream":true}'
    )
    with emulator_thread(tpot_ms=2.0, ttft_ms=1.0, max_concurrency=2) as e:
        socks = [_raw_request(e.url, body) for _ in range(2)]
        wait_for(lambda: len(e.engine.running) == 2)
        socks += [_raw_request(e.url, body) for _ in range(2)]
        wait_for(lambda: len(e.engine.waiting) == 2)
        assert len(e.engine.running) == 2
        # the gauge follows on the scheduler's log cadence (40 decode steps)
        wait_for(lambda: metric(e.url, "sglang:num_queue_reqs") == 2)
        assert metric(e.url, "sglang:num_running_reqs") == 2
        queued = [req for req, _ in e.engine.waiting]
        for s in socks[:2]:  # two running clients hang up: the queued two start, in order
            s.close()
        wait_for(lambda: {r.rid for r in e.engine.running.values()} == {r.rid for r in queued})
        assert not e.engine.waiting
        for s in socks[2:]:
            s.close()
        wait_for(lambda: not e.engine.running)
        assert e.engine.metrics.num_aborted_requests_total == 4
        assert e.engine.used_tokens == 0 and e.engine.reserved_tokens == 0


def test_disconnect_while_queued_leaves_the_queue():
    body = b'{"messages":[{"role":"user","content":"q"}],"max_tokens":500,"ignore_eos":true}'
    with emulator_thread(tpot_ms=2.0, ttft_ms=1.0, max_concurrency=1) as e:
        running = _raw_request(e.url, body)
        wait_for(lambda: len(e.engine.running) == 1)
        queued = _raw_request(e.url, body)
        wait_for(lambda: len(e.engine.waiting) == 1)
        queued.close()
        wait_for(lambda: not e.engine.waiting)
        assert len(e.engine.running) == 1
        running.close()
        wait_for(lambda: not e.engine.running)


def test_pool_reservation_limits_admission():
    """A request whose prompt + output does not fit next to the running ones waits."""
    body = b'{"prompt":"' + b"x" * 400 + b'","max_tokens":300,"ignore_eos":true,"stream":true}'
    with emulator_thread(tpot_ms=2.0, ttft_ms=1.0, max_total_tokens=500) as e:

        def post() -> socket.socket:
            parts = urlsplit(e.url)
            s = socket.create_connection((parts.hostname, parts.port), timeout=10)
            s.sendall(
                b"POST /v1/completions HTTP/1.1\r\nHost: x\r\nContent-Type: application/json\r\n"
                + f"Content-Length: {len(body)}\r\n\r\n".encode()
                + body
            )
            return s

        a = post()
        wait_for(lambda: len(e.engine.running) == 1)
        b = post()
        wait_for(lambda: len(e.engine.waiting) == 1)  # 400 tokens: 2 x 400 > 500
        a.close()
        wait_for(lambda: len(e.engine.running) == 1 and not e.engine.waiting)
        b.close()
        wait_for(lambda: not e.engine.running)
