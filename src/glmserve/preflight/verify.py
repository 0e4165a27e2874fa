"""Preflight: assert the patch's EFFECT on the installed SGLang, not just that files exist.

    python -m glmserve.preflight --target SITE       # exit 0 ok, 1 problems, 2 bad usage
    python -m glmserve.preflight --rules-only FILE   # the backend rules alone, on one file

`preflight(site)` returns a list of problems (empty = ok). It reads the installed code with `ast`
(SGLang and FlashInfer are never imported) and checks:
  * no apply or revert was interrupted here (no journal), the marker exists, names the
    installed SGLang version, and every file it lists still has its patched hash (nothing edited
    or reinstalled since);
  * the backend rules (rules.py), stated on data flow: each `run()` reads the gather of its own
    wrapper's indices, every plan is preceded on every path by the row count of the indptr it
    uses, no full-pool cast is reachable with the gather on, the switch selects what it says;
  * FlashInfer's `BatchMLAPagedAttentionWrapper.run()` really reads the attribute the patched
    path gathers by, in the installed FlashInfer's package layout (fichecks.py);
  * the gather module (and the native FP8 decode module, where the backend imports it) defines
    what the backend imports and can be loaded as a file.

`--rules-only FILE` runs the backend rules alone on one `flashinfer_mla_backend.py` (no marker,
no hashes): how a new series for another SGLang version is checked while it is being written.
A `flashattention_backend.py` (the fa3 MLA path, patched from SGLang 0.5.17 on) gets its own rules
(farules.py), both here and in the preflight wherever the marker lists that file.
"""

from __future__ import annotations

import argparse
import ast
import contextlib
import importlib.util
import sys
from pathlib import Path

from glmserve.preflight.farules import check_flashattention_backend, is_flashattention_backend
from glmserve.preflight.fichecks import wrapper_read_problems
from glmserve.preflight.flow import Module
from glmserve.preflight.rules import (
    ENV_SWITCH,
    GATHER_MODULE,
    NATIVE_MODULE,
    Report,
    check_backend,
)
from glmserve.series.detect import detect_version
from glmserve.series.engine import interrupted, read_marker
from glmserve.series.errors import PatchError
from glmserve.series.lock import MARKER_REL, read_optional, sha256_optional
from glmserve.sglang_lines import LineError, site_problems

BACKEND_REL = "sglang/srt/layers/attention/flashinfer_mla_backend.py"
BACKEND_NAME = "flashinfer_mla_backend.py"
FA_BACKEND_REL = "sglang/srt/layers/attention/flashattention_backend.py"
GATHER_REL = "sglang/srt/layers/attention/fp8_kv_gather.py"
NATIVE_REL = "sglang/srt/layers/attention/fp8_mla_decode.py"
MARKER_KEYS = ("series", "sglang_version", "lock_sha256", "patches", "files")


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
    lines, report = backend_rule_problems(backend)
    problems += lines
    if FA_BACKEND_REL in ((read_marker(site) or {}).get("files") or {}):
        fa_tree = _parse(site / FA_BACKEND_REL, problems)
        if fa_tree is not None:
            problems += backend_rule_problems(fa_tree, Path(FA_BACKEND_REL).name)[0]
    fi_dir = flashinfer or _flashinfer_dir(site)
    if fi_dir is not None:
        problems += wrapper_read_problems(fi_dir, report.wrapper_attrs, report.wrapper_backends)
    if gather is not None:
        problems += _check_gather_module(site / GATHER_REL, gather, backend, import_gather)
    native_imported = Module(backend, GATHER_MODULE, NATIVE_MODULE).native_names
    if native_imported:
        native = _parse(site / NATIVE_REL, problems)
        if native is not None:
            problems += _check_defines(site / NATIVE_REL, native, native_imported, import_gather)
    return problems


def backend_rule_problems(
    tree: ast.Module, filename: str = BACKEND_NAME
) -> tuple[list[str], Report]:
    """The data-flow rules on one parsed backend file, as printable lines: rules.py for the
    flashinfer MLA backend, farules.py for FlashAttention's."""
    if is_flashattention_backend(tree):
        report = check_flashattention_backend(tree)
    else:
        report = check_backend(tree)
    return [p.render(filename) for p in report.problems], report


def rules_only(path: Path) -> tuple[list[str], Report | None]:
    """The backend rules on one file; a file that cannot be read or parsed is one problem."""
    problems: list[str] = []
    tree = _parse(path, problems)
    if tree is None:
        return problems, None
    return backend_rule_problems(tree, path.name)


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
    half = interrupted(site)
    if half is not None:
        return [half]  # whatever the files and marker say, they may be mid-swap
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


def _mentions_switch_string(node: ast.AST) -> bool:
    return any(isinstance(s, ast.Constant) and s.value == ENV_SWITCH for s in ast.walk(node))


def _check_defines(
    path: Path, tree: ast.Module, imported: dict[str, str], import_module: bool
) -> list[str]:
    """The series-added module defines every name the backend imports from it (and loads)."""
    wanted = sorted({n for n in imported.values() if n != "*"})
    problems = [
        f"{path.name}: does not define {name}, which the backend imports"
        for name in sorted(set(wanted) - _defined_names(tree))
    ]
    if import_module and not problems:
        problems += _import_as_file(path, wanted)
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
    path: Path, tree: ast.Module, backend: ast.Module, import_gather: bool
) -> list[str]:
    imported = Module(backend, GATHER_MODULE, NATIVE_MODULE).gather_names
    problems = _check_defines(path, tree, imported, import_module=False)
    if not _mentions_switch_string(tree) and not _mentions_switch_string(backend):
        problems.append(f"{path.name}: {ENV_SWITCH} is read nowhere: there is no A/B switch")
    if import_gather and not problems:
        problems += _import_as_file(path, sorted({n for n in imported.values() if n != "*"}))
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
        prog="python -m glmserve.preflight",
        description="Preflight: check the patched SGLang under SITE does what the patch promises.",
    )
    what = parser.add_mutually_exclusive_group(required=True)
    what.add_argument("--target", type=Path, help="directory holding sglang/")
    what.add_argument(
        "--rules-only",
        type=Path,
        metavar="FILE",
        help="run only the backend rules on this flashinfer_mla_backend.py or "
        "flashattention_backend.py (no marker, no hashes)",
    )
    parser.add_argument(
        "--no-import",
        action="store_true",
        help="do not execute the gather module (for environments without torch/Triton)",
    )
    parser.add_argument("--expect-version", help="fail unless this SGLang version is installed")
    parser.add_argument(
        "--expect-line",
        metavar="LINE",
        help="fail unless the base holds that SGLang line and its pins (torch, FlashInfer, "
        "sglang-kernel: glmserve.sglang_lines; with --no-import, a base without them passes)",
    )
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
    if args.rules_only is not None:
        if not args.rules_only.is_file():
            print(f"{prog}: error: --rules-only {args.rules_only} is not a file", file=sys.stderr)
            return 2
        problems, report = rules_only(args.rules_only)
        for line in problems:
            print(f"{prog}: FAIL: {line}", file=sys.stderr)
        if problems or report is None:
            return 1
        if not report.plan_sites:  # FlashAttention: calls, no plans
            print(
                f"{prog}: ok: {args.rules_only.name} passes the FlashAttention MLA rules "
                f"(gathered call sites {len(report.run_sites)})"
            )
            return 0
        print(
            f"{prog}: ok: {args.rules_only.name} passes the backend rules "
            f"(run sites {len(report.run_sites)}, plan sites {len(report.plan_sites)}, "
            f"native kernel sites {len(report.native_sites)})"
        )
        return 0
    if not args.target.is_dir():
        print(f"{prog}: error: --target {args.target} is not a directory", file=sys.stderr)
        return 2
    problems = expectation_problems(
        args.target,
        sglang_version=args.expect_version,
        series=args.expect_series,
        lock_sha256=args.expect_lock,
    ) + preflight(args.target, import_gather=not args.no_import)
    if args.expect_line:
        try:
            try:
                installed = detect_version(args.target)
            except PatchError:
                installed = None  # site_problems says what the base holds instead
            problems = (
                site_problems(
                    args.target,
                    args.expect_line,
                    gpu_stack_required=not args.no_import,
                    installed_sglang=installed,
                )
                + problems
            )
        except LineError as exc:
            print(f"{prog}: error: {exc}", file=sys.stderr)
            return 2
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
