"""The SGLang lines the series serves, for parametrizing tests over each line's patched tree."""

from __future__ import annotations

from pathlib import Path

from glmserve.series.lock import load_lock

PATCHES = Path(__file__).resolve().parents[2] / "patches"


def source_lines() -> list[str]:
    """Every source series (one per SGLang line: 0.5.12.post1, 0.5.17, 0.5.23): each line's
    patched tree is tested, not only the pinned one's."""
    lock, _ = load_lock(PATCHES)
    return sorted({entry["source"] for entry in lock["series"].values()})
