"""Entry point: `python -m glmserve.exporter` (console script `glmserve-exporter`)."""

from __future__ import annotations

import sys

from glmserve.exporter.cli import main

if __name__ == "__main__":
    sys.exit(main())
