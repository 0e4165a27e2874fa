"""Launcher test fixtures: a Host whose GPUs, SGLang install, self-test and exec are all injected,
so every refusal and the exec itself are observable on a CPU-only machine."""

from __future__ import annotations

import io
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest
from support.launch import (
    PINNED,
    PROFILES_DIR,
    RTX,
    Outcome,
    Recorder,
    good_marker,
    gpus_like,
    sglang_parser_for,
)

from glmserve.launch import Gpu, Host, LaunchError, run


@pytest.fixture
def base_env(tmp_path: Path) -> dict[str, str]:
    """An environment whose writable paths all live in this test's tmp dir."""
    return {
        "HOME": str(tmp_path / "home"),
        "FLASHINFER_WORKSPACE_BASE": str(tmp_path / "fi"),
        "GLMSERVE_BUILD_INFO": str(tmp_path / "run" / "build-info.json"),
        "GLMSERVE_PROFILES_DIR": str(PROFILES_DIR),
        "PATH": "/usr/bin:/bin",
    }


@pytest.fixture
def launch(base_env: dict[str, str]) -> Callable[..., Outcome]:
    """launch(argv, env=, gpus=, version=, marker=, preflight=, selftest=, driver=, cuda=)."""

    def _launch(
        argv: list[str],
        *,
        env: dict[str, str] | None = None,
        gpus: list[Gpu] | None = None,
        site: Path | None = Path("/fake/site-packages"),
        version: str = PINNED,
        marker: Any = "good",
        preflight: list[str] | None = None,
        selftest: tuple[Any, ...] = ("passed", "bit-identical on 3 cases"),
        driver: str | None = "580.95.05",
        cuda: str | None = "13.0",
    ) -> Outcome:
        rec = Recorder()
        environ = {**base_env, **(env or {})}

        def fake_selftest(env: dict[str, str]) -> tuple[str, str, str, dict[str, Any]]:
            rec.selftests += 1
            rec.selftest_env = dict(env)
            # selftest = (status, detail[, native verdict[, timing of both decode paths]])
            status, detail, *rest = selftest
            native = str(rest[0]) if rest else ""
            timing = dict(rest[1]) if len(rest) > 1 else {}
            return str(status), str(detail), native, timing

        host = Host(
            environ=environ,
            gpus=lambda _env: list(gpus if gpus is not None else gpus_like(RTX, 8)),
            driver_version=lambda: driver,
            cuda_version=lambda _env: cuda,
            sglang_site=lambda: site,
            detect_version=lambda _site: version,
            read_marker=lambda _site: good_marker(version) if marker == "good" else marker,
            preflight=lambda _site: list(preflight or []),
            sglang_parser=lambda _site: sglang_parser_for(version),
            run_selftest=fake_selftest,
            execvpe=lambda file, args, e: rec.execs.append((file, list(args), dict(e))),
        )
        out, err = io.StringIO(), io.StringIO()
        try:
            code = run(argv, host, out=out, err=err)
        except LaunchError as exc:
            # The same rendering main() does: one line on stderr, exit status 2.
            err.write(f"glmserve.launch: error: {exc}\n")
            code = 2
        return Outcome(code, out.getvalue(), err.getvalue(), rec)

    return _launch
