"""A static matplotlib PREVIEW of the TPOT dashboard's time-series panels.

No Grafana server can run where this project is tested, so the README shows this instead: the
same panel queries (taken from glmserve.monitoring.dashboard, not retyped) evaluated over a range
against a real Prometheus, drawn one subplot per panel. It is labelled a preview on the image.
"""

from __future__ import annotations

import math
import re
from pathlib import Path
from typing import Protocol

from glmserve.exporter.canary import TPOT_SLO_S
from glmserve.monitoring.dashboard import Panel, panels


class RangeQuerier(Protocol):
    def query_range(self, expr: str, start: float, end: float, step: float) -> list[dict]: ...


def _legend(template: str, labels: dict[str, str]) -> str:
    return re.sub(r"\{\{\s*(\w+)\s*\}\}", lambda m: labels.get(m.group(1), ""), template)


def _scale(unit: str) -> tuple[float, str]:
    return {"s": (1000.0, "ms"), "percentunit": (100.0, "%")}.get(unit, (1.0, ""))


def render_preview(
    prom: RangeQuerier,
    start: float,
    end: float,
    output: str | Path,
    *,
    note: str = "",
    step: float | None = None,
) -> Path:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    chosen: list[Panel] = [p for p in panels() if p.kind == "timeseries"]
    step = step or max(1.0, (end - start) / 240)
    cols = 3
    rows = math.ceil(len(chosen) / cols)
    fig, axes = plt.subplots(rows, cols, figsize=(6.0 * cols, 3.4 * rows), squeeze=False)
    for ax, panel in zip(axes.flat, chosen, strict=False):
        factor, unit = _scale(panel.unit)
        for target in panel.targets:
            expr = target.expr.replace("$__rate_interval", "1m")
            for series in prom.query_range(expr, start, end, step):
                points: list[tuple[float, float]] = [
                    (float(t) - start, float(v) * factor)
                    for t, v in series["values"]
                    if math.isfinite(float(v))
                ]
                if not points:
                    continue
                xs, ys = zip(*points, strict=True)
                label = _legend(target.legend, series["metric"]) or expr[:40]
                ax.plot(xs, ys, linewidth=1.5, label=label)
        if panel.slo_line:
            ax.axhline(TPOT_SLO_S * factor, color="red", linestyle="--", linewidth=1, label="SLO")
        ax.set_title(panel.title, fontsize=10)
        ax.set_xlabel("seconds", fontsize=8)
        if unit:
            ax.set_ylabel(unit, fontsize=8)
        ax.tick_params(labelsize=7)
        ax.grid(alpha=0.3)
        ax.legend(fontsize=7, loc="best")
    for ax in list(axes.flat)[len(chosen) :]:
        ax.axis("off")
    title = "PREVIEW - TPOT dashboard panels rendered with matplotlib from Prometheus (not Grafana)"
    fig.suptitle(title + (f"\n{note}" if note else ""), fontsize=12, color="#b00020")
    fig.tight_layout(rect=(0, 0, 1, 0.95))
    out = Path(output)
    out.parent.mkdir(parents=True, exist_ok=True)
    fig.savefig(out, dpi=80)
    plt.close(fig)
    return out
