"""The doctor's vocabulary: every name .env.example lists, set or commented out."""

from __future__ import annotations

import re
from pathlib import Path

from glmserve.envfile import EnvFileError

# `NAME=value` and the commented-out `# NAME=value` (documented, left unset for its default).
KNOWN_LINE = re.compile(r"^#?\s*([A-Z][A-Z0-9_]*)=", re.M)
# Read by docker compose itself on the host (never interpolated, never given to the doctor
# service: COMPOSE_FILE names host paths, the project name means nothing inside a container).
COMPOSE_HOST_ONLY = ("COMPOSE_PROJECT_NAME", "COMPOSE_FILE")


def known_names(example: Path) -> set[str]:
    try:
        return set(KNOWN_LINE.findall(example.read_text(encoding="utf-8")))
    except OSError as exc:
        raise EnvFileError(f"cannot read {example}: {exc.strerror}") from None
