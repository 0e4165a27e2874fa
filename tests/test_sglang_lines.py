"""One home per SGLang line (glmserve.sglang_lines.LINES): the files that must name the pinned line
literally (the Dockerfile's ARG defaults, compose, .env.example, k8s) say exactly what the home
says, every line's series and profiles exist, and few files outside the home spell a version."""

from __future__ import annotations

import json
import re
import subprocess
import zipfile
from pathlib import Path

import pytest
import yaml
from support.policy import require
from support.stack import dockerfile_arg

import glmserve
from glmserve import sglang_lines
from glmserve.doctor.compose import load as load_compose
from glmserve.launch.profiles import available, find_profiles_dir
from glmserve.series.errors import PatchError
from glmserve.series.wheels import default_cache_dir, fetch_wheel

REPO = Path(__file__).resolve().parents[1]
PINNED = sglang_lines.get()
# Files outside the home, patches/, tests/, docs/ and bench/results/ that may spell an SGLang
# version: those that cannot read the home (Dockerfile ARG defaults, compose, .env.example, k8s
# manifests, checked below), the front page, and promtool's rule-test data.
MAY_SPELL_A_VERSION = {
    "src/glmserve/sglang_lines.py",
    "Dockerfile",
    "compose.yaml",
    ".env.example",
    "k8s/workers-lws.yaml",
    "README.md",
    "monitoring/prometheus/tests/glmserve-rules.test.yml",
}
# An SGLang release number (0.5.x, also inside image tags); a pin such as pkg==0.5.4 is not one.
VERSION = re.compile(r"(?<![=\d.])0\.5\.\d+(?:\.post\d+)?(?!\d)")


def test_the_dockerfile_builds_the_pinned_line_by_default() -> None:
    assert dockerfile_arg("BASE_IMAGE") == PINNED.base_image
    assert dockerfile_arg("SGLANG_VERSION") == PINNED.version
    assert dockerfile_arg("PATCH_SERIES") == PINNED.series
    assert dockerfile_arg("EXPECT_CUDA") == PINNED.cuda_major
    assert dockerfile_arg("GLMSERVE_VERSION") == glmserve.__version__


def test_compose_env_example_and_k8s_name_the_pinned_image() -> None:
    compose = load_compose(REPO / "compose.yaml")
    assert compose["services"]["sglang"]["image"] == f"${{GLMSERVE_IMAGE:-{PINNED.server_image}}}"
    example = (REPO / ".env.example").read_text()
    for key, value in sglang_lines.build_args().items():
        assert re.search(rf"^#? ?{key}={re.escape(value)}$", example, re.M), (key, value)
    workers = next(
        doc
        for doc in yaml.safe_load_all((REPO / "k8s" / "workers-lws.yaml").read_text())
        if doc and doc.get("kind") == "LeaderWorkerSet"
    )
    images = {
        c["image"]
        for tpl in ("leaderTemplate", "workerTemplate")
        for c in workers["spec"]["leaderWorkerTemplate"][tpl]["spec"]["containers"]
    }
    assert images == {PINNED.server_image}


def test_the_image_tag_carries_the_package_version() -> None:
    pyproject = (REPO / "pyproject.toml").read_text()
    assert re.search(rf'^version = "{re.escape(glmserve.__version__)}"$', pyproject, re.M)


@pytest.mark.parametrize("line", sglang_lines.LINES.values(), ids=lambda line: line.version)
def test_every_line_has_its_series_and_its_profiles(line: sglang_lines.Line) -> None:
    lock = json.loads((REPO / "patches" / "series.lock.json").read_text())
    assert lock["series"][line.version]["source"] == line.series
    assert (REPO / "patches" / line.series).is_dir()
    shipped = set(available(find_profiles_dir({}, None)))
    assert set(line.profiles) <= shipped, set(line.profiles) - shipped
    assert line.digest is None or line.digest.startswith("sha256:")  # the default: by digest
    assert f":v{line.version}-" in line.image and line.base_image.startswith(line.image)


def test_every_shipped_profile_belongs_to_a_line() -> None:
    listed = {name for line in sglang_lines.LINES.values() for name in line.profiles}
    assert set(available(find_profiles_dir({}, None))) <= listed


def test_lines_are_looked_up_by_version_with_one_clear_refusal() -> None:
    assert sglang_lines.get(PINNED.version) is PINNED
    with pytest.raises(sglang_lines.LineError, match=r"SGLang 0\.0\.1 is not a line"):
        sglang_lines.get("0.0.1")


def test_scripts_read_the_line_from_the_home(capsys: pytest.CaptureFixture[str]) -> None:
    assert sglang_lines.main(["get", "version"]) == 0
    assert sglang_lines.main(["build-args"]) == 0
    assert sglang_lines.main(["get", "nonsense"]) == 2
    out = capsys.readouterr().out.splitlines()
    assert out[0] == PINNED.version
    assert out[1:] == [f"{k}={v}" for k, v in sglang_lines.build_args().items()]


def test_few_files_spell_an_sglang_version() -> None:
    """A new line is one entry in the home, not edits across the tree."""
    proc = subprocess.run(
        ["git", "ls-files", "-z", "--", ".", ":!patches", ":!tests", ":!docs", ":!bench/results"],
        cwd=REPO, capture_output=True, text=True,
    )  # fmt: skip
    require(proc.returncode == 0, f"git ls-files failed here: {proc.stderr.strip()}")
    spelling = set()
    for name in filter(None, proc.stdout.split("\0")):
        path = REPO / name
        text = path.read_text(encoding="utf-8", errors="replace") if path.is_file() else ""
        if path.suffix not in (".png", ".gz") and VERSION.search(text):
            spelling.add(name)
    assert spelling <= MAY_SPELL_A_VERSION, sorted(spelling - MAY_SPELL_A_VERSION)
    assert len(MAY_SPELL_A_VERSION) <= 8


def test_the_pinned_lines_pins_are_its_wheels() -> None:
    """torch, FlashInfer and sglang-kernel as the line says are what the SGLang wheel requires."""
    try:
        wheel = fetch_wheel(PINNED.version, default_cache_dir())
    except PatchError as exc:
        require(False, f"cannot get the sglang {PINNED.version} wheel: {exc}")
    with zipfile.ZipFile(wheel) as zf:
        meta = zf.read(f"sglang-{PINNED.version}.dist-info/METADATA").decode()
    pins = dict(re.findall(r"^Requires-Dist: ([A-Za-z0-9_.-]+)==([^\s;]+)", meta, re.M))
    assert pins["torch"] == PINNED.torch
    assert pins["flashinfer_python"] == pins["flashinfer_cubin"] == PINNED.flashinfer
    assert pins["sglang-kernel"] == PINNED.sglang_kernel
