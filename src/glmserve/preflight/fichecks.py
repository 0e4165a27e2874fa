"""Does FlashInfer's `BatchMLAPagedAttentionWrapper.run()` really read what the patch reads?

The patched backend gathers exactly the rows listed in `wrapper._kv_indices_buf` and counts on
`run()` reading that same tensor. If a FlashInfer release renamed it, stopped reading it, or
moved the read into a per-backend object that keeps its own copy, the gather would refresh rows
`run()` never looks at (wrong output), or the patch would fall back to the full cast.

This reads FlashInfer's source with `ast` (FlashInfer is never imported, so this runs without a
GPU) in both package layouts: `flashinfer/mla.py` or `flashinfer/mla/_core.py` (0.6.x, where
`run()` passes `self._kv_indices_buf` to the kernel), and `flashinfer/mla/_batch_mla/...`
(0.7.x, where `run()` hands over to the planned backend's `run_from_wrapper()` and the wrapper
mirrors the planned backend's buffer). Stdlib only.
"""

from __future__ import annotations

import ast
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

WRAPPER = "BatchMLAPagedAttentionWrapper"
RUN = "run"


@dataclass(frozen=True)
class _Class:
    node: ast.ClassDef
    path: Path

    @property
    def bases(self) -> list[str]:
        out = []
        for b in self.node.bases:
            if isinstance(b, ast.Name):
                out.append(b.id)
            elif isinstance(b, ast.Attribute):
                out.append(b.attr)
            elif isinstance(b, ast.Subscript) and isinstance(b.value, ast.Name):
                out.append(b.value.id)
        return out

    @property
    def is_protocol(self) -> bool:
        return "Protocol" in self.bases


def _sources(fi_dir: Path) -> Iterator[Path]:
    if (fi_dir / "mla.py").is_file():
        yield fi_dir / "mla.py"
    if (fi_dir / "mla").is_dir():
        yield from sorted((fi_dir / "mla").rglob("*.py"))


def _classes(fi_dir: Path) -> dict[str, _Class]:
    found: dict[str, _Class] = {}
    for path in _sources(fi_dir):
        try:
            tree = ast.parse(path.read_bytes(), filename=str(path))
        except (SyntaxError, ValueError):
            continue
        for node in ast.walk(tree):
            if isinstance(node, ast.ClassDef):
                found.setdefault(node.name, _Class(node, path))
    return found


def _is_overload(fn: ast.FunctionDef) -> bool:
    for d in fn.decorator_list:
        name = d.attr if isinstance(d, ast.Attribute) else getattr(d, "id", None)
        if name == "overload":
            return True
    return False


def _is_stub(fn: ast.FunctionDef) -> bool:
    body = [
        s for s in fn.body if not (isinstance(s, ast.Expr) and isinstance(s.value, ast.Constant))
    ]
    return all(
        isinstance(s, ast.Pass)
        or (isinstance(s, ast.Expr) and isinstance(s.value, ast.Constant))
        or (isinstance(s, ast.Raise))
        for s in body
    )


class _Package:
    def __init__(self, fi_dir: Path) -> None:
        self.classes = _classes(fi_dir)

    def mro(self, name: str) -> list[_Class]:
        out: list[_Class] = []
        todo = [name]
        while todo:
            cls = self.classes.get(todo.pop(0))
            if cls is None or cls in out:
                continue
            out.append(cls)
            todo += cls.bases
        return out

    def method(self, cls: str, name: str) -> ast.FunctionDef | None:
        """The implementation `cls().name` resolves to (overload stubs skipped)."""
        for c in self.mro(cls):
            defs = [
                n
                for n in c.node.body
                if isinstance(n, ast.FunctionDef) and n.name == name and not _is_overload(n)
            ]
            if defs:
                return defs[-1]
        return None

    def self_reads(self, cls: str, name: str) -> set[str]:
        """Attributes `cls().name(...)` reads from self, following calls to its own methods."""
        seen: set[str] = set()
        reads: set[str] = set()
        todo = [name]
        while todo:
            meth = todo.pop()
            if meth in seen:
                continue
            seen.add(meth)
            fn = self.method(cls, meth)
            if fn is None:
                continue
            for n in ast.walk(fn):
                if (
                    isinstance(n, ast.Attribute)
                    and isinstance(n.ctx, ast.Load)
                    and isinstance(n.value, ast.Name)
                    and n.value.id == "self"
                ):
                    reads.add(n.attr)
                    todo.append(n.attr)
                elif _getattr_of_self(n) is not None:
                    reads.add(_getattr_of_self(n))  # type: ignore[arg-type]
        return reads

    def delegated_calls(self, cls: str, name: str) -> set[str]:
        """Methods whose result `cls().name(...)` returns, called on an object it took from its
        own attributes (0.7.x: `return planned_backend.run_from_wrapper(...)`)."""
        fn = self.method(cls, name)
        if fn is None:
            return set()
        held: set[str] = set()
        for n in ast.walk(fn):
            if isinstance(n, ast.Assign) and (
                _is_self_attr(n.value) or _getattr_of_self(n.value) is not None
            ):
                held |= {t.id for t in n.targets if isinstance(t, ast.Name)}
        calls = set()
        for ret in ast.walk(fn):
            if not isinstance(ret, ast.Return) or ret.value is None:
                continue
            n = ret.value
            if isinstance(n, ast.Call) and isinstance(n.func, ast.Attribute):
                recv = n.func.value
                if (isinstance(recv, ast.Name) and recv.id in held) or _is_self_attr(recv):
                    calls.add(n.func.attr)
        return calls

    def implementers(self, name: str, besides: str) -> list[str]:
        """Concrete classes (no subclass here, not a Protocol) whose `name` is real code."""
        have = []
        for cname, c in self.classes.items():
            if c.is_protocol or cname == besides:
                continue
            fn = self.method(cname, name)
            if fn is not None and not _is_stub(fn):
                have.append(cname)
        parents = {b for c in have for b in self.classes[c].bases}
        return sorted(c for c in have if c not in parents)

    def mirrors(self, cls: str, attr: str) -> bool:
        """Whether `cls` copies `attr` from another object into itself (`self.a = x.a`)."""
        for c in self.mro(cls):
            for n in ast.walk(c.node):
                if not isinstance(n, ast.Assign):
                    continue
                if not any(
                    isinstance(t, ast.Attribute)
                    and t.attr == attr
                    and isinstance(t.value, ast.Name)
                    and t.value.id == "self"
                    for t in n.targets
                ):
                    continue
                v = n.value
                if isinstance(v, ast.Attribute) and v.attr == attr and not _is_self_attr(v):
                    return True
                if (
                    isinstance(v, ast.Call)
                    and isinstance(v.func, ast.Name)
                    and v.func.id == "getattr"
                    and len(v.args) >= 2
                    and isinstance(v.args[1], ast.Constant)
                    and v.args[1].value == attr
                    and not (isinstance(v.args[0], ast.Name) and v.args[0].id == "self")
                ):
                    return True
        return False


def _is_self_attr(n: ast.AST) -> bool:
    return isinstance(n, ast.Attribute) and isinstance(n.value, ast.Name) and n.value.id == "self"


def _getattr_of_self(n: ast.AST) -> str | None:
    if (
        isinstance(n, ast.Call)
        and isinstance(n.func, ast.Name)
        and n.func.id == "getattr"
        and len(n.args) >= 2
        and isinstance(n.args[0], ast.Name)
        and n.args[0].id == "self"
        and isinstance(n.args[1], ast.Constant)
        and isinstance(n.args[1].value, str)
    ):
        return n.args[1].value
    return None


def registered_backends(fi_dir: Path) -> dict[str, str]:
    """FlashInfer 0.7.x's `_BACKEND_TYPES` table: backend name -> class name ({} before 0.7)."""
    for path in _sources(fi_dir):
        try:
            tree = ast.parse(path.read_bytes(), filename=str(path))
        except (SyntaxError, ValueError):
            continue
        for node in tree.body:
            target = node.target if isinstance(node, ast.AnnAssign) else None
            if isinstance(node, ast.Assign) and len(node.targets) == 1:
                target = node.targets[0]
            value = getattr(node, "value", None)
            named = isinstance(target, ast.Name) and target.id == "_BACKEND_TYPES"
            if named and isinstance(value, ast.Dict):
                return {
                    k.value: v.id
                    for k, v in zip(value.keys, value.values, strict=True)
                    if isinstance(k, ast.Constant) and isinstance(v, ast.Name)
                }
    return {}


def wrapper_read_problems(
    fi_dir: Path, wanted: set[str], backends: set[str] | None = None
) -> list[str]:
    """One line per attribute in `wanted` that this FlashInfer's `run()` does not really read.

    `backends`: the backend names the patched wrappers may plan with (None or "auto" among
    them: any); where FlashInfer registers its backends by name (0.7.x), only those are held
    to reading `wanted`."""
    if not wanted:
        return []
    pkg = _Package(fi_dir)
    named = registered_backends(fi_dir)
    allowed = None
    if backends and "auto" not in backends and named:
        unknown = sorted(b for b in backends if b not in named)
        if unknown:
            return [f"FlashInfer at {fi_dir}: no MLA backend named {unknown[0]!r}"]
        allowed = {named[b] for b in backends}
    where = f"FlashInfer at {fi_dir}"
    if WRAPPER not in pkg.classes:
        return [f"{where}: {WRAPPER} not found in mla.py / mla/"]
    if pkg.method(WRAPPER, RUN) is None:
        return [f"{where}: {WRAPPER} has no run()"]
    direct = pkg.self_reads(WRAPPER, RUN)
    delegated = sorted(pkg.delegated_calls(WRAPPER, RUN))
    problems = []
    for attr in sorted(wanted - direct):
        handlers = {m: pkg.implementers(m, WRAPPER) for m in delegated}
        handlers = {m: cs for m, cs in handlers.items() if cs}
        if not handlers:
            problems.append(
                f"{where}: {WRAPPER}.run() never reads {attr!r}, which the patched path gathers "
                "by: the gather would convert rows run() does not use"
            )
            continue
        for meth, classes in sorted(handlers.items()):
            blind = [
                c
                for c in classes
                if attr not in pkg.self_reads(c, meth) and (allowed is None or c in allowed)
            ]
            if blind:
                problems.append(
                    f"{where}: {WRAPPER}.run() hands over to the planned backend's {meth}(), "
                    f"and {', '.join(blind)} never read {attr!r}: with those backends the "
                    "patched gather would convert rows run() does not use"
                )
        if not pkg.mirrors(WRAPPER, attr):
            problems.append(
                f"{where}: {WRAPPER} reads {attr!r} through its planned backend but never "
                "copies it back into the wrapper, where the patched path reads it"
            )
    return problems
