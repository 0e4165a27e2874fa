"""Tests of glmserve.series, the patch series tool, on real SGLang trees."""

# The real SGLang trees (wheels cached in .cache/wheels), shared with the other patch rooms.
from support.sglang_trees import make_site, pristine_site, snapshot, wheel_tree  # noqa: F401
