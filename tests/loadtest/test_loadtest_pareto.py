"""The Pareto plot: its frontier, its data read back from the PNG, and the pixels checked
against that data (a picture that disagrees with its numbers fails)."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest
from support.pareto_png import png_problems, with_text

from glmserve.loadtest.pareto import (
    X_LABEL,
    Y_LABEL,
    pareto_data,
    pareto_figure,
    pareto_points,
    read_embedded,
    write_pareto,
)


def step(n: int, tok_s: float, per_user: float, grows: bool = False, requests: int = 10) -> dict:
    return {"step": n, "streams": 4, "label": f"step {n}", "requests": requests,
            "output_tokens_per_s": tok_s, "per_user_tokens_per_s": per_user,
            "arrivals": {"queue_grows": grows} if grows else None}  # fmt: skip


STEPS = [step(0, 50, 50), step(1, 400, 20), step(2, 150, 45), step(3, 120, 30),
         step(4, 380, 12, grows=True), step(5, 0, 0, requests=0)]  # fmt: skip


def test_frontier_is_the_points_nothing_beats_on_both_axes() -> None:
    points = {p["step"]: p for p in pareto_points(STEPS)}
    assert set(points) == {0, 1, 2, 3, 4}  # a step that timed nothing is no point
    assert {n for n, p in points.items() if p["on_frontier"]} == {0, 1, 2}
    assert points[4]["queue_grows"] and points[4]["color"] != points[1]["color"]


def test_axes_are_labelled_and_the_slo_is_a_line() -> None:
    data = pareto_data(STEPS, slo_tpot_ms=40.0)
    fig = pareto_figure(data)
    (ax,) = fig.axes
    assert (ax.get_xlabel(), ax.get_ylabel()) == (X_LABEL, Y_LABEL)
    assert data["slo_per_user_tokens_per_s"] == 25.0
    legend = [t.get_text() for t in ax.get_legend().get_texts()]
    assert "TPOT SLO 40 ms = 25 tok/s per user" in legend


def test_png_carries_its_data_and_its_pixels_agree(tmp_path: Path) -> None:
    png = write_pareto(tmp_path, STEPS, slo_tpot_ms=40.0)
    data = read_embedded(png)
    assert data == json.loads((tmp_path / "pareto.json").read_text())
    assert [(p["step"], p["x"], p["y"]) for p in data["points"]] == [
        (0, 50.0, 50.0), (1, 400.0, 20.0), (2, 150.0, 45.0), (3, 120.0, 30.0), (4, 380.0, 12.0)
    ]  # fmt: skip
    assert png_problems(png) == []
    # The same pixels with other numbers in them: the check must see the mismatch.
    moved = dict(data, points=[dict(p, y=p["y"] * 0.5) for p in data["points"]])
    with_text(png, tmp_path / "moved.png", json.dumps(moved))
    assert len(png_problems(tmp_path / "moved.png")) == 5
    no_line = dict(data, slo_per_user_tokens_per_s=40.0)
    with_text(png, tmp_path / "no_line.png", json.dumps(no_line))
    assert any("no SLO line" in p for p in png_problems(tmp_path / "no_line.png"))


def test_reader_prints_the_points_and_refuses_other_pngs(tmp_path: Path) -> None:
    png = write_pareto(tmp_path, STEPS, slo_tpot_ms=None)
    run = subprocess.run([sys.executable, "-m", "glmserve.loadtest.pareto", str(png)],
                         capture_output=True, text=True, check=True)  # fmt: skip
    assert "400.0" in run.stdout and "step 1" in run.stdout
    import matplotlib.pyplot as plt

    plain = tmp_path / "plain.png"
    plt.figure().savefig(plain)
    bad = subprocess.run([sys.executable, "-m", "glmserve.loadtest.pareto", str(plain)],
                         capture_output=True, text=True)  # fmt: skip
    assert bad.returncode == 2 and "no glmserve.pareto data" in bad.stderr
    assert bad.stderr.count("\n") == 1


@pytest.fixture(autouse=True)
def _close_figures():
    import matplotlib.pyplot as plt

    yield
    plt.close("all")
