"""Entry point: `python -m glmserve.launch` (the server image's ENTRYPOINT) and `glmserve-launch`."""

from __future__ import annotations

import sys

from glmserve.launch.cli import main

if __name__ == "__main__":
    sys.exit(main())

__all__ = ["main"]
