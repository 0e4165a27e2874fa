"""`python -m glmserve.launch`: profile + inputs -> validated argv list -> exec SGLang.

Order of work: parse inputs, validate everything (nothing has started yet, so any refusal is one
line and a non-zero exit), then run the kernel self-test, write the build-info file, and replace
this process with `python -m sglang.launch_server` (exec: SGLang keeps our PID, so `docker stop`'s
SIGTERM and Ctrl-C reach it directly and there is no wrapper left to forward or swallow signals).
"""

from __future__ import annotations

import argparse
import json
import sys
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any, NoReturn

from glmserve import buildinfo, switches
from glmserve.launch import checks, fit, sglang_argv, speculative
from glmserve.launch.errors import LaunchError
from glmserve.launch.host import Host
from glmserve.launch.profiles import (
    LAUNCHER_OWNED_FLAGS,
    PROFILES_DIR_ENV,
    Profile,
    available,
    decode_attention_backend,
    find_profiles_dir,
    load_profile,
    sglang_versions,
    uses_patched_path,
)
from glmserve.netaddr import host_problem

PROG = "glmserve.launch"
NOT_HERE = "not installed here (checked when the server image starts)"
DEFAULT_HOST = "127.0.0.1"
DEFAULT_PORT = 30000
EXTRA_ARGS_ENV = "GLMSERVE_EXTRA_ARGS"
# Under compose the model is mounted at a container path; this names the host folder behind it
# (MODEL_DIR), so that the plan and a refusal say the path the user set, not only /model.
MODEL_HOST_ENV = "GLMSERVE_MODEL_HOST_PATH"

# Input name -> environment variable. The CLI wins over the environment, which wins over the
# profile; docs/launch.md lists the same table.
ENV_INPUTS = {
    "profile": "GLMSERVE_PROFILE",
    "model_path": "GLMSERVE_MODEL_PATH",
    "tp": "GLMSERVE_TP",
    "nnodes": "GLMSERVE_NNODES",
    "node_rank": "GLMSERVE_NODE_RANK",
    "dist_init_addr": "GLMSERVE_DIST_INIT_ADDR",
    "host": "GLMSERVE_HOST",
    "port": "GLMSERVE_PORT",
    "profiles_dir": PROFILES_DIR_ENV,
    "allow_any_arch": "GLMSERVE_ALLOW_ANY_ARCH",
    "skip_selftest": "GLMSERVE_SKIP_SELFTEST",
    "build_info": buildinfo.ENV_VAR,
}


class _Parser(argparse.ArgumentParser):
    def error(self, message: str) -> NoReturn:
        # argparse prints usage plus the error; we promise one line.
        raise LaunchError(f"{message} (see --help)")


def _parser() -> argparse.ArgumentParser:
    p = _Parser(
        prog=f"python -m {PROG}",
        description="Validate a launch profile against this host, then exec SGLang.",
        epilog="Arguments after a lone '--' go to sglang.launch_server unchanged, as a list; "
        f"{EXTRA_ARGS_ENV} may hold a JSON array of more (placed before them).",
    )
    p.add_argument("--profile", help="profile name (a file in the profiles dir, without .json)")
    p.add_argument("--model-path", help="local model directory (default: the profile's, if any)")
    p.add_argument("--tp", help="tensor-parallel size (default: the profile's)")
    p.add_argument("--nnodes", help="nodes one server spans (default: the profile's)")
    p.add_argument("--node-rank", help="this node's rank, 0 = the one serving HTTP (multi-node)")
    p.add_argument(
        "--dist-init-addr", help="HOST:PORT of rank 0 for torch.distributed (multi-node)"
    )
    p.add_argument("--host", help=f"bind address (default {DEFAULT_HOST})")
    p.add_argument("--port", help=f"HTTP port (default {DEFAULT_PORT})")
    p.add_argument("--profiles-dir", help="folder holding the *.json profiles")
    p.add_argument(
        "--build-info", help="build-info file to write (default from glmserve.buildinfo)"
    )
    p.add_argument(
        "--allow-any-arch",
        action="store_true",
        default=None,
        help="skip the compute-capability check",
    )
    p.add_argument(
        "--skip-selftest",
        action="store_true",
        default=None,
        help="serve even if the kernel self-test fails",
    )
    mode = p.add_mutually_exclusive_group()
    mode.add_argument(
        "--dry-run",
        action="store_true",
        help="print the argv (JSON) and environment; GPUs not probed; start nothing",
    )
    mode.add_argument(
        "--check",
        action="store_true",
        help="like --dry-run, but also check the GPUs; start nothing",
    )
    mode.add_argument("--list-profiles", action="store_true", help="list profiles and exit")
    return p


@dataclass(frozen=True)
class Inputs:
    profile: str
    model_path: Path
    tp: int
    nnodes: int
    node_rank: int | None
    dist_init_addr: str | None
    host: str
    port: int
    extra_args: tuple[str, ...]
    allow_any_arch: bool
    skip_selftest: bool
    build_info: Path


@dataclass(frozen=True)
class Plan:
    profile: Profile
    inputs: Inputs
    argv: list[str]
    env: dict[str, str]  # the full environment SGLang is started with
    managed: dict[str, str]  # the profile's variables, final values
    sources: dict[str, str]  # for each managed variable: "profile" or "environment"
    model_config: dict[str, Any]


def split_passthrough(argv: Sequence[str]) -> tuple[list[str], list[str]]:
    """Split at the first lone '--': launcher options before it, SGLang's args after it."""
    argv = list(argv)
    if "--" in argv:
        cut = argv.index("--")
        return argv[:cut], argv[cut + 1 :]
    return argv, []


def parse_extra_env(raw: str | None) -> list[str]:
    if raw is None or not raw.strip():
        return []
    try:
        value = json.loads(raw)
    except json.JSONDecodeError as exc:
        raise LaunchError(
            f"{EXTRA_ARGS_ENV} must be a JSON array of strings, e.g. "
            f'["--mem-fraction-static", "0.8"] ({exc.msg} at column {exc.colno})'
        ) from None
    if not isinstance(value, list):
        raise LaunchError(
            f"{EXTRA_ARGS_ENV} must be a JSON array of strings, not {type(value).__name__}"
        )
    for i, item in enumerate(value):
        if not isinstance(item, str):
            raise LaunchError(
                f"{EXTRA_ARGS_ENV} entry {i} is {json.dumps(item)}, not a string "
                "(every argv entry must be quoted, numbers too)"
            )
    return value


def _pick(cli: Any, environ: Mapping[str, str], key: str) -> str | None:
    if cli is not None:
        return str(cli)
    value = environ.get(ENV_INPUTS[key])
    return value if value not in (None, "") else None


def _int(name: str, raw: str, low: int, high: int) -> int:
    try:
        value = int(raw)
    except ValueError:
        raise LaunchError(f"{name} must be an integer, not {raw!r}") from None
    if not low <= value <= high:
        raise LaunchError(f"{name} must be between {low} and {high}, not {value}")
    return value


def resolve_inputs(
    ns: argparse.Namespace, extra_cli: Sequence[str], profile: Profile, environ: Mapping[str, str]
) -> Inputs:
    model_raw = _pick(ns.model_path, environ, "model_path")
    if model_raw is not None:
        model_path = Path(model_raw).expanduser().resolve()
    elif profile.model.default_path is not None:
        model_path = profile.model.default_path
    else:
        raise LaunchError(
            f"profile '{profile.name}' has no default model: give --model-path or "
            f"{ENV_INPUTS['model_path']}"
        )
    tp_raw = _pick(ns.tp, environ, "tp")
    tp = _int("TP", tp_raw, 1, 1024) if tp_raw is not None else profile.tp
    nnodes, node_rank, dist_init_addr = _resolve_nodes(ns, environ, profile, tp)
    host = _pick(ns.host, environ, "host") or DEFAULT_HOST
    host_said = host_problem(host)
    if host_said:
        raise LaunchError(f"host {host!r} {host_said} (--host or {ENV_INPUTS['host']})")
    port_raw = _pick(ns.port, environ, "port")
    port = _int("port", port_raw, 1, 65535) if port_raw is not None else DEFAULT_PORT
    extra = [*parse_extra_env(environ.get(EXTRA_ARGS_ENV)), *extra_cli]
    # At once, with no SGLang needed (the doctor checks .env through this function): the stored
    # parser of the profile's line. run() asks the installed SGLang's own parser as well.
    check_sglang_args(stored_parser(profile), [], extra, profile)
    allow_any = ns.allow_any_arch or checks.parse_bool(
        ENV_INPUTS["allow_any_arch"], environ.get(ENV_INPUTS["allow_any_arch"])
    )
    skip_selftest = ns.skip_selftest or checks.parse_bool(
        ENV_INPUTS["skip_selftest"], environ.get(ENV_INPUTS["skip_selftest"])
    )
    build_info = Path(_pick(ns.build_info, environ, "build_info") or buildinfo.DEFAULT_PATH)
    return Inputs(
        profile=profile.name,
        model_path=model_path,
        tp=tp,
        nnodes=nnodes,
        node_rank=node_rank,
        dist_init_addr=dist_init_addr,
        host=host,
        port=port,
        extra_args=tuple(extra),
        allow_any_arch=bool(allow_any),
        skip_selftest=bool(skip_selftest),
        build_info=build_info,
    )


@dataclass(frozen=True)
class SglangParser:
    """SGLang's parser for this launch, and whose it is (named in each refusal)."""

    parser: argparse.ArgumentParser
    whose: str


def stored_parser(profile: Profile) -> SglangParser | None:
    """The stored parser of the profile's SGLang line (glmserve.launch.argspec), or None for a
    profile pinned to a line with none stored."""
    found = sglang_argv.line_parser(sglang_versions(profile))
    if found is None:
        return None
    version, parser = found
    return SglangParser(parser, f"SGLang {version}'s own parser, stored from its server_args.py")


def check_sglang_args(
    sglang: SglangParser | None, profile_args: Sequence[str], extra: Sequence[str], profile: Profile
) -> None:
    """Refuse, one line each, a profile or extra arg that SGLang would read as one of the
    launcher's own flags, and every flag or value SGLang's parser refuses (or its server would
    fail on: glmserve.launch.sglang_argv.check_args). Without a parser, every prefix of an
    owned flag (a superset of what the parser resolves to one; tests/launch checks no more)."""
    parser = sglang.parser if sglang is not None else None
    where = f"profile '{profile.name}' arg"
    sglang_argv.check_not_owned(parser, profile_args, LAUNCHER_OWNED_FLAGS, where)
    sglang_argv.check_not_owned(parser, extra, LAUNCHER_OWNED_FLAGS, "extra SGLang arg")
    if sglang is not None:
        where = f"profile '{profile.name}' args"
        sglang_argv.check_args(sglang.parser, profile_args, where, sglang.whose)
        sglang_argv.check_args(sglang.parser, extra, "extra SGLang args", sglang.whose)


def _resolve_nodes(
    ns: argparse.Namespace, environ: Mapping[str, str], profile: Profile, tp: int
) -> tuple[int, int | None, str | None]:
    """(nnodes, node rank, rank-0 address); multi-node needs both of the latter, and TP must
    split evenly over the nodes (SGLang asserts tp % nnodes == 0 only after loading starts)."""
    raw = _pick(ns.nnodes, environ, "nnodes")
    nnodes = _int("nnodes", raw, 1, 1024) if raw is not None else profile.nodes
    rank_raw = _pick(ns.node_rank, environ, "node_rank")
    addr = _pick(ns.dist_init_addr, environ, "dist_init_addr")
    if nnodes == 1:
        if rank_raw is not None or addr is not None:
            raise LaunchError(
                "--node-rank and --dist-init-addr are for a server that spans several nodes; "
                f"profile '{profile.name}' runs on one (set --nnodes to use more)"
            )
        return 1, None, None
    if tp % nnodes:
        raise LaunchError(f"TP {tp} does not split evenly over {nnodes} nodes")
    if rank_raw is None:
        raise LaunchError(
            f"a server over {nnodes} nodes needs this node's rank: --node-rank (or "
            f"{ENV_INPUTS['node_rank']}) 0 on the node that serves HTTP, 1..{nnodes - 1} on the others"
        )
    rank = _int("node rank", rank_raw, 0, nnodes - 1)
    if addr is None:
        raise LaunchError(
            f"a server over {nnodes} nodes needs rank 0's address: --dist-init-addr HOST:PORT "
            f"(or {ENV_INPUTS['dist_init_addr']}), the same on every node"
        )
    host, _, port = addr.rpartition(":")
    if not host or not port.isdigit() or not 1 <= int(port) <= 65535:
        raise LaunchError(f"--dist-init-addr must be HOST:PORT, not {addr!r}")
    return nnodes, rank, addr


def build_plan(
    profile: Profile,
    inputs: Inputs,
    environ: Mapping[str, str],
    python: str,
    model_config: dict[str, Any] | None = None,
) -> Plan:
    nodes = []
    if inputs.nnodes > 1:
        nodes = ["--nnodes", str(inputs.nnodes), "--node-rank", str(inputs.node_rank)]
        nodes += ["--dist-init-addr", str(inputs.dist_init_addr)]
    argv = [
        python,
        "-m",
        "sglang.launch_server",
        "--model-path",
        str(inputs.model_path),
        "--tp-size",
        str(inputs.tp),
        "--host",
        inputs.host,
        "--port",
        str(inputs.port),
        *nodes,
        *profile.args,
        # Last, so that for SGLang's store-type options the user's value wins (argparse keeps the
        # last occurrence); store_true flags cannot be undone this way, see docs/launch.md.
        *inputs.extra_args,
    ]
    managed: dict[str, str] = {}
    sources: dict[str, str] = {}
    for key, value in profile.env.items():
        # The process environment wins, so compose/.env can override a profile value; --dry-run
        # shows which one applied.
        if environ.get(key, "") != "":
            managed[key], sources[key] = environ[key], "environment"
        else:
            managed[key], sources[key] = value, "profile"
    env = dict(environ)
    env.update(managed)
    return Plan(profile, inputs, argv, env, managed, sources, dict(model_config or {}))


def _fit(ready: Validated, gpus: Sequence[Any] | None) -> fit.Fit | None:
    """The fit check for a profile that names its GPU memory, with the probed memory when the
    GPUs were probed and report it, else the profile's nominal value. Refuses when it fails."""
    plan = ready.plan
    profile, inputs = plan.profile, plan.inputs
    if profile.gpu_memory_gib is None:
        return None
    used = list(gpus or [])[: inputs.tp // inputs.nnodes]
    probed = [g.memory_mib for g in used if g.memory_mib]
    if probed and len(probed) == len(used):
        memory, where = min(probed) * fit.MIB, f"the GPUs here ({min(probed) / 1024:.1f} GiB each)"
    else:
        memory = int(profile.gpu_memory_gib * fit.GIB)
        where = f"{inputs.tp} GPUs of {profile.gpu_memory_gib:g} GiB (the profile's target)"
    result = fit.compute_fit(
        plan.model_config,
        quant_algo=profile.model.quant_algo,
        tp=inputs.tp,
        gpu_memory=memory,
        args=ready.args,
    )
    fit.check_fit(result, profile.name, where)
    return result


def on_the_host(message: str, model_path: Path, environ: Mapping[str, str]) -> str:
    """`message` with the model's container path followed by the host folder mounted there."""
    host_path = environ.get(MODEL_HOST_ENV, "").strip()
    if not host_path or host_path == str(model_path):
        return message
    return message.replace(str(model_path), f"{model_path} (MODEL_DIR={host_path} on the host)", 1)


def _report(ready: Validated, gpus: str, fitted: fit.Fit | None) -> dict[str, Any]:
    plan = ready.plan
    spec = speculative.from_args(ready.args)
    return {
        "profile": plan.profile.name,
        "profile_file": str(plan.profile.path),
        "model_path": str(plan.inputs.model_path),
        # Under compose: the host folder mounted at model_path (MODEL_DIR); else model_path.
        "model_path_on_host": plan.env.get(MODEL_HOST_ENV) or str(plan.inputs.model_path),
        "tp": plan.inputs.tp,
        "nnodes": plan.inputs.nnodes,
        "fit": None if fitted is None else fitted.as_dict(),
        # MTP as SGLang will run it (None: no speculative decoding asked).
        "speculative": None if spec is None else spec.as_dict(),
        "argv": ready.shown,  # secret values redacted
        # Only the variables the profile manages (plus the patch switch): the full environment
        # may hold tokens and must not be echoed into CI logs.
        "env": plan.managed,
        "env_sources": plan.sources,
        "sglang": ready.sglang_info,
        "gpus": gpus,
        "warnings": ready.warnings,
    }


@dataclass(frozen=True)
class Fp8Switches:
    """The FP8 switches as the deployment set them, parsed once (glmserve.switches)."""

    gather: str  # "on" or "off" for the build info
    request: str  # native or gather (pinned), or auto


@dataclass(frozen=True)
class Validated:
    """Everything the checks established before anything started, for the steps after."""

    plan: Plan
    backend: str | None  # the decode attention backend the argv selects
    patched_path: bool  # whether that backend runs the patched file
    site: Path | None
    version: str | None
    marker: dict[str, Any] | None
    fp8: Fp8Switches
    sglang_info: dict[str, Any]
    warnings: list[str]
    shown: list[str]  # the argv as printed (secret values redacted)
    args: sglang_argv.ServerArgs  # the SGLang argv as SGLang's parser reads it


@dataclass(frozen=True)
class Fp8Decode:
    """The FP8 decode path SGLang serves with, why, and both paths' timing where measured."""

    path: str
    why: str
    timing: dict[str, Any]


def run(argv: Sequence[str], host: Host, out: Any = None, err: Any = None) -> int:
    out = out or sys.stdout
    err = err or sys.stderr
    own, extra_cli = split_passthrough(argv)
    ns = _parser().parse_args(own)
    environ = host.environ
    profiles_dir = find_profiles_dir(environ, _pick(ns.profiles_dir, environ, "profiles_dir"))
    if ns.list_profiles:
        for name in available(profiles_dir):
            print(f"{name}\t{load_profile(profiles_dir, name).description}", file=out)
        return 0
    profile = load_profile(profiles_dir, _profile_name(ns, environ, profiles_dir))
    inputs = resolve_inputs(ns, extra_cli, profile, environ)

    # --- validation: nothing has started yet ---
    ready = validate(profile, inputs, host, dry_run=ns.dry_run)
    if ns.dry_run:
        _print_json(_report(ready, "not probed (--dry-run)", _fit(ready, None)), out)
        return 0
    gpu_line, fitted, fp8_gather = check_host(ready, host, err)
    if ns.check:
        _print_json(_report(ready, gpu_line, fitted), out)
        return 0
    checks.check_build_info_target(inputs.build_info)

    # --- start sequence ---
    for warning in ready.warnings:
        print(f"{PROG}: warning: {warning}", file=err)
    env, decode = self_test(ready, fp8_gather, host, err)
    write_build_info(ready, fp8_gather, decode)
    print(f"{PROG}: profile {profile.name} on {gpu_line}; exec {json.dumps(ready.shown)}", file=err)
    out.flush()
    err.flush()
    host.execvpe(ready.plan.argv[0], ready.plan.argv, env)
    return 0  # only reached when execvpe is a test double


def _print_json(report: dict[str, Any], out: Any) -> None:
    json.dump(report, out, indent=2)
    out.write("\n")


def _profile_name(ns: argparse.Namespace, environ: Mapping[str, str], profiles_dir: Path) -> str:
    name = _pick(ns.profile, environ, "profile")
    if name is None:
        listing = ", ".join(available(profiles_dir)) or "(none)"
        raise LaunchError(f"no profile given (--profile or GLMSERVE_PROFILE); available: {listing}")
    return name


def fp8_switches(env: Mapping[str, str]) -> Fp8Switches:
    """Both FP8 switches, validated on every path (compose always passes them)."""
    return Fp8Switches(checks.fp8_gather_state(env), checks.fp8_attention_request(env))


def validate(profile: Profile, inputs: Inputs, host: Host, dry_run: bool) -> Validated:
    """The model, SGLang and its patch, the argv, the switches and the cache dir, in the order
    the refusals are most useful; nothing starts."""
    environ = host.environ
    versions = sglang_versions(profile)
    # The model first. What the argv asks of it (MTP's NextN layer) is read by the stored
    # parser of the profile's line: the installed SGLang, checked below, must be that line.
    asked = sglang_argv.server_args([*profile.args, *inputs.extra_args], versions)
    try:
        model_config = checks.check_model(profile, inputs.model_path, asked)
    except LaunchError as exc:
        raise LaunchError(on_the_host(str(exc), inputs.model_path, environ)) from None
    plan = build_plan(profile, inputs, environ, sys.executable, model_config)
    site = host.sglang_site()
    # compose's launcher service dry-runs in the tools image, so that seeing the command needs
    # no SGLang base image: the plan is the same, and SGLang itself is checked where it runs.
    without_sglang = site is None and dry_run
    version = host.detect_version(site) if site is not None else None
    half = host.interrupted_patch(site) if site is not None else None
    if half is not None:
        raise LaunchError(half)  # files may be mid-swap: no profile may run on them
    marker = host.read_marker(site) if site is not None and version is not None else None
    if not without_sglang:
        # SGLang and its version first: the parser below is the installed one's.
        checks.check_sglang(profile, site, version, marker, require_patch=False)
    # Asked of SGLang's own parser: `--hos` or `--tp-s=64` would override the launcher's checks,
    # and a value SGLang refuses would be found minutes into start-up. The installed SGLang's;
    # without SGLang (the tools image's dry run), the stored one of the profile's line.
    if site is not None:
        sglang = SglangParser(host.sglang_parser(site), f"the installed SGLang {version}'s parser")
    else:
        sglang = stored_parser(profile)
    check_sglang_args(sglang, profile.args, inputs.extra_args, profile)
    # Every flag value the launcher acts on, read as SGLang will read it.
    args = sglang_argv.ServerArgs.parse(sglang.parser, plan.argv[3:]) if sglang else (
        sglang_argv.server_args(plan.argv[3:], versions)
    )  # fmt: skip
    backend = decode_attention_backend(args)
    patched_path = uses_patched_path(args, versions)
    checks.check_patched_geometry(model_config, patched_path)
    if not without_sglang and patched_path:
        checks.check_sglang(profile, site, version, marker, require_patch=True)
    parser = sglang.parser if sglang is not None else None
    if patched_path and site is not None:
        problems = host.preflight(site)
        if problems:
            more = f" (and {len(problems) - 1} more)" if len(problems) > 1 else ""
            raise LaunchError(f"patched SGLang in {site} fails the preflight: {problems[0]}{more}")
    fp8 = fp8_switches(plan.env)
    checks.check_writable_dir(checks.flashinfer_cache_dir(plan.env), "FlashInfer JIT cache dir")
    sglang_info = {
        "version": NOT_HERE if without_sglang else str(version),
        "site": NOT_HERE if without_sglang else str(site),
        "patch_series": str((marker or {}).get("series", "")),
        "attention_backend": backend or "(SGLang's choice)",
        "patch_in_use": patched_path,
        # Recorded only where it means something.
        "fp8_gather": fp8.gather if patched_path else "n/a",
    }
    warnings = [w for w in [checks.cuda_graph_warning(args)] if w]
    if without_sglang:
        warnings.append(
            f"no SGLang in this image: its version ({' or '.join(versions)} "
            "expected) and the patch are checked when the server image starts"
        )
    shown = sglang_argv.redact(parser, plan.argv)  # what is printed; SGLang gets plan.argv
    return Validated(
        plan, backend, patched_path, site, version, marker, fp8, sglang_info, warnings, shown, args
    )


def check_host(ready: Validated, host: Host, err: Any) -> tuple[str, fit.Fit | None, str]:
    """The driver, the GPUs and the fit: (the GPUs as one line, the fit, the FP8 gather state
    that will really run: "" where the patch does not, "off" on GPUs it cannot run on)."""
    plan, inputs = ready.plan, ready.plan.inputs
    # The driver first: with one too old for the image's CUDA, torch reports no GPUs at all.
    checks.check_driver(host.driver_version(), host.cuda_version(host.environ))
    gpus = host.gpus(host.environ)
    checks.check_gpus(plan.profile, inputs.tp, gpus, inputs.allow_any_arch, inputs.nnodes)
    local = gpus[: inputs.tp // inputs.nnodes]
    gpu_line = ", ".join(f"{g.index}:{g.name} (sm {g.capability_str})" for g in local)
    fitted = _fit(ready, gpus)
    fp8_gather = ready.fp8.gather if ready.patched_path else ""
    # The patched SGLang turns the gather off by itself on such GPUs: say so, record what runs.
    unsupported = checks.fp8_gather_unsupported(local) if fp8_gather == "on" else None
    if unsupported is not None:
        print(f"{PROG}: {unsupported}", file=err)
        fp8_gather = ready.sglang_info["fp8_gather"] = "off"
    return gpu_line, fitted, fp8_gather


def self_test(
    ready: Validated, fp8_gather: str, host: Host, err: Any
) -> tuple[dict[str, str], Fp8Decode]:
    """Run the kernel self-test where the patched path serves; refuse on a failure (unless
    overridden). Returns SGLang's environment, with the decode path it serves, and that path."""
    plan, request = ready.plan, ready.fp8.request
    # Until the self-test decides, the default: the pinned path, else native.
    path = request if request in switches.FP8_PATHS else switches.NATIVE
    why = f"pinned by {switches.FP8_ATTENTION.name}={request}" if request == path else ""
    decode = Fp8Decode(path, why or "default (not timed)", {})
    # FlashAttention's MLA path (patched from 0.5.17 on) always gathers through its page table;
    # the native kernel, and the choice between the two, belong to the flashinfer backend.
    one_path = ready.backend == "fa3"
    if one_path:
        decode = Fp8Decode(switches.GATHER, "fa3 MLA path: gather-then-cast of its pages", {})
    env = {**plan.env, **switches.FP8_ATTENTION.setting(decode.path)}
    if not ready.patched_path:
        print(
            f"{PROG}: self-test not run: attention backend {ready.backend or '(SGLang default)'} "
            "does not use a patched MLA path",
            file=err,
        )
        return env, decode
    if plan.inputs.skip_selftest:
        print(f"{PROG}: self-test skipped by override", file=err)
        return env, decode
    # The shape the self-test times both decode paths at: this model's heads per rank and
    # this server's decode batches (pathtiming); the server ignores these variables.
    env.update(checks.decode_timing_env(ready.args, plan.model_config, plan.inputs.tp))
    status, detail, native, timing = host.run_selftest(env)
    if status not in ("passed", "skipped"):
        raise LaunchError(
            f"kernel self-test {status}: {detail}; refusing to serve "
            "(override: --skip-selftest or GLMSERVE_SKIP_SELFTEST=1)"
        )
    print(f"{PROG}: self-test {status}: {detail}", file=err)
    if native:
        print(f"{PROG}: native FP8 decode self-test {native}", file=err)
    if fp8_gather == "on" and (native or timing) and not one_path:
        chosen, why = checks.choose_fp8_attention(request, native, timing)
        if native.startswith("failed"):
            # The gather path has just been proven bit-identical; serve on it, not refuse.
            print(f"{PROG}: serving with {switches.FP8_ATTENTION.name}=gather instead", file=err)
        else:
            print(f"{PROG}: FP8 decode path {chosen}: {why}", file=err)
        decode = Fp8Decode(chosen, why, timing)
        env.update(switches.FP8_ATTENTION.setting(chosen))
    return env, decode


def write_build_info(ready: Validated, fp8_gather: str, decode: Fp8Decode) -> None:
    target = ready.plan.inputs.build_info
    buildinfo.clear_launch_error(target)  # a previous refusal no longer holds
    patch_runs = fp8_gather == "on"
    buildinfo.write_build_info(
        target,
        {
            "sglang_version": str(ready.version),
            # What is installed, even where this profile's path does not run it; the
            # attention backend (and fp8_gather left empty) says whether it does.
            "patch_series": str((ready.marker or {}).get("series", "")),
            "patch_lock_sha256": str((ready.marker or {}).get("lock_sha256", "")),
            "fp8_gather": fp8_gather,
            # The decode path the patched backend takes (empty where the patch does not run),
            # what was asked of it (native, gather, or auto: the faster here), why it runs,
            # and both paths' µs per layer where the self-test timed them.
            "fp8_attention": decode.path if patch_runs else "",
            "fp8_attention_requested": ready.fp8.request if patch_runs else "",
            "fp8_attention_why": decode.why if patch_runs else "",
            "fp8_attention_timing": decode.timing if patch_runs else {},
            "attention_backend": ready.backend,
            # Whether this profile's decode runs a file the line's series patched.
            "patch_in_use": "yes" if ready.patched_path else "no",
            # What was asked of speculative decoding (MTP), for the acceptance alert.
            **speculative_fields(ready.args),
            "source": "launcher",
        },
    )


def speculative_fields(args: sglang_argv.ServerArgs) -> dict[str, str]:
    """The build-info fields of speculative decoding ("" where the argv asks for none)."""
    spec = speculative.from_args(args)
    tokens = spec.tokens_per_verify if spec is not None else None
    return {
        "speculative_algorithm": spec.algorithm if spec is not None else "",
        "speculative_num_draft_tokens": "" if tokens is None else str(tokens),
    }


HOLD_ENV = "GLMSERVE_HOLD_ON_ERROR"


def main(argv: Sequence[str] | None = None, host: Host | None = None) -> int:
    host = host or Host()
    try:
        return run(sys.argv[1:] if argv is None else argv, host)
    except LaunchError as exc:
        print(f"{PROG}: error: {exc}", file=sys.stderr, flush=True)
        if hold_requested(host.environ, sys.argv[1:] if argv is None else argv):
            hold(host, str(exc))
        return 2


# One-off commands answer and exit even under compose (`docker compose run --rm sglang --check`).
ONE_OFF = ("--dry-run", "--check", "--list-profiles", "-h", "--help")


def hold_requested(environ: Mapping[str, str], argv: Sequence[str]) -> bool:
    own, _ = split_passthrough(argv)
    if any(a in ONE_OFF for a in own):
        return False
    return environ.get(HOLD_ENV, "").strip().lower() in ("1", "true", "yes", "on")


def hold(host: Host, message: str) -> None:
    """Compose restarts a container that exits; a refusal would then repeat every few seconds
    and show only as "restarting". Instead: record the one line beside the build info (the
    exporter shows it: glmserve_launch_refused, the dashboard's status panel, an alert) and
    wait for docker stop. Fixing .env and `docker compose up -d` replaces the container."""
    target = _pick(None, host.environ, "build_info") or buildinfo.DEFAULT_PATH
    try:
        buildinfo.write_launch_error(target, message, host.clock())
    except OSError as exc:  # the refusal itself may be an unwritable build-info dir
        print(f"{PROG}: (could not record the refusal in {target}: {exc})", file=sys.stderr)
    print(
        f"{PROG}: waiting, not restarting: fix the setting and run `docker compose up -d` "
        f"({HOLD_ENV}=1)",
        file=sys.stderr,
        flush=True,
    )
    host.wait_for_stop()
