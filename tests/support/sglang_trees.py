"""Real SGLang trees for the patch-tool tests: wheels downloaded once into <repo>/.cache/wheels
(git-ignored, kept between runs), and only the files the series touches extracted per test."""

from __future__ import annotations

import hashlib
import shutil
from collections.abc import Callable
from pathlib import Path

import pytest

from glmserve.series.errors import PatchError
from glmserve.series.lock import load_lock
from glmserve.series.wheels import default_cache_dir, extract_site, fetch_wheel

REPO = Path(__file__).resolve().parents[2]
PATCHES = REPO / "patches"


@pytest.fixture(scope="session")
def pristine_site(
    tmp_path_factory: pytest.TempPathFactory, require: Callable[[bool, str], None]
) -> Callable[[str], Path]:
    """version -> a read-only-by-convention minimal site-packages extracted from the real wheel."""
    cache: dict[str, Path] = {}
    lock, _ = load_lock(PATCHES)

    def get(version: str) -> Path:
        if version not in cache:
            try:
                wheel = fetch_wheel(version, default_cache_dir())
            except PatchError as exc:
                require(False, f"cannot get the sglang {version} wheel: {exc}")
            members = [
                path
                for path, h in lock["series"][version]["files"].items()
                if h["before"] is not None
            ]
            cache[version] = extract_site(
                wheel, tmp_path_factory.mktemp(f"sglang-{version}"), members
            )
        return cache[version]

    return get


@pytest.fixture
def make_site(tmp_path: Path, pristine_site: Callable[[str], Path]) -> Callable[[str], Path]:
    """version -> a fresh, writable copy of that version's pristine tree for this test."""

    def make(version: str) -> Path:
        dest = tmp_path / f"site-{version}"
        shutil.copytree(pristine_site(version), dest)
        return dest

    return make


def _snapshot(site: Path) -> dict[str, str]:
    return {
        str(p.relative_to(site)): hashlib.sha256(p.read_bytes()).hexdigest()
        for p in sorted(site.rglob("*"))
        if p.is_file() and "__pycache__" not in p.parts
    }


@pytest.fixture
def snapshot() -> Callable[[Path], dict[str, str]]:
    """site -> sha256 of every file under it (bytecode excluded): "nothing changed" == equal."""
    return _snapshot


@pytest.fixture(scope="session")
def wheel_tree(
    tmp_path_factory: pytest.TempPathFactory, require: Callable[[bool, str], None]
) -> Callable[..., Path]:
    """(package, version, prefix) -> a directory holding that wheel's files under `prefix`
    (e.g. a newer SGLang's backend, or FlashInfer's mla package), downloaded once."""
    cache: dict[tuple[str, str, str], Path] = {}

    def get(package: str, version: str, prefix: str) -> Path:
        key = (package, version, prefix)
        if key not in cache:
            try:
                wheel = fetch_wheel(version, default_cache_dir(), package=package)
            except PatchError as exc:
                require(False, f"cannot get the {package} {version} wheel: {exc}")
            dest = tmp_path_factory.mktemp(f"{package}-{version}")
            cache[key] = extract_site(wheel, dest, prefixes=[prefix])
        return cache[key]

    return get


@pytest.fixture(scope="session")
def patched_tree(
    tmp_path_factory: pytest.TempPathFactory, pristine_site: Callable[[str], Path]
) -> Callable[[str], Path]:
    """version -> that version's real tree with the committed series applied by the real tool
    (shared by the session: tests read it, never write it)."""
    from glmserve.series import apply

    cache: dict[str, Path] = {}

    def get(version: str) -> Path:
        if version not in cache:
            site = tmp_path_factory.mktemp(f"patched-{version}")
            shutil.copytree(pristine_site(version), site, dirs_exist_ok=True)
            outcome = apply(site, PATCHES)
            assert outcome.action == "applied", outcome.message
            cache[version] = site
        return cache[version]

    return get
