"""Every flag a profile passes exists in the pinned SGLang's server_args.py, with a legal value.

The source is read from the real sglang wheel (downloaded once into .cache/wheels, as the patch
tests do) and parsed with ast: SGLang itself is never imported (it needs torch and CUDA), yet a
typo, a renamed flag or an invalid choice in a profile fails here instead of on a GPU host 7
minutes into model loading.

Some choices are not literals in server_args.py but registries elsewhere in the wheel, e.g.
`choices=["auto"] + list(ReasoningParser.DetectorMap.keys())`: those are followed through the
module's imports to the class's dict literal, so `--reasoning-parser glm45` is checked too.
"""

from __future__ import annotations

import ast
import json
import zipfile
from collections.abc import Callable
from dataclasses import dataclass

import pytest
from support.launch import PINNED, PROFILE_NAMES, PROFILES_DIR, pinned_sglang_parser

from glmserve.launch.profiles import LAUNCHER_OWNED_FLAGS, parse_profile_file, sglang_versions
from glmserve.launch.sglang_argv import annotated_fields, resolve
from glmserve.series.errors import PatchError
from glmserve.series.wheels import default_cache_dir, fetch_wheel

SERVER_ARGS = "sglang/srt/server_args.py"
VALUELESS_ACTIONS = {"store_true", "store_false", "store_const", "count", "help", "version"}
# SGLang's own valueless actions (arg_groups/argparse_actions.py in 0.5.17+: nargs=0).
DEPRECATED_VALUELESS = {
    "DeprecatedStoreTrueAction",
    "DeprecatedStoreConstAction",
    "DeprecatedAction",
}


@dataclass(frozen=True)
class FlagSpec:
    options: tuple[str, ...]
    action: str | None
    choices: frozenset[str] | None  # None: not a literal we can resolve
    type_name: str | None

    @property
    def takes_value(self) -> bool:
        return self.action not in VALUELESS_ACTIONS


class _Resolver:
    """Turns a `choices=` expression into a set of strings, or None when it cannot.

    Handles list/tuple/set literals, names bound to them (module constants such as
    ATTENTION_BACKEND_CHOICES and function locals), `a + b`, and `list(Cls.Attr.keys())` where
    Cls is imported from another module of the wheel and Attr is a dict literal in its body.
    """

    def __init__(self, tree: ast.Module, read_module: Callable[[str], str]) -> None:
        self.read_module = read_module
        self.bindings: dict[str, ast.AST] = {}
        self.imports: dict[str, str] = {}  # imported name -> module
        for node in ast.walk(tree):
            if isinstance(node, ast.Assign) and len(node.targets) == 1:
                target = node.targets[0]
                if isinstance(target, ast.Name):
                    self.bindings.setdefault(target.id, node.value)
            elif isinstance(node, ast.ImportFrom) and node.module:
                for alias in node.names:
                    self.imports[alias.asname or alias.name] = node.module

    def strings(self, node: ast.AST, depth: int = 0) -> frozenset[str] | None:
        if depth > 8:
            return None
        if isinstance(node, (ast.List, ast.Tuple, ast.Set)):
            values = [e.value for e in node.elts if isinstance(e, ast.Constant)]
            if len(values) == len(node.elts) and all(isinstance(v, str) for v in values):
                return frozenset(values)
            return None
        if isinstance(node, ast.Name) and node.id in self.bindings:
            return self.strings(self.bindings[node.id], depth + 1)
        if isinstance(node, ast.BinOp) and isinstance(node.op, ast.Add):
            left, right = self.strings(node.left, depth + 1), self.strings(node.right, depth + 1)
            return None if left is None or right is None else left | right
        registry = _registry_ref(node)
        if registry is not None:
            return self.registry_keys(*registry)
        return None

    def registry_keys(self, cls: str, attr: str) -> frozenset[str] | None:
        module = self.imports.get(cls)
        if module is None:
            return None
        tree = ast.parse(self.read_module(module))
        for node in tree.body:
            if isinstance(node, ast.ClassDef) and node.name == cls:
                for item in node.body:
                    target = getattr(item, "target", None) or next(
                        iter(getattr(item, "targets", [])), None
                    )
                    value = getattr(item, "value", None)
                    if (
                        isinstance(target, ast.Name)
                        and target.id == attr
                        and isinstance(value, ast.Dict)
                    ):
                        keys = [k.value for k in value.keys if isinstance(k, ast.Constant)]
                        return frozenset(str(k) for k in keys)
        return None


def _registry_ref(node: ast.AST) -> tuple[str, str] | None:
    """("Cls", "Attr") for `list(Cls.Attr.keys())`, else None."""
    if not (isinstance(node, ast.Call) and isinstance(node.func, ast.Name)):
        return None
    if node.func.id != "list" or len(node.args) != 1:
        return None
    inner = node.args[0]
    if not (
        isinstance(inner, ast.Call)
        and isinstance(inner.func, ast.Attribute)
        and inner.func.attr == "keys"
    ):
        return None
    owner = inner.func.value
    if isinstance(owner, ast.Attribute) and isinstance(owner.value, ast.Name):
        return owner.value.id, owner.attr
    return None


def parse_server_args(
    source: str, read_module: Callable[[str], str] = lambda _m: ""
) -> dict[str, FlagSpec]:
    tree = ast.parse(source)
    resolver = _Resolver(tree, read_module)
    specs: dict[str, FlagSpec] = {}
    for node in ast.walk(tree):
        if not (
            isinstance(node, ast.Call)
            and isinstance(node.func, ast.Attribute)
            and node.func.attr == "add_argument"
        ):
            continue
        options = tuple(
            a.value
            for a in node.args
            if isinstance(a, ast.Constant) and isinstance(a.value, str) and a.value.startswith("-")
        )
        kw = {k.arg: k.value for k in node.keywords if k.arg}
        action = kw.get("action")
        action_name = getattr(action, "attr", None) or getattr(action, "id", None)
        spec = FlagSpec(
            options=options,
            action=action.value
            if isinstance(action, ast.Constant)
            else ("store_true" if action_name in DEPRECATED_VALUELESS else None),
            choices=resolver.strings(kw["choices"]) if "choices" in kw else None,
            type_name=kw["type"].id if isinstance(kw.get("type"), ast.Name) else None,
        )
        for option in options:
            specs[option] = spec
    for options, _name, meta in annotated_fields(tree):  # SGLang 0.5.17+: annotated fields
        kind = meta["__kind__"].value
        action = meta.get("action")
        action_name = getattr(action, "attr", None) or getattr(action, "id", None)
        valueless = kind == "bool" or action_name in {
            "BooleanOptionalAction",
            "DeprecatedStoreTrueAction",
        }
        spec = FlagSpec(
            options=tuple(options),
            action="store_true" if valueless else None,
            choices=resolver.strings(meta["choices"]) if "choices" in meta else None,
            type_name=_scalar_type(meta["__type__"]),
        )
        for option in options:
            specs.setdefault(option, spec)
    return specs


def _scalar_type(node: ast.AST) -> str | None:
    """int / float / str of a field's type, Optional unwrapped (None: anything else)."""
    if isinstance(node, ast.Subscript) and getattr(node.value, "id", None) == "Optional":
        node = node.slice
    return node.id if isinstance(node, ast.Name) and node.id in ("int", "float", "str") else None


def _wheel_specs(version: str, require) -> dict[str, FlagSpec]:
    try:
        wheel = fetch_wheel(version, default_cache_dir())
    except PatchError as exc:
        require(False, f"cannot get the sglang {version} wheel: {exc}")
    with zipfile.ZipFile(wheel) as zf:
        source = zf.read(SERVER_ARGS).decode("utf-8")
        names = set(zf.namelist())

        def read_module(module: str) -> str:
            path = module.replace(".", "/") + ".py"
            return zf.read(path).decode("utf-8") if path in names else ""

        return parse_server_args(source, read_module)


@pytest.fixture(scope="module")
def specs(require) -> dict[str, FlagSpec]:
    return _wheel_specs(PINNED, require)


@pytest.fixture(scope="module")
def line_specs(require) -> Callable[[str], dict[str, FlagSpec]]:
    """version -> that SGLang line's flags (each profile is checked against its own line)."""
    cache: dict[str, dict[str, FlagSpec]] = {}

    def get(version: str) -> dict[str, FlagSpec]:
        if version not in cache:
            cache[version] = _wheel_specs(version, require)
        return cache[version]

    return get


def test_the_parse_sees_the_real_parser(specs):
    """Guards the guard: an AST walk that found nothing would make every check below vacuous."""
    assert len(specs) > 300
    assert "flashinfer" in specs["--attention-backend"].choices
    assert "modelopt_fp4" in specs["--quantization"].choices
    assert specs["--enable-metrics"].action == "store_true"
    assert specs["--port"].type_name == "int"
    # Followed through the imports to the parser registries (not literals in server_args.py).
    assert {"auto", "glm45", "deepseek-r1"} <= specs["--reasoning-parser"].choices
    assert {"auto", "glm47", "glm45"} <= specs["--tool-call-parser"].choices
    assert {"trtllm", "flashmla_kv"} <= specs["--nsa-decode-backend"].choices
    assert "flashinfer_trtllm" in specs["--moe-runner-backend"].choices


def check_argv(argv: list[str], specs: dict[str, FlagSpec], version: str = PINNED) -> list[str]:
    """Problems with an argv fragment as SGLang's argparse would see it."""
    problems = []
    i = 0
    while i < len(argv):
        token = argv[i]
        if not token.startswith("--"):
            problems.append(f"{token!r} is not a flag (stray value?)")
            i += 1
            continue
        flag, has_inline, inline = token.partition("=")
        spec = specs.get(flag)
        if spec is None:
            problems.append(f"{flag} does not exist in SGLang {version}")
            i += 1
            continue
        if not spec.takes_value:
            if has_inline:
                problems.append(f"{flag} takes no value")
            i += 1
            continue
        if has_inline:
            value, i = inline, i + 1
        elif i + 1 < len(argv):
            value, i = argv[i + 1], i + 2
        else:
            problems.append(f"{flag} needs a value")
            break
        if spec.choices is not None and value not in spec.choices:
            problems.append(f"{flag} {value!r} is not one of its choices")
        caster = {"int": int, "float": float}.get(spec.type_name or "")
        if caster is not None:
            try:
                caster(value)
            except ValueError:
                problems.append(f"{flag} {value!r} is not {spec.type_name}")
        if flag == "--json-model-override-args":
            try:
                json.loads(value)
            except json.JSONDecodeError:
                problems.append(f"{flag} {value!r} is not JSON")
    return problems


@pytest.mark.parametrize("name", PROFILE_NAMES)
def test_every_profile_flag_exists_with_a_legal_value(line_specs, name):
    """Against the server_args.py of the line the profile names (0.5.12.post1 or 0.5.17)."""
    profile = parse_profile_file(PROFILES_DIR / f"{name}.json")
    (version,) = sglang_versions(profile)  # the line that lists it
    assert check_argv(list(profile.args), line_specs(version), version) == []


def test_the_parse_sees_the_annotated_parser_of_the_current_line(line_specs):
    """0.5.17 declares most options as annotated ServerArgs fields, not add_argument calls: the
    parse must see them with their choices, or the current line's profiles check nothing."""
    specs = line_specs("0.5.17")
    assert len(specs) > 400
    assert {"dsa", "flashinfer", "fa3", "trtllm_mla"} <= specs["--attention-backend"].choices
    assert "flashinfer_sparse_mla" in specs["--dsa-decode-backend"].choices
    assert specs["--enable-metrics"].action == "store_true"
    assert specs["--tp-size"].type_name == "int" and "--tensor-parallel-size" in specs
    assert check_argv(["--attention-backend", "dsaa", "--dsa-decode-backend", "x"], specs) == [
        "--attention-backend 'dsaa' is not one of its choices",
        "--dsa-decode-backend 'x' is not one of its choices",
    ]


@pytest.mark.parametrize("version", ["0.5.17", "0.5.23"])
def test_the_launchers_parser_reads_the_newer_lines(version, require):
    """The launcher rebuilds SGLang's parser at start to keep its own flags its own: on the newer
    lines (annotated fields; 0.5.23's moved into arg_groups/fields/) it must still find them."""
    from glmserve.launch.profiles import LAUNCHER_OWNED_FLAGS
    from glmserve.launch.sglang_argv import FIELDS_DIR, owned_dests, parser_from_source

    with zipfile.ZipFile(fetch_wheel(version, default_cache_dir())) as zf:
        fields = tuple(
            zf.read(n).decode()
            for n in sorted(zf.namelist())
            if n.startswith(FIELDS_DIR + "/")
            and n.endswith(".py")
            and not n.endswith("/__init__.py")
        )
        parser = parser_from_source(zf.read(SERVER_ARGS).decode(), fields)
    dests = owned_dests(parser, LAUNCHER_OWNED_FLAGS)
    assert {"model_path", "tp_size", "host", "port", "nnodes", "node_rank"} <= set(dests)
    assert resolve(parser, "--tensor-parallel") == resolve(parser, "--tp") == "tp_size"
    assert resolve(parser, "--dsa-decode-backend") == "dsa_decode_backend"


def test_the_flags_the_launcher_adds_exist(specs):
    argv = ["--model-path", "/m", "--tp-size", "8", "--host", "127.0.0.1", "--port", "30000"]
    assert check_argv(argv, specs) == []


def test_the_multi_node_flags_the_launcher_adds_exist_with_their_types(specs):
    """SGLang's own multi-node TP: --nnodes / --node-rank are ints, --dist-init-addr a string."""
    argv = ["--nnodes", "2", "--node-rank", "1", "--dist-init-addr", "10.0.0.1:5000"]
    assert check_argv(argv, specs) == []
    assert specs["--nnodes"].type_name == "int" and specs["--node-rank"].type_name == "int"
    assert check_argv(["--nnodes", "two"], specs) == ["--nnodes 'two' is not int"]


def test_every_alias_of_a_launcher_owned_flag_is_blocked(specs):
    """If SGLang accepted --tp as well as --tp-size, an extra arg could bypass the TP check."""
    for flag in ("--model-path", "--tp-size", "--host", "--port", "--nnodes", "--node-rank",
                 "--dist-init-addr"):  # fmt: skip
        assert set(specs[flag].options) <= set(LAUNCHER_OWNED_FLAGS), specs[flag].options


def test_the_checker_rejects_what_it_should(specs):
    bad = [
        "--attention-backend",
        "flashinfr",
        "--no-such-flag",
        "--enable-metrics=1",
        "--port",
        "x",
        "--reasoning-parser",
        "glm5",
        "--tool-call-parser",
        "glm48",
    ]
    problems = check_argv(bad, specs)
    assert len(problems) == 6, problems


def test_the_launchers_view_of_the_parser_knows_every_sglang_option(specs):
    """glmserve.launch.sglang_argv rebuilds SGLang's parser: each option (and alias) resolves to
    a dest there, so an abbreviation of any of them is resolved as SGLang resolves it."""
    parser = pinned_sglang_parser()
    unresolved = [option for option in specs if resolve(parser, option) is None]
    assert not unresolved and len(specs) > 300
    assert resolve(parser, "--tp") == resolve(parser, "--tp-s") == resolve(parser, "--tp-size")
    assert resolve(parser, "--no-such-flag") is None


def test_the_prefix_fallback_refuses_no_option_sglang_would_accept(specs):
    """Without SGLang (the tools image), every prefix of a launcher-owned flag is refused. That
    must never hit an option of SGLang's own: none is a prefix of an owned flag or of --config
    (argparse takes an exact option over an abbreviation, so such an option would be legal)."""
    from glmserve.launch.sglang_argv import CONFIG_FLAG

    owned = (*LAUNCHER_OWNED_FLAGS, CONFIG_FLAG)
    for option in specs:
        if option in owned or not option.startswith("--") or len(option) < 4:
            continue
        assert not [f for f in owned if f.startswith(option)], option
