"""SGLang's own command-line parser, as the launcher needs it: to see what an argv *means*.

SGLang parses `sglang.launch_server`'s argv with a plain argparse parser (`prepare_server_args`:
`ArgumentParser(prog="sglang serve")`, then `ServerArgs.add_cli_args`). argparse accepts any
unique prefix of a long option and the `--flag=value` form, so `--hos 0.0.0.0` *is* `--host`:
checking extra args by name lets them override what the launcher validated. So the check asks the
parser itself which option each argument resolves to.

Importing SGLang needs torch and its whole dependency tree, and the launcher must stay cheap
(and testable on a CPU box), so the parser is rebuilt from the installed SGLang's
`server_args.py`: every `parser.add_argument(...)` of `add_cli_args` with its literal option
strings, action, nargs, dest and const. Types, choices and defaults are left out; they do not
change which option an argument resolves to. argparse itself then does the resolution, with the
settings SGLang uses.

From SGLang 0.5.17 on, most options are not `add_argument` calls but annotated `ServerArgs`
fields (`tp_size: A[int, Arg(help=..., aliases=[...])] = 1`), which `add_cli_args` turns into
options first (`add_cli_args_from_dataclass`, arg_groups/arg_utils.py): those are read from the
class body by the same rules (the field name as `--field-name` unless `cli_name`, its aliases, a
`bool` as store_true, a list as nargs "+", `no_cli` skipped). In 0.5.23 those fields moved into
per-namespace classes (`arg_groups/fields/*.py`, each with a `_NS_PATH`), read the same way.
"""

from __future__ import annotations

import argparse
import ast
import functools
from collections.abc import Iterable, Sequence
from pathlib import Path
from typing import Any, NoReturn

from glmserve.launch.errors import LaunchError

SERVER_ARGS_FILE = "sglang/srt/server_args.py"
FIELDS_DIR = "sglang/srt/arg_groups/fields"  # SGLang 0.5.23+: ServerArgs' fields by namespace
PARSER_PROG = "sglang serve"  # prepare_server_args' parser; allow_abbrev left at True

# SGLang's own argparse.Action subclasses, by the behaviour that matters for resolution: whether
# the option consumes a value (nargs), which SGLang passes or defaults in their __init__.
_VALUELESS_ACTIONS = {"DeprecatedStoreTrueAction", "DeprecatedAction", "DeprecatedStoreConstAction"}
_STORE_ACTIONS = {"LoRAPathAction", "DeprecatedAliasStoreAction"}
# The annotation alias SGLang 0.5.17+ declares its fields with (`A = Annotated`).
_ANNOTATED = {"A", "Annotated"}

# `--config FILE` merges a YAML file into the argv (server_args_config_parser): its keys could set
# anything, unseen by this check, so it is refused like a launcher-owned flag.
CONFIG_DEST = "config"

# Values never printed: the plan and the exec log line show REDACTED instead.
SECRET_DESTS = ("api_key", "admin_api_key", "ssl_keyfile_password")
REDACTED = "<redacted>"


class _ParseError(Exception):
    pass


class _Parser(argparse.ArgumentParser):
    # The check must never print usage or exit the launcher: `-h` among the extra args included.
    def error(self, message: str) -> NoReturn:
        raise _ParseError(message)

    def exit(self, status: int = 0, message: str | None = None) -> NoReturn:
        raise _ParseError(message or "exits")

    def print_help(self, file: Any = None) -> None:
        pass


def _literal(node: ast.AST) -> Any:
    try:
        return ast.literal_eval(node)
    except ValueError:
        return None


def _action(node: ast.AST | None) -> tuple[Any, dict[str, Any]]:
    """(action for add_argument, extra kwargs) for SGLang's `action=` expression."""
    if node is None:
        return "store", {}
    if isinstance(node, ast.Constant) and isinstance(node.value, str):
        return node.value, {}
    name = node.attr if isinstance(node, ast.Attribute) else getattr(node, "id", None)
    if name == "BooleanOptionalAction":
        return argparse.BooleanOptionalAction, {}
    if name in _VALUELESS_ACTIONS:
        return "store_const", {"const": True}
    if name in _STORE_ACTIONS:
        return "store", {}
    raise LaunchError(
        f"cannot read SGLang's argument parser: unknown action {ast.unparse(node)} in "
        f"{SERVER_ARGS_FILE}"
    )


def _add_cli_args(tree: ast.Module) -> ast.FunctionDef:
    for node in ast.walk(tree):
        if isinstance(node, ast.ClassDef) and node.name == "ServerArgs":
            for item in node.body:
                if isinstance(item, ast.FunctionDef) and item.name == "add_cli_args":
                    return item
    raise LaunchError(
        f"cannot read SGLang's argument parser: no ServerArgs.add_cli_args in {SERVER_ARGS_FILE}"
    )


def _field_kind(annotation: ast.AST) -> str:
    """ "bool", "list" or "value" for a field's type (Optional[...] / X | None unwrapped)."""
    node = annotation
    if isinstance(node, ast.Subscript) and getattr(node.value, "id", None) == "Optional":
        node = node.slice
    if isinstance(node, ast.BinOp) and isinstance(node.op, ast.BitOr):
        sides = [x for x in (node.left, node.right) if not _is_none(x)]
        node = sides[0] if len(sides) == 1 else node
    if isinstance(node, ast.Name) and node.id == "bool":
        return "bool"
    if isinstance(node, ast.Subscript) and getattr(node.value, "id", None) in ("List", "list"):
        return "list"
    return "value"


def _is_none(node: ast.AST) -> bool:
    return isinstance(node, ast.Constant) and node.value is None


def annotated_fields(tree: ast.Module) -> list[tuple[list[str], str, dict[str, ast.AST]]]:
    """(option strings, field name, Arg(...) keywords) of each annotated ServerArgs field with
    a CLI surface, in declaration order (add_cli_args_from_dataclass's)."""
    out = []
    for cls in ast.walk(tree):
        if not (isinstance(cls, ast.ClassDef) and (cls.name == "ServerArgs" or _namespaced(cls))):
            continue
        for item in cls.body:
            if not (isinstance(item, ast.AnnAssign) and isinstance(item.target, ast.Name)):
                continue
            ann = item.annotation
            if not (
                isinstance(ann, ast.Subscript) and getattr(ann.value, "id", None) in _ANNOTATED
            ):
                continue
            parts = ann.slice.elts if isinstance(ann.slice, ast.Tuple) else [ann.slice]
            meta: dict[str, ast.AST] | None = None
            for extra in parts[1:]:
                if isinstance(extra, ast.Constant) and isinstance(extra.value, str):
                    meta = {}
                    break
                if isinstance(extra, ast.Call) and getattr(extra.func, "id", None) == "Arg":
                    meta = {k.arg: k.value for k in extra.keywords if k.arg}
                    break
            if meta is None or _literal(meta.get("no_cli", ast.Constant(False))) is True:
                continue
            name = item.target.id
            cli = _literal(meta["cli_name"]) if "cli_name" in meta else None
            aliases = _literal(meta["aliases"]) if "aliases" in meta else []
            options = [cli or "--" + name.replace("_", "-"), *(aliases or [])]
            if not all(isinstance(o, str) for o in options):
                raise LaunchError(
                    f"cannot read SGLang's argument parser: field {name} has non-literal "
                    "option strings"
                )
            meta["__kind__"] = ast.Constant(_field_kind(parts[0]))
            meta["__type__"] = parts[0]
            out.append((options, name, meta))
    return out


def _namespaced(cls: ast.ClassDef) -> bool:
    """A 0.5.23 field class (collected into ServerArgs): it declares `_NS_PATH`."""
    for item in cls.body:
        targets = item.targets if isinstance(item, ast.Assign) else [getattr(item, "target", None)]
        if any(isinstance(t, ast.Name) and t.id == "_NS_PATH" for t in targets):
            return True
    return False


def _add_annotated(parser: argparse.ArgumentParser, tree: ast.Module) -> None:
    for options, name, meta in annotated_fields(tree):
        kind = meta["__kind__"].value
        if "action" in meta:
            action, kwargs = _action(meta["action"])
        elif kind == "bool":
            action, kwargs = "store_true", {}
        else:
            action, kwargs = "store", {}
            if kind == "list" and "type_parser" not in meta:
                kwargs["nargs"] = _literal(meta["nargs"]) if "nargs" in meta else "+"
            elif "nargs" in meta:
                kwargs["nargs"] = _literal(meta["nargs"])
        if "const" in meta and action not in ("store_true", "store_false"):
            kwargs.setdefault("const", _literal(meta["const"]))
        parser.add_argument(*options, action=action, dest=name, **kwargs)


@functools.lru_cache(maxsize=4)
def parser_from_source(source: str, field_sources: tuple[str, ...] = ()) -> argparse.ArgumentParser:
    """The parser `ServerArgs.add_cli_args` builds, rebuilt from its source (see the module doc);
    `field_sources`: the 0.5.23+ field modules, in file-name order."""
    parser = _Parser(prog=PARSER_PROG, argument_default=argparse.SUPPRESS)
    tree = ast.parse(source)
    for extra in field_sources:
        _add_annotated(parser, ast.parse(extra))
    _add_annotated(parser, tree)
    for node in ast.walk(_add_cli_args(tree)):
        if not (
            isinstance(node, ast.Call)
            and isinstance(node.func, ast.Attribute)
            and node.func.attr == "add_argument"
        ):
            continue
        options = [_literal(a) for a in node.args]
        if not options or not all(isinstance(o, str) for o in options):
            raise LaunchError(
                f"cannot read SGLang's argument parser: {ast.unparse(node)[:80]} has "
                "non-literal option strings"
            )
        keywords = {k.arg: k.value for k in node.keywords if k.arg}
        action, kwargs = _action(keywords.get("action"))
        for key in ("nargs", "dest", "const"):
            if key in keywords and key not in kwargs:
                kwargs[key] = _literal(keywords[key])
        if action in ("store_true", "store_false", "store_const"):
            kwargs.pop("nargs", None)
        parser.add_argument(*options, action=action, **kwargs)
    return parser


def load_parser(site: Path) -> argparse.ArgumentParser:
    """SGLang's parser for the installation in `site` (its server_args.py, never imported)."""
    path = site / SERVER_ARGS_FILE
    try:
        source = path.read_text(encoding="utf-8")
        fields = tuple(
            p.read_text(encoding="utf-8")
            for p in sorted((site / FIELDS_DIR).glob("*.py"))
            if p.name != "__init__.py"
        )
    except OSError as exc:
        raise LaunchError(f"cannot read SGLang's argument parser {path}: {exc.strerror}") from None
    return parser_from_source(source, fields)


def _option_like(arg: str) -> bool:
    # What argparse would try to match as an option: a leading '-' that is not a lone '-' or a
    # negative number (SGLang defines no option that looks like one).
    if not arg.startswith("-") or arg == "-":
        return False
    try:
        float(arg)
    except ValueError:
        return True
    return False


def resolve(parser: argparse.ArgumentParser, arg: str) -> str | None:
    """The dest SGLang's parser gives an option-like argument (prefix and `=` forms included),
    None when it matches no option. An ambiguous prefix raises LaunchError with argparse's words."""
    if not _option_like(arg):
        return None
    try:
        # A dummy value, so an option that takes one resolves without "expected one argument".
        ns, _ = parser.parse_known_args([arg, "VALUE"])
    except _ParseError as exc:
        raise LaunchError(f"SGLang's parser refuses the argument {arg}: {exc}") from None
    dests = list(vars(ns))
    return dests[0] if dests else None


def owned_dests(parser: argparse.ArgumentParser, flags: Iterable[str]) -> dict[str, str]:
    """dest -> the launcher's flag for it, for each of the launcher's own flags."""
    dests: dict[str, str] = {}
    for flag in flags:
        dest = resolve(parser, flag)
        if dest is None:
            raise LaunchError(f"SGLang's parser has no {flag}, which the launcher sets")
        dests.setdefault(dest, flag)
    return dests


# Without SGLang's parser (the tools image has no SGLang): what a prefix may stand for.
SECRET_FLAGS = ("--api-key", "--admin-api-key", "--ssl-keyfile-password")
CONFIG_FLAG = "--config"


def _prefix_dest(arg: str, flags: Iterable[str]) -> str | None:
    """The flag `arg` could abbreviate (or name exactly, or in its `=` form): the first of
    `flags` it is a prefix of. A superset of argparse's answer, which also needs the prefix to
    be unique among all of SGLang's options; a bare `--` or `-x` is too short to be one."""
    if not _option_like(arg):
        return None
    name = arg.split("=", 1)[0]
    if not name.startswith("--") or len(name) < 4:
        return None
    return next((f for f in flags if f.startswith(name)), None)


def check_not_owned(
    parser: argparse.ArgumentParser | None,
    args: Sequence[str],
    owned: Iterable[str],
    where: str,
) -> None:
    """Refuse the first argument SGLang would read as one of the launcher's own flags. With no
    parser (SGLang not installed here), refuse every prefix of one, which covers them all."""
    owned = tuple(owned)
    if parser is None:
        taken = {flag.lstrip("-").replace("-", "_"): flag for flag in owned}
    else:
        taken = owned_dests(parser, owned)
    for arg in args:
        if parser is None:
            hit = _prefix_dest(arg, (*owned, CONFIG_FLAG))
            dest = None if hit is None else hit.lstrip("-").replace("-", "_")
        else:
            dest = resolve(parser, arg)
        if dest is None:
            continue
        flag = arg.split("=", 1)[0]
        if dest in taken:
            reads = f" (SGLang reads it as {taken[dest]})" if flag != taken[dest] else ""
            raise LaunchError(
                f"{where} {flag} is set by the launcher itself{reads}; use its own input "
                "(--model-path, --tp, --host, --port, --nnodes, --node-rank, --dist-init-addr "
                "or their GLMSERVE_* variables)"
            )
        if dest == CONFIG_DEST:
            raise LaunchError(
                f"{where} {flag} reads more SGLang options from a file, which the launcher cannot "
                "check against the flags it owns; pass those options after -- instead"
            )


def redact(parser: argparse.ArgumentParser | None, argv: Sequence[str]) -> list[str]:
    """argv with the values of secret options replaced (`--api-key X`, `--api-k=X`, ...); with
    no parser, the values of every prefix of one."""
    out: list[str] = []
    hide_next = False
    for arg in argv:
        if hide_next:
            out.append(REDACTED)
            hide_next = False
            continue
        if parser is None:
            hit = _prefix_dest(arg, SECRET_FLAGS)
            dest = None if hit is None else hit.lstrip("-").replace("-", "_")
        else:
            try:
                dest = resolve(parser, arg)
            except LaunchError:
                dest = None
        if dest in SECRET_DESTS:
            if "=" in arg:
                out.append(arg.split("=", 1)[0] + "=" + REDACTED)
            else:
                out.append(arg)
                hide_next = True
            continue
        out.append(arg)
    return out
