"""Moved: the self-test is `python -m glmserve.selftest` now; this name keeps working as a thin shim."""

import runpy

if __name__ == "__main__":
    runpy.run_module("glmserve.selftest", run_name="__main__", alter_sys=True)
