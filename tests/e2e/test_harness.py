"""The e2e harness as a whole, without a GPU: its device command lines go through our launcher's
own validation, and a full dry run drives three emulated servers through every phase."""

from __future__ import annotations

import importlib.util
import json
import os
import sys
from pathlib import Path

import e2e_analysis as an  # bench/e2e (pytest's pythonpath)
import pytest
from support.launch import dry_run_plan
from support.policy import require

REPO = Path(__file__).resolve().parents[2]

_spec = importlib.util.spec_from_file_location("e2e_harness", REPO / "bench" / "e2e" / "harness.py")
assert _spec and _spec.loader
harness = importlib.util.module_from_spec(_spec)
_spec.loader.exec_module(harness)


def _last(argv: list[str], flag: str) -> str:
    """SGLang's argparse keeps the last occurrence of a store option."""
    idx = max(i for i, a in enumerate(argv) if a == flag)
    return argv[idx + 1]


@pytest.mark.parametrize("key", [s.key for s in an.plan_servers(2)])
def test_device_argv_is_accepted_by_the_launcher(tmp_path: Path, key: str) -> None:
    spec = next(s for s in an.plan_servers(2) if s.key == key)
    paths = {
        "model": REPO / "deploy" / "models" / "tiny-mla",
        "profiles": REPO / "deploy" / "profiles",
        "build_info": tmp_path / "bi.json",
    }
    argv = harness.launch_argv(spec, "device", paths, sys.executable)
    assert argv[1:3] == ["-m", "glmserve.launch"]
    environ = {"GLMSERVE_FP8_GATHER": spec.fp8_gather, "PATH": os.environ.get("PATH", "")}
    plan = dry_run_plan(argv[3:], environ)
    sg = plan["argv"]
    assert sg[1:3] == ["-m", "sglang.launch_server"]
    # Our pass-through flags must win over the profile's (they come later).
    assert _last(sg, "--kv-cache-dtype") == spec.kv_cache_dtype
    assert _last(sg, "--max-total-tokens") == str(an.MAX_TOTAL_TOKENS)
    assert _last(sg, "--cuda-graph-max-bs") == str(spec.cuda_graph_max_bs)
    assert _last(sg, "--tp-size") == str(spec.tp)
    assert _last(sg, "--port") == str(spec.port)
    assert "--disable-cuda-graph" not in sg  # the bars are about CUDA-graph decode
    assert plan["env"]["GLMSERVE_FP8_GATHER"] == spec.fp8_gather
    assert plan["sglang"]["fp8_gather"] == ("off" if spec.fp8_gather == "0" else "on")
    if spec.layers == 78:
        assert json.loads(_last(sg, "--json-model-override-args"))["num_hidden_layers"] == 78
    else:
        assert "--json-model-override-args" not in sg


def _run_dry(tmp_path: Path, *extra: str) -> dict:
    out = tmp_path / "out"
    rc = harness.main(
        ["--mode", "emulator", "--out", str(out), "--base-port", "0", "--only", "a8,b8,c8",
         "--prompts", "3", "--greedy-tokens", "6", "--tokens", "12", "--reps", "2",
         "--conc-reps", "1", "--canary-n", "2", "--ready-budget-s", "60", *extra]
    )  # fmt: skip
    assert rc == 0
    data = json.loads((out / "e2e.json").read_text())
    data["_md"] = (out / "e2e.md").read_text()
    return data


def test_emulator_dry_run_covers_every_phase_and_stops_servers(tmp_path: Path) -> None:
    data = _run_dry(tmp_path)
    servers = data["servers"]
    assert set(servers) == {"a8", "b8", "c8"}
    for key, r in servers.items():
        assert "error" not in r, (key, r.get("error"))
        assert r["n_single"] == 2 and r["tpot_1"] > 0 and r["ttft_1"] > 0
        assert r["tpot_8"] > 0 and r["tok_s_8"] > 0
        assert all(run["streams_ok"] == 8 for run in r["conc_runs"])
        assert r["canary_tpot"] > 0 and not r["canary_failures"]
        assert r["server_itl_mean"] > 0  # the emulator's sglang:inter_token_latency_seconds
        assert len(r["greedy_ids"]) == 3 and all(len(ids) == 6 for ids in r["greedy_ids"])
        assert r["build_info"]["source"] == "emulator"
    assert len(servers["a8"]["greedy_ids_cached"]) == 3 and "greedy_ids_cached" not in servers["c8"]
    assert "greedy_ids_repeat" in servers["b8"]
    bars = {b["name"]: b for b in data["bars"]["tp1-8L"]}
    assert bars["(a) == (b) greedy tokens"]["passed"] is True
    assert bars["(a) == (b) greedy tokens, prefix-cached (paged extend)"]["passed"] is True
    for name in ("patched/BF16 TPOT, 1 stream", "patched/BF16 TPOT, 8 streams",
                 "patched/unpatched TPOT, 1 stream"):  # fmt: skip
        assert isinstance(bars[name]["value"], float)
    assert "glmserve.exporter.canary" in data["meta"]["canary_source"]
    assert "| tp1-8L: (a) vs (b) | 3/3 |" in data["_md"]
    assert "| tp1-8L: b8 vs itself (repeat) | 3/3 |" in data["_md"]
    # Every server was stopped (and reaped) by the harness itself, not left to the caller.
    for r in servers.values():
        assert "glmserve.emulator" in r["argv"]
        assert r["exit_code"] is not None
    assert not data["notes"], data["notes"]


def test_deadline_skips_phases_and_says_so(tmp_path: Path) -> None:
    # Every 8-layer phase asks for >= 15 s; 12 s of deadline covers only the start-up.
    data = _run_dry(tmp_path, "--deadline-s", "12")
    servers = data["servers"]
    assert all("tpot_1" not in r and "greedy_ids" not in r for r in servers.values())
    if any(r.get("ready_s") is not None for r in servers.values()):
        skipped = [n for n in data["notes"] if n.startswith("skipped ")]
        assert len(skipped) == 4, data["notes"]  # greedy, single, conc and canary of tp1-8L
    else:  # a very slow machine: nothing came up in time, and each server says so
        assert all("error" in r for r in servers.values())
    assert all(b["passed"] is None for b in data["bars"].get("tp1-8L", []))


def test_pass_through_flags_exist_in_the_pinned_sglang() -> None:
    """Our flags after '--' are not checked by the launcher; read them against the real wheel's
    server_args.py (never imported: it needs torch/CUDA), so a typo fails here, not on the H200."""
    import ast
    import zipfile

    from glmserve.series.errors import PatchError
    from glmserve.series.wheels import default_cache_dir, fetch_wheel

    try:
        wheel = fetch_wheel("0.5.12.post1", default_cache_dir())
    except PatchError as exc:
        require(False, f"cannot get the sglang 0.5.12.post1 wheel: {exc}")
    with zipfile.ZipFile(wheel) as zf:
        tree = ast.parse(zf.read("sglang/srt/server_args.py").decode())
    known: dict[str, ast.Call] = {}
    for node in ast.walk(tree):
        if isinstance(node, ast.Call) and getattr(node.func, "attr", "") == "add_argument":
            for a in node.args:
                if isinstance(a, ast.Constant) and str(a.value).startswith("--"):
                    known[a.value] = node
    assert len(known) > 300  # the walk saw the real parser
    paths = {"model": Path("m"), "profiles": Path("p"), "build_info": Path("b")}
    for spec in an.plan_servers(2):
        argv = harness.launch_argv(spec, "device", paths, "python")
        passed = argv[argv.index("--") + 1 :]
        flags = [a for a in passed if a.startswith("--")]
        assert flags and all(f in known for f in flags), [f for f in flags if f not in known]
        kv = known["--kv-cache-dtype"]
        choices = next(k.value for k in kv.keywords if k.arg == "choices")
        assert spec.kv_cache_dtype in {c.value for c in choices.elts}


def test_summarize_merges_calls_side_by_side(tmp_path: Path) -> None:
    data = _run_dry(tmp_path)
    raw = tmp_path / "out" / "e2e.json"
    spec = importlib.util.spec_from_file_location(
        "e2e_summarize", REPO / "bench" / "e2e" / "summarize.py"
    )
    assert spec and spec.loader
    summarize = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(summarize)
    out = tmp_path / "summary"
    assert (
        summarize.main(
            ["--out", str(out), "--provenance", "from a test", f"one={raw}", f"two={raw}"]
        )
        == 0
    )
    md = (out.parent / "summary.md").read_text()
    assert "- from a test" in md
    assert "| group | bar | limit | one | two |" in md
    assert "| tp1-8L | (a) == (b) greedy tokens | all | 3/3 prompts pass | 3/3 prompts pass |" in md
    merged = json.loads((out.parent / "summary.json").read_text())
    rows = {r["server"]: r for r in merged["one"]["servers"]}
    assert rows["b8"]["tpot_1_median_s"] == data["servers"]["b8"]["tpot_1"]
    assert summarize.main(["--out", str(out), "missing-equals-sign"]) == 2
