"""Tests of glmserve.selftest on the CPU (TRITON_INTERPRET=1 and SGLang stand-ins; the GPU runs are tests/gpu)."""

# The real SGLang trees (wheels cached in .cache/wheels), shared with the other patch rooms.
from support.sglang_trees import (  # noqa: F401
    make_site,
    patched_tree,
    pristine_site,
    snapshot,
    wheel_tree,
)
