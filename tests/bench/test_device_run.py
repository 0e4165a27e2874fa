"""bench/device_run.sh and bench/bundle.sh on the CPU: every step but the GPU commands runs for
real (DEVICE_DRY_RUN=1 prints those instead), against a bundle cut from the real SGLang wheel."""

from __future__ import annotations

import json
import os
import shutil
import signal
import subprocess
import sys
import tarfile
from pathlib import Path

import pytest
from support.policy import require

from glmserve import sglang_api
from glmserve.series.lock import load_lock
from glmserve.series.wheels import default_cache_dir, extract_site, fetch_wheel

REPO = Path(__file__).resolve().parents[2]
PINNED = "0.5.12.post1"
DEVICE_RUN = REPO / "bench" / "device_run.sh"
BUNDLE_SH = REPO / "bench" / "bundle.sh"


@pytest.fixture(scope="module")
def bundle(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """A device bundle whose site/ holds the pinned wheel's files the series touches."""
    try:
        wheel = fetch_wheel(PINNED, default_cache_dir())
    except Exception as exc:
        require(False, f"cannot get the sglang {PINNED} wheel: {exc}")
    lock, _ = load_lock(REPO / "patches")
    files = [p for p, h in lock["series"][PINNED]["files"].items() if h["before"] is not None]
    root = tmp_path_factory.mktemp("bundle")
    extract_site(wheel, root / "site", files)
    (root / "site" / ".glmserve-bundle.json").write_text('{"overlay_tool_sha256_16": "cafe"}')
    out = root / "bundle.tar.xz"
    with tarfile.open(out, "w:xz") as tar:
        tar.add(root / "site", arcname="site")
    return out


def device_run(
    tmp: Path, bundle: Path | None, *args: str, **env: str
) -> subprocess.CompletedProcess:
    home = tmp / "home"
    home.mkdir(exist_ok=True)
    environ = {
        **os.environ,
        "OUT": str(tmp / "out"),
        "HOME": str(home),
        "DEVICE_WORK": str(tmp / "work"),
        "DEVICE_DRY_RUN": "1",
        "JIT_CACHE": str(tmp / "jit-in.tar.xz"),
        "E2E_PGID_FILE": str(tmp / "pgids"),
        "E2E_KILL_GRACE_S": "0.2",
        # python3 in the script is this interpreter (glmserve's venv), as on the device.
        "PATH": f"{Path(sys.executable).parent}:{os.environ['PATH']}",
        **env,
    }
    if bundle is not None:
        environ["BUNDLE"] = str(bundle)
    return subprocess.run(["bash", str(DEVICE_RUN), *args], cwd=REPO, env=environ,
                          capture_output=True, text=True, timeout=300)  # fmt: skip


def test_kernel_job_applies_the_series_and_runs_each_gpu_step(tmp_path, bundle):
    jit = tmp_path / "jit-src" / ".triton"
    jit.mkdir(parents=True)
    (jit / "kernel.bin").write_bytes(b"\1" * 64)
    with tarfile.open(tmp_path / "jit-in.tar.xz", "w:xz") as tar:
        tar.add(jit, arcname=".triton")
    proc = device_run(tmp_path, bundle, "--sweep")
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-3000:]
    log = (tmp_path / "out" / "device.log").read_text()
    assert "job kernel" in log and "restored JIT cache" in log
    assert f"SGLang {PINNED}: applied series {PINNED}" in log
    assert "applies cleanly" not in log and "already applied" in log  # --check after the apply
    assert "ok: SGLang" in log  # the preflight
    marker = json.loads(
        (tmp_path / "work" / "site" / "sglang" / ".glmserve-patch.json").read_text()
    )
    assert marker["series"] == PINNED
    # The GPU steps, in order, with the bench arguments passed through.
    dry = [line for line in proc.stdout.splitlines() if line.startswith("dry-run: ")]
    assert [d.split()[1:4] for d in dry] == [
        ["nvidia-smi", "--query-gpu=name,driver_version,clocks.sm,clocks.max.sm,temperature.gpu",
         "--format=csv"],
        ["python3", "-m", "glmserve.selftest"],
        ["python3", "-m", "pytest"],
        ["python3", "bench/gather_cast.py", "--out"],
    ]  # fmt: skip
    assert dry[-1].endswith("--sweep")
    (prov,) = [line for line in log.splitlines() if line.startswith("provenance: ")]
    prov = json.loads(prov.removeprefix("provenance: "))
    assert prov["series"] == PINNED and prov["bundle"] == {"overlay_tool_sha256_16": "cafe"}
    assert prov["lock_sha256"] == load_lock(REPO / "patches")[1] and len(prov["tree_sha256"]) == 64
    # The restored JIT cache goes back out for the next call.
    with tarfile.open(tmp_path / "out" / "jit-cache.tar.xz") as tar:
        assert ".triton/kernel.bin" in tar.getnames()


def test_correctness_job_is_the_kernel_job_without_the_benchmark(tmp_path, bundle):
    proc = device_run(tmp_path, bundle, "correctness")
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-3000:]
    assert "job correctness" in (tmp_path / "out" / "device.log").read_text()
    dry = [line.split()[1:4] for line in proc.stdout.splitlines() if line.startswith("dry-run: ")]
    assert dry[1:] == [
        ["python3", "-m", "glmserve.selftest"],
        ["python3", "-m", "pytest"],
    ]


def test_e2e_job_stops_servers_left_by_a_killed_call_then_runs_the_harness(tmp_path, bundle):
    leftover = subprocess.Popen(["sleep", "300"], start_new_session=True)
    try:
        (tmp_path / "pgids").write_text(f"{os.getpgid(leftover.pid)}\n")
        proc = device_run(tmp_path, bundle, "e2e", "--deadline-s", "480")
        assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-3000:]
        assert leftover.wait(timeout=10) == -signal.SIGTERM
    finally:
        if leftover.poll() is None:
            leftover.kill()
    assert not (tmp_path / "pgids").exists()
    (harness,) = [line for line in proc.stdout.splitlines() if line.startswith("dry-run: timeout")]
    out = str(tmp_path / "out")
    assert harness.split()[1:] == [
        "timeout", "-s", "TERM", "540", "python3", "bench/e2e/harness.py", "--mode", "device",
        "--out", out, "--deadline-s", "480",
    ]  # fmt: skip
    assert "job e2e" in (tmp_path / "out" / "device.log").read_text()


@pytest.mark.parametrize(
    ("command", "script", "hard_s", "log"),
    [
        (["bench/device_run.sh", "native"], ["bench/e2e/native.py"], "520", "run.log"),
        (["bench/device_run.sh", "fp8-decode"], ["bench/fp8_decode.py"], "560", "run.log"),
        (["bench/device_run.sh", "smoke"], ["-m", "glmserve.smoke"], "560", "smoke.log"),
        (["bench/device_run.sh", "fleet"], ["bench/fleet/fleet_bench.py", "--mode", "device"],
         "540", "bench.log"),
        # The aliases the commands in use still call.
        (["bench/e2e/device.sh"], ["bench/e2e/harness.py", "--mode", "device"], "540", "harness.log"),
        (["bench/e2e/native_device.sh"], ["bench/e2e/native.py"], "520", "run.log"),
        (["bench/fp8_decode_device.sh"], ["bench/fp8_decode.py"], "560", "run.log"),
    ],
)  # fmt: skip
def test_each_script_job_runs_its_script_under_a_hard_stop(tmp_path, bundle, command, script,
                                                           hard_s, log):  # fmt: skip
    env = {**os.environ, "OUT": str(tmp_path / "out"), "HOME": str(tmp_path),
           "DEVICE_WORK": str(tmp_path / "work"), "DEVICE_DRY_RUN": "1", "BUNDLE": str(bundle),
           "E2E_PGID_FILE": str(tmp_path / "pgids"),
           "PATH": f"{Path(sys.executable).parent}:{os.environ['PATH']}"}  # fmt: skip
    proc = subprocess.run(["bash", *command, "--only", "a8"], cwd=REPO, env=env,
                          capture_output=True, text=True, timeout=300)  # fmt: skip
    assert proc.returncode == 0, proc.stderr[-3000:]
    (run,) = [line for line in proc.stdout.splitlines() if line.startswith("dry-run: timeout")]
    assert run.split()[1:] == ["timeout", "-s", "TERM", hard_s, "python3", *script,
                               "--out", str(tmp_path / "out"), "--only", "a8"]  # fmt: skip
    assert (tmp_path / "out" / log).is_file()
    assert "series 0.5.12.post1" in (tmp_path / "out" / "device.log").read_text()


def test_missing_bundle_is_one_line_and_exit_2(tmp_path):
    proc = device_run(tmp_path, tmp_path / "absent.tar.xz")
    assert proc.returncode == 2
    assert proc.stderr.strip().splitlines() == [
        f"device_run: no bundle {tmp_path / 'absent.tar.xz'}: run bench/bundle.sh and carry it"
    ]
    assert not (tmp_path / "work").exists()


def _stub_tool(tmp: Path, *, patched: bool = False) -> Path:
    """An overlay tool that writes the files bundle.sh checks for, and counts its runs."""
    tool = tmp / "tool.sh"
    files = ["flashinfer/data/csrc/batch_mla_run.cu", "flashinfer/data/csrc/batch_mla_plan.cu",
             "flashinfer/data/csrc/batch_mla_config.jinja",
             "flashinfer/data/include/flashinfer/attention/mla.cuh",
             "sglang/srt/layers/attention/flashinfer_mla_backend.py",
             "sglang/srt/server_args.py"]  # fmt: skip
    if patched:
        files.append("sglang/srt/layers/attention/fp8_kv_gather.py")
    lines = ["#!/bin/bash", "set -e", f"echo run >> {tmp / 'runs'}", 'rm -rf "$1"']
    lines += [f'mkdir -p "$1/$(dirname {f})" && echo x > "$1/{f}"' for f in files]
    tool.write_text("\n".join(lines) + "\n")
    return tool


def _checkout_copy(repo: Path) -> None:
    """bundle.sh and the home it reads the pinned line from (glmserve.sglang_lines)."""
    (repo / "bench").mkdir(parents=True)
    shutil.copy(BUNDLE_SH, repo / "bench" / "bundle.sh")
    (repo / "src" / "glmserve").mkdir(parents=True)
    for name in ("__init__.py", "sglang_lines.py"):
        shutil.copy(REPO / "src" / "glmserve" / name, repo / "src" / "glmserve" / name)


def test_bundle_builds_the_overlay_once_and_packs_it_unpatched(tmp_path):
    require(shutil.which("xz") is not None, "xz is needed to pack the bundle")
    repo = tmp_path / "repo"  # bundle.sh works in the checkout it sits in: use a copy
    _checkout_copy(repo)
    env = {**os.environ, "SGLANG_BUNDLE_TOOL": str(_stub_tool(tmp_path))}
    for _ in range(2):
        proc = subprocess.run(["bash", str(repo / "bench" / "bundle.sh")], env=env,
                              capture_output=True, text=True, timeout=120)  # fmt: skip
        assert proc.returncode == 0, proc.stderr
    assert (tmp_path / "runs").read_text().count("run") == 1, "the overlay is cached by its stamp"
    out = repo / ".bundle" / f"sglang-{sglang_api.SGLANG_VERSION}.tar.xz"  # the pinned line
    with tarfile.open(out) as tar:
        names = set(tar.getnames())
        stamp = json.load(tar.extractfile("site/.glmserve-bundle.json"))
    assert "site/sglang/srt/layers/attention/flashinfer_mla_backend.py" in names
    assert not any("fp8_kv_gather" in n for n in names)
    assert len(stamp["overlay_tool_sha256_16"]) == 16


def test_bundle_refuses_a_patched_overlay(tmp_path):
    repo = tmp_path / "repo"
    _checkout_copy(repo)
    env = {**os.environ, "SGLANG_BUNDLE_TOOL": str(_stub_tool(tmp_path, patched=True))}
    proc = subprocess.run(["bash", str(repo / "bench" / "bundle.sh")], env=env,
                          capture_output=True, text=True, timeout=120)  # fmt: skip
    assert proc.returncode == 1 and "already patched" in proc.stderr
    assert not (repo / ".bundle").exists()


CURRENT = "0.5.17"


@pytest.fixture(scope="module")
def bundle_0517(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """A 0.5.17 device bundle: the real wheel's files that line's series touches, and the
    overlay's sgl_kernel/ without FA3's flash_ops (bench/overlay.sh leaves it out)."""
    try:
        wheel = fetch_wheel(CURRENT, default_cache_dir())
    except Exception as exc:
        require(False, f"cannot get the sglang {CURRENT} wheel: {exc}")
    lock, _ = load_lock(REPO / "patches")
    files = [p for p, h in lock["series"][CURRENT]["files"].items() if h["before"] is not None]
    root = tmp_path_factory.mktemp("bundle-0517")
    extract_site(wheel, root / "site", files)
    (root / "site" / "sgl_kernel").mkdir()
    (root / "site" / "sgl_kernel" / "__init__.py").write_text("")
    (root / "site" / ".glmserve-bundle.json").write_text('{"sglang_line": "0.5.17"}')
    out = root / "bundle.tar.xz"
    with tarfile.open(out, "w:xz") as tar:
        tar.add(root / "site", arcname="site")
    return out


def _fa3_parts(tmp: Path, *, corrupt: bool = False) -> Path:
    """What bench/fa3_kernels.sh writes, for a stand-in library: xz parts and the sha256."""
    require(shutil.which("xz") is not None, "xz is needed for the parts")
    parts = tmp / "fa3"
    parts.mkdir()
    lib = tmp / "flash_ops.abi3.so"
    lib.write_bytes(os.urandom(3000) * 50)
    digest = subprocess.run(["sha256sum", lib.name], cwd=tmp, capture_output=True, text=True)
    (parts / "flash_ops.sha256").write_text(digest.stdout)
    packed = subprocess.run(["xz", "-c", str(lib)], capture_output=True, check=True).stdout
    half = len(packed) // 2
    (parts / "flash_ops.abi3.so.xz.part-00").write_bytes(packed[:half])
    (parts / "flash_ops.abi3.so.xz.part-01").write_bytes(packed[half:] + (b"x" if corrupt else b""))
    return parts


@pytest.mark.parametrize("parts", ["all", "none", "corrupt"])
def test_lines_job_applies_the_0_5_17_series_and_runs_fa3_only_with_its_kernels(
    tmp_path, bundle_0517, parts
):
    env = {"FA3_PARTS": str(tmp_path / "absent")}
    if parts != "none":
        env["FA3_PARTS"] = str(_fa3_parts(tmp_path, corrupt=parts == "corrupt"))
    proc = device_run(tmp_path, bundle_0517, "lines", "--reps", "2", **env)
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-3000:]
    log = (tmp_path / "out" / "device.log").read_text()
    assert "job lines" in log and f"SGLang {CURRENT}: applied series {CURRENT}" in log
    assert f"ok: SGLang {CURRENT} patched with series {CURRENT}" in log  # the fa3 rules ran too
    (run,) = [line for line in proc.stdout.splitlines() if line.startswith("dry-run: timeout")]
    lib = tmp_path / "work" / "site" / "sgl_kernel" / "flash_ops.abi3.so"
    tail = ["--out", str(tmp_path / "out")]
    if parts == "all":
        assert "fa3 kernels installed" in log and lib.is_file()
        assert run.split()[6:] == ["bench/e2e/lines.py", *tail, "--reps", "2"]
    else:
        assert ("incomplete" if parts == "corrupt" else "no fa3 kernels") in log
        assert not lib.exists()
        assert run.split()[6:] == ["bench/e2e/lines.py", *tail, "--backends", "flashinfer",
                                   "--reps", "2"]  # fmt: skip
    assert run.split()[1:6] == ["timeout", "-s", "TERM", "540", "python3"]


def test_verify_job_times_the_verify_pass_then_runs_the_gpu_tests_and_the_bench(tmp_path, bundle):
    """MTP's job: bench/fp8_verify.py, the self-test with the verify pass's shape (8 heads, 4
    query tokens), then every GPU test, each under its own hard stop."""
    proc = device_run(tmp_path, bundle, "verify", "--variants", "none")
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-3000:]
    dry = [line.split()[1:] for line in proc.stdout.splitlines() if line.startswith("dry-run: ")]
    commands = [" ".join(d) for d in dry[1:]]
    assert commands[0].startswith("timeout -s TERM 240 python3 bench/fp8_verify.py --out ")
    assert commands[0].endswith("--variants none")
    assert commands[1].startswith("timeout -s TERM 150 python3 -m glmserve.selftest")
    assert commands[2].startswith("timeout -s TERM 200 python3 -m pytest")


def test_accuracy_job_builds_the_model_then_runs_the_bench(tmp_path, bundle):
    proc = device_run(tmp_path, bundle, "accuracy", "--contexts", "2048")
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-3000:]
    log = (tmp_path / "out" / "device.log").read_text()
    assert "job accuracy" in log and f"applied series {PINNED}" in log
    dry = [line.split()[1:] for line in proc.stdout.splitlines() if line.startswith("dry-run: ")]
    work = tmp_path / "work"
    model = str(work / "recall-mla")
    assert ["python3", "bench/accuracy/recall_build.py", "--out", model] in dry
    bench = [d for d in dry if d[0] == "timeout"][-1]
    assert bench[:3] == ["timeout", "-s", "TERM"] and 400 <= int(bench[3]) <= 500
    assert bench[4:] == [
        "python3", "bench/accuracy/accuracy_bench.py", "--out", str(tmp_path / "out"),
        "--model", model, "--site", str(work / "site"), "--work", str(work / "accuracy"),
        "--deadline-s", str(int(bench[3]) - 45), "--contexts", "2048",
    ]  # fmt: skip
    assert (tmp_path / "out" / "run.log").is_file()
