"""The SGLang patch series tool: version detection, lock, strict atomic apply/revert, marker.

Stdlib only, and nothing here imports SGLang, torch or the selftest: the tool runs at image
build time, before glmserve is installed, through the `patches/apply.py` shim.
"""

from __future__ import annotations

from glmserve.patching.detect import detect_version
from glmserve.patching.engine import Outcome, apply, check, interrupted, read_marker, revert
from glmserve.patching.errors import PatchError
from glmserve.patching.series import MARKER_REL, load_series, supported_versions

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
