"""The patch code's three rooms keep their walls: the series tool runs at image build time with
the stdlib alone (no torch, nothing from the rooms built on it), and the self-test, which runs
on the GPU, takes nothing from the preflight."""

from __future__ import annotations

import ast
import re
import subprocess
import sys
from pathlib import Path

import pytest

SRC = Path(__file__).resolve().parents[1] / "src"


def imported_modules(room: str) -> dict[str, set[str]]:
    """module file -> every module it imports (top level or inside functions), by full name."""
    out: dict[str, set[str]] = {}
    for path in sorted((SRC / "glmserve" / room).rglob("*.py")):
        names: set[str] = set()
        for node in ast.walk(ast.parse(path.read_text(encoding="utf-8"))):
            if isinstance(node, ast.Import):
                names.update(alias.name for alias in node.names)
            elif isinstance(node, ast.ImportFrom) and node.module and not node.level:
                names.add(node.module)
                names.update(f"{node.module}.{alias.name}" for alias in node.names)
        out[str(path.relative_to(SRC))] = names
    return out


def offenders(room: str, allowed) -> list[str]:
    return [
        f"{path} imports {name}"
        for path, names in imported_modules(room).items()
        for name in sorted(names)
        if not allowed(name)
    ]


def test_series_tool_is_stdlib_only() -> None:
    def allowed(name: str) -> bool:
        top = name.split(".")[0]
        if top == "glmserve":
            return name == "glmserve.series" or name.startswith("glmserve.series.")
        return top in sys.stdlib_module_names or top == "__future__"

    assert offenders("series", allowed) == []


def test_selftest_takes_nothing_from_the_preflight() -> None:
    def allowed(name: str) -> bool:
        return not (name == "glmserve.preflight" or name.startswith("glmserve.preflight."))

    assert offenders("selftest", allowed) == []


@pytest.mark.parametrize("room", ["series", "preflight", "selftest"])
def test_each_room_says_what_it_is(room: str) -> None:
    doc = ast.get_docstring(ast.parse((SRC / "glmserve" / room / "__init__.py").read_text()))
    assert doc and len(doc.splitlines()) <= 12, f"glmserve.{room} needs a short docstring"


@pytest.mark.parametrize(
    ("old", "usage"),
    [
        ("glmserve.patching", "usage: glmserve-patch "),  # the CLI of python -m glmserve.series
        ("glmserve.patching.verify", "usage: python -m glmserve.preflight "),
        ("glmserve.patching.selftest", "usage: python -m glmserve.selftest "),
        ("glmserve.patching.regen", "usage: python -m glmserve.series.regen "),
        ("glmserve.patching.workspace", "usage: python -m glmserve.series.workspace "),
    ],
)
def test_old_entry_points_still_run(old: str, usage: str) -> None:
    """Scripts and habits that still say `python -m glmserve.patching.X` get the new room's CLI."""
    proc = subprocess.run(
        [sys.executable, "-m", old, "--help"], capture_output=True, text=True, timeout=60
    )
    assert proc.returncode == 0, proc.stderr
    assert proc.stdout.startswith(usage), proc.stdout


def test_no_product_module_needs_the_test_instruments() -> None:
    """glmserve.testing is left out of the wheel (pyproject.toml), so nothing shipped imports it."""
    pyproject = (SRC.parent / "pyproject.toml").read_text()
    assert 'exclude = ["glmserve.testing", "glmserve.testing.*"]' in pyproject
    shipped = [p.name for p in (SRC / "glmserve").iterdir() if p.is_dir() and p.name != "testing"]
    found = [
        line
        for room in shipped
        for line in offenders(room, lambda name: not name.startswith("glmserve.testing"))
    ]
    assert found == []


def test_nothing_shipped_is_there_only_for_the_tests() -> None:
    """A public function or class of the package that only tests use belongs in tests/support
    or glmserve.testing (a test oracle once shipped in the self-test, a fleet writer that only
    a test called was documented as "the code compose uses"). Used means named anywhere else:
    the package, the scripts, the bench, the compose and docker files, or the docs (an API the
    docs point at is the product's)."""
    root = SRC.parent
    shipped = [p for p in (SRC / "glmserve").rglob("*.py") if "testing" not in p.parts]
    elsewhere = [*shipped, *root.glob("bench/**/*.py"), *root.glob("loadtest/*.py"),
                 *root.glob("patches/*.py"), *root.glob("docker/*.sh"), *root.glob("docs/*.md"),
                 root / "Dockerfile", root / "compose.yaml", root / "README.md"]  # fmt: skip
    text = {p: p.read_text(encoding="utf-8") for p in elsewhere}
    only_tests = []
    for path in shipped:
        for node in ast.parse(text[path]).body:
            if not isinstance(node, (ast.FunctionDef, ast.ClassDef)) or node.name.startswith("_"):
                continue
            if node.name == "main":
                continue
            word = re.compile(rf"\b{re.escape(node.name)}\b")
            uses = sum(len(word.findall(t)) for t in text.values())
            if uses <= 1:  # its own definition
                only_tests.append(f"{path.relative_to(SRC)}: {node.name}")
    assert only_tests == []
