"""The TPOT dashboard without Grafana: a matplotlib PREVIEW of its time-series panels, and
Prometheus graph links for its TPOT panels.

    python -m glmserve.dashboard.preview --prometheus http://127.0.0.1:9090 [--output F.png]
    python -m glmserve.dashboard.preview --prometheus http://127.0.0.1:9090 --links

The panel queries come from glmserve.dashboard.grafana (not retyped), evaluated over a range
against a live Prometheus and drawn one subplot per panel; the image says it is a preview. Where
Grafana's image cannot be pulled this is how the dashboard is seen (the demo prints both).
"""

from __future__ import annotations

import argparse
import json
import math
import re
import sys
import textwrap
import time
import urllib.error
import urllib.parse
import urllib.request
from collections.abc import Sequence
from pathlib import Path
from typing import Any, Protocol

from glmserve import sglang_api
from glmserve.dashboard.grafana import Panel, panels
from glmserve.exporter.canary import TPOT_SLO_S

PROG = "python -m glmserve.dashboard.preview"
# Grafana's $__rate_interval is >= 4 scrape intervals; 1m is what the shipped 15 s gives.
RATE_INTERVAL = "1m"
# Two limits that are often equal (the emulator, and profiles that cap the running batch at the
# graph size): the one drawn on top is thin and dotted, so the one beneath still shows.
LINE_STYLES: dict[str, dict[str, Any]] = {
    "CUDA graphs up to": {"color": "tab:purple", "linestyle": "-", "linewidth": 5, "alpha": 0.35},
    "running limit": {"color": "black", "linestyle": (0, (2, 2)), "linewidth": 1.5},
}


# Capacities drawn beside what uses them. One far above its data (a 495,552-token pool over a few
# thousand used tokens, a running limit of 256 over 8 running requests) would flatten the data
# to a line at zero: past LIMIT_HEADROOM x the data's peak it is named in the legend instead.
LIMIT_LEGENDS = ("pool", "CUDA graphs up to", "running limit")
LIMIT_HEADROOM = 4.0
# SGLang's own histograms, whose quantiles Prometheus estimates by linear interpolation inside
# a bucket: a TTFT of 251 ms in the (0.2, 0.4] s bucket reads 300 ms at p50. The legend names the
# bucket, so that the server's line is not mistaken for the canary's or Locust's, which time
# each request.
SERVER_BUCKETS = {"TTFT": sglang_api.TTFT_BUCKETS, "ITL": sglang_api.ITL_BUCKETS}
# The window a recording rule's name ends with (`...:rate1m`, `...:quantile5m`): for that long
# after Prometheus starts, the rule sees less than a window of data and reads low.
_WINDOW = re.compile(r":[a-z]+(\d+)([ms])$")
FADED = 0.4  # the alpha of a line over its rule's first window
FOOTNOTE = (
    "Rates and quantiles use the window their rule names (1m, 5m) and move at each scrape; a "
    "line is faded for its first window after Prometheus started, when it reads low. SGLang counts "
    "a request's output tokens when it finishes. Server percentiles are estimated inside "
    "SGLang's histogram buckets (the legend names the bucket); the canary and Locust time each "
    "request."
)


class RangeQuerier(Protocol):
    def query_range(self, expr: str, start: float, end: float, step: float) -> list[dict]: ...


class PrometheusError(RuntimeError):
    """Prometheus could not be asked, or refused; str() is the one line shown."""


class PrometheusHTTP:
    """The two API calls the preview makes, over plain HTTP (stdlib only)."""

    def __init__(self, url: str, timeout_s: float = 30.0) -> None:
        self.url = url.rstrip("/")
        self.timeout_s = timeout_s

    def _get(self, path: str, params: dict[str, Any]) -> Any:
        address = f"{self.url}{path}?{urllib.parse.urlencode(params)}"
        try:
            with urllib.request.urlopen(address, timeout=self.timeout_s) as resp:
                body = json.load(resp)
        except urllib.error.HTTPError as exc:
            raise PrometheusError(f"{self.url}: HTTP {exc.code} for {path}") from None
        except (urllib.error.URLError, OSError) as exc:
            reason = getattr(exc, "reason", exc)
            raise PrometheusError(f"cannot reach Prometheus at {self.url}: {reason}") from None
        except ValueError:
            raise PrometheusError(
                f"{self.url}{path} did not answer JSON: is it Prometheus?"
            ) from None
        if not isinstance(body, dict) or body.get("status") != "success":
            raise PrometheusError(f"{self.url}{path}: {body}")
        return body["data"]

    def query(self, expr: str) -> list[dict]:
        return list(self._get("/api/v1/query", {"query": expr})["result"])

    def query_range(self, expr: str, start: float, end: float, step: float) -> list[dict]:
        params = {"query": expr, "start": start, "end": end, "step": step}
        return list(self._get("/api/v1/query_range", params)["result"])


def panel_exprs(panel: Panel) -> list[str]:
    return [t.expr.replace("$__rate_interval", RATE_INTERVAL) for t in panel.targets]


def tpot_panels() -> list[Panel]:
    return [p for p in panels() if p.kind == "timeseries" and p.title.startswith("TPOT")]


def graph_link(prometheus_url: str, exprs: Sequence[str], range_input: str = "15m") -> str:
    """A Prometheus expression-browser link graphing `exprs`, one panel each. /graph is the
    2.x page; 3.x redirects it to /query, and both read g<i>.expr and g<i>.tab=0 (graph)."""
    params: list[tuple[str, str]] = []
    for i, expr in enumerate(exprs):
        params += [(f"g{i}.expr", expr), (f"g{i}.tab", "0"), (f"g{i}.range_input", range_input)]
    return f"{prometheus_url.rstrip('/')}/graph?{urllib.parse.urlencode(params)}"


def tpot_links(prometheus_url: str, range_input: str = "15m") -> list[tuple[str, str]]:
    """(panel title, link) for each TPOT panel of the dashboard."""
    return [
        (p.title, graph_link(prometheus_url, panel_exprs(p), range_input)) for p in tpot_panels()
    ]


def _legend(template: str, labels: dict[str, str]) -> str:
    return re.sub(r"\{\{\s*(\w+)\s*\}\}", lambda m: labels.get(m.group(1), ""), template)


def _scale(unit: str) -> tuple[float, str]:
    return {"s": (1000.0, "ms"), "percentunit": (100.0, "%")}.get(unit, (1.0, ""))


def preview_figure(
    prom: RangeQuerier, start: float, end: float, *, note: str = "", step: float | None = None
) -> tuple[Any, list[str]]:
    """The figure, and the titles of the panels that had no data in the range."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    chosen: list[Panel] = [p for p in panels() if p.kind == "timeseries"]
    step = step or max(1.0, (end - start) / 240)
    cols = 3
    rows = math.ceil(len(chosen) / cols)
    fig, axes = plt.subplots(rows, cols, figsize=(6.0 * cols, 3.4 * rows), squeeze=False)
    empty = []
    for ax, panel in zip(axes.flat, chosen, strict=False):
        factor, unit = _scale(panel.unit)
        peak = -math.inf
        limits: list[tuple[str, dict[str, Any], list[float], list[float]]] = []
        for target, expr in zip(panel.targets, panel_exprs(panel), strict=True):
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
                style = LINE_STYLES.get(target.legend, {"linewidth": 1.5})
                if target.legend in LIMIT_LEGENDS:
                    limits.append((label, style, list(xs), list(ys)))
                    continue
                peak = max(peak, *ys)
                label = bucket_label(panel, label, ys[-1] / factor)
                _plot_after_window(ax, xs, ys, window_s(expr), label, style)
        ceiling = _draw_limits(ax, limits, peak)
        if peak == -math.inf and not limits:
            empty.append(panel.title)
            ax.text(0.5, 0.5, "no data yet", ha="center", va="center", transform=ax.transAxes)
        if panel.slo_line:
            slo = TPOT_SLO_S * factor
            ax.axhline(slo, color="red", linestyle="--", linewidth=1, label=f"SLO {slo:g} {unit}")
        _y_range(ax, panel, peak if ceiling is None else ceiling)
        if ceiling is not None:
            ax.set_ylim(top=ceiling)
        ax.set_xlim(0, end - start)
        ax.set_title(panel.title, fontsize=10)
        ax.set_xlabel("seconds", fontsize=8)
        if unit:
            ax.set_ylabel(unit, fontsize=8)
        ax.tick_params(labelsize=7)
        ax.grid(alpha=0.3)
        if ax.get_legend_handles_labels()[0]:
            ax.legend(fontsize=7, loc="best")
    for ax in list(axes.flat)[len(chosen) :]:
        ax.axis("off")
    title = "PREVIEW - TPOT dashboard panels rendered with matplotlib from Prometheus (not Grafana)"
    fig.suptitle(title + (f"\n{note}" if note else ""), fontsize=12, color="#b00020")
    fig.text(0.01, 0.005, textwrap.fill(FOOTNOTE, 190), fontsize=8, color="0.3", va="bottom")
    fig.tight_layout(rect=(0, 0.035, 1, 0.95))
    return fig, empty


def window_s(expr: str) -> float:
    """The window a recording rule's name ends with, in seconds (0: not a windowed rule)."""
    found = _WINDOW.search(expr)
    if found is None:
        return 0.0
    return float(found[1]) * (60 if found[2] == "m" else 1)


def bucket_label(panel: Panel, label: str, last_s: float) -> str:
    """A server quantile's legend, with the SGLang bucket its last value lies in."""
    buckets = next((b for key, b in SERVER_BUCKETS.items() if panel.title.startswith(key)), None)
    if buckets is None or not label.startswith("server p") or not math.isfinite(last_s):
        return label
    lower = max((b for b in buckets if b < last_s), default=0.0)
    upper = min((b for b in buckets if b >= last_s), default=math.inf)
    return f"{label} (bucket {lower * 1000:g}-{upper * 1000:g} ms)"


def _plot_after_window(
    ax: Any, xs: Sequence[float], ys: Sequence[float], window: float, label: str, style: dict
) -> None:
    """The series, faded over its rule's first window after Prometheus started (where it reads
    low: a rate or quantile over less than its window of data), full from there on."""
    cut = next((i for i, x in enumerate(xs) if x >= window), len(xs))
    if cut == 0:
        ax.plot(xs, ys, label=label, **style)
        return
    (early,) = ax.plot(xs[: cut + 1], ys[: cut + 1], alpha=FADED, **style)
    ax.plot(xs[cut:], ys[cut:], label=label, **{"color": early.get_color(), **style})


def _draw_limits(
    ax: Any, limits: list[tuple[str, dict[str, Any], list[float], list[float]]], peak: float
) -> float | None:
    """Draw each capacity line; one far above the data is named in the legend instead (its
    value, "off the scale") and the axis stays on the data. Returns that axis top, or None."""
    ceiling = None
    for label, style, xs, ys in limits:
        if peak > 0 and max(ys) > LIMIT_HEADROOM * peak:
            ceiling = peak * 1.25
            ax.plot([], [], label=f"{label} {ys[-1]:,.0f} (off the scale)", **style)
        else:
            ax.plot(xs, ys, label=label, **style)
    return ceiling


def _y_range(ax: Any, panel: Panel, peak: float) -> None:
    """Axes a reader can trust: shares on 0-100 % (a steady 100 % is not drawn as 96-104), and a
    panel that stayed at 0 on 0..1 instead of matplotlib's -0.04..0.04 around nothing."""
    from matplotlib.ticker import MultipleLocator

    if panel.unit == "percentunit":
        ax.set_ylim(0, 105)
        ax.yaxis.set_major_locator(MultipleLocator(25))
    elif panel.min_value is not None and not peak > panel.min_value:
        ax.set_ylim(panel.min_value, panel.min_value + 1)
    elif panel.min_value is not None:
        ax.set_ylim(bottom=panel.min_value)


def render_preview(
    prom: RangeQuerier,
    start: float,
    end: float,
    output: str | Path,
    *,
    note: str = "",
    step: float | None = None,
) -> Path:
    import matplotlib.pyplot as plt

    fig, _ = preview_figure(prom, start, end, note=note, step=step)
    out = Path(output)
    out.parent.mkdir(parents=True, exist_ok=True)
    fig.savefig(out, dpi=80)
    plt.close(fig)
    return out


def _since_prometheus_start(prom: PrometheusHTTP, start: float) -> float:
    """A young Prometheus has no data before it started: begin there, not minutes earlier."""
    result = prom.query('max(process_start_time_seconds{job="prometheus"})')
    if result:
        return max(start, float(result[0]["value"][1]))
    return start


def main(argv: Sequence[str] | None = None) -> int:
    p = argparse.ArgumentParser(prog=PROG, description=__doc__.splitlines()[0])
    p.add_argument("--prometheus", default="http://127.0.0.1:9090", help="Prometheus base URL")
    p.add_argument("--output", default="dashboard-preview.png", help="PNG to write")
    p.add_argument("--minutes", type=float, default=15.0, help="how far back to draw")
    p.add_argument(
        "--links", action="store_true", help="print the TPOT panels' Prometheus graph links only"
    )
    args = p.parse_args(argv)
    if args.links:
        for title, link in tpot_links(args.prometheus):
            print(f"{title}: {link}")
        return 0
    if not args.minutes > 0:
        p.error(f"--minutes must be > 0, not {args.minutes:g}")
    prom = PrometheusHTTP(args.prometheus)
    end = time.time()
    try:
        start = _since_prometheus_start(prom, end - args.minutes * 60)
        out = render_preview(
            prom, start, end, args.output, note=f"{args.prometheus}, last {end - start:.0f} s"
        )
    except PrometheusError as exc:
        print(f"{PROG}: error: {exc}", file=sys.stderr)
        return 1
    print(f"wrote {out}: the dashboard's time-series panels over the last {end - start:.0f} s")
    return 0


if __name__ == "__main__":
    sys.exit(main())
