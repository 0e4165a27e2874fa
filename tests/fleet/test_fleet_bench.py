"""bench/fleet/fleet_bench.py on the CPU: its logic end to end against emulators, and its
device command lines through the launcher's own validation (the GPU run is the lead's)."""

from __future__ import annotations

import argparse
import json
import subprocess
import sys
from pathlib import Path

import pytest
from support.launch import dry_run_plan

from glmserve.launch.sglang_argv import server_args

ROOT = Path(__file__).resolve().parents[2]
BENCH = ROOT / "bench" / "fleet" / "fleet_bench.py"

pytest.importorskip("smg", reason="pip install '.[router]'")


def load_bench():
    import fleet_bench  # bench/fleet (pytest's pythonpath)

    return fleet_bench


@pytest.mark.slow
def test_the_bench_runs_every_phase_against_emulators(tmp_path):
    proc = subprocess.run(
        [sys.executable, str(BENCH), "--mode", "emulator", "--quick", "--out", str(tmp_path)],
        capture_output=True, text=True, timeout=300, cwd=ROOT,
    )  # fmt: skip
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-3000:]
    data = json.loads((tmp_path / "fleet.json").read_text())
    phases = data["phases"]
    assert list(phases) == ["T1", "T2", "C-rr", "C-ca"] and not data["skipped"]
    # T1 routes to A only, T2 to both: the router, not the bench, decides.
    assert phases["T1"]["request_share"] == {"A": 1.0, "B": 0.0}
    assert all(0.3 <= v <= 0.7 for v in phases["T2"]["request_share"].values())
    for p in phases.values():
        assert p["locust_rc"] == 0 and p["locust_requests"] > 0 and not p["locust_failures"]
        assert p["server_generation_tokens"] > 0
        # The emulator counts prompt tokens but exports no sglang:cached_tokens_total.
        assert p["cache_hit_rate"] == 0.0
    assert data["derived"]["throughput_two_vs_one"] > 0
    assert "| C-ca | cache_aware | A+B |" in (tmp_path / "fleet.md").read_text()


def test_the_shared_prefix_workload_has_the_planned_token_counts(tmp_path):
    bench = load_bench()
    plan = bench.Plan.for_mode("device", quick=False)
    words = bench.vocab(ROOT / "deploy" / "models")
    path = bench.prompt_file(tmp_path / "p.jsonl", plan, words)
    prompts = [json.loads(line)["prompt"] for line in path.read_text().splitlines()]
    assert len(prompts) == plan.groups * plan.variants
    lengths = {len(p.split()) for p in prompts}
    assert lengths == {plan.prefix_tokens + 8}
    prefixes = {" ".join(p.split()[: plan.prefix_tokens]) for p in prompts}
    assert len(prefixes) == plan.groups
    # The point of the plan: all prefixes overflow one pool, half of them fit.
    assert plan.groups * plan.prefix_tokens > plan.pool_tokens
    assert plan.groups * plan.prefix_tokens / 2 < plan.pool_tokens


def test_the_device_server_command_passes_the_launchers_validation(tmp_path):
    """The exact argv device mode starts, through the launcher with the real tiny profile and
    model (SGLang's install and the GPUs faked: --dry-run)."""
    bench = load_bench()
    plan = bench.Plan.for_mode("device", quick=False)
    args = argparse.Namespace(
        python="python3",
        model_dir=ROOT / "deploy" / "models",
        profiles_dir=ROOT / "deploy" / "profiles",
    )
    argv = bench.server_argv("device", 31001, args, plan, tmp_path / "bi.json")
    assert argv[1:3] == ["-m", "glmserve.launch"]
    environ = {"HOME": str(tmp_path), "FLASHINFER_WORKSPACE_BASE": str(tmp_path / "fi")}
    final = dry_run_plan(argv[3:], environ)["argv"]
    # SGLang's argparse keeps the last occurrence: the bench's values override the profile's.
    values = server_args(final[3:])
    assert values.get("--max-total-tokens") == plan.pool_tokens
    assert values.get("--cuda-graph-max-bs") == plan.users
    assert values.get("--mem-fraction-static") == 0.4
    assert "--sleep-on-idle" in final and final[final.index("--port") + 1] == "31001"


def test_render_redraws_the_report_from_a_runs_json(tmp_path):
    """--render rebuilds fleet.md from fleet.json alone, with the prefill the caches saved."""
    bench = load_bench()
    phase = {"policy": "cache_aware", "workers": ["A", "B"], "locust_output_tokens_per_s": 1234.5,
             "locust_requests": 10, "locust_ttft_p50_ms": 9.87, "locust_tpot_p50_ms": None,
             "locust_failures": {"broken_stream": 2}, "request_share": {"A": 0.25, "B": 0.75},
             "cache_hit_rate": 0.9,
             "server_counters": {s: {"sglang:prompt_tokens_total": 500.0,
                                     "sglang:cached_tokens_total": 450.0} for s in "AB"}}  # fmt: skip
    data = {"meta": {"mode": "device", "router_version": "0.3.2", "date": "d", "command": "c",
                     "servers": "s", "plan": {}},
            "phases": {"C-ca": phase}, "skipped": [], "derived": {}}  # fmt: skip
    src = tmp_path / "fleet.json"
    src.write_text(json.dumps(data))
    assert bench.main(["--mode", "device", "--out", str(tmp_path / "r"), "--render", str(src)]) == 0
    row = "| C-ca | cache_aware | A+B | 1,234 | 10 | 9.9 | n/a | 2 | A 25%, B 75% | 90.0% | 100 |"
    assert row in (tmp_path / "r" / "fleet.md").read_text()
