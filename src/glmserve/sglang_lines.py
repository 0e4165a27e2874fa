"""One home per SGLang line: the SGLang releases glmserve builds on, one `Line` entry each in
LINES, with what each one pins: its official base image (tag and digest), CUDA major and CPython,
torch, FlashInfer and sglang-kernel (as its wheel's METADATA pins them), its patch series
(patches/<series>/) and the launch profiles written and checked for it. The API facts shared by
the lines are in glmserve.sglang_api.

    python -m glmserve.sglang_lines                      # the table
    python -m glmserve.sglang_lines get FIELD [LINE]     # one value, for scripts (bench/)
    python -m glmserve.sglang_lines build-args [LINE]    # KEY=VALUE lines for .env / --build-arg

The Dockerfile's ARG defaults, compose.yaml, .env.example and k8s/ name the default line
literally (they cannot read Python); tests/test_sglang_lines.py holds them to this table. Adding
a line is one entry here (docs/patch.md, "Adding a series for a new SGLang version").
Stdlib only: the launcher reads it inside the SGLang image.
"""

from __future__ import annotations

import argparse
import sys
from dataclasses import asdict, dataclass

from glmserve import __version__


@dataclass(frozen=True)
class Line:
    version: str  # the SGLang release: its wheel on PyPI and its official image
    image: str  # that image, by tag (the devel variant: FlashInfer JIT-compiles with nvcc)
    digest: str | None  # the tag's digest, where known (None: the tag alone)
    cuda_major: str  # of the base's torch (the build checks it: --expect-cuda)
    python: str  # the base image's CPython
    torch: str
    flashinfer: str  # flashinfer_python (and flashinfer_cubin)
    sglang_kernel: str
    series: str  # the patch series under patches/ that the lock maps this version to
    profiles: tuple[str, ...]  # the launch profiles written and checked for this line

    @property
    def base_image(self) -> str:
        """The base to build on: the tag, pinned by digest where the digest is known."""
        return f"{self.image}@{self.digest}" if self.digest else self.image

    @property
    def server_image(self) -> str:
        """The server image glmserve builds on this line (its tag names its parts)."""
        return f"glmserve/server:{__version__}-sglang{self.version}"


DEFAULT_LINE = "0.5.12.post1"  # what the Dockerfile builds unless told otherwise

LINES: dict[str, Line] = {
    line.version: line
    for line in (
        Line(
            version="0.5.12.post1",
            image="lmsysorg/sglang:v0.5.12.post1-cu130",
            digest="sha256:ceaf8b16e02d165143633ac228bbb994a05fe77d7e0526cf035ae4bbf4eacc36",
            cuda_major="13",
            python="3.12",
            torch="2.11.0",
            flashinfer="0.6.11.post1",
            sglang_kernel="0.4.2.post2",
            series="0.5.12.post1",
            profiles=(
                "glm5-nvfp4-b200-tp4",
                "glm5-nvfp4-b200-tp8",
                "glm5-nvfp4-b200-tp8-dense",
                "glm5-nvfp4-rtxpro6000-2node-tp8",
                "glm5-nvfp4-rtxpro6000-tp8",
                "tiny-mla",
                "tiny-mla-78l",
            ),
        ),
    )
}


class LineError(ValueError):
    """An SGLang version glmserve has no line for; the message is the one line to show."""


def get(version: str = DEFAULT_LINE) -> Line:
    try:
        return LINES[version]
    except KeyError:
        raise LineError(
            f"SGLang {version} is not a line glmserve builds (lines: {', '.join(LINES)})"
        ) from None


def lines_for_profile(profile: str) -> tuple[Line, ...]:
    return tuple(line for line in LINES.values() if profile in line.profiles)


def build_args(version: str = DEFAULT_LINE) -> dict[str, str]:
    """The .env entries (compose passes them as build args) that build and run a line."""
    line = get(version)
    return {
        "BASE_IMAGE": line.base_image,
        "SGLANG_VERSION": line.version,
        "PATCH_SERIES": line.series,
        "GLMSERVE_IMAGE": line.server_image,
    }


def main(argv: list[str] | None = None) -> int:
    prog = "python -m glmserve.sglang_lines"
    parser = argparse.ArgumentParser(prog=prog, description=__doc__.split("\n\n")[0])
    sub = parser.add_subparsers(dest="command")
    one = sub.add_parser("get", help="one field of a line (or base_image, server_image)")
    one.add_argument("field")
    one.add_argument("line", nargs="?", default=DEFAULT_LINE)
    env = sub.add_parser("build-args", help="KEY=VALUE lines for .env that build a line")
    env.add_argument("line", nargs="?", default=DEFAULT_LINE)
    args = parser.parse_args(argv)
    try:
        if args.command == "build-args":
            for key, value in build_args(args.line).items():
                print(f"{key}={value}")
            return 0
        if args.command == "get":
            line = get(args.line)
            fields = {
                **asdict(line),
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
            f"{mark} {line.version:14} series {line.series:14} torch {line.torch:7} "
            f"flashinfer {line.flashinfer:13} sglang-kernel {line.sglang_kernel:12} "
            f"{line.base_image}"
        )
    return 0


if __name__ == "__main__":
    sys.exit(main())
