"""`python -m glmserve.launch.argstore [--write]`: the stored SGLang options of each line
(glmserve/launch/sglang_args/<line>.json, glmserve.launch.argspec) against the real wheels,
downloaded once into .cache/wheels; --write regenerates the stale ones. Run it after adding a
line to glmserve.sglang_lines."""

from __future__ import annotations

import argparse
import sys
from collections.abc import Sequence

from glmserve.launch.argspec import SHIPPED_DIR, dumps, from_wheel


def main(argv: Sequence[str] | None = None) -> int:
    """Regenerate sglang_args/<line>.json from the real wheels (downloaded once into
    .cache/wheels): `python -m glmserve.launch.argstore --write`, or checks them."""
    from glmserve import sglang_lines
    from glmserve.series.errors import PatchError
    from glmserve.series.wheels import fetch_wheel

    p = argparse.ArgumentParser(prog="python -m glmserve.launch.argstore", description=main.__doc__)
    p.add_argument("--write", action="store_true", help="write the files (default: check them)")
    args = p.parse_args(argv)
    stale = []
    for version in sorted(sglang_lines.LINES):
        try:
            text = dumps(from_wheel(fetch_wheel(version)), version)
        except PatchError as exc:
            print(f"argstore: {exc}", file=sys.stderr)
            return 1
        path = SHIPPED_DIR / f"{version}.json"
        if not path.is_file() or path.read_text(encoding="utf-8") != text:
            stale.append(path.name)
            if args.write:
                path.parent.mkdir(parents=True, exist_ok=True)
                path.write_text(text, encoding="utf-8")
    if stale and not args.write:
        print(f"argstore: stale: {', '.join(stale)} (run with --write)", file=sys.stderr)
        return 1
    print(
        f"argstore: {'wrote' if args.write and stale else 'up to date:'} {', '.join(stale) or 'all'}"
    )
    return 0


if __name__ == "__main__":
    sys.exit(main())
