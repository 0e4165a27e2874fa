"""`python -m glmserve.launch` as a real process against a real SGLang tree.

The tree holds the files the patch series touches, extracted from the pinned wheel, and is patched
with the real patch tool; the launcher finds it on PYTHONPATH exactly as it finds site-packages in
the image. This is the path the image check takes (dry run per profile), minus Docker.
"""

from __future__ import annotations

import importlib.util
import json
import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest
from support.launch import GLM_FIXTURE, PINNED, PROFILES_DIR, REPO

from glmserve.launch.sglang_argv import SERVER_ARGS_FILE
from glmserve.series import apply
from glmserve.series.errors import PatchError
from glmserve.series.lock import load_lock
from glmserve.series.wheels import default_cache_dir, extract_site, fetch_wheel

PATCHES = REPO / "patches"
JSON_ARG = '{"num_hidden_layers": 78, "text": "two  spaces, a \\"quote\\" and $HOME"}'


@pytest.fixture(scope="module")
def pristine(tmp_path_factory, require) -> Path:
    try:
        wheel = fetch_wheel(PINNED, default_cache_dir())
    except PatchError as exc:
        require(False, f"cannot get the sglang {PINNED} wheel: {exc}")
    lock, _ = load_lock(PATCHES)
    members = [p for p, h in lock["series"][PINNED]["files"].items() if h["before"] is not None]
    members.append(SERVER_ARGS_FILE)  # the launcher reads SGLang's parser from it
    return extract_site(wheel, tmp_path_factory.mktemp("sglang-pristine"), members)


@pytest.fixture(scope="module")
def patched(pristine, tmp_path_factory) -> Path:
    site = tmp_path_factory.mktemp("sglang-patched")
    shutil.copytree(pristine, site, dirs_exist_ok=True)
    apply(site, PATCHES)
    return site


def launch(site: Path, tmp_path: Path, *argv: str) -> subprocess.CompletedProcess[str]:
    env = {
        "PATH": os.environ.get("PATH", "/usr/bin:/bin"),
        "HOME": str(tmp_path / "home"),
        "PYTHONPATH": str(site),
        "FLASHINFER_WORKSPACE_BASE": str(tmp_path / "fi"),
        "GLMSERVE_PROFILES_DIR": str(PROFILES_DIR),
    }
    return subprocess.run(
        [sys.executable, "-m", "glmserve.launch", *argv],
        env=env,
        capture_output=True,
        text=True,
        timeout=120,
    )


def test_dry_run_on_a_patched_tree_keeps_a_json_arg_intact(patched, tmp_path):
    proc = launch(
        patched,
        tmp_path,
        "--dry-run",
        "--profile",
        "glm5-nvfp4-rtxpro6000-tp8",
        "--model-path",
        str(GLM_FIXTURE),
        "--",
        "--json-model-override-args",
        JSON_ARG,
    )
    assert proc.returncode == 0, proc.stderr
    report = json.loads(proc.stdout)
    assert report["argv"][-2:] == ["--json-model-override-args", JSON_ARG]
    assert report["sglang"] == {
        "version": PINNED,
        "site": str(patched),
        "patch_series": PINNED,
        "attention_backend": "flashinfer",
        "patch_in_use": True,
        "fp8_gather": "on",
    }


@pytest.mark.parametrize(
    ("extra", "flag", "reads"),
    [
        (["--hos", "0.0.0.0"], "--hos", "--host"),
        (["--tp-s", "64"], "--tp-s", "--tp-size"),
        (["--model-pa", "/etc"], "--model-pa", "--model-path"),
        (["--hos=0.0.0.0"], "--hos", "--host"),
        # Ambiguous in SGLang's own parser (--dist-init-addr, --dist-timeout; --disable-cuda-graph,
        # --disable-cuda-graph-padding): refused with argparse's words, as SGLang would refuse it.
        (["--dist", "10.0.0.1:5000"], "--dist", None),
        (["--disable-cuda"], "--disable-cuda", None),
    ],
)
def test_an_abbreviated_extra_arg_cannot_override_a_launcher_owned_flag(
    patched, tmp_path, extra, flag, reads
):
    """The probe's override: argparse takes unique prefixes, so `--hos 0.0.0.0` is `--host`."""
    proc = launch(patched, tmp_path, "--dry-run", "--profile", "tiny-mla", "--", *extra)
    assert proc.returncode == 2, proc.stdout
    [line] = proc.stderr.splitlines()
    assert line.startswith("glmserve.launch: error: ") and flag in line
    if reads:
        assert f"set by the launcher itself (SGLang reads it as {reads})" in line
    else:
        assert "ambiguous" in line


def test_a_config_file_of_sglang_options_is_refused(patched, tmp_path):
    """`--config FILE` merges YAML keys into SGLang's argv, out of this check's sight."""
    proc = launch(patched, tmp_path, "--dry-run", "--profile", "tiny-mla", "--", "--conf", "x.yaml")
    assert proc.returncode == 2
    [line] = proc.stderr.splitlines()
    assert "--conf reads more SGLang options from a file" in line


def test_secret_values_are_redacted_from_the_printed_plan(patched, tmp_path):
    proc = launch(
        patched, tmp_path, "--dry-run", "--profile", "tiny-mla",
        "--", "--api-key", "s3cret-1", "--admin-api-k=s3cret-2", "--ssl-keyfile-password", "s3cret-3",
    )  # fmt: skip
    assert proc.returncode == 0, proc.stderr
    assert "s3cret" not in proc.stdout + proc.stderr
    argv = json.loads(proc.stdout)["argv"]
    assert argv[-5:] == [
        "--api-key", "<redacted>", "--admin-api-k=<redacted>", "--ssl-keyfile-password", "<redacted>"
    ]  # fmt: skip


def test_dsa_profile_dry_runs_on_an_unpatched_tree(pristine, tmp_path):
    """The B200 default reads FP8 natively (nsa): a real, unpatched SGLang tree is enough."""
    proc = launch(
        pristine,
        tmp_path,
        "--dry-run",
        "--profile",
        "glm5-nvfp4-b200-tp8",
        "--model-path",
        str(GLM_FIXTURE),
    )
    assert proc.returncode == 0, proc.stderr
    report = json.loads(proc.stdout)
    assert report["sglang"]["patch_series"] == "" and report["sglang"]["patch_in_use"] is False


def test_unpatched_tree_is_refused_in_one_line(pristine, tmp_path):
    proc = launch(pristine, tmp_path, "--dry-run", "--profile", "tiny-mla")
    assert proc.returncode == 2
    assert proc.stdout == ""
    [line] = proc.stderr.splitlines()
    assert line.startswith("glmserve.launch: error: ") and "is not patched" in line


@pytest.mark.skipif(
    importlib.util.find_spec("sglang") is not None, reason="this venv has its own SGLang installed"
)
def test_no_sglang_at_all_is_refused_in_one_line_but_dry_runs(tmp_path):
    """A start (or --check) needs SGLang; a dry run shows the plan without it (compose's
    launcher service runs in the tools image) and says what it could not check."""
    empty = tmp_path / "empty-site"
    empty.mkdir()
    proc = launch(empty, tmp_path, "--check", "--profile", "tiny-mla")
    assert proc.returncode == 2
    [line] = proc.stderr.splitlines()
    assert "SGLang is not installed" in line
    proc = launch(empty, tmp_path, "--dry-run", "--profile", "tiny-mla")
    assert proc.returncode == 0, proc.stderr
    report = json.loads(proc.stdout)
    assert report["argv"][1:3] == ["-m", "sglang.launch_server"]
    assert report["sglang"]["version"].startswith("not installed here")
    assert any("no SGLang in this image" in w for w in report["warnings"])


@pytest.mark.skipif(
    importlib.util.find_spec("sglang") is not None, reason="this venv has its own SGLang installed"
)
@pytest.mark.parametrize(
    "extra", [["--hos", "0.0.0.0"], ["--tp-s=64"], ["--model-pa", "/etc"], ["--conf", "x.yaml"]]
)
def test_without_sglang_a_dry_run_still_refuses_prefixes_of_owned_flags(tmp_path, extra):
    """The tools image's dry run has no SGLang parser to ask: every prefix of a launcher-owned
    flag is refused instead, so the probe's `--hos 0.0.0.0` exits 2 there too."""
    empty = tmp_path / "empty-site"
    empty.mkdir()
    proc = launch(empty, tmp_path, "--dry-run", "--profile", "tiny-mla", "--", *extra)
    assert proc.returncode == 2, proc.stdout
    [line] = proc.stderr.splitlines()
    assert line.startswith("glmserve.launch: error: extra SGLang arg " + extra[0].split("=")[0])


@pytest.mark.skipif(
    importlib.util.find_spec("sglang") is not None, reason="this venv has its own SGLang installed"
)
def test_without_sglang_secret_values_are_still_redacted(tmp_path):
    empty = tmp_path / "empty-site"
    empty.mkdir()
    proc = launch(empty, tmp_path, "--dry-run", "--profile", "tiny-mla",
                  "--", "--api-k", "s3cret", "--admin-api-key=s3cret")  # fmt: skip
    assert proc.returncode == 0, proc.stderr
    assert "s3cret" not in proc.stdout + proc.stderr
