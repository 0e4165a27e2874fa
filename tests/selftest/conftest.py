"""Tests of glmserve.selftest on the CPU (TRITON_INTERPRET=1 and SGLang stand-ins; the GPU runs are tests/gpu)."""

# The real SGLang trees (wheels cached in .cache/wheels), shared with the other patch rooms.
from support.sglang_trees import make_site, pristine_site, snapshot, wheel_tree  # noqa: F401
