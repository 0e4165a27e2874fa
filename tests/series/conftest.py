"""Tests of glmserve.series, the patch series tool, on real SGLang trees."""

# The real SGLang trees (wheels cached in .cache/wheels), shared with the other patch rooms.
from support.sglang_trees import (  # noqa: F401
    make_site,
    patched_tree,
    pristine_site,
    snapshot,
    wheel_tree,
)
