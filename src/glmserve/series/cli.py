"""`python3 patches/apply.py --target SITE [--check] [--revert]` (also `python -m glmserve.series`).

Exit status: 0 done or nothing to do, 1 refused or failed (the tree is unchanged; under --check
also a half-applied tree, which a plain run heals), 2 bad usage.
Each outcome is one line: success on stdout, refusal on stderr.
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

from glmserve.series.engine import apply, check, revert
from glmserve.series.errors import PatchError
from glmserve.series.lock import default_patches_dir

PROG = "glmserve-patch"


def build_parser(prog: str = PROG) -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog=prog,
        description="Apply the glmserve patch series to the SGLang installed in a site directory.",
    )
    parser.add_argument(
        "--target", required=True, type=Path, help="directory holding the sglang/ package"
    )
    parser.add_argument("--check", action="store_true", help="verify only; change nothing")
    parser.add_argument("--revert", action="store_true", help="restore the unpatched files")
    parser.add_argument(
        "--patches", type=Path, default=None, help="series directory (default: this checkout's)"
    )
    return parser


def main(argv: list[str] | None = None, *, default_patches: Path | None = None) -> int:
    parser = build_parser()
    args = parser.parse_args(argv)
    patches = args.patches or default_patches or default_patches_dir()
    if patches is None or not patches.is_dir():
        where = patches or "next to this checkout's src/"
        print(
            f"{PROG}: error: no patch series directory ({where}); pass --patches", file=sys.stderr
        )
        return 2
    if not args.target.is_dir():
        print(f"{PROG}: error: --target {args.target} is not a directory", file=sys.stderr)
        return 2
    try:
        if args.revert:
            outcome = revert(args.target, patches, dry_run=args.check)
        elif args.check:
            outcome = check(args.target, patches)
        else:
            outcome = apply(args.target, patches)
    except PatchError as exc:
        print(f"{PROG}: error: {exc}", file=sys.stderr)
        return 1
    print(f"{PROG}: {outcome.message}")
    return 0
