"""The one exception type of the launcher: a reason to refuse, worded as one line for a human."""

from __future__ import annotations


class LaunchError(Exception):
    """Bad input or an unfit host. The message is the whole error line: no traceback is shown."""

    def __init__(self, message: str) -> None:
        # Newlines would break the "one clear line" promise (and log parsers downstream).
        super().__init__(" ".join(message.split()))
