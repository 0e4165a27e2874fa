"""The recall trainer on the CPU: batches in the task's layout, the smoke run, and the torch
reference's verdict on the committed checkpoint (right wiring wins, a miswired one loses)."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest

torch = pytest.importorskip("torch")

import recall_model as rm  # noqa: E402  (bench/accuracy)
import recall_task as task  # noqa: E402
import recall_train as rt  # noqa: E402

REPO = Path(__file__).resolve().parents[2]
COMMITTED = REPO / "bench" / "models" / "recall-mla"


def test_training_batches_hold_records_and_their_answers() -> None:
    gen = torch.Generator().manual_seed(0)
    ids, target, region = rt.draw_batch(gen, 3, 400, 20, 6, "cpu")
    assert ids.shape == (3, 400) and region == 400 - 6 * rt.SEG
    L = task.VALUE_LEN
    for row, tgt in zip(ids.tolist(), target.tolist(), strict=True):
        assert row[0] == task.BOS
        body = row[1:region]
        records = {}
        for i, tok in enumerate(body):
            if task.KEY0 <= tok < task.VALUE0:
                records[tok] = tuple(body[i + 1 : i + 1 + L])
        assert len(records) == 20  # unique keys, none overwritten
        assert all([task.slot_of(v) for v in val] == list(range(L)) for val in records.values())
        assert sum(t >= task.FILLER0 for t in body) == len(body) - 20 * (L + 1)
        for s in range(6):
            seg = row[region + s * rt.SEG : region + (s + 1) * rt.SEG]
            assert seg[0] == task.QUERY_ID and seg[-1] == task.END_ID
            assert tuple(seg[2:-1]) == records[seg[1]]
        # targets: the value and END tokens of each segment and every Q but the first
        want = [False] * region + ([True, False] + [True] * (L + 1)) * 6
        want[region] = False
        assert tgt == want
    with pytest.raises(ValueError, match="do not fit"):
        rt.draw_batch(gen, 1, 200, 30, 4, "cpu")


def test_record_counts_start_small_then_reach_the_bench_densities() -> None:
    rng = np.random.default_rng(0)
    early = [rt.draw_shape(rng, 8192, False, 0.05) for _ in range(200)]
    late = [rt.draw_shape(rng, 8192, False, 0.8) for _ in range(400)]
    assert max(n for n, _ in early) <= 8 and all(q == min(n, 16) for n, q in early)
    assert min(n for n, _ in late) >= 2 and max(n for n, _ in late) >= 700
    assert sum(n >= 600 for n, _ in late) > 50  # the 8k bench prompts hold 637 records


def test_schedule_by_time_and_by_steps() -> None:
    s = rt.Schedule([512, 2048], [1, 3], lr=1e-3, budget_s=100, steps=0)
    assert s.length(s.progress(0, 10)) == 512 and s.length(s.progress(0, 30)) == 2048
    assert s.rate(0.5) < s.rate(0.1) and s.rate(0.0) > 0
    fixed = rt.Schedule([512], [1], lr=1e-3, budget_s=0, steps=40)
    assert fixed.progress(20, 1e9) == 0.5


@pytest.mark.slow
def test_smoke_training_runs_exports_and_the_loss_falls(tmp_path) -> None:
    out = tmp_path / "ckpt"
    proc = subprocess.run(
        [sys.executable, str(REPO / "bench" / "accuracy" / "recall_train.py"), "--smoke",
         "--out", str(out), "--steps", "24", "--log-every", "23"],
        capture_output=True, text=True, timeout=900,
    )  # fmt: skip
    assert proc.returncode == 0, proc.stdout[-2000:] + proc.stderr[-2000:]
    report = json.loads((out / "train.json").read_text())
    first, last = report["history"][0]["loss"], report["history"][-1]["loss"]
    assert report["steps"] == 24 and last < first - 1.0, (first, last)
    assert {"config.json", "model.safetensors", "tokenizer.json", "tokenizer_config.json"} <= {
        p.name for p in out.iterdir()
    }
    model = rm.read_checkpoint(out)
    assert model.shape == rm.SMOKE_SHAPE
    assert "256" in report["eval"]


def _committed() -> rm.RecallModel:
    if not (COMMITTED / "model.safetensors").is_file():
        pytest.skip(
            "bench/models/recall-mla is not committed yet (bash bench/device_run.sh accuracy trains it)"
        )
    return rm.read_checkpoint(COMMITTED).eval()


def test_the_committed_model_solves_the_task_and_a_miswired_attention_does_not() -> None:
    model = _committed()
    right = rt.evaluate(model, [1024], seed=5, haystacks=1, queries=16, device="cpu")["1024"]
    assert right["accuracy"] >= 0.9, right
    for mode in ("previous_layer", "shifted_rows"):
        wrong = rt.evaluate(model, [1024], 5, 1, 16, "cpu", miswire=mode)["1024"]
        assert wrong["accuracy"] < 0.5, (mode, wrong)
