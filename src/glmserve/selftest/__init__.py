"""The start-up self-test: on the GPU it is about to serve on, the patch's kernels and the patched
backend class prove themselves before SGLang serves (runner.py), and both FP8 decode paths are
timed so the faster serves (pathtiming.py).

    python -m glmserve.selftest [--timeout 30] [--json]

Needs torch (imported lazily, in a child process); nothing here imports glmserve.preflight.
"""
