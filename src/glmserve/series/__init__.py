"""The patch series tool: which SGLang is installed, the series and its lock, strict atomic
apply/revert with a marker, and the tools that make a series (regen, workspace, wheels).

    python -m glmserve.series --target SITE [--check] [--revert]   (= python3 patches/apply.py)

Stdlib only: it runs at image build time, before glmserve is installed, through the
`patches/apply.py` shim. Nothing here imports SGLang or torch, nor glmserve.preflight or
glmserve.selftest (which build on it); tests/series checks both.
"""

from __future__ import annotations

from glmserve.series.detect import detect_version
from glmserve.series.engine import Outcome, apply, check, interrupted, read_marker, revert
from glmserve.series.errors import PatchError
from glmserve.series.lock import MARKER_REL, load_series, supported_versions

__all__ = [
    "MARKER_REL",
    "Outcome",
    "PatchError",
    "apply",
    "check",
    "detect_version",
    "interrupted",
    "load_series",
    "read_marker",
    "revert",
    "supported_versions",
]
