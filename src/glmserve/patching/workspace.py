"""Moved: the patch workspace is `python -m glmserve.series.workspace` now; this name keeps working as a thin shim."""

import runpy

if __name__ == "__main__":
    runpy.run_module("glmserve.series.workspace", run_name="__main__", alter_sys=True)
