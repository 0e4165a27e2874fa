"""Moved: the preflight is `python -m glmserve.preflight` now; this name keeps working as a thin shim."""

import runpy

if __name__ == "__main__":
    runpy.run_module("glmserve.preflight", run_name="__main__", alter_sys=True)
