"""Tests of glmserve.preflight, the static checks of the patched backend, on real trees and mutants."""

# The real SGLang trees (wheels cached in .cache/wheels), shared with the other patch rooms.
from support.sglang_trees import make_site, pristine_site, snapshot, wheel_tree  # noqa: F401
