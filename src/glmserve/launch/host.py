"""Everything the launcher asks of the machine, behind one object that tests replace.

The launcher's logic (cli.py) never touches GPUs, site-packages, the self-test or exec directly, so
every refusal can be tested on a CPU-only box with an injected inventory.
"""

from __future__ import annotations

import argparse
import importlib.util
import os
import time
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, NoReturn

from glmserve.launch.errors import LaunchError
from glmserve.launch.inventory import Gpu, cuda_runtime_version, detect_gpus, driver_version
from glmserve.launch.sglang_argv import load_parser


def sglang_site() -> Path | None:
    """The site dir holding the sglang package, found without importing it (importing SGLang
    pulls in torch and takes seconds; the check must stay cheap and side-effect free)."""
    spec = importlib.util.find_spec("sglang")
    if spec is None or not spec.submodule_search_locations:
        return None
    return Path(next(iter(spec.submodule_search_locations))).parent


def detect_version(site: Path) -> str:
    """The installed SGLang version, read from files by the patch tool (never imported)."""
    from glmserve.series import PatchError
    from glmserve.series import detect_version as _detect

    try:
        return _detect(site)
    except PatchError as exc:
        raise LaunchError(f"cannot tell which SGLang is installed: {exc}") from None


def read_marker(site: Path) -> dict[str, Any] | None:
    """The patch marker apply.py wrote into the package, or None when SGLang is unpatched."""
    from glmserve.series import read_marker as _read

    return _read(site)


def interrupted_patch(site: Path) -> str | None:
    """One line when an apply or revert of the series was interrupted in this tree, else None."""
    from glmserve.series import interrupted

    return interrupted(site)


def preflight(site: Path) -> list[str]:
    """The patch tool's check of the patch's effect (AST only: the self-test runs the kernel)."""
    from glmserve.preflight.verify import preflight as _preflight

    return _preflight(site, import_gather=False)


def run_selftest(env: Mapping[str, str]) -> tuple[str, str, str, dict[str, Any]]:
    """(status, detail, native, timing) from the kernel self-test; a crash or a missing module
    counts as failed, because serving an unverified kernel is exactly what the self-test exists
    to prevent. `native` is the native FP8 decode kernel's own verdict ("" when it was not
    checked); `timing` both decode paths timed on this GPU ({} when not timed).

    The self-test reads os.environ (the FP8 switches) and hands it to its child, so it gets the
    environment the server will get; this process is replaced by exec right after anyway.
    """
    os.environ.update(env)
    try:
        from glmserve.selftest.runner import run_selftest as _run
    except ImportError as exc:
        return "failed", f"self-test module not importable ({exc})", "", {}
    try:
        report = _run(timeout_s=30)
    except Exception as exc:  # a broken self-test must not look like a pass
        return "failed", f"self-test raised {type(exc).__name__}: {exc}", "", {}
    return str(report.status), str(report.detail), str(report.native), dict(report.timing)


def wait_for_stop() -> None:
    """Block until SIGTERM or SIGINT (docker stop, Ctrl-C)."""
    import signal
    import threading

    stop = threading.Event()
    for sig in (signal.SIGTERM, signal.SIGINT):
        signal.signal(sig, lambda *_: stop.set())
    while not stop.wait(3600):
        pass


def _exec(file: str, argv: list[str], env: Mapping[str, str]) -> NoReturn:
    os.execvpe(file, argv, dict(env))


@dataclass
class Host:
    environ: Mapping[str, str] = field(default_factory=lambda: os.environ)
    gpus: Callable[[Mapping[str, str]], list[Gpu]] = detect_gpus
    driver_version: Callable[[], str | None] = driver_version
    cuda_version: Callable[[Mapping[str, str]], str | None] = cuda_runtime_version
    sglang_site: Callable[[], Path | None] = sglang_site
    detect_version: Callable[[Path], str] = detect_version
    read_marker: Callable[[Path], dict[str, Any] | None] = read_marker
    # SGLang's argument parser, rebuilt from the installed server_args.py (never imported).
    sglang_parser: Callable[[Path], argparse.ArgumentParser] = load_parser
    preflight: Callable[[Path], list[str]] = preflight
    interrupted_patch: Callable[[Path], str | None] = interrupted_patch
    run_selftest: Callable[[Mapping[str, str]], tuple[str, str, str, dict[str, Any]]] = run_selftest
    execvpe: Callable[[str, list[str], Mapping[str, str]], Any] = _exec
    wait_for_stop: Callable[[], None] = wait_for_stop
    clock: Callable[[], float] = time.time
