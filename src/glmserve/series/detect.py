"""Which SGLang is installed under a site directory, read from files (SGLang is never imported:
importing it pulls in torch and CUDA, and the tool must run at image build time and in CI)."""

from __future__ import annotations

import ast
import importlib.metadata
from pathlib import Path

from glmserve.series.errors import PatchError


def dist_versions(site: str | Path, project: str) -> list[str]:
    """The version of every install of `project` recorded directly under `site` (dist-info or
    egg-info metadata), as importlib.metadata reads them: nothing is imported, and names are
    matched as packaging normalises them (sglang_router is not sglang). The one reader of
    installed versions (glmserve.sglang_lines reads the GPU stack's through it too)."""
    found = []
    for dist in importlib.metadata.distributions(name=project, path=[str(site)]):
        version = dist.metadata["Version"] if dist.metadata else None
        if version:
            found.append(version.strip())
    return sorted(found)


def _literal_version(path: Path) -> str | None:
    """`__version__ = "x"` (or `__version__ = version = "x"`) as a literal in a module file."""
    if not path.is_file():
        return None
    try:
        tree = ast.parse(path.read_bytes(), filename=str(path))
    except SyntaxError:
        return None
    for node in tree.body:
        if not isinstance(node, ast.Assign):
            continue
        names = {t.id for t in node.targets if isinstance(t, ast.Name)}
        if "__version__" in names and isinstance(node.value, ast.Constant):
            value = node.value.value
            if isinstance(value, str):
                return value
    return None


def detect_version(site: str | Path) -> str:
    """Return the SGLang version installed in `site` (the directory that holds `sglang/`).

    Sources, most authoritative first: the distribution metadata pip wrote, then the version
    module setuptools-scm generated (`sglang/_version.py`, present in wheels and editable
    installs), then a literal in `sglang/version.py` (older releases). Disagreement between
    them is an error rather than a guess: it means the tree was assembled by hand.
    """
    site = Path(site)
    if not (site / "sglang").is_dir():
        hint = ""
        if site.name == "sglang" and (site / "srt").is_dir():
            # The package itself was given (an easy slip when copying a path from a traceback).
            hint = f"; {site} is the package itself: pass its parent, --target {site.parent}"
        raise PatchError(f"no sglang/ package directory in {site}{hint}")
    distinct = sorted(set(dist_versions(site, "sglang")))
    if len(distinct) > 1:
        raise PatchError(
            f"several SGLang installs recorded in {site} ({', '.join(distinct)}); remove stale ones"
        )
    module_version = _literal_version(site / "sglang" / "_version.py") or _literal_version(
        site / "sglang" / "version.py"
    )
    if distinct and module_version and module_version != distinct[0]:
        raise PatchError(
            f"SGLang version metadata says {distinct[0]} but sglang/_version.py says "
            f"{module_version} in {site}"
        )
    version = distinct[0] if distinct else module_version
    if not version:
        raise PatchError(f"cannot determine the SGLang version installed in {site}")
    return version
