"""bench/e2e/native.py end to end on emulators: four paths started, their recall-model twins
asked the agreement check's queries, every timed path summarised with its bars (the device run
is the same code)."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[2]


def recall_checkpoint(tmp_path: Path) -> Path:
    """An untrained recall checkpoint: the emulators do not read weights, the flow needs one."""
    torch = pytest.importorskip("torch")
    import recall_model as rm

    torch.manual_seed(0)
    rm.write_checkpoint(rm.RecallModel(rm.Shape()), tmp_path / "recall")
    return tmp_path / "recall"


def test_native_e2e_dry_run_on_emulators(tmp_path):
    out = tmp_path / "out"
    proc = subprocess.run(
        [
            sys.executable, str(REPO / "bench" / "e2e" / "native.py"), "--out", str(out),
            "--emulator", "--reps", "1", "--long-reps", "1", "--conc-reps", "1", "--loaded-reps", "1",
            "--tokens", "8", "--ready-budget-s", "60", "--recall-model", str(recall_checkpoint(tmp_path)),
            "--recall-work", str(tmp_path / "work"),
        ],
        capture_output=True, text=True, timeout=300,
    )  # fmt: skip
    assert proc.returncode == 0, proc.stdout[-2000:] + proc.stderr[-2000:]
    doc = json.loads((out / "native-e2e.json").read_text())
    assert all("ready_s" in s for s in doc["servers"].values()), doc["servers"]
    assert all("ready_s" in s for s in doc["recall_servers"].values()), doc["recall_servers"]
    # every path's recall twin answered 16 queries per context; each but upstream compared
    assert set(doc["greedy"]) == {"upstream", "gather", "native", "bf16"}
    for name, per in doc["greedy"].items():
        assert set(per) == {"2048", "8192"}
        for r in per.values():
            assert r["queries"] == 16 and r["errors"] == 0, (name, r)
            assert ("identical_to_reference" in r) == (name != "upstream")
    for path in ("bf16", "gather", "native"):
        s = doc["summary"][path]
        keys = ("single_128_ms", "single_6000_ms", "conc_16_ms", "conc_16_tok_s",
                "loaded_64_ms", "loaded_64_steady_ms", "loaded_64_tok_s")  # fmt: skip
        assert all(s[k] for k in keys), (path, s)
        # Beside TPOT, where it comes from: one token per decode step and no acceptance
        # length on these servers (no speculative decoding).
        for workload in ("single_128", "single_6000", "conc_16", "loaded_64"):
            assert s[f"{workload}_tokens_per_step"] == 1.0, (path, workload)
            assert s[f"{workload}_accept_length"] is None, (path, workload)
    # TPOT at 1 stream (two prompts), 16 streams and 64 streams steady; tok/s at 16 and 64.
    assert len(doc["bars"]) == 6
    assert any("native <= 0.9x bf16, 64 streams" in b["bar"] for b in doc["bars"])
    md = (out / "native-e2e.md").read_text()
    assert "| native |" in md and "identical to upstream / queries" in md
    assert "Where the TPOT comes from (MTP)" in md and "| native | 1.00 / — |" in md


def test_native_e2e_mtp_mode_pairs_each_fp8_path_with_its_bf16_twin(tmp_path):
    """--mtp: BF16/native/gather with MTP beside BF16/native without; the bars compare native
    with BF16 KV in each mode, and no upstream or recall server starts."""
    proc = subprocess.run(
        [
            sys.executable, str(REPO / "bench" / "e2e" / "native.py"), "--out", str(tmp_path),
            "--emulator", "--mtp", "--heads", "8", "--reps", "1", "--long-reps", "1",
            "--conc-reps", "1", "--loaded-reps", "1", "--tokens", "8", "--ready-budget-s", "60",
        ],
        capture_output=True, text=True, timeout=300,
    )  # fmt: skip
    assert proc.returncode == 0, proc.stdout[-2000:] + proc.stderr[-2000:]
    doc = json.loads((tmp_path / "native-e2e.json").read_text())
    assert set(doc["servers"]) == {"bf16-mtp", "native-mtp", "gather-mtp", "bf16", "native"}
    assert doc["greedy"] == {} and doc["pool_tokens"] == 200_000
    bars = [b["bar"] for b in doc["bars"]]
    assert any(b.startswith("TPOT native-mtp <= 1.0x bf16-mtp, single stream") for b in bars)
    assert any(b.startswith("TPOT native <= 1.0x bf16, single stream") for b in bars)
    assert len(bars) == 12


def test_native_e2e_builds_the_recall_model_where_none_is(tmp_path):
    model = tmp_path / "absent" / "recall-mla"
    proc = subprocess.run(
        [
            sys.executable, str(REPO / "bench" / "e2e" / "native.py"), "--out", str(tmp_path),
            "--emulator", "--reps", "1", "--long-reps", "0", "--conc-reps", "0", "--loaded-reps", "0",
            "--tokens", "4", "--ready-budget-s", "60", "--recall-model", str(model),
            "--recall-work", str(tmp_path / "work"),
        ],
        capture_output=True, text=True, timeout=300,
    )  # fmt: skip
    assert proc.returncode == 0, proc.stdout[-2000:] + proc.stderr[-2000:]
    doc = json.loads((tmp_path / "native-e2e.json").read_text())
    assert (model / "model.safetensors").is_file() and (model / "build.json").is_file()
    assert doc["recall_servers"] and doc["greedy"], doc["notes"]
