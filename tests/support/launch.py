"""Shared constants and doubles for the launcher tests."""

from __future__ import annotations

import argparse
import functools
import zipfile
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from glmserve.launch import Gpu
from glmserve.launch.sglang_argv import SERVER_ARGS_FILE, parser_from_source

REPO = Path(__file__).resolve().parents[2]
PROFILES_DIR = REPO / "deploy" / "profiles"
GLM_FIXTURE = REPO / "tests" / "fixtures" / "glm5-nvfp4"
GLM52_FIXTURE = REPO / "tests" / "fixtures" / "glm52-nvfp4"
MODEL_FIXTURES = (GLM_FIXTURE, GLM52_FIXTURE)
TINY_MODEL = REPO / "deploy" / "models" / "tiny-mla"
PINNED = "0.5.12.post1"
PROFILE_NAMES = sorted(p.stem for p in PROFILES_DIR.glob("*.json"))

RTX = Gpu(index=0, name="NVIDIA RTX PRO 6000 Blackwell Workstation Edition", capability=(12, 0))
B200 = Gpu(index=0, name="NVIDIA B200", capability=(10, 0))
H200 = Gpu(index=0, name="NVIDIA H200", capability=(9, 0))


@functools.lru_cache(maxsize=1)
def pinned_server_args_source() -> str:
    """The pinned SGLang's server_args.py, from its wheel (downloaded once into .cache/wheels)."""
    from glmserve.series.errors import PatchError
    from glmserve.series.wheels import fetch_wheel
    from support.policy import require

    try:
        wheel = fetch_wheel(PINNED)
    except PatchError as exc:
        require(False, f"cannot get the sglang {PINNED} wheel: {exc}")
        raise
    with zipfile.ZipFile(wheel) as zf:
        return zf.read(SERVER_ARGS_FILE).decode("utf-8")


@functools.lru_cache(maxsize=4)
def sglang_parser_for(version: str) -> argparse.ArgumentParser:
    """The launcher's view of that SGLang line's parser, from its wheel (server_args.py and, from
    0.5.23, arg_groups/fields/)."""
    from glmserve.launch.sglang_argv import FIELDS_DIR
    from glmserve.series.errors import PatchError
    from glmserve.series.wheels import fetch_wheel
    from support.policy import require

    if version == PINNED:
        return pinned_sglang_parser()
    try:
        wheel = fetch_wheel(version)
    except PatchError as exc:
        require(False, f"cannot get the sglang {version} wheel: {exc}")
        raise
    with zipfile.ZipFile(wheel) as zf:
        fields = tuple(
            zf.read(n).decode("utf-8")
            for n in sorted(zf.namelist())
            if n.startswith(FIELDS_DIR + "/")
            and n.endswith(".py")
            and not n.endswith("/__init__.py")
        )
        return parser_from_source(zf.read(SERVER_ARGS_FILE).decode("utf-8"), fields)


def pinned_sglang_parser(_site: Path | None = None) -> argparse.ArgumentParser:
    """The launcher's view of the pinned SGLang's argument parser, for a Host double whose
    site-packages are not real."""
    return parser_from_source(pinned_server_args_source())


def gpus_like(proto: Gpu, n: int) -> list[Gpu]:
    return [Gpu(index=i, name=proto.name, capability=proto.capability) for i in range(n)]


def good_marker(version: str = PINNED) -> dict[str, Any]:
    return {"series": version, "sglang_version": version, "lock_sha256": "ab" * 32}


@dataclass
class Recorder:
    """What the launcher did to the machine: exec calls and self-test runs."""

    execs: list[tuple[str, list[str], dict[str, str]]] = field(default_factory=list)
    selftests: int = 0
    selftest_env: dict[str, str] = field(default_factory=dict)


@dataclass
class Outcome:
    code: int
    out: str
    err: str
    rec: Recorder


def dry_run_plan(launcher_args: list[str], environ: dict[str, str]) -> dict[str, Any]:
    """The launcher's --dry-run plan for `launcher_args` (what follows `python -m
    glmserve.launch`), on a host whose SGLang is the pinned release, patched, and never imported,
    preflighted or started: the point is how the caller's flags meet the real profiles."""
    import io
    import json

    from glmserve.launch import Host, run

    def no_exec(*_args: object) -> None:
        raise AssertionError("--dry-run must not exec")

    host = Host(
        environ=environ,
        sglang_site=lambda: Path("/nonexistent/site"),
        detect_version=lambda _site: PINNED,
        read_marker=lambda _site: good_marker(),
        preflight=lambda _site: [],
        sglang_parser=pinned_sglang_parser,
        execvpe=no_exec,
    )
    out, err = io.StringIO(), io.StringIO()
    assert run(["--dry-run", *launcher_args], host, out=out, err=err) == 0, err.getvalue()
    return json.loads(out.getvalue())


def model_fixture(profile: str) -> Path:
    """The fake model dir whose config.json satisfies the profile's model checks (GLM-5 for the
    GLM-5/5.1 profiles, GLM-5.2 for the glm52-* ones)."""
    import json

    from glmserve.launch.profiles import parse_profile_file

    expect = parse_profile_file(PROFILES_DIR / f"{profile}.json").model.expect
    for fixture in MODEL_FIXTURES:
        config = json.loads((fixture / "config.json").read_text())
        if all(config.get(key) == value for key, value in expect.items()):
            return fixture
    raise LookupError(f"no model fixture satisfies profile {profile}'s model.expect {expect}")
