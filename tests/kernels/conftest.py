"""The series' own kernels (fp8_kv_gather.py, fp8_mla_decode.py) from a real patched tree, on the CPU."""

# The real SGLang trees (wheels cached in .cache/wheels), shared with the other patch rooms.
from support.sglang_trees import (  # noqa: F401
    make_site,
    patched_tree,
    pristine_site,
    snapshot,
    wheel_tree,
)
