"""compose.yaml as data: its services and profiles, and compose's ${VAR} interpolation."""

from __future__ import annotations

import re
from collections.abc import Mapping
from pathlib import Path
from typing import Any

# The name after `$` or `${` (compose's rule for variable names).
_NAME = re.compile(r"[A-Za-z_][A-Za-z0-9_]*")
# The operators after a braced name: ${NAME:-default}, ${NAME-default}, ${NAME:?err},
# ${NAME?err}, ${NAME:+alt}, ${NAME+alt}; the longest first.
_OPS = (":-", ":?", ":+", "-", "?", "+")


class ComposeFileError(ValueError):
    """compose.yaml cannot be read; str() is the one line shown."""


def load(path: Path) -> dict[str, Any]:
    """The file as YAML, compose's merge tags (!reset, !override) read as their plain values."""
    import yaml

    class Loader(yaml.SafeLoader):
        pass

    def plain(loader: yaml.SafeLoader, suffix: str, node: yaml.Node) -> Any:
        if isinstance(node, yaml.SequenceNode):
            return loader.construct_sequence(node, deep=True)
        if isinstance(node, yaml.MappingNode):
            return loader.construct_mapping(node, deep=True)
        return loader.construct_scalar(node)  # type: ignore[arg-type]

    Loader.add_multi_constructor("!", plain)
    try:
        data = yaml.load(path.read_text(encoding="utf-8"), Loader=Loader)  # a SafeLoader subclass
    except OSError as exc:
        raise ComposeFileError(f"cannot read {path}: {exc.strerror}") from None
    except yaml.YAMLError as exc:
        raise ComposeFileError(f"{path} is not valid YAML: {exc}") from None
    if not isinstance(data, dict) or not isinstance(data.get("services"), dict):
        raise ComposeFileError(f"{path} has no services")
    return data


def services(files: list[dict[str, Any]]) -> dict[str, dict[str, Any]]:
    """Services of several files merged by name, later files on top (as `-f a -f b` does), and
    `extends` of a service in the same files resolved, for the keys read here."""
    out: dict[str, dict[str, Any]] = {}
    for data in files:
        for name, svc in data["services"].items():
            out[name] = {**out.get(name, {}), **(svc or {})}
    return {name: _extended(out, name, ()) for name in out}


def _extended(svcs: dict[str, dict[str, Any]], name: str, seen: tuple[str, ...]) -> dict[str, Any]:
    svc = svcs[name]
    base = svc.get("extends")
    base = base.get("service") if isinstance(base, dict) and "file" not in base else base
    if not isinstance(base, str) or base not in svcs or base in seen:
        return svc
    parent = _extended(svcs, base, (*seen, name))
    merged = {**parent, **svc}
    for key in ("environment",):  # mappings compose merges key by key
        if isinstance(parent.get(key), dict) and isinstance(svc.get(key), dict):
            merged[key] = {**parent[key], **svc[key]}
    return merged


def profiles(svcs: Mapping[str, Mapping[str, Any]]) -> set[str]:
    return {p for svc in svcs.values() for p in svc.get("profiles") or []}


def active(svcs: Mapping[str, Mapping[str, Any]], chosen: set[str]) -> list[str]:
    """Services `up` starts: those without a profile, and those in a chosen one."""
    return [n for n, s in svcs.items() if not s.get("profiles") or set(s["profiles"]) & chosen]


def names_in(node: Any) -> set[str]:
    """Every variable a node interpolates, those inside defaults included."""
    if isinstance(node, dict):
        return set().union(*(names_in(v) for v in node.values())) if node else set()
    if isinstance(node, list):
        return set().union(*(names_in(v) for v in node)) if node else set()
    if isinstance(node, str):
        seen: set[str] = set()
        _expand(node, {}, seen)
        return seen
    return set()


def interpolate(node: Any, values: Mapping[str, str]) -> Any:
    """What compose makes of a node, `values` being the variables that are set."""
    if isinstance(node, dict):
        return {k: interpolate(v, values) for k, v in node.items()}
    if isinstance(node, list):
        return [interpolate(v, values) for v in node]
    if not isinstance(node, str):
        return node
    return _expand(node, values, set())


def _expand(text: str, values: Mapping[str, str], seen: set[str]) -> str:
    """compose's template: `$$` is a literal `$`, `$NAME` and `${NAME...}` are replaced, and the
    default or alternative of a braced form is itself a template (`${A:-x${B:-y}}`). Every
    name met is added to `seen`, including those in branches not taken."""
    out: list[str] = []
    i = 0
    while i < len(text):
        dollar = text.find("$", i)
        if dollar < 0:
            out.append(text[i:])
            break
        out.append(text[i:dollar])
        nxt = text[dollar + 1 : dollar + 2]
        if nxt == "$":
            out.append("$")
            i = dollar + 2
        elif nxt == "{":
            end = _closing_brace(text, dollar + 2)
            if end < 0:  # compose refuses it; keep the text as it is
                out.append(text[dollar:])
                break
            out.append(_braced(text[dollar + 2 : end], values, seen))
            i = end + 1
        else:
            name = _NAME.match(text, dollar + 1)
            if name is None:
                out.append("$")
                i = dollar + 1
                continue
            seen.add(name.group(0))
            out.append(values.get(name.group(0), ""))
            i = name.end()
    return "".join(out)


def _closing_brace(text: str, start: int) -> int:
    """Index of the `}` that closes a `${` whose body starts at `start`; -1 if none."""
    depth = 1
    i = start
    while i < len(text):
        if text.startswith("$$", i):
            i += 2
            continue
        if text.startswith("${", i):
            depth += 1
            i += 2
            continue
        if text[i] == "}":
            depth -= 1
            if depth == 0:
                return i
        i += 1
    return -1


def _braced(body: str, values: Mapping[str, str], seen: set[str]) -> str:
    name = _NAME.match(body)
    if name is None:
        return "${" + body + "}"
    var = name.group(0)
    seen.add(var)
    rest = body[name.end() :]
    op = next((o for o in _OPS if rest.startswith(o)), None)
    arg = _expand(rest[len(op) :], values, seen) if op else ""
    value = values.get(var)
    empty = value is None or (value == "" and op is not None and op.startswith(":"))
    if op in (":-", "-"):
        return arg if empty else str(value)
    if op in (":+", "+"):
        return "" if empty else arg
    # ${NAME}, and ${NAME:?err}: an unset required variable compose itself reports.
    return "" if value is None else value
