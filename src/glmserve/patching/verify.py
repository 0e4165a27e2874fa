"""Preflight: assert the patch's EFFECT on the installed SGLang, not just that files exist.

    python -m glmserve.patching.verify --target SITE     # exit 0 ok, 1 problems, 2 bad usage

`preflight(site)` returns a list of problems (empty = ok). It reads the installed code with `ast`
(SGLang is not imported) and checks:
  * the marker exists, names the installed SGLang version, and every file it lists still has
    its patched hash (nothing edited or reinstalled since);
  * the backend imports the gather module, and the gather module defines what is imported
    and can be loaded as a file;
  * nothing reachable from `forward_decode` / `forward_extend` still casts the whole
    `get_key_buffer(...)` pool, except behind the GLMSERVE_FP8_GATHER switch, and both paths
    reach the gather;
  * every attribute the patched path reads with `getattr(obj, "name", fallback)` (FlashInfer
    wrapper internals) is really set by the installed FlashInfer's MLA wrapper, so a FlashInfer
    change cannot silently send the patched path down its fallback;
  * every `*wrapper*.plan(...)` in the backend (decode, draft decode, target verify, draft
    extend, CUDA-graph capture and replay all funnel through these) is preceded by a call into
    the gather (which refreshes its device-side row count);
  * where the backend imports the native FP8 decode module: `forward_decode` reaches its
    kernel, the decode indices updater records every plan for it (`note_plan` after the
    plans), and the module defines what is imported and loads as a file.
"""

from __future__ import annotations

import argparse
import ast
import contextlib
import importlib.util
import sys
from collections.abc import Iterator
from pathlib import Path

from glmserve.patching.detect import detect_version
from glmserve.patching.engine import read_marker
from glmserve.patching.errors import PatchError
from glmserve.patching.series import MARKER_REL, read_optional, sha256_optional

BACKEND_REL = "sglang/srt/layers/attention/flashinfer_mla_backend.py"
GATHER_REL = "sglang/srt/layers/attention/fp8_kv_gather.py"
GATHER_MODULE = "sglang.srt.layers.attention.fp8_kv_gather"
NATIVE_REL = "sglang/srt/layers/attention/fp8_mla_decode.py"
NATIVE_MODULE = "sglang.srt.layers.attention.fp8_mla_decode"
NATIVE_KERNEL = "mla_decode_fp8"
NATIVE_NOTE = "note_plan"
DECODE_UPDATER = "FlashInferMLAIndicesUpdaterDecode"
BACKEND_CLASS = "FlashInferMLAAttnBackend"
FORWARD_METHODS = ("forward_decode", "forward_extend")
ENV_SWITCH = "GLMSERVE_FP8_GATHER"
FLASHINFER_WRAPPER = "BatchMLAPagedAttentionWrapper"
MARKER_KEYS = ("series", "sglang_version", "lock_sha256", "patches", "files")
# Tensor methods that convert a whole tensor's dtype.
CAST_METHODS = frozenset({"to", "bfloat16", "half", "float", "type"})


def preflight(
    site: str | Path, *, import_gather: bool = True, flashinfer: Path | None = None
) -> list[str]:
    """Problems with the patched SGLang under `site` (the directory holding sglang/); [] = ok.

    `import_gather` also executes the gather module from its file (needs torch and Triton,
    as the server does); switch it off only where those are absent by design. `flashinfer` is
    the FlashInfer package directory to check wrapper attributes against (default: the one in
    `site`, else the one this interpreter would import; no FlashInfer = that check is skipped,
    as in CI, where nothing could run the backend anyway).
    """
    site = Path(site)
    try:
        version = detect_version(site)
    except PatchError as exc:
        return [str(exc)]
    problems = _check_marker(site, version)
    backend = _parse(site / BACKEND_REL, problems)
    gather = _parse(site / GATHER_REL, problems)
    if backend is None:
        return problems
    analysis = _BackendAnalysis(backend)
    problems += analysis.problems()
    fi_dir = flashinfer or _flashinfer_dir(site)
    if fi_dir is not None:
        problems += _check_flashinfer_attrs(fi_dir, analysis.wrapper_attrs_read())
    if gather is not None:
        problems += _check_gather_module(site / GATHER_REL, gather, analysis, import_gather)
    if analysis.native_imported:
        native = _parse(site / NATIVE_REL, problems)
        if native is not None:
            problems += _check_defines(
                site / NATIVE_REL, native, analysis.native_imported, import_gather
            )
    return problems


def expectation_problems(
    site: str | Path,
    *,
    sglang_version: str | None = None,
    series: str | None = None,
    lock_sha256: str | None = None,
) -> list[str]:
    """What an image build promises in its labels, checked against what was really installed.

    The Dockerfile labels its image with the SGLang version, series and lock hash; this keeps
    those labels from claiming anything the patch tool did not record.
    """
    site = Path(site)
    problems: list[str] = []
    if sglang_version is not None:
        try:
            installed = detect_version(site)
        except PatchError as exc:
            return [str(exc)]
        if installed != sglang_version:
            problems.append(f"installed SGLang is {installed}, the build pins {sglang_version}")
    marker = read_marker(site) or {}
    for key, want in (("series", series), ("lock_sha256", lock_sha256)):
        if want is not None and marker.get(key) != want:
            problems.append(f"marker {key} is {marker.get(key)!r}, the build expects {want!r}")
    return problems


def _torch_version_file(site: Path) -> Path | None:
    """torch/version.py next to SGLang, else wherever this interpreter finds torch (an editable
    SGLang checkout lives outside site-packages). Located, never imported."""
    beside = site / "torch" / "version.py"
    if beside.is_file():
        return beside
    spec = importlib.util.find_spec("torch")
    if spec is None or not spec.origin:
        return None
    found = Path(spec.origin).parent / "version.py"
    return found if found.is_file() else None


def cuda_build_problems(site: str | Path, cuda_major: str, *, torch_required: bool) -> list[str]:
    """The base image's torch must be a CUDA `cuda_major` build: the Dockerfile pins the -cu130
    tag by digest, and public documents also call that digest `latest`, so the build checks what
    the digest really holds instead of trusting either name. Read from torch/version.py (`cuda =
    '13.0'`) with ast; a torch-less stand-in base (torch_required=False) has nothing to check."""
    path = _torch_version_file(Path(site))
    if path is None:
        return ["torch not found: cannot tell which CUDA the base image is built for"] * bool(
            torch_required
        )
    tree = ast.parse(path.read_text(encoding="utf-8"), filename=str(path))
    for node in tree.body:
        target = node.target if isinstance(node, ast.AnnAssign) else None
        if isinstance(node, ast.Assign) and len(node.targets) == 1:
            target = node.targets[0]
        if isinstance(target, ast.Name) and target.id == "cuda":
            value = getattr(node, "value", None)
            cuda = value.value if isinstance(value, ast.Constant) else None
            if not isinstance(cuda, str):
                return [
                    f"base image torch ({path}) is not a CUDA build; expected CUDA {cuda_major}"
                ]
            if cuda.split(".")[0] != cuda_major:
                return [
                    f"base image torch is built for CUDA {cuda}, the image needs CUDA "
                    f"{cuda_major}.x (is BASE_IMAGE the -cu{cuda_major}0 build? check its digest "
                    "with docker buildx imagetools inspect)"
                ]
            return []
    return [f"{path}: no cuda = ... assignment; cannot tell the base image's CUDA"]


def _parse(path: Path, problems: list[str]) -> ast.Module | None:
    data = read_optional(path)
    if data is None:
        problems.append(f"{path.name}: missing ({path})")
        return None
    try:
        return ast.parse(data, filename=str(path))
    except SyntaxError as exc:
        problems.append(f"{path.name}: does not parse: {exc.msg} (line {exc.lineno})")
        return None


def _check_marker(site: Path, version: str) -> list[str]:
    marker = read_marker(site)
    if marker is None:
        return [f"no valid patch marker {MARKER_REL}: the series is not applied (patches/apply.py)"]
    missing = [k for k in MARKER_KEYS if k not in marker]
    if missing:
        return [f"{MARKER_REL}: missing field(s) {', '.join(missing)}"]
    problems = []
    if marker["sglang_version"] != version:
        problems.append(
            f"{MARKER_REL} is for SGLang {marker['sglang_version']}, but {version} is installed"
        )
    files = marker["files"]
    if not isinstance(files, dict) or not files:
        return [*problems, f"{MARKER_REL}: no files recorded"]
    for rel, hashes in sorted(files.items()):
        want = hashes.get("after") if isinstance(hashes, dict) else "?"
        if sha256_optional(read_optional(site / rel)) != want:
            problems.append(f"{rel}: differs from the patched file recorded in {MARKER_REL}")
    return problems


def _identifiers(node: ast.AST) -> Iterator[str]:
    """Names and attribute names mentioned anywhere in `node`."""
    for sub in ast.walk(node):
        if isinstance(sub, ast.Name):
            yield sub.id
        elif isinstance(sub, ast.Attribute):
            yield sub.attr


def _mentions_switch_string(node: ast.AST) -> bool:
    return any(isinstance(s, ast.Constant) and s.value == ENV_SWITCH for s in ast.walk(node))


class _BackendAnalysis:
    def __init__(self, tree: ast.Module) -> None:
        self.tree = tree
        self.parents: dict[ast.AST, ast.AST] = {}
        for node in ast.walk(tree):
            for child in ast.iter_child_nodes(node):
                self.parents[child] = node
        self.imported = self._module_imports(GATHER_MODULE)
        self.native_imported = self._module_imports(NATIVE_MODULE)
        self.switch = self._switch_names()

    # --- what counts as "the gather" -----------------------------------------------------

    def _module_imports(self, module: str) -> dict[str, str]:
        """{local name: name in `module`} for `from <module> import X` (or `import ... as`)."""
        found: dict[str, str] = {}
        short = module.rsplit(".", 1)[1]
        for node in ast.walk(self.tree):
            if isinstance(node, ast.ImportFrom) and (
                node.module == module or (node.level == 1 and node.module == short)
            ):
                for alias in node.names:
                    found[alias.asname or alias.name] = alias.name
            elif isinstance(node, ast.Import):
                for alias in node.names:
                    if alias.name == module and alias.asname:
                        found[alias.asname] = "*"
        return found

    def _switch_names(self) -> set[str]:
        """Identifiers bound (transitively) to the gather module or the env switch, e.g.
        `self.fp8_gather = Fp8KvGather.create(...)` makes `fp8_gather` one."""
        names = set(self.imported)
        while True:
            grown = set(names)
            for node in ast.walk(self.tree):
                if isinstance(node, (ast.Assign, ast.AnnAssign)) and node.value is not None:
                    if _mentions_switch_string(node.value) or names & set(_identifiers(node.value)):
                        targets = node.targets if isinstance(node, ast.Assign) else [node.target]
                        for t in targets:
                            if isinstance(t, ast.Name):
                                grown.add(t.id)
                            elif isinstance(t, ast.Attribute):
                                grown.add(t.attr)
                elif isinstance(node, ast.FunctionDef) and _mentions_switch_string(node):
                    grown.add(node.name)
            if grown == names:
                return names
            names = grown

    def _is_switch_expr(self, node: ast.AST) -> bool:
        return _mentions_switch_string(node) or bool(self.switch & set(_identifiers(node)))

    def _gather_calls(self, node: ast.AST) -> list[ast.Call]:
        return [
            c for c in ast.walk(node) if isinstance(c, ast.Call) and self._is_switch_expr(c.func)
        ]

    # --- structure helpers -----------------------------------------------------------------

    def _function_of(self, node: ast.AST) -> ast.FunctionDef | None:
        while node in self.parents:
            node = self.parents[node]
            if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef)):
                return node  # type: ignore[return-value]
        return None

    def _earlier_siblings(self, node: ast.AST) -> Iterator[ast.stmt]:
        """For each enclosing statement list up to the function, the statements before ours."""
        while node in self.parents:
            parent = self.parents[node]
            for _field, value in ast.iter_fields(parent):
                if isinstance(value, list) and node in value:
                    yield from value[: value.index(node)]
            if isinstance(parent, (ast.FunctionDef, ast.AsyncFunctionDef)):
                return
            node = parent

    def _guarded(self, cast: ast.Call) -> bool:
        """Inside an `if`/ternary on the switch, or after `if <switch>: return/raise`."""
        node: ast.AST = cast
        while node in self.parents:
            parent = self.parents[node]
            if (
                isinstance(parent, (ast.If, ast.IfExp))
                and node is not parent.test
                and self._is_switch_expr(parent.test)
            ):
                return True
            if isinstance(parent, (ast.FunctionDef, ast.AsyncFunctionDef)):
                break
            node = parent
        for stmt in self._earlier_siblings(cast):
            if (
                isinstance(stmt, ast.If)
                and self._is_switch_expr(stmt.test)
                and isinstance(stmt.body[-1], (ast.Return, ast.Raise))
            ):
                return True
        return False

    # --- the checks ------------------------------------------------------------------------

    def _full_pool_casts(self, func: ast.FunctionDef) -> list[ast.Call]:
        def is_pool_call(n: ast.AST) -> bool:
            return (
                isinstance(n, ast.Call)
                and isinstance(n.func, ast.Attribute)
                and n.func.attr == "get_key_buffer"
            )

        pool_vars = {
            t.id
            for n in ast.walk(func)
            if isinstance(n, ast.Assign) and is_pool_call(n.value)
            for t in n.targets
            if isinstance(t, ast.Name)
        }
        casts = []
        for n in ast.walk(func):
            if (
                isinstance(n, ast.Call)
                and isinstance(n.func, ast.Attribute)
                and n.func.attr in CAST_METHODS
            ):
                recv = n.func.value
                if is_pool_call(recv) or (isinstance(recv, ast.Name) and recv.id in pool_vars):
                    casts.append(n)
        return casts

    def problems(self) -> list[str]:
        where = "flashinfer_mla_backend.py"
        if not self.imported:
            return [f"{where}: does not import {GATHER_MODULE}: the gather is not wired in"]
        problems: list[str] = []
        cls = next(
            (n for n in self.tree.body if isinstance(n, ast.ClassDef) and n.name == BACKEND_CLASS),
            None,
        )
        if cls is None:
            return [f"{where}: class {BACKEND_CLASS} not found"]
        methods = {n.name: n for n in cls.body if isinstance(n, ast.FunctionDef)}
        for entry in FORWARD_METHODS:
            if entry not in methods:
                problems.append(f"{where}: {BACKEND_CLASS}.{entry} not found")
                continue
            reached = self._reachable(entry, methods)
            for name in sorted(reached):
                for cast in self._full_pool_casts(methods[name]):
                    if not self._guarded(cast):
                        via = "" if name == entry else f" (via {name})"
                        problems.append(
                            f"{where}:{cast.lineno}: {entry}{via} still casts the whole "
                            f"get_key_buffer() pool outside the {ENV_SWITCH} switch"
                        )
            if not any(self._gather_calls(methods[name]) for name in reached):
                problems.append(f"{where}: {entry} never calls the fp8 gather")
        problems += self._plan_problems(where)
        if self.native_imported:
            problems += self._native_problems(where, methods)
        return problems

    def _native_problems(self, where: str, methods: dict[str, ast.FunctionDef]) -> list[str]:
        """The native decode kernel is reached from forward_decode, and the decode updater
        records each plan for it after planning (else it silently stays on the gather)."""
        problems = []
        kernel = {local for local, name in self.native_imported.items() if name == NATIVE_KERNEL}
        if "forward_decode" in methods and not any(
            isinstance(n, ast.Call) and isinstance(n.func, ast.Name) and n.func.id in kernel
            for name in self._reachable("forward_decode", methods)
            for n in ast.walk(methods[name])
        ):
            problems.append(f"{where}: forward_decode never calls the native {NATIVE_KERNEL}")
        updater = next(
            (n for n in self.tree.body if isinstance(n, ast.ClassDef) and n.name == DECODE_UPDATER),
            None,
        )
        for func in [] if updater is None else updater.body:
            if not isinstance(func, ast.FunctionDef):
                continue
            body = func.body
            plans = [i for i, st in enumerate(body) if self._plans_in(st)]
            notes = [i for i, st in enumerate(body) if _calls_attr(st, NATIVE_NOTE)]
            if plans and not any(i > max(plans) for i in notes):
                problems.append(
                    f"{where}:{func.lineno}: {DECODE_UPDATER}.{func.name} plans the decode "
                    f"wrapper but never records the plan for native decode ({NATIVE_NOTE})"
                )
        return problems

    def _plans_in(self, node: ast.AST) -> bool:
        return any(
            isinstance(n, ast.Call)
            and isinstance(n.func, ast.Attribute)
            and n.func.attr == "plan"
            and "wrapper" in " ".join(_identifiers(n.func.value)).lower()
            for n in ast.walk(node)
        )

    def _reachable(self, entry: str, methods: dict[str, ast.FunctionDef]) -> set[str]:
        seen, todo = {entry}, [entry]
        while todo:
            for n in ast.walk(methods[todo.pop()]):
                if (
                    isinstance(n, ast.Call)
                    and isinstance(n.func, ast.Attribute)
                    and isinstance(n.func.value, ast.Name)
                    and n.func.value.id == "self"
                    and n.func.attr in methods
                    and n.func.attr not in seen
                ):
                    seen.add(n.func.attr)
                    todo.append(n.func.attr)
        return seen

    def wrapper_attrs_read(self) -> set[str]:
        """Attribute names the forward paths read as `getattr(x, "name", fallback)`."""
        cls = next(
            (n for n in self.tree.body if isinstance(n, ast.ClassDef) and n.name == BACKEND_CLASS),
            None,
        )
        if cls is None:
            return set()
        methods = {n.name: n for n in cls.body if isinstance(n, ast.FunctionDef)}
        names: set[str] = set()
        for entry in FORWARD_METHODS:
            if entry not in methods:
                continue
            for name in self._reachable(entry, methods):
                for n in ast.walk(methods[name]):
                    if (
                        isinstance(n, ast.Call)
                        and isinstance(n.func, ast.Name)
                        and n.func.id == "getattr"
                        and len(n.args) == 3
                        and isinstance(n.args[1], ast.Constant)
                        and isinstance(n.args[1].value, str)
                    ):
                        names.add(n.args[1].value)
        return names

    def _plan_problems(self, where: str) -> list[str]:
        problems = []
        plans = [
            n
            for n in ast.walk(self.tree)
            if isinstance(n, ast.Call)
            and isinstance(n.func, ast.Attribute)
            and n.func.attr == "plan"
            and "wrapper" in " ".join(_identifiers(n.func.value)).lower()
        ]
        if not plans:
            return [f"{where}: no `<wrapper>.plan(...)` call found; this backend is not understood"]
        for call in plans:
            if not any(self._gather_calls(s) for s in self._earlier_siblings(call)):
                func = self._function_of(call)
                name = func.name if func else "<module>"
                problems.append(
                    f"{where}:{call.lineno}: {name} plans a FlashInfer MLA wrapper without "
                    "updating the fp8 gather first"
                )
        return problems


def _flashinfer_dir(site: Path) -> Path | None:
    if (site / "flashinfer").is_dir():
        return site / "flashinfer"
    try:
        spec = importlib.util.find_spec("flashinfer")  # locates the package, does not import it
    except (ImportError, ValueError):
        return None
    if spec is None or not spec.submodule_search_locations:
        return None
    return Path(next(iter(spec.submodule_search_locations)))


def _check_flashinfer_attrs(fi_dir: Path, wanted: set[str]) -> list[str]:
    if not wanted:
        return []
    sources = [fi_dir / "mla.py", *sorted((fi_dir / "mla").glob("*.py"))]
    assigned: set[str] | None = None
    for path in sources:
        if not path.is_file():
            continue
        try:
            tree = ast.parse(path.read_bytes(), filename=str(path))
        except SyntaxError:
            continue
        for cls in ast.walk(tree):
            if isinstance(cls, ast.ClassDef) and cls.name == FLASHINFER_WRAPPER:
                assigned = assigned or set()
                for n in ast.walk(cls):
                    targets = (
                        n.targets
                        if isinstance(n, ast.Assign)
                        else [n.target]
                        if isinstance(n, ast.AnnAssign)
                        else []
                    )
                    assigned |= {
                        t.attr
                        for t in targets
                        if isinstance(t, ast.Attribute)
                        and isinstance(t.value, ast.Name)
                        and t.value.id == "self"
                    }
    if assigned is None:
        return [f"FlashInfer at {fi_dir}: {FLASHINFER_WRAPPER} not found in mla.py / mla/"]
    return [
        f"FlashInfer at {fi_dir}: {FLASHINFER_WRAPPER} never sets {name!r}, which the patched "
        "path reads; it would silently fall back to the full-pool cast"
        for name in sorted(wanted - assigned)
    ]


def _calls_attr(node: ast.AST, attr: str) -> bool:
    return any(
        isinstance(n, ast.Call) and isinstance(n.func, ast.Attribute) and n.func.attr == attr
        for n in ast.walk(node)
    )


def _check_defines(
    path: Path, tree: ast.Module, imported: dict[str, str], import_module: bool
) -> list[str]:
    """The series-added module defines every name the backend imports from it (and loads)."""
    problems = [
        f"{path.name}: does not define {name}, which the backend imports"
        for name in sorted({n for n in imported.values() if n != "*"} - _defined_names(tree))
    ]
    if import_module and not problems:
        problems += _import_as_file(path, sorted(n for n in imported.values() if n != "*"))
    return problems


def _defined_names(tree: ast.Module) -> set[str]:
    defined = set()
    for node in tree.body:
        if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef, ast.ClassDef)):
            defined.add(node.name)
        elif isinstance(node, (ast.Assign, ast.AnnAssign)):
            targets = node.targets if isinstance(node, ast.Assign) else [node.target]
            defined |= {t.id for t in targets if isinstance(t, ast.Name)}
        elif isinstance(node, (ast.Import, ast.ImportFrom)):
            defined |= {(a.asname or a.name).split(".")[0] for a in node.names}
    return defined


def _check_gather_module(
    path: Path, tree: ast.Module, analysis: _BackendAnalysis, import_gather: bool
) -> list[str]:
    problems = _check_defines(path, tree, analysis.imported, import_module=False)
    if not _mentions_switch_string(tree) and not _mentions_switch_string(analysis.tree):
        problems.append(f"{path.name}: {ENV_SWITCH} is read nowhere: there is no A/B switch")
    if import_gather and not problems:
        wanted = sorted({n for n in analysis.imported.values() if n != "*"})
        problems += _import_as_file(path, wanted)
    return problems


def _import_as_file(path: Path, wanted: list[str]) -> list[str]:
    """Execute the module from its file, without importing the sglang package around it."""
    name = f"_glmserve_preflight_{path.stem}"
    spec = importlib.util.spec_from_file_location(name, path)
    if spec is None or spec.loader is None:
        return [f"{path.name}: cannot be loaded as a module"]
    module = importlib.util.module_from_spec(spec)
    sys.modules[name] = module  # decorators (dataclass, triton.jit) look the module up
    try:
        spec.loader.exec_module(module)
    except Exception as exc:
        return [f"{path.name}: import failed: {type(exc).__name__}: {exc}"]
    finally:
        sys.modules.pop(name, None)
    return [f"{path.name}: {n} missing after import" for n in wanted if not hasattr(module, n)]


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(
        prog="python -m glmserve.patching.verify",
        description="Preflight: check the patched SGLang under SITE does what the patch promises.",
    )
    parser.add_argument("--target", required=True, type=Path, help="directory holding sglang/")
    parser.add_argument(
        "--no-import",
        action="store_true",
        help="do not execute the gather module (for environments without torch/Triton)",
    )
    parser.add_argument("--expect-version", help="fail unless this SGLang version is installed")
    parser.add_argument("--expect-series", help="fail unless the marker names this series")
    parser.add_argument("--expect-lock", help="fail unless the marker records this lock sha256")
    parser.add_argument(
        "--expect-cuda",
        metavar="MAJOR",
        help="fail unless the installed torch is a CUDA MAJOR build (with --no-import, a base "
        "without torch passes)",
    )
    args = parser.parse_args(argv)
    prog = parser.prog
    if not args.target.is_dir():
        print(f"{prog}: error: --target {args.target} is not a directory", file=sys.stderr)
        return 2
    problems = expectation_problems(
        args.target,
        sglang_version=args.expect_version,
        series=args.expect_series,
        lock_sha256=args.expect_lock,
    ) + preflight(args.target, import_gather=not args.no_import)
    if args.expect_cuda:
        problems += cuda_build_problems(
            args.target, args.expect_cuda, torch_required=not args.no_import
        )
    if problems:
        for line in problems:
            print(f"{prog}: FAIL: {line}", file=sys.stderr)
        return 1
    marker = read_marker(args.target) or {}
    print(
        f"{prog}: ok: SGLang {marker.get('sglang_version')} patched with series "
        f"{marker.get('series')} (lock {str(marker.get('lock_sha256'))[:12]})"
    )
    return 0


if __name__ == "__main__":
    with contextlib.suppress(BrokenPipeError):
        sys.exit(main())
