"""Fixtures for the emulator tests: a fast in-process emulator and an SSE helper."""

from __future__ import annotations

import json
from collections.abc import Iterator
from typing import Any

import httpx
import pytest

from glmserve.emulator.testing import RunningEmulator, emulator_thread
from glmserve.streaming import SSEDecoder


@pytest.fixture(scope="module")
def emu() -> Iterator[RunningEmulator]:
    """1 ms per token: protocol tests, not timing tests."""
    with emulator_thread(tpot_ms=1.0, ttft_ms=2.0) as running:
        yield running


@pytest.fixture
def client() -> Iterator[httpx.Client]:
    with httpx.Client(timeout=30) as c:
        yield c


def sse_events(raw: bytes) -> list[str]:
    """Every `data:` payload, checking the framing: each event is `data: ...\\n\\n`."""
    assert raw.endswith(b"\n\n"), raw[-40:]
    for block in raw.split(b"\n\n")[:-1]:
        assert block.startswith(b"data: "), block[:80]
        assert b"\n" not in block, "one data line per event"
    dec = SSEDecoder()
    return dec.feed(raw)


def json_events(raw: bytes) -> tuple[list[dict[str, Any]], str]:
    events = sse_events(raw)
    return [json.loads(e) for e in events[:-1]], events[-1]
