"""Each component's own validator, run on the inputs compose.yaml builds for it.

The doctor does not know what a good EMULATOR_TPOT_MS is: it interpolates the emulator
service's command line from the value, as compose would, and asks the emulator's own parser.
Each variable is tried alone (the others at compose.yaml's defaults), so that each bad value
gets its own line naming it; then all together, for rules that span several values.
"""

from __future__ import annotations

import contextlib
import io
import os
import re
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from glmserve.doctor import compose, external
from glmserve.envfile import shown

# What the component says about its input, or None when it takes it.
Validator = Callable[[Any], "str | None"]


@dataclass(frozen=True)
class Component:
    service: str
    inputs: Callable[[dict[str, Any]], Any]  # the service's config -> the part to interpolate
    validate: Validator


def _argv_after(module: str) -> Callable[[dict[str, Any]], list[str]]:
    def pick(service: dict[str, Any]) -> list[str]:
        command = list(service.get("command") or [])
        return command[command.index(module) + 1 :] if module in command else []

    return pick


def _argparse_message(call: Callable[[], Any]) -> str | None:
    """Run a CLI's own parsing; its one-line refusal (argparse prints it and exits 2)."""
    err = io.StringIO()
    try:
        with contextlib.redirect_stderr(err):
            call()
    except SystemExit as exc:
        if exc.code not in (0, None):
            return err.getvalue().strip() or f"exit status {exc.code}"
    return None


def emulator(argv: Sequence[str]) -> str | None:
    from glmserve.emulator.config import parse_config

    return _argparse_message(lambda: parse_config(list(argv)))


def exporter(argv: Sequence[str]) -> str | None:
    from glmserve.exporter.cli import PROG, load_config
    from glmserve.exporter.config import ConfigError

    try:
        return _argparse_message(lambda: load_config(list(argv), {}))
    except ConfigError as exc:
        return f"{PROG}: error: {exc}"


def launcher(environ: Mapping[str, Any]) -> str | None:
    """The launcher's own input checks (profile, TP, nodes, port, extra args, switches), as it
    runs them before it looks at the GPUs or SGLang."""
    from glmserve.launch.cli import PROG, _parser, fp8_switches, resolve_inputs
    from glmserve.launch.errors import LaunchError
    from glmserve.launch.profiles import find_profiles_dir, load_profile

    env = {k: "" if v is None else str(v) for k, v in environ.items()}
    try:
        profile = load_profile(_profiles_dir(find_profiles_dir), env.get("GLMSERVE_PROFILE", ""))
        # Compose gives the launcher no options, only this environment: its parser's defaults.
        resolve_inputs(_parser().parse_args([]), [], profile, env)
        fp8_switches(env)
    except LaunchError as exc:
        return f"{PROG}: error: {exc}"
    return None


def _profiles_dir(find: Callable[[Mapping[str, str], str | None], Path]) -> Path:
    """Where this process finds the profiles (the server image's own are the same files)."""
    from glmserve.launch.profiles import PROFILES_DIR_ENV

    return find({k: v for k, v in os.environ.items() if k == PROFILES_DIR_ENV}, None)


def model_dir(path: str, profile_name: str) -> str | None:
    """What the launcher would say about MODEL_DIR once mounted at /model. A profile it cannot
    load is the launcher component's finding (under GLMSERVE_PROFILE), not said again here."""
    from glmserve.launch import checks
    from glmserve.launch.cli import PROG
    from glmserve.launch.errors import LaunchError
    from glmserve.launch.profiles import find_profiles_dir, load_profile

    try:
        profile = load_profile(_profiles_dir(find_profiles_dir), profile_name)
    except LaunchError:
        return None
    try:
        checks.check_model(profile, Path(path))
    except LaunchError as exc:
        return f"{PROG}: error: {exc}"
    return None


def fleet(environ: Mapping[str, str]) -> str | None:
    from glmserve.fleet.router import FleetError
    from glmserve.fleet.spec import from_env

    try:
        from_env(environ)
    except FleetError as exc:
        return f"glmserve.fleet: error: {exc}"
    return None


COMPONENTS = [
    Component("emulator", _argv_after("glmserve.emulator"), emulator),
    Component("exporter", _argv_after("glmserve.exporter"), exporter),
    Component("sglang", lambda svc: dict(svc.get("environment") or {}), launcher),
    Component("prometheus", lambda svc: list(svc.get("command") or []), external.prometheus),
    Component("grafana", lambda svc: dict(svc.get("environment") or {}), external.grafana),
]
# The fleet reads its variables itself (python -m glmserve.fleet compose), not through compose.
FLEET_PREFIXES = ("FLEET_", "ROUTER_")
FLEET_IN_USE = ("FLEET_LOCAL_REPLICAS", "FLEET_REMOTE_WORKERS", "FLEET_EMULATED")


def _sglang_line(value: str) -> str | None:
    from glmserve.sglang_lines import LineError, get

    try:
        get(value)
    except LineError as exc:
        return str(exc)
    return None


def _sha256(value: str) -> str | None:
    ok = re.fullmatch(r"[0-9a-f]{64}", value)
    return None if ok else "must be the 64 hex digits of patches/series.lock.json's sha256"


# Values no service of ours parses (build arguments, compose's own settings, NCCL's): each
# checked by the grammar of what does read it. Names ending in _IMAGE are image references.
VARIABLE_RULES: dict[str, Callable[[str], str | None]] = {
    "SGLANG_LINE": _sglang_line,
    "GLMSERVE_PULL_POLICY": external.pull_policy_problem,
    "COMPOSE_PROJECT_NAME": external.project_name_problem,
    "NCCL_P2P_LEVEL": external.nccl_p2p_level_problem,
    "PATCH_LOCK_SHA256": _sha256,
}


def _rule(name: str) -> Callable[[str], str | None] | None:
    if name in VARIABLE_RULES:
        return VARIABLE_RULES[name]
    return external.image_problem if name.endswith("_IMAGE") else None


def value_problems(
    services: Mapping[str, dict[str, Any]],
    values: Mapping[str, str],
    where: Mapping[str, str],
    project_dir: Path = Path("."),
) -> list[str]:
    """One line per bad value (`where` says which file line or the environment set it). A value
    several services read (SGLANG_PORT: the server, the exporter's target, Locust's host) is
    named once, by the first component that refuses it."""
    components = [
        *COMPONENTS,
        Component("locust", lambda svc: list(svc.get("command") or []),
                  lambda argv: external.locust(argv, project_dir)),
    ]  # fmt: skip
    problems: list[str] = []
    named: set[str] = set()
    for component in components:
        if component.service not in services:
            continue
        node = component.inputs(services[component.service])
        baseline = component.validate(compose.interpolate(node, {}))
        if baseline:
            problems.append(f"compose.yaml's {component.service} at its defaults: {baseline}")
            continue
        alone = []
        for name in sorted(compose.names_in(node) & set(values) - named):
            said = component.validate(compose.interpolate(node, {name: values[name]}))
            if said:
                alone.append(f"{shown(name, values[name])} ({where[name]}): {said}")
                named.add(name)
        together = component.validate(compose.interpolate(node, values))
        if together and not alone and not named & compose.names_in(node):
            alone.append(f"{component.service}: {together}")
        problems += alone
    for name in sorted(set(values) - named):
        rule = _rule(name)
        value = values[name].strip()
        said = rule(value) if rule is not None and value else None
        if said:
            problems.append(f"{shown(name, values[name])} ({where[name]}): {said}")
            named.add(name)
    problems += _fleet_problems(values, where, named)
    return problems


def _fleet_problems(
    values: Mapping[str, str], where: Mapping[str, str], named: set[str]
) -> list[str]:
    """The fleet's variables through the fleet's own reader, each alone (on an emulated fleet
    when .env describes none, so a typo there is found before the fleet is ever rendered),
    then all together."""
    fleet_values = {k: v for k, v in values.items() if k.startswith(FLEET_PREFIXES)}
    shape = {n: values[n] for n in FLEET_IN_USE if values.get(n, "").strip()}
    base = {
        "GLMSERVE_PROFILE": values.get("GLMSERVE_PROFILE", ""),
        **(shape or {"FLEET_EMULATED": "1"}),
    }
    problems = []
    for name in sorted(set(fleet_values) - named):
        if not fleet_values[name].strip():
            continue  # empty: the fleet's default
        said = fleet({**base, name: fleet_values[name]})
        if said:
            problems.append(f"{shown(name, values[name])} ({where[name]}): {said}")
            named.add(name)
    if not problems:
        said = fleet({**base, **fleet_values})
        if said and shape:
            problems.append(said)
    return problems
