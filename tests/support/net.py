"""Loopback networking for tests."""

from __future__ import annotations

import socket


def free_port() -> int:
    """A 127.0.0.1 port that was free a moment ago (for servers that need the port up front)."""
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])
