"""Canary: timings come from glmserve.streaming; every failure is counted with its reason."""

from __future__ import annotations

import itertools

import httpx
import pytest
from prometheus_client import CollectorRegistry
from support.exporter import StepClock, broken_body, mock_client
from support.sse import chat_events

from glmserve.exporter.canary import (
    SGLANG_ITL_BUCKETS,
    TPOT_BUCKETS,
    TPOT_SLO_S,
    Canary,
    CanaryMetrics,
    canary_overhead,
)
from glmserve.streaming import FAILURE_REASONS, StreamRequest

TARGET = "http://127.0.0.1:30000"


def make_canary(handler, n_tokens: int = 8) -> tuple[Canary, CollectorRegistry]:
    registry = CollectorRegistry()
    canary = Canary(
        TARGET,
        StreamRequest(max_tokens=n_tokens),
        CanaryMetrics(registry),
        mock_client(handler),
        clock=StepClock(0.005),
        wall_clock=lambda: 1_700_000_000.0,
    )
    return canary, registry


def sample(registry: CollectorRegistry, name: str, **labels: str) -> float:
    value = registry.get_sample_value(name, labels)
    assert value is not None, f"{name}{labels} is not exported"
    return value


def test_success_records_request_level_tpot_from_usage_counts():
    """Three tokens per chunk still give TPOT per *token*: counts come from usage."""
    events = chat_events(9, tokens_per_chunk=3)
    canary, reg = make_canary(lambda req: httpx.Response(200, content=iter(events)), 9)
    assert canary.run_once() is None
    # Each chunk costs two clock steps (feed + deadline check) = 10 ms; token chunks 2..3 come
    # 20 ms after chunk 1 and carry 6 tokens after the first 3, so TPOT = 20 ms / 8 tokens.
    assert sample(reg, "glmserve_canary_tpot_seconds_sum") == pytest.approx(0.020 / 8)
    assert sample(reg, "glmserve_canary_tpot_seconds_count") == 1
    assert sample(reg, "glmserve_canary_itl_seconds_count") == 8
    assert sample(reg, "glmserve_canary_output_tokens_total") == 9
    assert sample(reg, "glmserve_canary_decode_tokens_per_second") == pytest.approx(400.0)
    assert sample(reg, "glmserve_canary_last_success_timestamp_seconds") == 1_700_000_000.0
    assert sample(reg, "glmserve_canary_requests_total") == 1
    for reason in FAILURE_REASONS:
        assert sample(reg, "glmserve_canary_failures_total", reason=reason) == 0


def test_ttft_skips_the_role_only_ack_chunk():
    """TTFT ends at the first token-carrying event, not at the role chunk (the ack)."""
    events = chat_events(4)
    canary, reg = make_canary(lambda req: httpx.Response(200, content=iter(events)), 4)
    canary.run_once()
    # t0 at step 2 (deadline, t0); ack at step 3 (role chunk); first token at step 5.
    assert sample(reg, "glmserve_canary_ttft_seconds_sum") == pytest.approx(0.015)


def test_request_is_fixed_length_with_ignore_eos_and_usage():
    seen: list[dict] = []

    def handler(req: httpx.Request) -> httpx.Response:
        import json

        seen.append(json.loads(req.content))
        return httpx.Response(200, content=iter(chat_events(4)))

    canary, _ = make_canary(handler, 4)
    canary.run_once()
    body = seen[0]
    assert body["ignore_eos"] is True and body["max_tokens"] == 4 and body["stream"] is True
    assert body["stream_options"]["include_usage"] is True


def _raise(exc: Exception):
    def handler(req: httpx.Request) -> httpx.Response:
        raise exc

    return handler


@pytest.mark.parametrize(
    ("handler", "reason"),
    [
        (_raise(httpx.ConnectError("refused")), "connect"),
        (_raise(httpx.ReadTimeout("slow")), "timeout"),
        (lambda req: httpx.Response(503, text="overloaded"), "http_status"),
        (
            lambda req: httpx.Response(200, content=iter(broken_body(chat_events(8), 3))),
            "broken_stream",
        ),
        (
            lambda req: httpx.Response(200, content=iter(chat_events(8)[:4])),
            "broken_stream",
        ),
        (
            lambda req: httpx.Response(200, content=iter([b"data: {oops\n\n"])),
            "malformed_sse",
        ),
        (
            lambda req: httpx.Response(
                200, content=iter([b'data: {"choices": "x"}\n\n', b"data: [DONE]\n\n"])
            ),
            "malformed_sse",
        ),
        (
            lambda req: httpx.Response(
                200, content=iter([b'data: {"error": {"message": "x"}}\n\n'])
            ),
            "stream_error",
        ),
        (_raise(httpx.WriteError("pipe")), "broken_stream"),
    ],
)
def test_each_failure_is_counted_under_its_reason(handler, reason):
    canary, reg = make_canary(handler)
    assert canary.run_once() == reason
    assert sample(reg, "glmserve_canary_failures_total", reason=reason) == 1
    others = [r for r in FAILURE_REASONS if r != reason]
    assert all(sample(reg, "glmserve_canary_failures_total", reason=r) == 0 for r in others)
    assert sample(reg, "glmserve_canary_tpot_seconds_count") == 0
    assert sample(reg, "glmserve_canary_last_success_timestamp_seconds") == 0


def test_failure_then_recovery_without_restart():
    """A down target is a counted failure; the next probe after it returns succeeds."""
    state = {"down": True}

    def handler(req: httpx.Request) -> httpx.Response:
        if state["down"]:
            raise httpx.ConnectError("refused")
        return httpx.Response(200, content=iter(chat_events(4)))

    canary, reg = make_canary(handler, 4)
    assert canary.run_once() == "connect"
    state["down"] = False
    assert canary.run_once() is None
    assert sample(reg, "glmserve_canary_tpot_seconds_count") == 1
    assert sample(reg, "glmserve_canary_requests_total") == 2


def test_slo_is_an_exact_bucket_boundary_and_buckets_are_fine_enough():
    """SLO attainment is a bucket ratio; adjacent bounds differ by <= 5 % in 10..200 ms."""
    assert TPOT_SLO_S in TPOT_BUCKETS and TPOT_SLO_S in SGLANG_ITL_BUCKETS
    assert list(TPOT_BUCKETS) == sorted(set(TPOT_BUCKETS))
    pairs = [(a, b) for a, b in itertools.pairwise(TPOT_BUCKETS) if 0.010 <= a < 0.2]
    assert len(pairs) > 50 and all(b / a <= 1.05 + 1e-9 for a, b in pairs)
    assert all(b / a <= 1.025 + 1e-9 for a, b in pairs if 0.020 <= a < 0.040)
    # The le label is the float's repr: it must read as the intended decimal.
    assert all(len(repr(b)) <= 6 for b in TPOT_BUCKETS), [
        b for b in TPOT_BUCKETS if len(repr(b)) > 6
    ]


def test_default_canary_overhead_is_under_one_percent_of_decode_slots():
    """64 tokens every 15 s at 20 ms TPOT + 0.5 s TTFT on 48 slots (SGLang's smallest default)."""
    share = canary_overhead(15.0, 64, 0.020, 0.5, 48)
    assert share == pytest.approx((0.5 + 63 * 0.020) / 15.0 / 48)
    assert share < 0.01
    # A slow server or a single slot is where it would not hold: the formula must show that.
    assert canary_overhead(15.0, 64, 0.250, 2.0, 1) == pytest.approx(1.0)
