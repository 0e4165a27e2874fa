"""Test doubles for the exporter: build info, a replayable clock, an httpx mock, and scraping a
running exporter (SSE bodies and the SSE server are in support.sse)."""

from __future__ import annotations

import time
from collections.abc import Callable, Iterator

import httpx
from prometheus_client.parser import text_string_to_metric_families

BUILD_INFO = {
    "sglang_version": "0.5.12.post1",
    "patch_series": "0.5.12.post1",
    "patch_lock_sha256": "ab" * 32,
    "fp8_gather": "on",
    "fp8_attention": "native",
    "fp8_attention_requested": "auto",
    "patch_in_use": "yes",
    "source": "launcher",
}


class StepClock:
    """A perf_counter stand-in that advances a fixed step per call: replayable timings."""

    def __init__(self, step: float = 0.005) -> None:
        self.t = 1000.0
        self.step = step

    def __call__(self) -> float:
        self.t += self.step
        return self.t


def mock_client(handler: Callable[[httpx.Request], httpx.Response]) -> httpx.Client:
    return httpx.Client(transport=httpx.MockTransport(handler))


def broken_body(events: list[bytes], keep: int) -> Iterator[bytes]:
    yield from events[:keep]
    raise httpx.RemoteProtocolError("peer closed connection without sending complete message body")


# --- scraping a running exporter -------------------------------------------------------


def scrape(port: int) -> dict[tuple[str, tuple], float]:
    resp = httpx.get(f"http://127.0.0.1:{port}/metrics", timeout=5)
    resp.raise_for_status()
    out = {}
    for family in text_string_to_metric_families(resp.text):
        for s in family.samples:
            out[(s.name, tuple(sorted(s.labels.items())))] = s.value
    return out


def value(samples: dict, name: str, **labels: str) -> float:
    return samples.get((name, tuple(sorted(labels.items()))), float("nan"))


def wait_for(port: int, cond: Callable[[dict], bool], timeout_s: float = 20.0) -> dict:
    deadline = time.monotonic() + timeout_s
    samples: dict = {}
    while time.monotonic() < deadline:
        samples = scrape(port)
        if cond(samples):
            return samples
        time.sleep(0.05)
    raise AssertionError(f"condition not met within {timeout_s} s; last scrape: {samples}")


def tpot_count(s: dict) -> float:
    return value(s, "glmserve_canary_tpot_seconds_count")


def failures(s: dict, reason: str) -> float:
    return value(s, "glmserve_canary_failures_total", reason=reason)
