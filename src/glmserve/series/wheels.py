"""Real SGLang wheels as test and regen input: download once into a cache, extract only what the
series touches plus the version metadata (a full SGLang tree is ~4,000 files we never read)."""

from __future__ import annotations

import os
import subprocess
import sys
import tempfile
import zipfile
from collections.abc import Iterable
from pathlib import Path

from glmserve.series.errors import PatchError

# Enough for version detection and for py_compile / ast inspection of the patched module.
BASE_MEMBERS = ("sglang/__init__.py", "sglang/version.py", "sglang/_version.py")


def default_cache_dir() -> Path:
    """<checkout>/.cache/wheels (git-ignored), shared by regen and the tests."""
    return Path(__file__).resolve().parents[3] / ".cache" / "wheels"


def find_wheel(version: str, cache_dir: Path, package: str = "sglang") -> Path | None:
    # Any tag will do: the files we need are pure Python (only a gRPC .so differs per tag).
    stem = package.replace("-", "_")
    hits = sorted(cache_dir.glob(f"{stem}-{version}-*.whl"))
    return hits[0] if hits else None


def fetch_wheel(
    version: str,
    cache_dir: Path | None = None,
    *,
    download: bool = True,
    package: str = "sglang",
) -> Path:
    """Path of the package==version wheel in the cache (SGLang unless told otherwise, e.g.
    flashinfer-python for the wrapper check), downloading it with pip if missing."""
    cache_dir = cache_dir or default_cache_dir()
    found = find_wheel(version, cache_dir, package)
    if found or not download:
        if found is None:
            raise PatchError(f"no {package} {version} wheel in {cache_dir} (downloads disabled)")
        return found
    cache_dir.mkdir(parents=True, exist_ok=True)
    # Download into a private directory and rename into place: a concurrent test run never
    # sees a half-written wheel under the cached name.
    with tempfile.TemporaryDirectory(dir=cache_dir, prefix=".download-") as tmp:
        cmd = [sys.executable, "-m", "pip", "download", "--quiet", "--no-deps"]
        cmd += ["--disable-pip-version-check", "--dest", tmp, f"{package}=={version}"]
        proc = subprocess.run(cmd, capture_output=True, text=True, timeout=600)
        got = find_wheel(version, Path(tmp), package)
        if proc.returncode != 0 or got is None:
            tail = (proc.stderr.strip().splitlines() or ["no output"])[-1]
            raise PatchError(f"pip download {package}=={version} failed: {tail}")
        os.replace(got, cache_dir / got.name)
    found = find_wheel(version, cache_dir, package)
    assert found is not None
    return found


def wheel_members(wheel: Path) -> set[str]:
    with zipfile.ZipFile(wheel) as zf:
        return set(zf.namelist())


def extract_site(
    wheel: Path, dest: Path, members: Iterable[str] = (), *, prefixes: Iterable[str] = ()
) -> Path:
    """Extract `members` (paths relative to site-packages), every member under one of
    `prefixes`, the dist-info METADATA and the version modules from `wheel` into `dest`, which
    then looks like a minimal site-packages."""
    with zipfile.ZipFile(wheel) as zf:
        names = set(zf.namelist())
        wanted = set(members) | {m for m in BASE_MEMBERS if m in names}
        wanted |= {n for n in names for p in prefixes if n.startswith(p) and not n.endswith("/")}
        wanted |= {n for n in names if n.endswith(".dist-info/METADATA") and n.count("/") == 1}
        missing = sorted(set(members) - names)
        if missing:
            raise PatchError(f"{wheel.name} has no {missing[0]}")
        for name in sorted(wanted):
            # Member names come from our own list or the dist-info pattern, never from the
            # archive's arbitrary entries, so no path can escape `dest`.
            target = dest / name
            target.parent.mkdir(parents=True, exist_ok=True)
            target.write_bytes(zf.read(name))
    return dest
