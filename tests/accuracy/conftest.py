"""The accuracy bench's tests: its miswiring runs on the real patched tree, like the patch rooms."""

from support.sglang_trees import (  # noqa: F401
    patched_tree,
    pristine_site,
)
