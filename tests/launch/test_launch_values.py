"""The dry run refuses what SGLang would refuse, or fail on, before anything starts: each bad
extra arg or launcher value in one line, exit 2, no traceback, through the real command and
without SGLang installed (the tools image's case: the stored parser of the profile's line).
The doctor refuses the same GLMSERVE_EXTRA_ARGS with the same words."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest
from support.launch import GLM_FIXTURE, REPO

RTX_PROFILE = "glm5-nvfp4-rtxpro6000-tp8"
CURRENT_PROFILE = "tiny-mla-78l-sglang0.5.17"

# (extra args after --, a fragment of the one line). Each would have reached SGLang.
BAD_EXTRA_ARGS = [
    (
        ["--mem-fraction-static", "abc"],
        "argument --mem-fraction-static: invalid float value: 'abc'",
    ),
    (["--context-length", "abc"], "argument --context-length: Invalid integer value: 'abc'"),
    (["--mem-fraction-static", "1.5"], "--mem-fraction-static 1.5 is not a fraction of GPU memory"),
    (["--mem-fraction-static", "0"], "--mem-fraction-static 0 is not a fraction of GPU memory"),
    (["--no-such-flag"], "unrecognized arguments: --no-such-flag"),
    (["--kv-cache-dtype", "nonsense"], "argument --kv-cache-dtype: invalid choice: 'nonsense'"),
    (["--cuda-graph-max-bs", "abc"], "argument --cuda-graph-max-bs: invalid int value: 'abc'"),
    (["--cuda-graph-max-bs", "0"], "--cuda-graph-max-bs 0 is not a batch size, > 0"),
    (["--disable-cuda"], "ambiguous option: --disable-cuda could match --disable-cuda-graph"),
    (["--attention-backend", "flashinfr"], "argument --attention-backend: invalid choice"),
    (["--attention-back", "fa9"], "argument --attention-backend: invalid choice: 'fa9'"),
    (["--enable-metrics=1"], "argument --enable-metrics: ignored explicit argument '1'"),
    (["--json-model-override-args", "{x"], "--json-model-override-args '{x' is not a JSON object"),
    (["stray-value"], "unrecognized arguments: stray-value"),
    (["--max-running-requests"], "argument --max-running-requests: expected one argument"),
    (["--tp-s=4"], "extra SGLang arg --tp-s is set by the launcher itself"),
    (["--host", "0.0.0.0"], "extra SGLang arg --host is set by the launcher itself"),
]


def launch(*argv: str, env: dict[str, str] | None = None) -> subprocess.CompletedProcess[str]:
    environ = {k: v for k, v in os.environ.items() if not k.startswith("GLMSERVE_")}
    environ["PYTHONPATH"] = str(REPO / "src")
    return subprocess.run(
        [sys.executable, "-m", "glmserve.launch", *argv],
        capture_output=True,
        text=True,
        timeout=60,
        env={**environ, **(env or {})},
        cwd=REPO,
    )


def one_line(proc: subprocess.CompletedProcess[str]) -> str:
    assert proc.returncode == 2, proc.stdout + proc.stderr
    assert proc.stdout == ""
    (line,) = proc.stderr.splitlines()
    assert line.startswith("glmserve.launch: error: ") and "Traceback" not in proc.stderr
    return line


def test_sglang_is_not_installed_here():
    """The premise: these run as the tools image's dry run does, with no SGLang to ask."""
    proc = subprocess.run([sys.executable, "-c", "import sglang"], capture_output=True)
    assert proc.returncode != 0


@pytest.mark.parametrize(("extra", "fragment"), BAD_EXTRA_ARGS, ids=lambda v: " ".join(v)[:40])
def test_each_bad_extra_arg_is_one_line_exit_2(extra, fragment):
    line = one_line(launch("--dry-run", "--profile", RTX_PROFILE, "--model-path", str(GLM_FIXTURE),
                           "--", *extra))  # fmt: skip
    assert fragment in line, line


def test_the_refusal_names_whose_parser_said_it():
    line = one_line(launch("--dry-run", "--profile", RTX_PROFILE, "--model-path", str(GLM_FIXTURE),
                           "--", "--kv-cache-dtype", "nonsense"))  # fmt: skip
    assert line.endswith("(SGLang 0.5.12.post1's own parser, stored from its server_args.py)")


def test_the_current_lines_profile_is_checked_against_its_own_line():
    """0.5.17 knows mxfp8 KV, 0.5.12.post1 does not: each profile's line decides."""
    tiny = ["--dry-run", "--profile", CURRENT_PROFILE]
    proc = launch(*tiny, "--", "--kv-cache-dtype", "mxfp8")
    assert proc.returncode == 0, proc.stderr
    pinned = ["--dry-run", "--profile", RTX_PROFILE, "--model-path", str(GLM_FIXTURE)]
    assert "invalid choice: 'mxfp8'" in one_line(launch(*pinned, "--", "--kv-cache-dtype", "mxfp8"))


@pytest.mark.parametrize(
    ("option", "value", "fragment"),
    [
        ("--host", "a b", "host 'a b' is neither an IP address nor a host name"),
        ("--port", "99999", "port must be between 1 and 65535, not 99999"),
        ("--tp", "eight", "TP must be an integer, not 'eight'"),
    ],
)
def test_bad_launcher_inputs_are_one_line(option, value, fragment):
    line = one_line(launch("--dry-run", "--profile", RTX_PROFILE, "--model-path", str(GLM_FIXTURE),
                           option, value))  # fmt: skip
    assert fragment in line, line


def test_the_env_array_is_checked_the_same_way():
    extra = json.dumps(["--mem-fraction-static", "abc"])
    proc = launch("--dry-run", "--model-path", str(GLM_FIXTURE),
                  env={"GLMSERVE_PROFILE": RTX_PROFILE, "GLMSERVE_EXTRA_ARGS": extra})  # fmt: skip
    assert "invalid float value: 'abc'" in one_line(proc)


def test_good_values_in_sglangs_own_spellings_pass():
    proc = launch("--dry-run", "--profile", RTX_PROFILE, "--model-path", str(GLM_FIXTURE), "--",
                  "--context-length=128k", "--mem-fraction-static", "0.85", "--kv-cache-d",
                  "fp8_e4m3", "--max-running-requests", "64")  # fmt: skip
    assert proc.returncode == 0, proc.stderr
    report = json.loads(proc.stdout)
    assert report["fit"]["mem_fraction_static"] == 0.85 and report["fit"]["fits"]


def test_the_doctor_refuses_the_same_extra_args(tmp_path: Path):
    """The doctor checks .env through the launcher's own input checks: the same line."""
    for name in ("compose.yaml", ".env.example", "monitoring", "loadtest"):
        (tmp_path / name).symlink_to(REPO / name)
    extra = json.dumps(["--cuda-graph-max-bs", "abc"])
    env = tmp_path / "doctor.env"
    env.write_text(f"GLMSERVE_EXTRA_ARGS='{extra}'\n")
    proc = subprocess.run(
        [sys.executable, "-m", "glmserve.doctor", "--in-compose", "--project-dir", str(tmp_path),
         "--env-file", str(env)],
        capture_output=True, text=True, timeout=60, cwd=tmp_path,
        env={**os.environ, "PYTHONPATH": str(REPO / "src")},
    )  # fmt: skip
    assert proc.returncode == 1
    (line,) = proc.stderr.splitlines()
    assert line.startswith("glmserve.doctor: GLMSERVE_EXTRA_ARGS=")
    assert "argument --cuda-graph-max-bs: invalid int value: 'abc'" in line


def test_the_model_dir_is_named_as_the_user_set_it(tmp_path: Path):
    """Under compose the launcher sees /model; the plan and a refusal name MODEL_DIR too."""
    mounted = {"GLMSERVE_MODEL_HOST_PATH": str(GLM_FIXTURE), "GLMSERVE_PROFILE": RTX_PROFILE}
    proc = launch("--dry-run", "--model-path", str(GLM_FIXTURE), env=mounted)
    assert proc.returncode == 0, proc.stderr
    assert json.loads(proc.stdout)["model_path_on_host"] == str(GLM_FIXTURE)
    missing = {**mounted, "GLMSERVE_MODEL_HOST_PATH": "/models/GLM-5-NVFP4"}
    line = one_line(launch("--dry-run", "--model-path", str(tmp_path / "model"), env=missing))
    assert line == (
        f"glmserve.launch: error: model dir {tmp_path / 'model'} (MODEL_DIR=/models/GLM-5-NVFP4 "
        "on the host) does not exist (is the volume mounted?)"
    )
