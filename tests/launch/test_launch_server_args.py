"""Every flag a profile passes exists in the pinned SGLang's server_args.py, with a legal value.

The source is read from the real sglang wheel (downloaded once into .cache/wheels, as the patch
tests do) and parsed with ast: SGLang itself is never imported (it needs torch and CUDA), yet a
typo, a renamed flag or an invalid choice in a profile fails here instead of on a GPU host 7
minutes into model loading.
"""

from __future__ import annotations

import ast
import json
import zipfile
from dataclasses import dataclass

import pytest
from launch_helpers import PINNED, PROFILE_NAMES, PROFILES_DIR

from glmserve.launch.profiles import LAUNCHER_OWNED_FLAGS, parse_profile_file
from glmserve.patching.errors import PatchError
from glmserve.patching.wheels import default_cache_dir, fetch_wheel

SERVER_ARGS = "sglang/srt/server_args.py"
VALUELESS_ACTIONS = {"store_true", "store_false", "store_const", "count", "help", "version"}


@dataclass(frozen=True)
class FlagSpec:
    options: tuple[str, ...]
    action: str | None
    choices: frozenset[str] | None  # None: not a literal we can resolve
    type_name: str | None

    @property
    def takes_value(self) -> bool:
        return self.action not in VALUELESS_ACTIONS


def _literal_strings(node: ast.AST, constants: dict[str, frozenset[str]]) -> frozenset[str] | None:
    if isinstance(node, (ast.List, ast.Tuple, ast.Set)):
        values = [e.value for e in node.elts if isinstance(e, ast.Constant)]
        if len(values) == len(node.elts) and all(isinstance(v, str) for v in values):
            return frozenset(values)
        return None
    if isinstance(node, ast.Name):
        return constants.get(node.id)
    return None


def parse_server_args(source: str) -> dict[str, FlagSpec]:
    tree = ast.parse(source)
    constants: dict[str, frozenset[str]] = {}
    for node in tree.body:  # module-level CHOICES lists, e.g. ATTENTION_BACKEND_CHOICES
        if isinstance(node, ast.Assign) and len(node.targets) == 1:
            target = node.targets[0]
            if isinstance(target, ast.Name):
                values = _literal_strings(node.value, constants)
                if values is not None:
                    constants[target.id] = values
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
        spec = FlagSpec(
            options=options,
            action=action.value if isinstance(action, ast.Constant) else None,
            choices=_literal_strings(kw["choices"], constants) if "choices" in kw else None,
            type_name=kw["type"].id if isinstance(kw.get("type"), ast.Name) else None,
        )
        for option in options:
            specs[option] = spec
    return specs


@pytest.fixture(scope="module")
def specs(require) -> dict[str, FlagSpec]:
    try:
        wheel = fetch_wheel(PINNED, default_cache_dir())
    except PatchError as exc:
        require(False, f"cannot get the sglang {PINNED} wheel: {exc}")
    with zipfile.ZipFile(wheel) as zf:
        source = zf.read(SERVER_ARGS).decode("utf-8")
    return parse_server_args(source)


def test_the_parse_sees_the_real_parser(specs):
    """Guards the guard: an AST walk that found nothing would make every check below vacuous."""
    assert len(specs) > 300
    assert "flashinfer" in specs["--attention-backend"].choices
    assert "modelopt_fp4" in specs["--quantization"].choices
    assert specs["--enable-metrics"].action == "store_true"
    assert specs["--port"].type_name == "int"


def check_argv(argv: list[str], specs: dict[str, FlagSpec]) -> list[str]:
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
            problems.append(f"{flag} does not exist in SGLang {PINNED}")
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
def test_every_profile_flag_exists_with_a_legal_value(specs, name):
    profile = parse_profile_file(PROFILES_DIR / f"{name}.json")
    assert check_argv(list(profile.args), specs) == []


def test_the_flags_the_launcher_adds_exist(specs):
    argv = ["--model-path", "/m", "--tp-size", "8", "--host", "127.0.0.1", "--port", "30000"]
    assert check_argv(argv, specs) == []


def test_every_alias_of_a_launcher_owned_flag_is_blocked(specs):
    """If SGLang accepted --tp as well as --tp-size, an extra arg could bypass the TP check."""
    for flag in ("--model-path", "--tp-size", "--host", "--port"):
        assert set(specs[flag].options) <= set(LAUNCHER_OWNED_FLAGS), specs[flag].options


def test_the_checker_rejects_what_it_should(specs):
    bad = [
        "--attention-backend",
        "flashinfr",
        "--no-such-flag",
        "--enable-metrics=1",
        "--port",
        "x",
    ]
    problems = check_argv(bad, specs)
    assert len(problems) == 4, problems
