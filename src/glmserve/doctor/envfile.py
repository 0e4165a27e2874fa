"""The env file as compose reads it, and the names .env.example makes known."""

from __future__ import annotations

import re
from dataclasses import dataclass
from pathlib import Path

NAME = re.compile(r"[A-Za-z_][A-Za-z0-9_]*")
# `NAME=value` and the commented-out `# NAME=value` (documented, left unset for its default).
KNOWN_LINE = re.compile(r"^#?\s*([A-Z][A-Z0-9_]*)=", re.M)
# Values never echoed in a problem line.
SECRETS = re.compile(r"(PASSWORD|TOKEN|SECRET)$")


class EnvFileError(ValueError):
    """The env file cannot be read; str() is the one line shown."""


@dataclass(frozen=True)
class Entry:
    line: int
    name: str
    value: str


def parse_env_file(path: Path) -> tuple[list[Entry], list[str]]:
    """Entries, and a problem line for each line compose could not read as NAME=VALUE.

    Compose's dotenv rules, as far as .env files use them: '#' comment lines, an optional
    `export `, single quotes literal, double quotes with \\n/\\"/\\\\ escapes, and an unquoted
    value ending at ' #' (an inline comment)."""
    try:
        text = path.read_text(encoding="utf-8")
    except OSError as exc:
        raise EnvFileError(f"cannot read {path}: {exc.strerror}") from None
    except UnicodeDecodeError:
        raise EnvFileError(f"{path} is not UTF-8 text") from None
    entries, problems = [], []
    for n, raw in enumerate(text.splitlines(), 1):
        line = raw.strip()
        if not line or line.startswith("#"):
            continue
        if line.startswith("export "):
            line = line[len("export ") :].lstrip()
        name, sep, value = line.partition("=")
        name = name.strip()
        if not sep or not NAME.fullmatch(name):
            problems.append(f"{path.name}:{n}: not NAME=VALUE: {raw.strip()[:60]!r}")
            continue
        entries.append(Entry(n, name, _unquote(value.strip())))
    return entries, problems


def _unquote(value: str) -> str:
    if len(value) >= 2 and value[0] == value[-1] == "'":
        return value[1:-1]
    if len(value) >= 2 and value[0] == value[-1] == '"':
        inner = value[1:-1]
        return re.sub(r"\\(.)", lambda m: {"n": "\n", "t": "\t"}.get(m.group(1), m.group(1)), inner)
    comment = re.search(r"\s#", value)
    return value[: comment.start()].rstrip() if comment else value


def known_names(example: Path) -> set[str]:
    """Every name .env.example lists, set or commented out: the doctor's vocabulary."""
    try:
        return set(KNOWN_LINE.findall(example.read_text(encoding="utf-8")))
    except OSError as exc:
        raise EnvFileError(f"cannot read {example}: {exc.strerror}") from None


def shown(name: str, value: str) -> str:
    """NAME=value for a problem line, with secrets masked."""
    return f"{name}=<hidden>" if SECRETS.search(name) else f"{name}={value!r}"
