"""One home per SGLang line (glmserve.sglang_lines.LINES): the files that must name the pinned line
literally (the Dockerfile's ARG defaults, compose, .env.example, k8s) say exactly what the home
says, every line's series and profiles exist, few files outside the home spell a version, every
pin is what that line's real wheel requires, every line is its own source series in the lock (the
fa3 path patched exactly where the table says), and the build's base check refuses another
line's base or GPU stack in one line each."""

from __future__ import annotations

import io
import json
import re
import subprocess
import tokenize
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
FA_BACKEND = "sglang/srt/layers/attention/flashattention_backend.py"
PINNED = sglang_lines.get()
# Files outside the home, patches/, tests/, docs/, bench/results/ and bench/overlay-pins/ (per-line
# data, as patches/ is) whose code or data may spell an SGLang version: those that cannot read
# the home (Dockerfile ARG defaults, compose, .env.example, k8s manifests, checked below), the
# front page, promtool's rule-test data, and the class checks, which name the release whose
# backend API they drive (a fact of that API, not a pin). Comments, docstrings and prose (*.md)
# may name a release where they state what it changed.
MAY_SPELL_A_VERSION = {
    "src/glmserve/sglang_lines.py",
    "Dockerfile",
    "compose.yaml",
    ".env.example",
    "k8s/workers-lws.yaml",
    "README.md",
    "monitoring/prometheus/tests/glmserve-rules.test.yml",
    "src/glmserve/selftest/classcheck.py",
}
# An SGLang release number (0.5.x, also inside image tags); a pin such as pkg==0.5.4 is not one.
VERSION = re.compile(r"(?<![=\d.])0\.5\.\d+(?:\.post\d+)?(?!\d)")


def test_the_dockerfile_builds_the_pinned_line_by_default() -> None:
    assert dockerfile_arg("BASE_IMAGE") == "lmsysorg/sglang:v${SGLANG_LINE}-cu130"
    assert PINNED.image == f"lmsysorg/sglang:v{PINNED.version}-cu130"
    assert dockerfile_arg("SGLANG_LINE") == PINNED.version == PINNED.series
    assert dockerfile_arg("EXPECT_CUDA") == PINNED.cuda_major
    assert dockerfile_arg("GLMSERVE_VERSION") == glmserve.__version__


def test_compose_env_example_and_k8s_name_the_pinned_image() -> None:
    compose = load_compose(REPO / "compose.yaml")
    tag = PINNED.server_image.replace(PINNED.version, f"${{SGLANG_LINE:-{PINNED.version}}}")
    assert compose["services"]["sglang"]["image"] == f"${{GLMSERVE_IMAGE:-{tag}}}"
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
    with pytest.raises(sglang_lines.LineError, match=r"SGLang line '0\.0\.1' is not built here"):
        sglang_lines.get("0.0.1")


def test_scripts_read_the_line_from_the_home(capsys: pytest.CaptureFixture[str]) -> None:
    assert sglang_lines.main(["get", "version"]) == 0
    assert sglang_lines.main(["get", "version", "current"]) == 0
    assert sglang_lines.main(["build-args"]) == 0
    assert sglang_lines.main(["get", "nonsense"]) == 2
    out = capsys.readouterr().out.splitlines()
    assert out[:2] == [PINNED.version, sglang_lines.CURRENT_LINE]
    assert out[2:] == [f"{k}={v}" for k, v in sglang_lines.build_args().items()]


def code_of(path: Path, text: str) -> str:
    """The text without its comments (and, for Python, its docstrings): what runs or is read as
    data. Shell-style comments are whole lines starting with '#' or text after ' #'."""
    if path.suffix == ".py":
        kept, previous = [], tokenize.NEWLINE
        for tok in tokenize.generate_tokens(io.StringIO(text).readline):
            docstring = tok.type == tokenize.STRING and previous in STATEMENT_START
            if tok.type != tokenize.COMMENT and not docstring:
                kept.append(tok.string)
            if tok.type not in (tokenize.NL, tokenize.COMMENT):
                previous = tok.type
        return " ".join(kept)
    if path.suffix in (".json", ".png", ".gz"):
        return text
    return "\n".join(re.sub(r"(^|\s)#.*", "", line) for line in text.splitlines())


STATEMENT_START = (tokenize.NEWLINE, tokenize.INDENT, tokenize.DEDENT, tokenize.ENCODING)


def test_few_files_spell_an_sglang_version() -> None:
    """A new line is one entry in the home, not edits across the tree."""
    proc = subprocess.run(
        ["git", "ls-files", "-z", "--", ".", ":!patches", ":!tests", ":!docs", ":!bench/results",
         ":!bench/overlay-pins", ":!*.md", "README.md"],
        cwd=REPO, capture_output=True, text=True,
    )  # fmt: skip
    require(proc.returncode == 0, f"git ls-files failed here: {proc.stderr.strip()}")
    spelling = set()
    for name in filter(None, proc.stdout.split("\0")):
        path = REPO / name
        text = path.read_text(encoding="utf-8", errors="replace") if path.is_file() else ""
        if path.suffix in (".png", ".gz") or not VERSION.search(code_of(path, text)):
            continue
        if path.parent.name == "profiles" and path.suffix == ".json":
            # A profile written for another line documents that line (and how it differs from
            # the default one); it may name those two and no other.
            own = {line.version for line in sglang_lines.lines_for_profile(path.stem)}
            if own and set(VERSION.findall(text)) <= own | {PINNED.version}:
                continue
        spelling.add(name)
    assert spelling <= MAY_SPELL_A_VERSION, sorted(spelling - MAY_SPELL_A_VERSION)
    assert len(MAY_SPELL_A_VERSION) <= 8


def requires(version: str, require) -> dict[str, str]:
    """{project: pinned version} from the line's wheel METADATA (Requires-Dist: x==v)."""
    try:
        wheel = fetch_wheel(version, default_cache_dir())
    except PatchError as exc:
        require(False, f"cannot get the sglang {version} wheel: {exc}")
    with zipfile.ZipFile(wheel) as zf:
        meta = next(n for n in zf.namelist() if n.endswith(".dist-info/METADATA"))
        text = zf.read(meta).decode()
    pins = {}
    for line in text.splitlines():
        if line.startswith("Requires-Dist:") and "==" in line and ";" not in line:
            spec = line.split(":", 1)[1].strip()
            name, pinned = spec.split("==", 1)
            pins[name.split("[")[0].strip().lower().replace("_", "-")] = pinned.strip()
    return pins


@pytest.mark.parametrize("version", sorted(sglang_lines.LINES))
def test_each_line_pins_what_its_wheel_requires(version, require):
    line = sglang_lines.get(version)
    pins = requires(version, require)
    assert pins["torch"] == line.torch
    assert pins["flashinfer-python"] == line.flashinfer
    assert pins["sglang-kernel"] == line.sglang_kernel
    assert line.lab_gpu is (line.torch == "2.11.0")  # the lent H200's torch


def test_each_line_is_its_own_series_and_patches_what_the_table_says():
    lock = json.loads((REPO / "patches" / "series.lock.json").read_text())["series"]
    for version, line in sglang_lines.LINES.items():
        assert lock[version]["source"] == version
        assert (FA_BACKEND in lock[version]["files"]) is ("fa3" in line.patched_backends)
        assert "flashinfer" in line.patched_backends
    assert sglang_lines.DEFAULT_LINE in sglang_lines.LINES
    assert sglang_lines.CURRENT_LINE in sglang_lines.LINES


def test_build_args_are_the_line_and_its_base(capsys):
    assert sglang_lines.main(["build-args", "0.5.17"]) == 0
    assert capsys.readouterr().out.splitlines() == [
        "SGLANG_LINE=0.5.17",
        "BASE_IMAGE=lmsysorg/sglang:v0.5.17-cu130",
    ]
    assert sglang_lines.main(["build-args", "0.5.12.post1"]) == 0
    assert (
        capsys.readouterr()
        .out.splitlines()[1]
        .endswith("-cu130@sha256:ceaf8b16e02d165143633ac228bbb994a05fe77d7e0526cf035ae4bbf4eacc36")
    )
    assert sglang_lines.main(["build-args", "0.5.18"]) == 2
    assert capsys.readouterr().err.splitlines() == [
        "python -m glmserve.sglang_lines: error: SGLang line '0.5.18' is not built here "
        "(lines: 0.5.12.post1, 0.5.17, 0.5.23)"
    ]


def fake_site(tmp_path: Path, **versions: str) -> Path:
    for project, version in versions.items():
        info = tmp_path / f"{project}-{version}.dist-info"
        info.mkdir(parents=True)
        (info / "METADATA").write_text(
            f"Metadata-Version: 2.1\nName: {project}\nVersion: {version}\n"
        )
    return tmp_path


def test_the_base_check_refuses_another_line_and_another_gpu_stack(tmp_path):
    right = fake_site(
        tmp_path / "right",
        sglang="0.5.17",
        torch="2.11.0+cu130",
        flashinfer_python="0.6.15.post1",
        sglang_kernel="0.4.5",
    )
    assert sglang_lines.site_problems(right, "0.5.17", gpu_stack_required=True) == []
    assert sglang_lines.site_problems(right, "0.5.23", gpu_stack_required=True) == [
        "the base holds SGLang 0.5.17, the line is 0.5.23: build SGLANG_LINE=0.5.23 on "
        "lmsysorg/sglang:v0.5.23-cu130",
        "the base holds torch 2.11.0+cu130, SGLang 0.5.23 pins 2.14.1",
        "the base holds flashinfer-python 0.6.15.post1, SGLang 0.5.23 pins 0.7.2",
        "the base holds sglang-kernel 0.4.5, SGLang 0.5.23 pins 0.4.10",
    ]
    # CI's stand-in: SGLang alone, no GPU stack; required on a real base.
    bare = fake_site(tmp_path / "bare", sglang="0.5.17")
    assert sglang_lines.site_problems(bare, "0.5.17", gpu_stack_required=False) == []
    assert len(sglang_lines.site_problems(bare, "0.5.17", gpu_stack_required=True)) == 3
