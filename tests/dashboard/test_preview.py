"""The dashboard preview drawn from fixed Prometheus answers, read back from matplotlib's Axes,
and the TPOT panels' Prometheus graph links. (The same command against a live Prometheus:
tests/dashboard/test_dashboard_queries.py.)"""

from __future__ import annotations

import subprocess
import sys
import urllib.parse
from collections.abc import Iterator

import pytest
from support.net import free_port

from glmserve.dashboard.grafana import panels
from glmserve.dashboard.preview import (
    FADED,
    FOOTNOTE,
    LINE_STYLES,
    bucket_label,
    panel_exprs,
    preview_figure,
    tpot_links,
    window_s,
)

START, END = 1_000_000.0, 1_000_300.0


class FixedPrometheus:
    """query_range answers from a table: expr -> [(labels, value)], constant over the range."""

    def __init__(self, table: dict[str, list[tuple[dict[str, str], float]]]) -> None:
        self.table = table

    def query_range(self, expr: str, start: float, end: float, step: float) -> list[dict]:
        times = [start + i * step for i in range(int((end - start) / step) + 1)]
        return [
            {"metric": labels, "values": [[t, str(value)] for t in times]}
            for labels, value in self.table.get(expr, [])
        ]


def expr_of(title: str, legend: str) -> str:
    (panel,) = [p for p in panels() if p.title == title]
    (expr,) = [
        e for t, e in zip(panel.targets, panel_exprs(panel), strict=True) if t.legend == legend
    ]
    return expr


RUNNING = "Running and queued requests"
TABLE = {
    expr_of(RUNNING, "running"): [({}, 40.0)],
    expr_of(RUNNING, "queued"): [({}, 0.0)],
    # Equal, as on the emulator and on profiles that cap the batch at the graph size.
    expr_of(RUNNING, "CUDA graphs up to"): [({}, 64.0)],
    expr_of(RUNNING, "running limit"): [({}, 64.0)],
    expr_of("SLO attainment over time", "canary requests"): [({}, 1.0)],
    expr_of("SLO attainment over time", "server tokens"): [({}, 1.0)],
    expr_of("Canary failures by reason", "{{reason}}"): [({"reason": "timeout"}, 0.0)],
    expr_of("TPOT p50/p90/p99 - canary (per request)", "canary p{{quantile}}"): [
        ({"quantile": "0.5"}, 0.020),
        ({"quantile": "0.9"}, 0.021),
    ],
}


@pytest.fixture(scope="module")
def axes() -> Iterator[dict]:
    import matplotlib.pyplot as plt

    fig, empty = preview_figure(FixedPrometheus(TABLE), START, END)
    fig.canvas.draw()
    yield {ax.get_title(): ax for ax in fig.axes if ax.get_title()} | {"<empty>": empty}
    plt.close(fig)


def visible_ticks(ax) -> list[float]:
    lo, hi = ax.get_ylim()
    return [t for t in ax.get_yticks() if lo <= t <= hi]


def test_slo_attainment_is_drawn_on_0_to_100_percent(axes):
    ax = axes["SLO attainment over time"]
    assert ax.get_ylabel() == "%"
    assert ax.get_ylim()[0] == 0 and 100 < ax.get_ylim()[1] <= 110
    assert visible_ticks(ax) == [0, 25, 50, 75, 100]


def test_a_panel_that_stayed_at_zero_gets_a_0_to_1_axis(axes):
    ax = axes["Canary failures by reason"]
    assert ax.get_ylim() == (0, 1)
    assert [line.get_label() for line in ax.get_lines()] == ["timeout"]


def test_a_panel_without_data_says_so_and_keeps_a_sane_axis(axes):
    ax = axes["KV cache tokens: used vs pool"]
    assert "KV cache tokens: used vs pool" in axes["<empty>"]
    assert "no data yet" in [t.get_text() for t in ax.texts]
    assert ax.get_ylim() == (0, 1)


def test_the_graph_limit_stays_visible_under_an_equal_running_limit(axes):
    ax = axes[RUNNING]
    lines = {line.get_label(): (i, line) for i, line in enumerate(ax.get_lines())}
    legend = [t.get_text() for t in ax.get_legend().get_texts()]
    assert {"CUDA graphs up to", "running limit"} <= set(legend)
    under_at, under = lines["CUDA graphs up to"]
    over_at, over = lines["running limit"]
    assert list(under.get_ydata()) == list(over.get_ydata())  # the case that used to hide
    assert over_at > under_at  # drawn later, on top ...
    assert over.get_linewidth() < under.get_linewidth()  # ... and thinner, so both show
    assert over.get_linestyle() != under.get_linestyle()
    assert over.get_color() != under.get_color()


def test_tpot_is_in_ms_with_the_slo_line(axes):
    ax = axes["TPOT p50/p90/p99 - canary (per request)"]
    assert ax.get_ylabel() == "ms"
    ys = {line.get_label(): line.get_ydata()[0] for line in ax.get_lines()}
    # The SLO the suggested Locust runs judge by too (tests/monitoring/test_slo.py).
    assert ys["canary p0.5"] == pytest.approx(20.0) and ys["SLO 40 ms"] == pytest.approx(40.0)
    assert ax.get_ylim()[0] == 0


def test_line_styles_name_real_legends():
    """A renamed target would silently lose its style."""
    legends = {t.legend for p in panels() for t in p.targets}
    assert set(LINE_STYLES) <= legends


def test_tpot_links_graph_each_tpot_panels_queries():
    links = dict(tpot_links("http://127.0.0.1:9090/"))
    assert list(links) == [p.title for p in panels() if p.title.startswith("TPOT")]
    assert len(links) == 2
    for title, link in links.items():
        url = urllib.parse.urlsplit(link)
        assert (url.scheme, url.netloc, url.path) == ("http", "127.0.0.1:9090", "/graph")
        query = urllib.parse.parse_qs(url.query)
        (panel,) = [p for p in panels() if p.title == title]
        exprs = [query[f"g{i}.expr"][0] for i in range(len(panel.targets))]
        assert exprs == panel_exprs(panel)
        assert all(query[f"g{i}.tab"] == ["0"] for i in range(len(exprs)))  # the graph tab


def test_unreachable_prometheus_is_one_line_and_exit_1(tmp_path):
    out = tmp_path / "p.png"
    proc = subprocess.run(
        [sys.executable, "-m", "glmserve.dashboard.preview",
         "--prometheus", f"http://127.0.0.1:{free_port()}", "--output", str(out)],
        capture_output=True, text=True, timeout=60,
    )  # fmt: skip
    assert proc.returncode == 1
    lines = proc.stderr.strip().splitlines()
    assert len(lines) == 1 and "cannot reach Prometheus" in lines[0], proc.stderr
    assert not out.exists()


KV = "KV cache tokens: used vs pool"
FAR = {
    # The demo: 8 running requests under a running limit of 256, a few thousand used tokens in
    # a 495,552-token pool. Drawn to the limits' scale, both read as a flat zero.
    expr_of(RUNNING, "running"): [({}, 8.0)],
    expr_of(RUNNING, "queued"): [({}, 0.0)],
    expr_of(RUNNING, "CUDA graphs up to"): [({}, 256.0)],
    expr_of(RUNNING, "running limit"): [({}, 256.0)],
    expr_of(KV, "used"): [({}, 3072.0)],
    expr_of(KV, "pool"): [({}, 495_552.0)],
    expr_of("TTFT p50/p90/p99", "server p{{quantile}}"): [({"quantile": "0.5"}, 0.300)],
    expr_of("TTFT p50/p90/p99", "canary p{{quantile}}"): [({"quantile": "0.5"}, 0.251)],
}


@pytest.fixture(scope="module")
def far_axes() -> Iterator[dict]:
    import matplotlib.pyplot as plt

    fig, _ = preview_figure(FixedPrometheus(FAR), START, END)
    fig.canvas.draw()
    yield {ax.get_title(): ax for ax in fig.axes if ax.get_title()} | {
        "<text>": [t.get_text() for t in fig.texts]
    }
    plt.close(fig)


@pytest.mark.parametrize(
    ("title", "data", "limits"),
    [
        (KV, 3072.0, ["pool 495,552 (off the scale)"]),
        (
            RUNNING,
            8.0,
            ["CUDA graphs up to 256 (off the scale)", "running limit 256 (off the scale)"],
        ),
    ],
)
def test_a_capacity_far_above_its_data_is_named_not_drawn(far_axes, title, data, limits):
    ax = far_axes[title]
    low, high = ax.get_ylim()
    assert low == 0 and high == pytest.approx(data * 1.25)  # the axis is the data's
    legend = [t.get_text() for t in ax.get_legend().get_texts()]
    assert set(limits) <= set(legend), legend
    drawn = [line for line in ax.get_lines() if len(line.get_ydata())]
    assert max(max(line.get_ydata()) for line in drawn) == pytest.approx(data)


def test_server_quantiles_name_the_bucket_they_are_estimated_in(far_axes):
    """Server TTFT p50 300 ms beside the canary's 251 ms: the legend says why (SGLang's 0.2-0.4 s
    bucket, interpolated); the canary's is per request and says nothing."""
    legend = [t.get_text() for t in far_axes["TTFT p50/p90/p99"].get_legend().get_texts()]
    assert "server p0.5 (bucket 200-400 ms)" in legend and "canary p0.5" in legend
    assert bucket_label(panels()[0], "canary p0.5", 0.02) == "canary p0.5"
    assert FOOTNOTE in "\n".join(far_axes["<text>"]).replace("\n", " ")


def test_the_first_window_after_prometheus_starts_is_marked(far_axes):
    assert window_s("glmserve:sglang_output_tokens_per_second:rate1m") == 60
    assert window_s("glmserve:canary_tpot_seconds:quantile5m") == 300
    assert window_s("max(glmserve_server_cuda_graph_max_bs)") == 0
    ax = far_axes["TTFT p50/p90/p99"]
    server = [line for line in ax.get_lines() if line.get_color() == ax.get_lines()[0].get_color()]
    early, late = server  # the server quantile (1m window): faded, then full with its label
    assert early.get_alpha() == FADED and late.get_alpha() is None
    assert max(early.get_xdata()) == pytest.approx(60, abs=2) == min(late.get_xdata())
    assert late.get_label().startswith("server p0.5") and early.get_label().startswith("_")
