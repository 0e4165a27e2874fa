"""Moved: the patch tool is `python -m glmserve.series` now; this name keeps working as a thin shim."""

import runpy

if __name__ == "__main__":
    runpy.run_module("glmserve.series", run_name="__main__", alter_sys=True)
