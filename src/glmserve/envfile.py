"""The env file (`.env`) as docker compose reads it: the ONE reader for the host tools that
take it (the doctor, the fleet), through python-dotenv, whose grammar is compose's: '#'
comments, `export NAME=...`, single quotes literal, double quotes with escapes and several
lines, and an unquoted value ending at ' #'.

Which files: `--env-file` when given, else COMPOSE_ENV_FILES (comma-separated, as compose
reads it), else `.env` in the project directory when it exists. The launcher never reads an
env file: compose hands it the values.
"""

from __future__ import annotations

import io
import re
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path

NAME = re.compile(r"[A-Za-z_][A-Za-z0-9_]*")
ENV_FILES_VAR = "COMPOSE_ENV_FILES"
# Values never echoed in a problem line.
SECRETS = re.compile(r"(PASSWORD|TOKEN|SECRET)$")


class EnvFileError(ValueError):
    """The env file cannot be read; str() is the one line shown."""


@dataclass(frozen=True)
class Entry:
    line: int
    name: str
    value: str
    file: str = ".env"  # the file's name, for problem lines ("file:line")

    @property
    def where(self) -> str:
        return f"{self.file}:{self.line}"


def read_entries(path: Path) -> tuple[list[Entry], list[str]]:
    """Entries, and a problem line for each line compose could not read as NAME=VALUE."""
    from dotenv.parser import parse_stream

    try:
        text = path.read_text(encoding="utf-8")
    except OSError as exc:
        raise EnvFileError(f"cannot read {path}: {exc.strerror or exc}") from None
    except UnicodeDecodeError:
        raise EnvFileError(f"{path} is not UTF-8 text") from None
    entries, problems = [], []
    for binding in parse_stream(io.StringIO(text)):
        original = binding.original.string
        raw = original.strip()
        # A binding starts at the blank lines before it; its line is where its text starts.
        line = binding.original.line + original[: len(original) - len(original.lstrip())].count(
            "\n"
        )
        if binding.error or (binding.key is not None and binding.value is None):
            problems.append(f"{path.name}:{line}: not NAME=VALUE: {raw[:60]!r}")
        elif binding.key is not None:
            if NAME.fullmatch(binding.key):
                entries.append(Entry(line, binding.key, binding.value or "", path.name))
            else:
                problems.append(f"{path.name}:{line}: not NAME=VALUE: {raw[:60]!r}")
    return entries, problems


def read_values(path: Path) -> dict[str, str]:
    """NAME -> value, later lines winning; a line that is not NAME=VALUE is an EnvFileError."""
    entries, problems = read_entries(path)
    if problems:
        more = f" (and {len(problems) - 1} more)" if len(problems) > 1 else ""
        raise EnvFileError(problems[0] + more)
    return {e.name: e.value for e in entries}


def chosen_files(
    explicit: Sequence[Path] | None, environ: Mapping[str, str], project_dir: Path
) -> list[Path]:
    """The env files compose would read, in order (later ones override earlier ones)."""
    if explicit:
        return list(explicit)
    listed = [p.strip() for p in environ.get(ENV_FILES_VAR, "").split(",") if p.strip()]
    if listed:
        return [Path(p) for p in listed]
    default = project_dir / ".env"
    return [default] if default.exists() else []


def shown(name: str, value: str) -> str:
    """NAME=value for a problem line, with secrets masked."""
    return f"{name}=<hidden>" if SECRETS.search(name) else f"{name}={value!r}"
