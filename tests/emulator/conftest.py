"""Fixtures for the emulator tests: a fast in-process emulator and an HTTP client."""

from __future__ import annotations

from collections.abc import Iterator

import httpx
import pytest

from glmserve.testing.emulator import RunningEmulator, emulator_thread


@pytest.fixture(scope="module")
def emu() -> Iterator[RunningEmulator]:
    """1 ms per token: protocol tests, not timing tests."""
    with emulator_thread(tpot_ms=1.0, ttft_ms=2.0) as running:
        yield running


@pytest.fixture
def client() -> Iterator[httpx.Client]:
    with httpx.Client(timeout=30) as c:
        yield c
