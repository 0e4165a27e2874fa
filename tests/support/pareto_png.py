"""Check a pareto.png against the data it carries: every point and the SLO line must be where
the embedded axes box puts them, in their colour, in the image's own pixels."""

from __future__ import annotations

import struct
import zlib
from pathlib import Path
from typing import Any

from glmserve.loadtest.pareto import PNG_KEY, read_embedded


def to_pixel(data: dict[str, Any], x: float, y: float) -> tuple[float, float]:
    """Where a data point lands in the PNG (column, row), from the embedded axes box."""
    left, top, right, bottom = data["axes_px"]
    (x0, x1), (y0, y1) = data["xlim"], data["ylim"]
    col = left + (x - x0) / (x1 - x0) * (right - left)
    row = bottom - (y - y0) / (y1 - y0) * (bottom - top)
    return col, row


def _rgb(hex_color: str) -> tuple[float, float, float]:
    return tuple(int(hex_color[i : i + 2], 16) / 255 for i in (1, 3, 5))  # type: ignore[return-value]


def _near(pixel, color, tol: float = 0.08) -> bool:
    return all(abs(float(p) - c) <= tol for p, c in zip(pixel[:3], color, strict=True))


def png_problems(png: Path) -> list[str]:
    """What in the picture disagrees with its embedded data (empty: nothing)."""
    import matplotlib.image

    data = read_embedded(png)
    img = matplotlib.image.imread(str(png))
    height, width = img.shape[:2]
    problems = []
    if [width, height] != data["size_px"]:
        problems.append(f"image is {width}x{height}, data says {data['size_px']}")
        return problems
    for p in data["points"]:
        col, row = to_pixel(data, p["x"], p["y"])
        c, r = round(col), round(row)
        window = [img[y][x] for y in range(r - 2, r + 3) for x in range(c - 2, c + 3)
                  if 0 <= y < height and 0 <= x < width]  # fmt: skip
        if not any(_near(px, _rgb(p["color"])) for px in window):
            problems.append(f"step {p['step']}: no {p['color']} marker at pixel ({c}, {r})")
    slo = data["slo_per_user_tokens_per_s"]
    if slo is not None:
        _, row = to_pixel(data, data["xlim"][0], slo)
        left, _, right, _ = data["axes_px"]
        colour = _rgb(data["slo_color"])
        rows = [round(row) + d for d in (-1, 0, 1) if 0 <= round(row) + d < height]
        hits = sum(
            any(_near(img[y][x], colour) for y in rows) for x in range(round(left), round(right))
        )
        if hits < 0.4 * (right - left):  # a dashed line covers over half its length
            problems.append(f"no SLO line at row {round(row)} ({hits} of {right - left:.0f} px)")
    return problems


def with_text(png: Path, out: Path, text: str) -> None:
    """A copy of `png` whose embedded data is `text` (the pixels untouched)."""
    raw = png.read_bytes()
    chunks, pos = [raw[:8]], 8
    while pos < len(raw):
        (length,) = struct.unpack(">I", raw[pos : pos + 4])
        kind, body = raw[pos + 4 : pos + 8], raw[pos + 8 : pos + 8 + length]
        if kind == b"tEXt" and body.startswith(PNG_KEY.encode() + b"\0"):
            body = PNG_KEY.encode() + b"\0" + text.encode("latin-1")
        chunks.append(struct.pack(">I", len(body)) + kind + body
                      + struct.pack(">I", zlib.crc32(kind + body) & 0xFFFFFFFF))  # fmt: skip
        pos += 12 + length
    out.write_bytes(b"".join(chunks))
