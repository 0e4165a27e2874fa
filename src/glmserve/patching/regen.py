"""Moved: the lock generator is `python -m glmserve.series.regen` now; this name keeps working as a thin shim."""

import runpy

if __name__ == "__main__":
    runpy.run_module("glmserve.series.regen", run_name="__main__", alter_sys=True)
