"""The patch code's rooms keep their walls: the series tool runs at image build time with the
stdlib alone (no torch, nothing from the rooms built on it), the self-test, which runs on the
GPU, takes nothing from the preflight, and each kernel has one definition, self-contained."""

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


@pytest.mark.parametrize("room", ["series", "preflight", "selftest", "kernels"])
def test_each_room_says_what_it_is(room: str) -> None:
    doc = ast.get_docstring(ast.parse((SRC / "glmserve" / room / "__init__.py").read_text()))
    assert doc and len(doc.splitlines()) <= 12, f"glmserve.{room} needs a short docstring"


def test_kernels_are_self_contained() -> None:
    """The kernels are copied into SGLang as they are (glmserve.series.kernels): they may import
    torch, Triton and the standard library, nothing of glmserve or SGLang."""

    def allowed(name: str) -> bool:
        top = name.split(".")[0]
        return top in ("torch", "triton", "__future__") or top in sys.stdlib_module_names

    assert offenders("kernels", allowed) == []


def _tracked_files() -> list[Path]:
    repo = SRC.parent
    proc = subprocess.run(
        ["git", "ls-files", "-z"], cwd=repo, capture_output=True, timeout=60, check=False
    )
    if proc.returncode == 0:
        return [repo / name for name in proc.stdout.decode().split("\0") if name]
    skip = {".git", ".venv", ".cache", "node_modules"}
    return [
        p
        for p in repo.rglob("*")
        if p.is_file() and not skip.intersection(p.relative_to(repo).parts)
    ]


def _kernel_functions(module: ast.Module) -> set[str]:
    """The Triton kernels of a module (@triton.jit) and the functions that launch them."""
    functions = [node for node in module.body if isinstance(node, ast.FunctionDef)]
    jit = {
        f.name
        for f in functions
        for d in f.decorator_list
        if "triton.jit" in ast.unparse(d.func if isinstance(d, ast.Call) else d)
    }
    launchers = {
        f.name
        for f in functions
        if any(isinstance(n, ast.Name) and n.id in jit for n in ast.walk(f))
    }
    return jit | launchers


def test_each_kernel_is_defined_once_in_the_repository() -> None:
    """Every function of a kernel source is defined in that file alone: no second copy in the
    tree, and inside the diffs only in the generated sections (tests/series/test_kernels.py
    proves those equal the source, byte for byte)."""
    from glmserve.series.kernels import KERNEL_FILES, KERNELS_DIR, _section_path, _sections

    names: set[str] = set()
    for name in KERNEL_FILES.values():
        names |= _kernel_functions(ast.parse((KERNELS_DIR / name).read_text(encoding="utf-8")))
    assert {"mla_decode_fp8", "gather_cast", "gather_cast_pages"} <= names
    found: dict[str, list[str]] = {name: [] for name in names}
    for path in _tracked_files():
        if path.suffix not in (".py", ".patch") or not path.is_file():
            continue
        data = path.read_bytes()
        if path.suffix == ".patch":
            # Only sections that are not a generated kernel copy count as definitions.
            data = b"".join(s for s in _sections(data)[1] if _section_path(s) not in KERNEL_FILES)
        text = data.decode("utf-8", "replace")
        for name in names:
            if f"def {name}(" in text:
                found[name].append(str(path.relative_to(SRC.parent)))
    expected = {name: 1 for name in names}
    counts = {name: len(paths) for name, paths in found.items()}
    assert counts == expected, {n: p for n, p in found.items() if len(p) != 1}
    assert all(paths[0].startswith("src/glmserve/kernels/") for paths in found.values()), found


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
