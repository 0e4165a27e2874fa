"""`python -m glmserve.fleet compose [--env-file .env] [--out-dir .fleet]` (docs/fleet.md)."""

from __future__ import annotations

import argparse
import os
import sys
from pathlib import Path

from glmserve.envfile import EnvFileError, read_values
from glmserve.fleet.render import main_compose
from glmserve.fleet.router import FleetError

PROG = "glmserve.fleet"


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(prog=f"python -m {PROG}", description=__doc__)
    sub = p.add_subparsers(dest="command", required=True)
    c = sub.add_parser("compose", help="write the fleet's compose override and Prometheus targets")
    c.add_argument("--env-file", type=Path, default=Path(".env"))
    c.add_argument("--out-dir", type=Path, default=Path(".fleet"))
    args = p.parse_args(argv)
    try:
        try:
            env = read_values(args.env_file)
        except EnvFileError as exc:
            raise FleetError(str(exc)) from None
        # The process environment wins, as it does for compose's own interpolation.
        env.update({k: v for k, v in os.environ.items() if k.startswith(("FLEET_", "ROUTER_"))})
        return main_compose(env, args.out_dir, str(args.env_file))
    except FleetError as exc:
        print(f"{PROG}: error: {exc}", file=sys.stderr)
        return 2


if __name__ == "__main__":
    sys.exit(main())
