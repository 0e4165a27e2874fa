"""Loopback networking for tests."""

from __future__ import annotations

from glmserve.serverproc import free_port

__all__ = ["free_port"]
