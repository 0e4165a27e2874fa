"""The Pareto plot: per-user tok/s against the server's total output tok/s, one point per step.

Up and to the right is better; a step no other step beats on both axes is on the frontier. The
TPOT SLO is the horizontal line per-user tok/s = 1000 / --slo-tpot-ms: points under it missed it
on average. The data the plot is drawn from is written beside it (pareto.json) and into the PNG
itself, as a tEXt chunk, together with where the axes landed in pixels, so the picture can be
read back and checked against its numbers:

    python -m glmserve.loadtest.pareto loadtest-report/pareto.png      # prints the data
"""

from __future__ import annotations

import json
import struct
import sys
import zlib
from collections.abc import Sequence
from pathlib import Path
from typing import Any

SCHEMA = "glmserve.loadtest.pareto/1"
PNG_KEY = "glmserve.pareto"
X_LABEL = "total output tokens/s (server)"
Y_LABEL = "output tokens/s per user (1 / TPOT)"
POINT_COLOR = "#1f77b4"
GROWING_COLOR = "#ff7f0e"  # an open-loop step whose queue grew (above capacity)
SLO_COLOR = "#d62728"
DPI = 100


def pareto_points(step_dicts: Sequence[dict[str, Any]]) -> list[dict[str, Any]]:
    """One point per step that timed requests, marked on_frontier when no other point is at
    least as good on both axes and better on one."""
    points = []
    for d in step_dicts:
        y = d.get("per_user_tokens_per_s")
        if not d["requests"] or y is None:
            continue
        arrivals = d.get("arrivals") or {}
        points.append(
            {
                "step": d["step"],
                "label": d.get("label") or f"{d['streams']} streams",
                "x": float(d["output_tokens_per_s"]),
                "y": float(y),
                "queue_grows": bool(arrivals.get("queue_grows")),
            }
        )
    for p in points:
        p["on_frontier"] = not any(
            q["x"] >= p["x"] and q["y"] >= p["y"] and (q["x"] > p["x"] or q["y"] > p["y"])
            for q in points
        )
        p["color"] = GROWING_COLOR if p["queue_grows"] else POINT_COLOR
    return points


def pareto_data(step_dicts: Sequence[dict[str, Any]], slo_tpot_ms: float | None) -> dict[str, Any]:
    points = pareto_points(step_dicts)
    slo_y = None if slo_tpot_ms is None else 1000.0 / slo_tpot_ms
    xs = [p["x"] for p in points] or [1.0]
    ys = [p["y"] for p in points] + ([slo_y] if slo_y is not None else []) or [1.0]
    return {
        "schema": SCHEMA,
        "x_label": X_LABEL,
        "y_label": Y_LABEL,
        "points": points,
        "slo_tpot_ms": slo_tpot_ms,
        "slo_per_user_tokens_per_s": slo_y,
        "slo_color": SLO_COLOR,
        "xlim": [0.0, max(xs) * 1.15 or 1.0],
        "ylim": [0.0, max(ys) * 1.2 or 1.0],
    }


def pareto_figure(data: dict[str, Any]) -> Any:
    """Draw `data` (pareto_data); afterwards data['axes_px'] holds the axes' box in PNG
    pixels (left, top, right, bottom; y down) and data['size_px'] the image size."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt
    from matplotlib.ticker import MaxNLocator, ScalarFormatter

    fig, ax = plt.subplots(figsize=(8, 6), dpi=DPI)
    points = data["points"]
    frontier = sorted((p for p in points if p["on_frontier"]), key=lambda p: p["x"])
    if len(frontier) > 1:
        ax.plot([p["x"] for p in frontier], [p["y"] for p in frontier], "-", color="0.6",
                linewidth=1, zorder=1, label="Pareto frontier")  # fmt: skip
    for grows in (False, True):
        chosen = [p for p in points if p["queue_grows"] == grows]
        if chosen:
            ax.scatter([p["x"] for p in chosen], [p["y"] for p in chosen], s=64, zorder=3,
                       color=GROWING_COLOR if grows else POINT_COLOR,
                       label="queue grows (above capacity)" if grows else "step")  # fmt: skip
    for p in points:
        ax.annotate(p["label"], (p["x"], p["y"]), textcoords="offset points", xytext=(7, 7),
                    fontsize="small")  # fmt: skip
    if data["slo_per_user_tokens_per_s"] is not None:
        ax.axhline(data["slo_per_user_tokens_per_s"], color=SLO_COLOR, linestyle="--", zorder=2,
                   label=f"TPOT SLO {data['slo_tpot_ms']:g} ms "
                   f"= {data['slo_per_user_tokens_per_s']:.3g} tok/s per user")  # fmt: skip
    if not points:
        ax.text(0.5, 0.5, "no step timed a request", ha="center", va="center",
                transform=ax.transAxes)  # fmt: skip
    ax.set_xlim(*data["xlim"])
    ax.set_ylim(*data["ylim"])
    ax.set_xlabel(X_LABEL)
    ax.set_ylabel(Y_LABEL)
    ax.set_title("per-user speed vs total throughput (up and right is better)")
    for axis in (ax.xaxis, ax.yaxis):
        fmt = ScalarFormatter(useOffset=False)
        fmt.set_scientific(False)
        axis.set_major_formatter(fmt)
        axis.set_major_locator(MaxNLocator(nbins=6))
    ax.legend(fontsize="small", loc="upper right")
    fig.tight_layout()
    fig.canvas.draw()
    width, height = fig.canvas.get_width_height()
    box = ax.get_window_extent()
    data["size_px"] = [width, height]
    data["axes_px"] = [box.x0, height - box.y1, box.x1, height - box.y0]
    return fig


def write_pareto(directory: Path, step_dicts: Sequence[dict[str, Any]],
                 slo_tpot_ms: float | None) -> Path:  # fmt: skip
    """pareto.png (its data in a tEXt chunk) and pareto.json (the same data)."""
    import matplotlib.pyplot as plt

    data = pareto_data(step_dicts, slo_tpot_ms)
    fig = pareto_figure(data)
    path = directory / "pareto.png"
    text = json.dumps(data, allow_nan=False)
    fig.savefig(path, dpi=DPI, metadata={PNG_KEY: text})
    plt.close(fig)
    (directory / "pareto.json").write_text(json.dumps(data, indent=2, allow_nan=False) + "\n")
    return path


def png_text_chunks(path: Path) -> dict[str, str]:
    """The tEXt and zTXt chunks of a PNG (stdlib only)."""
    raw = Path(path).read_bytes()
    if raw[:8] != b"\x89PNG\r\n\x1a\n":
        raise ValueError(f"{path} is not a PNG")
    out, pos = {}, 8
    while pos + 8 <= len(raw):
        (length,) = struct.unpack(">I", raw[pos : pos + 4])
        kind = raw[pos + 4 : pos + 8]
        body = raw[pos + 8 : pos + 8 + length]
        if kind == b"tEXt":
            key, _, value = body.partition(b"\0")
            out[key.decode("latin-1")] = value.decode("latin-1")
        elif kind == b"zTXt":
            key, _, rest = body.partition(b"\0")
            out[key.decode("latin-1")] = zlib.decompress(rest[1:]).decode("latin-1")
        if kind == b"IEND":
            break
        pos += 12 + length
    return out


def read_embedded(path: Path) -> dict[str, Any]:
    """The data a pareto.png was drawn from."""
    chunks = png_text_chunks(path)
    if PNG_KEY not in chunks:
        raise ValueError(f"{path} carries no {PNG_KEY} data (not a glmserve Pareto plot)")
    return json.loads(chunks[PNG_KEY])


def main(argv: Sequence[str] | None = None) -> int:
    args = list(sys.argv[1:] if argv is None else argv)
    if len(args) != 1:
        sys.stderr.write("usage: python -m glmserve.loadtest.pareto PARETO.png\n")
        return 2
    try:
        data = read_embedded(Path(args[0]))
    except (OSError, ValueError) as exc:
        sys.stderr.write(f"glmserve.loadtest.pareto: {exc}\n")
        return 2
    print(f"{'step':>4}  {'tok/s':>9}  {'tok/s/user':>10}  frontier  label")
    for p in data["points"]:
        mark = "yes" if p["on_frontier"] else ""
        print(f"{p['step']:>4}  {p['x']:>9.1f}  {p['y']:>10.2f}  {mark:>8}  {p['label']}")
    if data["slo_per_user_tokens_per_s"] is not None:
        print(f"TPOT SLO {data['slo_tpot_ms']:g} ms: {data['slo_per_user_tokens_per_s']:.3g} "
              "tok/s per user")  # fmt: skip
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
