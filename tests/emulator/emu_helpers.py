"""SSE helpers for the emulator tests (a uniquely named module: several test folders have a
conftest.py, so importing helpers from `conftest` would be ambiguous)."""

from __future__ import annotations

import json
from typing import Any

from glmserve.streaming import SSEDecoder


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
