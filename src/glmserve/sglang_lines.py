"""One home per SGLang line: the SGLang releases the image builds on (`SGLANG_LINE`, the one
build argument), one `Line` entry each in LINES, with what each one pins: its official base image
(tag, and digest where known), CUDA major and CPython, torch, FlashInfer and sglang-kernel (as its
wheel's METADATA pins them: read, not guessed), its patch series (patches/<line>/, the lock's
entry of the same name), the attention backends that series patches and the launch profiles
written and checked for it. The API facts shared by the lines are in glmserve.sglang_api.

    python -m glmserve.sglang_lines                        # the table
    python -m glmserve.sglang_lines get FIELD [LINE]       # one value, for scripts (bench/)
    python -m glmserve.sglang_lines build-args [LINE]      # KEY=VALUE lines for .env / --build-arg
    python -m glmserve.sglang_lines check-site SITE LINE   # the base's pins, read from dist-info

The build checks the base it pulled against the line's pins, so a tag that moved, or a base of
another line, fails the build in one line instead of serving something else. Digests: only
0.5.12.post1's official image digest is known here (no registry is reachable where this was
written); the other lines build on their official version tag, held to the line by that check.

The Dockerfile's ARG defaults, compose.yaml, .env.example and k8s/ name the default line
literally (they cannot read Python); tests/test_sglang_lines.py holds them to this table. Adding
a line is one entry here (docs/patch.md, "Adding a series for a new SGLang version").
Stdlib only: the build stage, the launcher and the exporter import it.
"""

from __future__ import annotations

import argparse
import importlib.metadata
import sys
from dataclasses import asdict, dataclass
from pathlib import Path

from glmserve import __version__


@dataclass(frozen=True)
class Line:
    version: str  # the SGLang release: its wheel on PyPI, its official image, its patch series
    image: str  # that image, by tag (the devel variant: FlashInfer JIT-compiles with nvcc)
    digest: str | None  # the tag's digest, where known (None: the tag alone)
    cuda_major: str  # of the base's torch (the build checks it: --expect-cuda)
    torch: str
    flashinfer: str  # flashinfer-python (and flashinfer-cubin)
    sglang_kernel: str
    lab_gpu: bool  # runnable on the lent H200 (its torch is 2.11)
    # SGLang attention backends whose MLA path the line's series patches (decode and extend).
    patched_backends: tuple[str, ...]
    glm5_attention: str  # what GLM-5 on Blackwell runs on this line by default
    profiles: tuple[str, ...]  # the launch profiles written and checked for this line
    note: str

    @property
    def series(self) -> str:
        """The patch series under patches/: each line is its own source series."""
        return self.version

    @property
    def base_image(self) -> str:
        """The base to build on: the tag, pinned by digest where the digest is known."""
        return f"{self.image}@{self.digest}" if self.digest else self.image

    @property
    def server_image(self) -> str:
        """The server image glmserve builds on this line (its tag names its parts)."""
        return f"glmserve/server:{__version__}-sglang{self.version}"


DEFAULT_LINE = "0.5.12.post1"
# The current line beside the patched default: GLM-5 on DSA, the series proven on the H200.
CURRENT_LINE = "0.5.17"
ALIASES = {"default": DEFAULT_LINE, "current": CURRENT_LINE}  # for scripts that name no version

LINES: dict[str, Line] = {
    line.version: line
    for line in (
        Line(
            version="0.5.12.post1",
            image="lmsysorg/sglang:v0.5.12.post1-cu130",
            digest="sha256:ceaf8b16e02d165143633ac228bbb994a05fe77d7e0526cf035ae4bbf4eacc36",
            torch="2.11.0",
            flashinfer="0.6.11.post1",
            sglang_kernel="0.4.2.post2",
            cuda_major="13",
            lab_gpu=True,
            patched_backends=("flashinfer",),
            glm5_attention="dense MLA on flashinfer (patched: FP8 KV read natively)",
            profiles=(
                "glm5-nvfp4-b200-tp4",
                "glm5-nvfp4-b200-tp8",
                "glm5-nvfp4-b200-tp8-dense",
                "glm5-nvfp4-b200-tp8-dense-mtp",
                "glm5-nvfp4-b200-tp8-mtp",
                "glm5-nvfp4-rtxpro6000-2node-tp8",
                "glm5-nvfp4-rtxpro6000-tp8",
                "glm5-nvfp4-rtxpro6000-tp8-mtp",
                "glm52-nvfp4-rtxpro6000-tp8",
                "tiny-mla",
                "tiny-mla-78l",
            ),
            note="the newest line where GLM-5 runs dense MLA on flashinfer with no extra flags",
        ),
        Line(
            version="0.5.17",
            image="lmsysorg/sglang:v0.5.17-cu130",
            digest=None,
            torch="2.11.0",
            flashinfer="0.6.15.post1",
            sglang_kernel="0.4.5",
            cuda_major="13",
            lab_gpu=True,
            patched_backends=("flashinfer", "fa3"),
            glm5_attention="DSA (nsa; flashinfer_sparse_mla on SM120, trtllm on SM100): FP8 "
            "KV read natively, no patch",
            profiles=(
                "glm5-nvfp4-b200-tp8-dsa",
                "glm5-nvfp4-b200-tp8-dsa-mtp",
                "glm5-nvfp4-rtxpro6000-tp8-dsa",
                "glm5-nvfp4-rtxpro6000-tp8-dsa-mtp",
                "glm52-nvfp4-b200-tp8-dsa",
                "tiny-mla-78l-sglang0.5.17",
            ),
            note="series also patches the fa3 MLA path (SGLang's SM90 default)",
        ),
        Line(
            version="0.5.23",
            image="lmsysorg/sglang:v0.5.23-cu130",
            digest=None,
            torch="2.14.1",
            flashinfer="0.7.2",
            sglang_kernel="0.4.10",
            cuda_major="13",
            lab_gpu=False,
            patched_backends=("flashinfer", "fa3"),
            glm5_attention="DSA (as 0.5.17); dense flashinfer on GLM-5 is broken here",
            profiles=(),
            note="newest release; torch 2.14.1 does not run on the lab H200 (unproven on a GPU)",
        ),
    )
}


class LineError(ValueError):
    """An unknown line: one line naming the known ones."""


def get(version: str = DEFAULT_LINE) -> Line:
    try:
        return LINES[version]
    except KeyError:
        raise LineError(
            f"SGLang line {version!r} is not built here (lines: {', '.join(LINES)})"
        ) from None


def patched_backends(version: str) -> tuple[str, ...]:
    """The attention backends the series patches on that line ("flashinfer" on an unknown one:
    what every series patches)."""
    line = LINES.get(version)
    return line.patched_backends if line else ("flashinfer",)


def lines_for_profile(profile: str) -> tuple[Line, ...]:
    return tuple(line for line in LINES.values() if profile in line.profiles)


def build_args(version: str = DEFAULT_LINE) -> dict[str, str]:
    """The Dockerfile build arguments for a line: SGLANG_LINE alone selects it; BASE_IMAGE is
    spelled out with the digest where the table has one."""
    line = get(version)
    return {"SGLANG_LINE": line.version, "BASE_IMAGE": line.base_image}


def _installed(site: Path, project: str) -> str | None:
    """The project's version beside SGLang in `site`; for an editable SGLang checkout (the
    official images install it so, outside site-packages) this interpreter's environment."""
    from glmserve.series.detect import dist_versions

    if dist_versions(site, "sglang"):
        found = dist_versions(site, project)
        return found[-1] if found else None
    try:
        return importlib.metadata.version(project)
    except importlib.metadata.PackageNotFoundError:
        return None


def site_problems(
    site: str | Path,
    version: str,
    *,
    gpu_stack_required: bool,
    installed_sglang: str | None = None,
) -> list[str]:
    """What the base installed under `site`, against the line's pins: SGLang itself always
    (`installed_sglang` if the caller detected it already); torch, FlashInfer and sglang-kernel
    where installed (required unless `gpu_stack_required` is False, as on CI's stand-in base,
    which carries SGLang without its GPU dependencies)."""
    site = Path(site)
    line = get(version)
    problems = []
    sglang = installed_sglang or _installed(site, "sglang")
    if sglang != line.version:
        problems.append(
            f"the base holds SGLang {sglang or 'nothing'}, the line is {line.version}: build "
            f"SGLANG_LINE={line.version} on {line.base_image}"
        )
    for project, want in (
        ("torch", line.torch),
        ("flashinfer-python", line.flashinfer),
        ("sglang-kernel", line.sglang_kernel),
    ):
        got = _installed(site, project)
        if got is None and not gpu_stack_required:
            continue
        # A local build tag (torch 2.11.0+cu130) is the same release.
        if got is None or got.split("+", 1)[0] != want:
            problems.append(
                f"the base holds {project} {got or 'nothing'}, SGLang {line.version} pins {want}"
            )
    return problems


def main(argv: list[str] | None = None) -> int:
    prog = "python -m glmserve.sglang_lines"
    parser = argparse.ArgumentParser(prog=prog, description=__doc__.split("\n\n")[0])
    sub = parser.add_subparsers(dest="command")
    one = sub.add_parser("get", help="one field of a line (or series, base_image, server_image)")
    one.add_argument("field")
    one.add_argument("line", nargs="?", default=DEFAULT_LINE, help="a version, default or current")
    ba = sub.add_parser("build-args", help="KEY=VALUE build arguments for one line")
    ba.add_argument("line", nargs="?", default=DEFAULT_LINE)
    cs = sub.add_parser("check-site", help="the installed SGLang stack against a line's pins")
    cs.add_argument("site", type=Path)
    cs.add_argument("line")
    cs.add_argument(
        "--no-gpu-stack",
        action="store_true",
        help="torch/FlashInfer/sglang-kernel may be absent (CI's stand-in base)",
    )
    args = parser.parse_args(argv)
    try:
        if args.command == "build-args":
            for key, value in build_args(args.line).items():
                print(f"{key}={value}")
            return 0
        if args.command == "check-site":
            problems = site_problems(args.site, args.line, gpu_stack_required=not args.no_gpu_stack)
            for problem in problems:
                print(f"{prog}: FAIL: {problem}", file=sys.stderr)
            if problems:
                return 1
            print(f"{prog}: ok: {args.site} holds SGLang {args.line} and its pins")
            return 0
        if args.command == "get":
            line = get(ALIASES.get(args.line, args.line))
            fields = {
                **asdict(line),
                "series": line.series,
                "base_image": line.base_image,
                "server_image": line.server_image,
            }
            if args.field not in fields:
                raise LineError(f"a line has no field {args.field!r} (fields: {', '.join(fields)})")
            value = fields[args.field]
            print(" ".join(value) if isinstance(value, tuple) else value)
            return 0
    except LineError as exc:
        print(f"{prog}: error: {exc}", file=sys.stderr)
        return 2
    for line in LINES.values():
        mark = "*" if line.version == DEFAULT_LINE else " "
        print(
            f"{mark} {line.version:14} torch {line.torch:7} flashinfer {line.flashinfer:13} "
            f"sglang-kernel {line.sglang_kernel:12} {line.base_image}"
        )
    return 0


if __name__ == "__main__":
    sys.exit(main())
