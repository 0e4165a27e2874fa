"""`python -m glmserve.emulator --host 127.0.0.1 --port 30000 --tpot-ms X --ttft-ms Y ...`"""

from __future__ import annotations

import sys
from collections.abc import Sequence

from glmserve.emulator.config import parse_config
from glmserve.emulator.server import run


def main(argv: Sequence[str] | None = None) -> int:
    config, ns = parse_config(argv)
    return run(config, log_level=ns.log_level)


if __name__ == "__main__":
    sys.exit(main())
