"""The smoke test end to end on the CPU: the emulator plays every variant (--server emulator),
and the launcher command lines it would run on the real box go through the launcher's own
validation (dry run), so the variant's KV dtype really reaches SGLang's argv."""

from __future__ import annotations

import json
import socket
import subprocess
import sys
from pathlib import Path

import pytest
from support.launch import dry_run_plan
from support.net import free_port

from glmserve.smoke import cli as smoke
from glmserve.smoke.variants import select

REPO = Path(__file__).resolve().parents[2]
GLM_FIXTURE = REPO / "tests" / "fixtures" / "glm5-nvfp4"


def _smoke(*args: str, **kw) -> subprocess.CompletedProcess:
    return subprocess.run(
        [sys.executable, "-m", "glmserve.smoke", *args],
        capture_output=True,
        text=True,
        timeout=240,
        cwd=REPO,
        **kw,
    )


def test_a_full_rehearsal_on_the_emulator_passes_and_writes_the_report(tmp_path):
    out = tmp_path / "report"
    proc = _smoke("--server", "emulator", "--profile", "glm5-nvfp4-rtxpro6000-tp8",
                  "--port", str(free_port()), "--long-tokens", "3000", "--out", str(out))  # fmt: skip
    assert proc.returncode == 0, proc.stdout[-2000:] + proc.stderr[-2000:]
    data = json.loads((out / "smoke.json").read_text())
    assert data["meta"]["complete"] is True
    assert [v["name"] for v in data["variants"]] == [
        "bf16-kv", "fp8-upstream-cast", "fp8-gather", "fp8-native"
    ]  # fmt: skip
    assert all(c["ok"] for c in data["checks"]), data["checks"]
    for name, r in data["results"].items():
        assert r["server"]["kv_cache_dtype"] == ("bfloat16" if name == "bf16-kv" else "fp8_e4m3")
        assert r["probes"]["prefix-b"]["cached_tokens"] > 0  # the emulator's radix-cache model
        assert r["probes"]["long"]["prompt_tokens"] >= 2400
        assert (out / "logs" / f"{name}.log").is_file()
    assert (out / "smoke.md").read_text().startswith("# Smoke test: PASS")
    assert "PASS: report" in proc.stdout


def test_a_dsa_profile_runs_bf16_against_fp8_as_shipped(tmp_path):
    proc = _smoke("--server", "emulator", "--profile", "glm5-nvfp4-b200-tp8", "--long-tokens",
                  "1000", "--port", str(free_port()), "--out", str(tmp_path))  # fmt: skip
    assert proc.returncode == 0, proc.stdout[-2000:]
    data = json.loads((tmp_path / "smoke.json").read_text())
    assert [v["name"] for v in data["variants"]] == ["bf16-kv", "fp8"]
    assert data["results"]["fp8"]["server"]["attention_backend"] == "nsa"


def test_a_variant_that_does_not_start_fails_the_run(tmp_path, monkeypatch):
    real = smoke.emulator_command

    def broken(variant, ns, port, build_info, patched):
        argv, env = real(variant, ns, port, build_info, patched)
        if variant.name == "fp8-native":
            argv = [*argv, "--tpot-ms", "-1"]  # the emulator refuses it and exits 2
        return argv, env

    monkeypatch.setattr(smoke, "emulator_command", broken)
    code = smoke.main(["--server", "emulator", "--profile", "glm5-nvfp4-rtxpro6000-tp8",
                       "--variants", "fp8-native", "--long-tokens", "1000",
                       "--port", str(free_port()), "--out", str(tmp_path)])  # fmt: skip
    assert code == 1
    data = json.loads((tmp_path / "smoke.json").read_text())
    served = next(c for c in data["checks"] if c["name"] == "served")
    assert not served["ok"] and "fp8-native: exited with 2" in served["detail"]
    assert "--tpot-ms must be > 0" in (tmp_path / "logs" / "fp8-native.log").read_text()


def test_a_busy_port_is_refused_in_one_line_before_anything_starts(tmp_path):
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        s.listen()
        port = s.getsockname()[1]
        proc = _smoke("--server", "emulator", "--port", str(port), "--out", str(tmp_path / "r"))
    assert proc.returncode == 2
    [line] = proc.stderr.splitlines()
    assert line.startswith("glmserve.smoke: error: something already listens on 127.0.0.1:")
    assert not (tmp_path / "r").exists()


@pytest.mark.parametrize(
    ("args", "fragment"),
    [
        (["--variants", "fp8-nope"], "unknown variant 'fp8-nope'"),
        ([], "no profile given"),
        (["--profile", "glm5-h100"], "unknown profile 'glm5-h100'"),
    ],
)
def test_bad_input_is_one_line(args, fragment, monkeypatch):
    monkeypatch.delenv("GLMSERVE_PROFILE", raising=False)
    base = ["--server", "emulator", "--profile", "tiny-mla"] if "--variants" in args else []
    proc = _smoke(*base, *args)
    assert proc.returncode == 2
    [line] = proc.stderr.splitlines()
    assert fragment in line


def test_on_the_real_box_each_variant_reaches_sglang_with_its_own_kv_dtype(tmp_path, monkeypatch):
    """Even with the BF16 fallback left in GLMSERVE_EXTRA_ARGS, the FP8 variants run FP8."""
    monkeypatch.setenv("GLMSERVE_EXTRA_ARGS", '["--kv-cache-dtype", "bfloat16"]')
    monkeypatch.setenv("FLASHINFER_WORKSPACE_BASE", str(tmp_path / "fi"))
    ns = smoke._parser().parse_args(
        ["--profile", "glm5-nvfp4-rtxpro6000-tp8", "--model-path", str(GLM_FIXTURE)]
    )
    for variant in select(patched_path=True):
        argv, env = smoke.launcher_command(variant, ns, 30555, tmp_path / "b.json")
        report = dry_run_plan(argv[3:], env)  # argv[3:]: after python -m glmserve.launch
        sglang = report["argv"]
        kv = [sglang[i + 1] for i, a in enumerate(sglang) if a == "--kv-cache-dtype"]
        assert kv[-1] == variant.kv_cache_dtype, variant.name  # argparse keeps the last one
        assert sglang[sglang.index("--port") + 1] == "30555"
        assert sglang[sglang.index("--host") + 1] == "127.0.0.1"
        gather = "off" if variant.env.get("GLMSERVE_FP8_GATHER") == "0" else "on"
        assert report["sglang"]["fp8_gather"] == gather, variant.name


def test_the_report_names_the_model_the_launcher_will_load(tmp_path):
    def run_for(*args: str, environ: dict[str, str]) -> smoke.Run:
        ns = smoke._parser().parse_args(["--server", "emulator", "--out", str(tmp_path), *args])
        ns.model_path = ns.model_path or environ.get("GLMSERVE_MODEL_PATH")
        return smoke.Run(ns, environ)

    # No path given: the profile's own default, as the launcher resolves it.
    tiny = run_for("--profile", "tiny-mla", environ={})
    assert tiny.meta["model_path"] == str(REPO / "deploy" / "models" / "tiny-mla")
    # Given (flag or environment): that one.
    given = run_for("--profile", "tiny-mla", environ={"GLMSERVE_MODEL_PATH": "/model"})
    assert given.meta["model_path"] == "/model"
    # A GLM profile names no default: the report says none was given rather than guessing.
    assert run_for("--profile", "glm5-nvfp4-b200-tp8", environ={}).meta["model_path"] is None
