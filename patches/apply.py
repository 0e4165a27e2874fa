#!/usr/bin/env python3
"""Apply the patch series to an SGLang install: python3 patches/apply.py --target SITE [--check] [--revert]

A thin shim over glmserve.series (the patch series tool) that needs only the stdlib and this checkout's src/, so it runs
in a Dockerfile before glmserve is installed. SITE is the directory holding the sglang/ package
(site-packages). Exit status: 0 done or nothing to do, 1 refused/failed (tree unchanged), 2 usage.
"""

import sys
from pathlib import Path

HERE = Path(__file__).resolve().parent
# First on the path, so this checkout's tool is used even if another glmserve is installed.
sys.path.insert(0, str(HERE.parent / "src"))

from glmserve.series.cli import main  # noqa: E402

if __name__ == "__main__":
    sys.exit(main(sys.argv[1:], default_patches=HERE))
