"""The report's plots, drawn from fixed steps and read back from matplotlib's Axes: the ticks and
labels a reader sees, not only that a PNG was written."""

from __future__ import annotations

from collections.abc import Iterator

import pytest

from glmserve.loadtest.report import sweep_figure
from glmserve.loadtest.results import SLO, StepResult
from glmserve.streaming import Aggregate, StreamTiming

LEVELS = [1, 2, 4, 8]


def timing(ttft: float, tpot: float, n: int = 5) -> StreamTiming:
    return StreamTiming(
        ack_s=ttft / 2, ttft_s=ttft, tpot_s=tpot, itl_s=(tpot,) * (n - 1),
        e2e_s=ttft + tpot * (n - 1), output_tokens=n, prompt_tokens=7, events=n, token_events=n,
    )  # fmt: skip


def steps(timed: list[int], failed: list[int]) -> list[StepResult]:
    out = []
    for i, (streams, ok, bad) in enumerate(zip(LEVELS, timed, failed, strict=True)):
        agg = Aggregate()
        for _ in range(ok):
            agg.add(timing(0.2 + 0.01 * i, 0.02 + 0.002 * i))
        for _ in range(bad):
            agg.fail("timeout")
        out.append(StepResult(i, streams, 10.0, agg))
    return out


@pytest.fixture
def close_figures() -> Iterator[None]:
    import matplotlib.pyplot as plt

    yield
    plt.close("all")


def axes_by_title(fig) -> dict:
    fig.canvas.draw()  # tick labels are only final once drawn
    return {ax.get_title(): ax for ax in fig.axes}


def labels(ticklabels) -> list[str]:
    return [t.get_text() for t in ticklabels if t.get_text()]


# The tallest step's zero failures used to pin the y axis to its top (the bar was cut off);
# a tallest step with failures on top is the other case.
@pytest.mark.parametrize("failed", [[0, 0, 3, 0], [0, 0, 0, 9]], ids=["clean-top", "failed-top"])
def test_requests_per_step_shows_the_levels_run_and_every_bar_whole(close_figures, failed):
    ax = axes_by_title(sweep_figure(steps([40, 80, 160, 300], failed), None, None))[
        "requests per step"
    ]
    assert ax.get_xlabel() == "concurrent streams"
    assert labels(ax.get_xticklabels()) == [str(n) for n in LEVELS]
    bottom, top = ax.get_ylim()
    assert bottom == 0
    tallest = max(bar.get_y() + bar.get_height() for bar in ax.patches)
    assert tallest == 300 + failed[3]
    assert top > tallest * 1.1, "no headroom above the tallest bar (the legend sits there)"
    # Integer counts on y, written as plain integers.
    shown = [
        (value, label.get_text())
        for value, label in zip(ax.get_yticks(), ax.get_yticklabels(), strict=True)
        if bottom <= value <= top
    ]
    assert len(shown) >= 3
    assert all(value == int(value) and text == str(int(value)) for value, text in shown), shown


def test_latency_and_throughput_axes_are_labelled_with_the_levels(close_figures):
    axes = axes_by_title(sweep_figure(steps([4, 4, 4, 4], [0, 0, 0, 0]), SLO(500, 40, 90), None))
    for title in ("TPOT vs concurrency", "TTFT vs concurrency", "output tok/s vs concurrency"):
        ax = axes[title]
        assert ax.get_xlabel() == "concurrent streams"
        assert labels(ax.get_xticklabels()) == [str(n) for n in LEVELS], title
        assert ax.get_ylim()[0] == 0
    tpot = axes["TPOT vs concurrency"]
    assert "SLO 40 ms (p90)" in labels(tpot.get_legend().get_texts())
