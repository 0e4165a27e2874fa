"""bench/e2e/native.py end to end on emulators: four paths started, every prompt set compared
with upstream, every timed path summarised with its bars (the device run is the same code)."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

REPO = Path(__file__).resolve().parents[2]


def test_native_e2e_dry_run_on_emulators(tmp_path):
    proc = subprocess.run(
        [
            sys.executable, str(REPO / "bench" / "e2e" / "native.py"), "--out", str(tmp_path),
            "--emulator", "--reps", "1", "--long-reps", "1", "--conc-reps", "1", "--loaded-reps", "1",
            "--tokens", "8", "--greedy-tokens", "4", "--ready-budget-s", "60",
        ],
        capture_output=True, text=True, timeout=300,
    )  # fmt: skip
    assert proc.returncode == 0, proc.stdout[-2000:] + proc.stderr[-2000:]
    doc = json.loads((tmp_path / "native-e2e.json").read_text())
    assert all("ready_s" in s for s in doc["servers"].values()), doc["servers"]
    assert set(doc["greedy"]) == {"gather", "native", "bf16"}
    for sets in doc["greedy"].values():
        counts = {k: v["prompts"] for k, v in sets.items()}
        assert counts == {"short": 6, "long": 1, "shared_prefix": 4, "concurrent": 16}
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
    assert any("0.9x BF16 KV, 64 streams" in b["bar"] for b in doc["bars"])
    text = (tmp_path / "native-e2e.md").read_text()
    assert "| native |" in text
    assert "Where the TPOT comes from (MTP)" in text and "| native | 1.00 / — |" in text
