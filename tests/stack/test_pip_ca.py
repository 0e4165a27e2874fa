"""docker/pip-ca.sh: pip's TLS failure behind an intercepting proxy ends with the fix, in one
line; other outcomes pass through unchanged. pip is replaced by a stand-in interpreter."""

from __future__ import annotations

import subprocess
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[2]
SSL_FAILURE = (
    "WARNING: Retrying (Retry(total=4)) after connection broken by 'SSLError("
    "SSLCertVerificationError(1, '[SSL: CERTIFICATE_VERIFY_FAILED] certificate verify failed: "
    "self-signed certificate in certificate chain (_ssl.c:1006)'))': /simple/starlette/"
)


def fake_python(tmp_path: Path, output: str, status: int) -> Path:
    exe = tmp_path / "python"
    exe.write_text(f"#!/bin/sh\ncat <<'OUT'\n{output}\nOUT\nexit {status}\n")
    exe.chmod(0o755)
    return exe


def pip_ca(tmp_path: Path, exe: Path, ca_files: int = 0) -> subprocess.CompletedProcess[str]:
    ca = tmp_path / "ca"
    ca.mkdir()
    for i in range(ca_files):
        (ca / f"proxy{i}.crt").write_text("-----BEGIN CERTIFICATE-----\n")
    return subprocess.run(
        ["sh", str(REPO / "docker" / "pip-ca.sh"), str(exe), "install", "starlette"],
        capture_output=True,
        text=True,
        env={"PATH": "/usr/bin:/bin", "PIP_CA_DIR": str(ca)},
        timeout=30,
    )


@pytest.mark.parametrize(("ca_files", "fix"), [(0, "put its CA certificate"), (1, "did not make")])
def test_a_certificate_failure_ends_with_the_fix(tmp_path, ca_files, fix):
    proc = pip_ca(tmp_path, fake_python(tmp_path, SSL_FAILURE, 1), ca_files)
    assert proc.returncode == 1
    assert SSL_FAILURE.splitlines()[0] in proc.stdout  # pip's own output is still shown
    last = proc.stderr.strip().splitlines()[-1]
    assert last.startswith("pip-ca.sh: error: pip could not verify a TLS certificate")
    assert fix in last and ".ca/" in last and "docs/deploy.md" in last


def test_other_failures_and_successes_pass_through(tmp_path):
    other = pip_ca(tmp_path, fake_python(tmp_path, "ERROR: No matching distribution", 1))
    assert other.returncode == 1 and "pip-ca.sh: error" not in other.stderr
    (tmp_path / "ca").rename(tmp_path / "ca-1")
    ok = pip_ca(tmp_path, fake_python(tmp_path, "Successfully installed starlette", 0))
    assert ok.returncode == 0 and "Successfully installed" in ok.stdout
