"""`python -m glmserve.doctor`: see the package docstring (glmserve/doctor/__init__.py)."""

from __future__ import annotations

import argparse
import difflib
import os
import sys
from collections.abc import Callable, Mapping, Sequence
from pathlib import Path
from typing import Any

from glmserve.doctor import compose
from glmserve.doctor.components import model_dir, value_problems
from glmserve.doctor.host import check_host
from glmserve.doctor.names import known_names
from glmserve.doctor.scrape import scrape_problems
from glmserve.envfile import Entry, EnvFileError, chosen_files, read_entries

PROG = "glmserve.doctor"
# Services that answer on SGLANG_PORT; the fleet's router and replicas carry the fleet profile.
SERVERS = ("sglang", "emulator")
FLEET_PROFILE = "fleet"
GRAFANA_GUARD = (
    "grafana: GRAFANA_ADMIN_PASSWORD is not set (cp .env.example .env and set it); there is no "
    "default admin password, so Grafana would not start"
)


def _parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(
        prog=f"python -m {PROG}",
        description="Check .env, the compose profiles and the host before `docker compose up`.",
    )
    p.add_argument("services", nargs="*", metavar="SERVICE", help="the services `up` will start")
    p.add_argument(
        "--env-file",
        action="append",
        type=Path,
        help="as docker compose takes it (repeatable); default: COMPOSE_ENV_FILES, else .env in "
        "the project dir, if present",
    )
    p.add_argument("--project-dir", type=Path, default=Path("."), help="where compose.yaml is")
    p.add_argument("-f", "--file", action="append", type=Path, help="compose file(s)")
    p.add_argument("--profile", action="append", default=[], help="as given to docker compose")
    p.add_argument(
        "--in-compose",
        action="store_true",
        help="the doctor service: values and names only (no Docker, no --profile to see)",
    )
    return p


def nearest(name: str, known: set[str]) -> str | None:
    upper = {k.upper(): k for k in known}
    match = difflib.get_close_matches(name.upper(), list(upper), n=1, cutoff=0.6)
    return upper[match[0]] if match else None


def _did_you_mean(name: str, known: set[str]) -> str:
    close = nearest(name, known)
    return f" (did you mean {close}?)" if close else ""


def diagnose(
    args: argparse.Namespace,
    environ: Mapping[str, str],
    host_check: Callable[[bool], tuple[list[str], list[str]]] = check_host,
) -> tuple[list[str], list[str]]:
    """(problems, notes)."""
    project = args.project_dir
    problems: list[str] = []
    notes: list[str] = []
    known = known_names(project / ".env.example")

    env_files = chosen_files(args.env_file, environ, project)
    entries: list[Entry] = []
    for env_file in env_files:
        try:
            found, syntax = read_entries(env_file)
        except EnvFileError as exc:
            if not args.in_compose:
                raise
            notes.append(f"{exc} (names not checked; run {PROG} on the host)")
            continue
        entries += found
        problems += syntax
        notes.append(f"{env_file.name} checked")
        problems += [
            f"{e.where}: {e.name} is not a known name{_did_you_mean(e.name, known)}; "
            ".env.example lists them all"
            for e in found
            if e.name not in known
        ]
    if not env_files:
        notes.append("no .env (compose.yaml's defaults)")

    # What compose interpolates: the env files in order, under the process environment.
    values: dict[str, str] = {}
    where: dict[str, str] = {}
    for e in entries:
        values[e.name], where[e.name] = e.value, e.where
    for name in known & set(environ):
        if values.get(name) != environ[name]:
            values[name], where[name] = environ[name], "environment"

    files = args.file or ([] if args.in_compose else _compose_files(values, environ, project))
    files = files or [project / "compose.yaml"]
    svcs = compose.services([compose.load(f) for f in files])
    declared = compose.profiles(svcs)
    listed = args.profile or values.get("COMPOSE_PROFILES", "").split(",")
    chosen = [p.strip() for p in listed if p.strip()]
    source = "--profile" if args.profile else "COMPOSE_PROFILES"
    for profile in chosen:
        if profile not in declared:
            problems.append(
                f"{source}: compose profile {profile!r} does not exist"
                f"{_did_you_mean(profile, declared)}; the compose files have: "
                + ", ".join(sorted(declared))
            )
    if chosen:
        notes.append("profiles " + ",".join(chosen))

    problems += value_problems(svcs, values, where, project)
    problems += scrape_problems(svcs, values, project)
    if args.in_compose:
        return problems, notes

    # --- the host, and what the services about to start need from it ---
    unknown = [s for s in args.services if s not in svcs]
    problems += [
        f"no service {s!r} in the compose files{_did_you_mean(s, set(svcs))}" for s in unknown
    ]
    starting = list(args.services) or compose.active(svcs, set(chosen))
    starting = [s for s in starting if s in svcs]
    if not args.services and not any(
        s in SERVERS or FLEET_PROFILE in (svcs[s].get("profiles") or []) for s in starting
    ):
        problems.append(
            "no server would start: none of the active profiles runs sglang (gpu) or the "
            "emulator (emulated); set COMPOSE_PROFILES or give --profile"
        )
    problems += _service_needs(svcs, starting, values, project)
    needs_gpu = any(_reserves_gpu(svcs[s]) for s in starting)
    host_problems, host_notes = host_check(needs_gpu)
    return problems + host_problems, notes + host_notes


def _compose_files(
    values: Mapping[str, str], environ: Mapping[str, str], project: Path
) -> list[Path]:
    """COMPOSE_FILE as compose reads it (from the env file or the shell), relative to the
    project dir; an empty list when unset."""
    separator = environ.get("COMPOSE_PATH_SEPARATOR") or values.get("COMPOSE_PATH_SEPARATOR")
    raw = values.get("COMPOSE_FILE", "")
    return [project / f for f in raw.split(separator or os.pathsep) if f.strip()]


def _reserves_gpu(service: dict[str, Any]) -> bool:
    devices = ((service.get("deploy") or {}).get("resources") or {}).get("reservations") or {}
    return bool(devices.get("devices"))


def _service_needs(
    svcs: Mapping[str, dict[str, Any]],
    starting: Sequence[str],
    values: Mapping[str, str],
    project: Path,
) -> list[str]:
    """Host state the starting services rely on: the model directory and Grafana's password."""
    problems = []
    for name in starting:
        svc = svcs[name]
        for volume in svc.get("volumes") or []:
            if isinstance(volume, dict) and volume.get("target") == "/model":
                source = Path(compose.interpolate(volume.get("source", ""), values))
                source = source if source.is_absolute() else project.resolve() / source
                env = compose.interpolate(svcs[name].get("environment") or {}, values)
                said = model_dir(str(source), str(env.get("GLMSERVE_PROFILE") or ""))
                if said:
                    problems.append(f"MODEL_DIR: {said}")
                break
    if "grafana" in starting:
        env = compose.interpolate(svcs["grafana"].get("environment") or {}, values)
        if not env.get("GF_SECURITY_ADMIN_PASSWORD"):
            problems.append(GRAFANA_GUARD)
    # The same model dir is mounted by sglang, launcher and smoke: say it once.
    return list(dict.fromkeys(problems))


def main(
    argv: Sequence[str] | None = None,
    environ: Mapping[str, str] | None = None,
    host_check: Callable[[bool], tuple[list[str], list[str]]] = check_host,
) -> int:
    args = _parser().parse_args(argv)
    try:
        problems, notes = diagnose(args, os.environ if environ is None else environ, host_check)
    except (EnvFileError, compose.ComposeFileError) as exc:
        problems, notes = [str(exc)], []
    for line in problems:
        print(f"{PROG}: {line}", file=sys.stderr)
    if problems:
        return 1
    print(f"{PROG}: ok: " + "; ".join(notes))
    return 0


if __name__ == "__main__":
    sys.exit(main())
