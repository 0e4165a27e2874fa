"""SGLang's command-line options as data, and the argparse parser they make.

`sglang.launch_server` parses its argv with a plain argparse parser built by
`ServerArgs.add_cli_args`. Importing SGLang to get it needs torch and its whole tree, and the
tools image (the dry run, the doctor) has no SGLang at all, so the options are read from the
source instead, never imported:

- `add_argument(...)` calls of `add_cli_args` with their literal option strings, action, nargs,
  dest, const, `type=` (by name) and `choices=` (literals, module constants, `a + b`, and
  registries such as `list(ReasoningParser.DetectorMap.keys())` followed through the imports);
- from 0.5.17 on, annotated `ServerArgs` fields (`tp_size: A[int, Arg(...)] = 1`), which
  `add_cli_args_from_dataclass` turns into options: the field name as `--field-name` unless
  `cli_name`, its aliases, `bool` as store_true, a list as nargs "+", `Literal[...]` as choices,
  `type_parser` or the annotated type as the type, `no_cli` skipped; in 0.5.23 those fields
  live in per-namespace classes (`arg_groups/fields/*.py`, each with a `_NS_PATH`).

The same data is stored per SGLang line in `sglang_args/<version>.json` (regenerated from the
wheels: `python -m glmserve.launch.argstore --write`; tests/launch checks it against them), so
the dry run checks the profile's line without SGLang. `parser()` then builds the parser with
SGLang's types (stdlib copies of its converters, under the same names, so argparse words each
refusal as SGLang's own parser would) and choices: a value SGLang would refuse after minutes of
start-up is refused before anything starts.
"""

from __future__ import annotations

import argparse
import ast
import functools
import json
import re
from collections.abc import Callable, Iterable, Sequence
from dataclasses import dataclass
from decimal import Decimal, InvalidOperation
from pathlib import Path
from typing import Any, NoReturn

from glmserve.launch.errors import LaunchError

SERVER_ARGS_FILE = "sglang/srt/server_args.py"
FIELDS_DIR = "sglang/srt/arg_groups/fields"  # SGLang 0.5.23+: ServerArgs' fields by namespace
PARSER_PROG = "sglang serve"  # prepare_server_args' parser; allow_abbrev left at True
SHIPPED_DIR = Path(__file__).resolve().parent / "sglang_args"
FORMAT = 1

# SGLang's own argparse.Action subclasses, by what matters here: whether the option consumes a
# value, which SGLang passes or defaults in their __init__.
_VALUELESS_ACTIONS = {"DeprecatedStoreTrueAction", "DeprecatedAction", "DeprecatedStoreConstAction"}
_STORE_ACTIONS = {"LoRAPathAction", "DeprecatedAliasStoreAction"}
_PLAIN_ACTIONS = {"store", "store_true", "store_false", "store_const", "append", "count"}
# The annotation alias SGLang 0.5.17+ declares its fields with (`A = Annotated`).
_ANNOTATED = {"A", "Annotated"}


@dataclass(frozen=True)
class OptionSpec:
    """One SGLang option, as much of it as decides how an argv parses and which values pass."""

    options: tuple[str, ...]
    dest: str
    action: str = "store"  # argparse's name, or "boolean_optional"
    nargs: Any = None
    const: Any = None
    type: str | None = None  # a converter name (CONVERTERS); None or unknown: any string
    choices: tuple[Any, ...] | None = None  # None: any value

    def __post_init__(self) -> None:
        # Hashable throughout (parsers are cached by their options): a literal list const or
        # nargs becomes a tuple.
        for key in ("const", "nargs"):
            if isinstance(getattr(self, key), list):
                object.__setattr__(self, key, tuple(getattr(self, key)))

    def as_json(self) -> dict[str, Any]:
        out: dict[str, Any] = {"options": list(self.options), "dest": self.dest}
        if self.action != "store":
            out["action"] = self.action
        for key in ("nargs", "const", "type"):
            if getattr(self, key) is not None:
                out[key] = getattr(self, key)
        if self.choices is not None:
            out["choices"] = list(self.choices)
        return out

    @classmethod
    def from_json(cls, raw: dict[str, Any]) -> OptionSpec:
        choices = raw.get("choices")
        return cls(
            options=tuple(raw["options"]),
            dest=raw["dest"],
            action=raw.get("action", "store"),
            nargs=raw.get("nargs"),
            const=raw.get("const"),
            type=raw.get("type"),
            choices=None if choices is None else tuple(choices),
        )


# --- SGLang's converters, by the name its server_args.py gives them ---------------------------


def human_readable_int(value: str) -> int:
    """sglang.srt.utils.common.human_readable_int: an integer, SI (1k, 25.6k) or IEC (1Ki)."""
    value = value.strip()
    si = {"k": 10**3, "M": 10**6, "G": 10**9, "T": 10**12}
    iec = {"Ki": 2**10, "Mi": 2**20, "Gi": 2**30, "Ti": 2**40}
    match = re.fullmatch(r"(\d+(?:\.\d+)?)(Ki|Mi|Gi|Ti|k|M|G|T)", value)
    if match:
        number, suffix = match.groups()
        if suffix in iec:
            if "." in number:
                raise argparse.ArgumentTypeError(
                    f"Decimals are not allowed with IEC suffixes like '{suffix}'."
                )
            return int(number) * iec[suffix]
        try:
            return int(Decimal(number) * si[suffix])
        except InvalidOperation:
            pass
    try:
        return int(value)
    except ValueError:
        raise argparse.ArgumentTypeError(
            f"Invalid integer value: '{value}'. Use a plain integer, SI suffixes (1k, 1M), or "
            "IEC suffixes (1Ki, 1Mi). Suffixes are case-sensitive."
        ) from None


def nullable_str(value: str) -> str | None:
    return None if not value or value == "None" else value


def json_list_type(value: str) -> Any:
    try:
        return json.loads(value)
    except json.JSONDecodeError:
        raise argparse.ArgumentTypeError(
            f"Invalid JSON list: {value}. Please provide a valid JSON list."
        ) from None


def loads(value: str) -> Any:  # json.loads, under the name argparse's message gives it
    return json.loads(value)


CONVERTERS: dict[str, Callable[[str], Any]] = {
    "int": int,
    "float": float,
    "str": str,
    "human_readable_int": human_readable_int,
    "nullable_str": nullable_str,
    "json_list_type": json_list_type,
    "json.loads": loads,
}


# --- reading server_args.py -------------------------------------------------------------------


def _literal(node: ast.AST | None) -> Any:
    if node is None:
        return None
    try:
        return ast.literal_eval(node)
    except ValueError:
        return None


def _name(node: ast.AST | None) -> str | None:
    """`int` -> "int", `json.loads` -> "json.loads"; anything else None."""
    if isinstance(node, ast.Name):
        return node.id
    if isinstance(node, ast.Attribute) and isinstance(node.value, ast.Name):
        return f"{node.value.id}.{node.attr}"
    return None


def _action(node: ast.AST | None) -> tuple[str, dict[str, Any]]:
    """(action, extra spec fields) for SGLang's `action=` expression."""
    if node is None:
        return "store", {}
    if isinstance(node, ast.Constant) and node.value in _PLAIN_ACTIONS:
        return node.value, {}
    name = node.attr if isinstance(node, ast.Attribute) else getattr(node, "id", None)
    if name == "BooleanOptionalAction":
        return "boolean_optional", {}
    if name in _VALUELESS_ACTIONS:
        return "store_const", {"const": True}
    if name in _STORE_ACTIONS:
        return "store", {}
    raise LaunchError(
        f"cannot read SGLang's argument parser: unknown action {ast.unparse(node)} in "
        f"{SERVER_ARGS_FILE}"
    )


class _Choices:
    """Turns a `choices=` expression into a tuple of values, or None when it cannot: literals,
    names bound to them (module constants, function locals, in any of the files read), `a + b`,
    `list(...)`/`sorted(...)` of those, and `list(Cls.Attr.keys())` where Cls is imported from
    another module of the package and Attr is a dict literal in its body."""

    def __init__(self, trees: Sequence[ast.Module], read_module: Callable[[str], str]) -> None:
        self.read_module = read_module
        self.bindings: dict[str, ast.AST] = {}
        self.imports: dict[str, str] = {}
        for tree in trees:
            for node in ast.walk(tree):
                if isinstance(node, ast.Assign) and len(node.targets) == 1:
                    if isinstance(node.targets[0], ast.Name):
                        self.bindings.setdefault(node.targets[0].id, node.value)
                elif isinstance(node, ast.AnnAssign) and isinstance(node.target, ast.Name):
                    if node.value is not None:
                        self.bindings.setdefault(node.target.id, node.value)
                elif isinstance(node, ast.ImportFrom) and node.module:
                    for alias in node.names:
                        self.imports[alias.asname or alias.name] = node.module

    def values(self, node: ast.AST, depth: int = 0) -> tuple[Any, ...] | None:
        if depth > 8:
            return None
        if isinstance(node, (ast.List, ast.Tuple, ast.Set)):
            parts = [self.values(e, depth + 1) if isinstance(e, ast.Starred) else None
                     for e in node.elts]  # fmt: skip
            out: list[Any] = []
            for element, starred in zip(node.elts, parts, strict=True):
                if isinstance(element, ast.Starred):
                    if starred is None:
                        return None
                    out += starred
                elif isinstance(element, ast.Constant) and isinstance(
                    element.value, (str, int, float)
                ):
                    out.append(element.value)
                else:
                    return None
            return tuple(out)
        if isinstance(node, ast.Starred):
            return self.values(node.value, depth + 1)
        if isinstance(node, ast.Name) and node.id in self.bindings:
            return self.values(self.bindings[node.id], depth + 1)
        if isinstance(node, ast.Name) and node.id in self.imports:  # a constants module
            return self.imported(self.imports[node.id], node.id, depth)
        if isinstance(node, ast.BinOp) and isinstance(node.op, ast.Add):
            left, right = self.values(node.left, depth + 1), self.values(node.right, depth + 1)
            return None if left is None or right is None else left + right
        wrapped = isinstance(node, ast.Call) and _name(node.func) in ("list", "sorted", "tuple")
        if wrapped and len(node.args) == 1:
            inner = node.args[0]
            registry = _keys_of(inner)
            if registry is not None:
                return self.registry_keys(*registry)
            return self.values(inner, depth + 1)
        return None

    def imported(self, module: str, name: str, depth: int) -> tuple[Any, ...] | None:
        source = self.read_module(module)
        if not source:
            return None
        other = _Choices([ast.parse(source)], self.read_module)
        if name not in other.bindings:
            return None
        return other.values(other.bindings[name], depth + 1)

    def registry_keys(self, cls: str, attr: str) -> tuple[Any, ...] | None:
        module = self.imports.get(cls)
        source = self.read_module(module) if module else ""
        if not source:
            return None
        for node in ast.parse(source).body:
            if isinstance(node, ast.ClassDef) and node.name == cls:
                for item in node.body:
                    target = getattr(item, "target", None) or next(
                        iter(getattr(item, "targets", [])), None
                    )
                    value = getattr(item, "value", None)
                    named = isinstance(target, ast.Name) and target.id == attr
                    if named and isinstance(value, ast.Dict):
                        keys = [k.value for k in value.keys if isinstance(k, ast.Constant)]
                        return tuple(str(k) for k in keys)
        return None


def _keys_of(node: ast.AST) -> tuple[str, str] | None:
    """("Cls", "Attr") for `Cls.Attr.keys()`, else None."""
    if (
        isinstance(node, ast.Call)
        and isinstance(node.func, ast.Attribute)
        and node.func.attr == "keys"
        and isinstance(node.func.value, ast.Attribute)
        and isinstance(node.func.value.value, ast.Name)
    ):
        return node.func.value.value.id, node.func.value.attr
    return None


def _unwrap_optional(node: ast.AST) -> ast.AST:
    if isinstance(node, ast.Subscript) and _name(node.value) in ("Optional", "typing.Optional"):
        return node.slice
    if isinstance(node, ast.Subscript) and _name(node.value) in ("Union", "typing.Union"):
        parts = node.slice.elts if isinstance(node.slice, ast.Tuple) else [node.slice]
        rest = [p for p in parts if not _is_none(p)]
        return rest[0] if len(rest) == 1 else node
    if isinstance(node, ast.BinOp) and isinstance(node.op, ast.BitOr):
        rest = [x for x in (node.left, node.right) if not _is_none(x)]
        return rest[0] if len(rest) == 1 else node
    return node


def _is_none(node: ast.AST) -> bool:
    return isinstance(node, ast.Constant) and node.value is None


def _scalar_type(node: ast.AST) -> str | None:
    """add_cli_args_from_dataclass's `_infer_type_func`: int and float are converted, every
    other annotation is read as a string."""
    name = _name(node)
    return name if name in ("int", "float") else "str"


def _namespaced(cls: ast.ClassDef) -> bool:
    """A 0.5.23 field class (collected into ServerArgs): it declares `_NS_PATH`."""
    for item in cls.body:
        targets = item.targets if isinstance(item, ast.Assign) else [getattr(item, "target", None)]
        if any(isinstance(t, ast.Name) and t.id == "_NS_PATH" for t in targets):
            return True
    return False


def annotated_fields(tree: ast.Module) -> list[tuple[list[str], str, dict[str, ast.AST]]]:
    """(option strings, field name, Arg(...) keywords) of each annotated ServerArgs field with
    a CLI surface, in declaration order (add_cli_args_from_dataclass's). The keywords also hold
    `__type__`, the annotated type."""
    out = []
    for cls in ast.walk(tree):
        if not (isinstance(cls, ast.ClassDef) and (cls.name == "ServerArgs" or _namespaced(cls))):
            continue
        for item in cls.body:
            if not (isinstance(item, ast.AnnAssign) and isinstance(item.target, ast.Name)):
                continue
            ann = item.annotation
            if not (isinstance(ann, ast.Subscript) and _name(ann.value) in _ANNOTATED):
                continue
            parts = ann.slice.elts if isinstance(ann.slice, ast.Tuple) else [ann.slice]
            meta: dict[str, ast.AST] | None = None
            for extra in parts[1:]:
                if isinstance(extra, (ast.Constant, ast.JoinedStr)) and not isinstance(
                    getattr(extra, "value", ""), bool
                ):
                    meta = {}
                    break
                if isinstance(extra, ast.Call) and _name(extra.func) == "Arg":
                    meta = {k.arg: k.value for k in extra.keywords if k.arg}
                    break
            if meta is None or _literal(meta.get("no_cli")) is True:
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
            meta["__type__"] = parts[0]
            out.append((options, name, meta))
    return out


def _field_spec(
    options: list[str], name: str, meta: dict[str, ast.AST], choices: _Choices
) -> OptionSpec:
    inner = _unwrap_optional(meta["__type__"])
    explicit_choices = choices.values(meta["choices"]) if "choices" in meta else None
    parser_name = _name(meta.get("type_parser"))
    nargs = _literal(meta.get("nargs"))
    const = _literal(meta.get("const"))
    if "action" in meta:
        action, extra = _action(meta["action"])
        return OptionSpec(tuple(options), name, action, nargs, extra.get("const", const))
    if isinstance(inner, ast.Subscript) and _name(inner.value) in ("Literal", "typing.Literal"):
        parts = inner.slice.elts if isinstance(inner.slice, ast.Tuple) else [inner.slice]
        literal = tuple(_literal(p) for p in parts)
        kind = type(literal[0]).__name__ if literal else "str"
        kind = parser_name or (kind if kind in ("int", "float") else "str")
        return OptionSpec(
            tuple(options), name, "store", None, const, kind, explicit_choices or literal
        )
    if (
        isinstance(inner, ast.Subscript)
        and _name(inner.value) in ("List", "list", "typing.List")
        and parser_name is None
    ):
        element = _scalar_type(inner.slice)
        return OptionSpec(
            tuple(options), name, "store", nargs or "+", const, element, explicit_choices
        )
    if _name(inner) == "bool":
        return OptionSpec(tuple(options), name, "store_true")
    kind = parser_name or _scalar_type(inner)
    return OptionSpec(tuple(options), name, "store", nargs, const, kind, explicit_choices)


def _add_cli_args(tree: ast.Module) -> ast.FunctionDef:
    for node in ast.walk(tree):
        if isinstance(node, ast.ClassDef) and node.name == "ServerArgs":
            for item in node.body:
                if isinstance(item, ast.FunctionDef) and item.name == "add_cli_args":
                    return item
    raise LaunchError(
        f"cannot read SGLang's argument parser: no ServerArgs.add_cli_args in {SERVER_ARGS_FILE}"
    )


def _dest(options: Sequence[str]) -> str:
    """argparse's default dest: the first long option, else the first, without dashes."""
    first = next((o for o in options if o.startswith("--")), options[0])
    return first.lstrip("-").replace("-", "_")


def read_source(
    source: str,
    field_sources: Sequence[str] = (),
    read_module: Callable[[str], str] = lambda _m: "",
) -> list[OptionSpec]:
    """Every option `ServerArgs.add_cli_args` adds, in its order: the field modules' fields
    (0.5.23+), ServerArgs' annotated fields (0.5.17+), then its add_argument calls.
    `read_module("sglang.srt.x")` gives another module's source (for registries), or ''."""
    tree = ast.parse(source)
    fields = [ast.parse(s) for s in field_sources]
    choices = _Choices([tree, *fields], read_module)
    specs: list[OptionSpec] = []
    for module in [*fields, tree]:
        specs += [_field_spec(o, n, m, choices) for o, n, m in annotated_fields(module)]
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
        kw = {k.arg: k.value for k in node.keywords if k.arg}
        action, extra = _action(kw.get("action"))
        valueless = action in ("store_true", "store_false", "store_const", "count",
                               "boolean_optional")  # fmt: skip
        specs.append(
            OptionSpec(
                options=tuple(options),
                dest=_literal(kw.get("dest")) or _dest(options),
                action=action,
                nargs=None if valueless else _literal(kw.get("nargs")),
                const=extra.get("const", _literal(kw.get("const"))),
                type=None if valueless else _name(kw.get("type")),
                choices=None if valueless or "choices" not in kw else choices.values(kw["choices"]),
            )
        )
    return specs


def read_site(site: Path) -> list[OptionSpec]:
    """The options of the SGLang installed in `site` (its files, never imported)."""
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

    def read_module(module: str) -> str:
        try:
            return (site / (module.replace(".", "/") + ".py")).read_text(encoding="utf-8")
        except OSError:
            return ""

    return read_source(source, fields, read_module)


# --- the shipped copies, one per SGLang line -----------------------------------------------------


def dumps(specs: Iterable[OptionSpec], version: str) -> str:
    """The stored form: one option per line, so a new SGLang line diffs option by option. The
    file's name is the line (glmserve.sglang_lines is the one place that spells versions)."""
    del version
    head = json.dumps({"format": FORMAT})[:-1]
    lines = ",\n".join(json.dumps(s.as_json()) for s in specs)
    return f'{head}, "options": [\n{lines}\n]}}\n'


@functools.lru_cache(maxsize=8)
def shipped(version: str) -> tuple[OptionSpec, ...] | None:
    """The stored options of an SGLang line, or None when none are stored for it."""
    path = SHIPPED_DIR / f"{version}.json"
    try:
        doc = json.loads(path.read_text(encoding="utf-8"))
    except FileNotFoundError:
        return None
    except (OSError, ValueError) as exc:
        raise LaunchError(f"cannot read {path}: {exc}") from None
    if doc.get("format") != FORMAT:
        raise LaunchError(f"{path} is format {doc.get('format')!r}, not {FORMAT}")
    return tuple(OptionSpec.from_json(o) for o in doc["options"])


# --- the parser ----------------------------------------------------------------------------------


class ParseError(Exception):
    """argparse's one-line refusal, never printed or exited on by argparse itself."""


class Parser(argparse.ArgumentParser):
    # The launcher must never print usage or exit: `-h` among the extra args included.
    def error(self, message: str) -> NoReturn:
        raise ParseError(message)

    def exit(self, status: int = 0, message: str | None = None) -> NoReturn:
        raise ParseError(message or "exits")

    def print_help(self, file: Any = None) -> None:
        pass


def _converter(name: str | None) -> Callable[[str], Any] | None:
    return CONVERTERS.get(name or "")


@functools.lru_cache(maxsize=16)
def parser(specs: tuple[OptionSpec, ...], typed: bool = True) -> argparse.ArgumentParser:
    """SGLang's parser from its options: abbreviations, `=` forms, types and choices as SGLang
    resolves them. Nothing is required and nothing has a default (only what an argv sets).
    Its `untyped` twin (no types, no choices) says which option an argument is, whatever its
    value (glmserve.launch.sglang_argv.resolve)."""
    p = Parser(prog=PARSER_PROG, argument_default=argparse.SUPPRESS)
    p.untyped = parser(specs, typed=False) if typed else p  # type: ignore[attr-defined]
    for spec in specs:
        kwargs: dict[str, Any] = {"dest": spec.dest}
        if spec.action == "boolean_optional":
            kwargs["action"] = argparse.BooleanOptionalAction
        elif spec.action in ("store_true", "store_false", "count"):
            kwargs["action"] = spec.action
        elif spec.action == "store_const":
            kwargs.update(action="store_const", const=spec.const)
        else:
            kwargs["action"] = spec.action
            if spec.nargs is not None:
                kwargs["nargs"] = spec.nargs
            if spec.const is not None and spec.nargs == "?":
                kwargs["const"] = spec.const
            converter = _converter(spec.type)
            if converter is not None and typed:
                kwargs["type"] = converter
            if spec.choices is not None and typed:
                kwargs["choices"] = spec.choices
        p.add_argument(*spec.options, **kwargs)
    return p


def parser_from_source(source: str, field_sources: tuple[str, ...] = ()) -> argparse.ArgumentParser:
    return parser(tuple(read_source(source, field_sources)))


def from_wheel(wheel: Path) -> list[OptionSpec]:
    """The options of the SGLang in a wheel (server_args.py, the field modules, registries)."""
    import zipfile

    with zipfile.ZipFile(wheel) as zf:
        names = set(zf.namelist())
        fields = tuple(
            zf.read(n).decode("utf-8")
            for n in sorted(names)
            if n.startswith(FIELDS_DIR + "/")
            and n.endswith(".py")
            and not n.endswith("/__init__.py")
        )

        def read_module(module: str) -> str:
            path = module.replace(".", "/") + ".py"
            return zf.read(path).decode("utf-8") if path in names else ""

        return read_source(zf.read(SERVER_ARGS_FILE).decode("utf-8"), fields, read_module)
