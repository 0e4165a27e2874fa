"""What a missing prerequisite means depends on where the tests run."""

from __future__ import annotations

import os

import pytest

IN_CI = os.environ.get("CI", "").lower() in ("1", "true", "yes")


def require(condition: bool, reason: str) -> None:
    """Skip when a prerequisite is missing; in CI a missing prerequisite is a failure.

    CI provisions Docker, Prometheus and the wheel cache itself, so a skip there would hide a
    broken provisioning step behind a green run.
    """
    if condition:
        return
    if IN_CI:
        pytest.fail(f"CI=true but {reason}", pytrace=False)
    pytest.skip(reason)
