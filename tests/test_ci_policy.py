"""Under CI=true a patch or kernel test that skips is a failure (tests/conftest.py), wherever
the skip comes from: a test body, a fixture, or a module-level importorskip."""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
from pathlib import Path

TESTS = Path(__file__).resolve().parent


def _run(root: Path, ci: bool) -> str:
    env = {**os.environ, "CI": "true" if ci else ""}
    proc = subprocess.run(
        [sys.executable, "-m", "pytest", "-q", "-p", "no:cacheprovider",
         "--rootdir", str(root), str(root / "tests")],
        capture_output=True, text=True, env=env, timeout=120, cwd=root,
    )  # fmt: skip
    return proc.stdout.strip().splitlines()[-1]


def test_skips_fail_in_ci_only_for_patch_and_kernel_tests(tmp_path):
    tests = tmp_path / "tests"
    (tests / "series").mkdir(parents=True)
    (tests / "kernels").mkdir()
    shutil.copy(TESTS / "conftest.py", tests / "conftest.py")
    shutil.copytree(TESTS / "support", tests / "support")
    (tests / "series" / "test_body.py").write_text(
        "import pytest\n\ndef test_b():\n    pytest.skip('no wheel')\n"
    )
    (tests / "test_elsewhere.py").write_text(
        "import pytest\n\ndef test_c():\n    pytest.skip('optional here')\n"
    )
    assert _run(tmp_path, ci=False).startswith("2 skipped")
    assert _run(tmp_path, ci=True).startswith("1 failed, 1 skipped")
    (tests / "kernels" / "test_module.py").write_text(
        "import pytest\n\npytest.importorskip('no_such_module_for_this_test')\n"
    )
    assert "1 error" in _run(tmp_path, ci=True)
