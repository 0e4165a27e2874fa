"""`python -m glmserve.fleet compose [--env-file .env] [--out-dir .fleet]` (docs/fleet.md)."""

from __future__ import annotations

import argparse
import os
import sys
from pathlib import Path

from glmserve.fleet.render import main_compose
from glmserve.fleet.router import FleetError

PROG = "glmserve.fleet"


def read_env_file(path: Path) -> dict[str, str]:
    """KEY=VALUE lines as compose reads .env: '#' comments, optional quotes, no expansion."""
    out: dict[str, str] = {}
    for n, line in enumerate(path.read_text(encoding="utf-8").splitlines(), 1):
        line = line.strip()
        if not line or line.startswith("#"):
            continue
        key, sep, value = line.partition("=")
        if not sep or not key.strip():
            raise FleetError(f"{path}:{n}: not KEY=VALUE")
        value = value.strip()
        if len(value) >= 2 and value[0] == value[-1] and value[0] in "'\"":
            value = value[1:-1]
        out[key.strip()] = value
    return out


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(prog=f"python -m {PROG}", description=__doc__)
    sub = p.add_subparsers(dest="command", required=True)
    c = sub.add_parser("compose", help="write the fleet's compose override and Prometheus targets")
    c.add_argument("--env-file", type=Path, default=Path(".env"))
    c.add_argument("--out-dir", type=Path, default=Path(".fleet"))
    args = p.parse_args(argv)
    try:
        try:
            env = read_env_file(args.env_file)
        except OSError as exc:
            raise FleetError(f"cannot read {args.env_file}: {exc.strerror}") from None
        # The process environment wins, as it does for compose's own interpolation.
        env.update({k: v for k, v in os.environ.items() if k.startswith(("FLEET_", "ROUTER_"))})
        return main_compose(env, args.out_dir, str(args.env_file))
    except FleetError as exc:
        print(f"{PROG}: error: {exc}", file=sys.stderr)
        return 2


if __name__ == "__main__":
    sys.exit(main())
