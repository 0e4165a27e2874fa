"""bench/e2e/lines.py (the SGLang 0.5.17 GPU proof) end to end on emulators: both phases
started, every prompt set compared with upstream, the issue's bars computed from one run (the
device run is the same code with real servers)."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

REPO = Path(__file__).resolve().parents[2]

from test_native import recall_checkpoint  # noqa: E402  (the same stand-in checkpoint)


def run_lines(out: Path, *extra: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [
            sys.executable, str(REPO / "bench" / "e2e" / "lines.py"), "--out", str(out),
            "--emulator", "--reps", "1", "--long-reps", "1", "--conc-reps", "1",
            "--loaded-reps", "1", "--tokens", "8", "--ready-budget-s", "60",
            "--recall-work", str(out.parent / "recall-work"), *extra,
        ],
        capture_output=True, text=True, timeout=300,
    )  # fmt: skip


def test_lines_e2e_dry_run_on_emulators(tmp_path):
    out = tmp_path / "out"
    proc = run_lines(out, "--recall-model", str(recall_checkpoint(tmp_path)))
    assert proc.returncode == 0, proc.stdout[-2000:] + proc.stderr[-2000:]
    doc = json.loads((out / "lines-e2e.json").read_text())
    assert list(doc["phases"]) == ["fa3", "flashinfer"]
    fa3, fi = doc["phases"]["fa3"], doc["phases"]["flashinfer"]
    assert set(fa3["servers"]) == {"upstream", "patched", "bf16"}
    assert set(fi["servers"]) == {"upstream", "patched", "gather", "bf16"}
    for phase in (fa3, fi):
        assert all("ready_s" in s for s in phase["servers"].values()), phase["servers"]
        # Every server was started through the launcher's stand-in on its own backend.
        for s in phase["servers"].values():
            assert "--attention-backend" in s["argv"]
        # the agreement check: each path's recall twin, 16 queries at 2k and at 8k
        assert set(phase["greedy"]) == set(phase["servers"])
        assert {c: r["queries"] for c, r in phase["greedy"]["patched"].items()} == {
            "2048": 16,
            "8192": 16,
        }
        assert all(r["errors"] == 0 for per in phase["greedy"].values() for r in per.values())
        assert phase["summary"]["upstream"]["single_128_ms"] is not None
        assert phase["summary"]["patched"]["loaded_64_steady_ms"] is not None
    # Per backend: <= 1.05x BF16 and <= 0.15x upstream at 1 and 16 streams, and identity of the
    # bit-identical path (fa3's patched path, flashinfer's gather path).
    bars = [b["bar"] for ph in (fa3, fi) for b in ph["bars"]]
    assert len(bars) == 10
    assert "fa3: patched greedy identical to upstream (32 recall queries)" in bars
    assert "flashinfer: gather greedy identical to upstream (32 recall queries)" in bars
    assert "| fa3 | patched |" in (out / "lines-e2e.md").read_text()


def test_lines_e2e_refuses_an_unknown_backend_in_one_line(tmp_path):
    bad = run_lines(tmp_path / "bad", "--backends", "fa3,triton")
    assert bad.returncode == 2
    assert (
        bad.stderr.strip()
        .splitlines()[-1]
        .endswith("--backends takes fa3, flashinfer (got triton)")
    )
    assert not (tmp_path / "bad").exists()
