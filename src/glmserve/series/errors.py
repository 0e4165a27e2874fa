"""The one exception type of the patch tool: its message is the single line the CLI prints."""

from __future__ import annotations


class PatchError(Exception):
    """A refusal or failure; the tree is left exactly as it was found."""
