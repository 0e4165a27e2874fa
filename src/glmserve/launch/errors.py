"""The one exception type of the launcher: a reason to refuse, worded as one line for a human."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any


class LaunchError(Exception):
    """Bad input or an unfit host. The message is the whole error line: no traceback is shown."""

    def __init__(self, message: str) -> None:
        # Newlines would break the "one clear line" promise (and log parsers downstream).
        super().__init__(" ".join(message.split()))


def read_json(path: Path, what: str) -> Any:
    """Parse a JSON file, or refuse with one line naming `what` it was meant to be."""
    try:
        return json.loads(path.read_text(encoding="utf-8"))
    except json.JSONDecodeError as exc:
        raise LaunchError(
            f"{what} {path} is not valid JSON: line {exc.lineno} column {exc.colno}: {exc.msg}"
        ) from None
    except OSError as exc:
        raise LaunchError(f"cannot read {what} {path}: {exc.strerror}") from None
