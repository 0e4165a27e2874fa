"""`python -m glmserve.smoke`: start each variant in turn, send the probes, compare, report.

Exit status: 0 every check passed; 1 a check failed (the report says which); 2 bad input or a
busy port (one line, nothing started); 130 interrupted (the report so far is written, marked
incomplete).
"""

from __future__ import annotations

import argparse
import contextlib
import datetime as dt
import json
import os
import shlex
import signal
import socket
import sys
import time
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any, NoReturn

from glmserve import buildinfo, sglang_api
from glmserve.launch.cli import ENV_INPUTS, EXTRA_ARGS_ENV, HOLD_ENV
from glmserve.serverproc import ServerProcess
from glmserve.smoke import probes as P
from glmserve.smoke import verdict
from glmserve.smoke.variants import Variant, VariantError, select
from glmserve.switches import FP8_GATHER, GATHER_OFF

PROG = "glmserve.smoke"
DEFAULT_PORT = 30000


class SmokeError(Exception):
    """Bad input; the message is the one line shown."""


class _Parser(argparse.ArgumentParser):
    def error(self, message: str) -> NoReturn:
        raise SmokeError(f"{message} (see --help)")


def _parser() -> argparse.ArgumentParser:
    p = _Parser(
        prog=f"python -m {PROG}",
        description="Start the server once per variant (BF16 KV, upstream cast, patched gather, "
        "native FP8), send the same greedy prompts, and compare (docs/deploy.md).",
    )
    p.add_argument("--profile", help="launch profile (default $GLMSERVE_PROFILE)")
    p.add_argument("--model-path", help="model dir (default $GLMSERVE_MODEL_PATH or the profile's)")
    p.add_argument("--profiles-dir", help="profiles folder (default as the launcher finds it)")
    p.add_argument("--tp", help="tensor-parallel size (default $GLMSERVE_TP or the profile's)")
    p.add_argument(
        "--port",
        type=int,
        help=f"port the variants listen on (default $GLMSERVE_PORT or {DEFAULT_PORT})",
    )
    p.add_argument(
        "--variants", default="", help="comma-separated subset (the bf16-kv reference always runs)"
    )
    p.add_argument("--out", help="report folder (default smoke-report/<UTC time>)")
    p.add_argument("--server", choices=("launcher", "emulator"), default="launcher",
                   help="launcher: the real server through python -m glmserve.launch; "
                   "emulator: glmserve.emulator (a CPU rehearsal of the procedure)")  # fmt: skip
    p.add_argument("--ready-timeout-s", type=float, default=1800.0,
                   help="per variant: model load plus the first JIT compile (default 30 min)")  # fmt: skip
    p.add_argument("--request-timeout-s", type=float, default=300.0)
    p.add_argument("--stop-grace-s", type=float, default=60.0)
    p.add_argument("--long-tokens", type=int, default=12_000, help="size of the long prompt")
    return p


def _env_or(value: Any, environ: Mapping[str, str], key: str) -> str | None:
    if value not in (None, ""):
        return str(value)
    return environ.get(key) or None


def profile_facts(
    profile_name: str | None, profiles_dir: str | None, environ: Mapping[str, str]
) -> tuple[bool, Path | None]:
    """Whether the profile (plus GLMSERVE_EXTRA_ARGS) decodes on a path its line patched,
    worked out exactly as the launcher does, and the model dir it names by default."""
    from glmserve.launch.cli import parse_extra_env
    from glmserve.launch.errors import LaunchError
    from glmserve.launch.profiles import (
        find_profiles_dir,
        load_profile,
        sglang_versions,
        uses_patched_path,
    )
    from glmserve.launch.sglang_argv import server_args

    if profile_name is None:
        return True, None
    try:
        profile = load_profile(find_profiles_dir(environ, profiles_dir), profile_name)
        extra = parse_extra_env(environ.get(EXTRA_ARGS_ENV))
        versions = sglang_versions(profile)
        args = server_args([*profile.args, *extra], versions)
    except LaunchError as exc:
        raise SmokeError(str(exc)) from None
    return uses_patched_path(args, versions), profile.model.default_path


def port_in_use(port: int) -> bool:
    with socket.socket() as s:
        s.settimeout(1.0)
        return s.connect_ex(("127.0.0.1", port)) == 0


def launcher_command(
    variant: Variant, ns: argparse.Namespace, port: int, build_info: Path
) -> tuple[list[str], dict[str, str]]:
    """The real server: our launcher (so its checks and self-test run), the variant's switches
    in the environment and its SGLang args after '--', which come after GLMSERVE_EXTRA_ARGS."""
    argv = [sys.executable, "-m", "glmserve.launch", "--host", "127.0.0.1", "--port", str(port),
            "--build-info", str(build_info)]  # fmt: skip
    for flag, value in (("--profile", ns.profile), ("--model-path", ns.model_path),
                        ("--profiles-dir", ns.profiles_dir), ("--tp", ns.tp)):  # fmt: skip
        if value:
            argv += [flag, str(value)]
    argv += ["--", *variant.args]
    # A refusing variant must exit (and be reported), not wait as the compose service does.
    env = {**os.environ, **variant.env, HOLD_ENV: "0"}
    return argv, env


def emulator_command(
    variant: Variant, ns: argparse.Namespace, port: int, build_info: Path, patched: bool
) -> tuple[list[str], dict[str, str]]:
    """The CPU rehearsal: the emulator plays each variant's KV dtype and patch state."""
    dtype = variant.kv_cache_dtype
    if dtype == "bfloat16":
        cost = "bf16"
    elif not patched:
        cost = "off"
    else:
        cost = "upstream" if variant.env.get(FP8_GATHER.name) == GATHER_OFF else "patched"
    argv = [sys.executable, "-m", "glmserve.emulator", "--host", "127.0.0.1", "--port", str(port),
            "--tpot-ms", "2", "--ttft-ms", "20", "--health-delay-s", "0",
            "--kv-cache-dtype", dtype, "--cost-model", cost,
            "--attention-backend", "flashinfer" if patched else "nsa",
            "--build-info-file", str(build_info)]  # fmt: skip
    return argv, {**os.environ, **variant.env}


def server_info(url: str, timeout_s: float = 10.0) -> dict[str, Any]:
    import httpx

    for path in sglang_api.SERVER_INFO_PATHS:
        with contextlib.suppress(httpx.HTTPError, ValueError):
            r = httpx.get(url + path, timeout=timeout_s)
            if r.status_code == 200 and isinstance(r.json(), dict):
                info = r.json()
                return {
                    "kv_cache_dtype": info.get("kv_cache_dtype"),
                    "attention_backend": sglang_api.info_attention_backend(info),
                    "sglang_version": sglang_api.info_version(info),
                    "kv_pool_tokens": sglang_api.info_kv_pool_tokens(info),
                }
    return {}


class Run:
    def __init__(self, ns: argparse.Namespace, environ: Mapping[str, str]) -> None:
        self.ns = ns
        self.port = int(ns.port or environ.get(ENV_INPUTS["port"]) or DEFAULT_PORT)
        stamp = dt.datetime.now(dt.timezone.utc).strftime("%Y%m%dT%H%M%SZ")
        self.out = Path(ns.out or Path("smoke-report") / stamp)
        self.patched, default_model = profile_facts(ns.profile, ns.profiles_dir, environ)
        names = [n.strip() for n in ns.variants.split(",") if n.strip()]
        try:
            self.variants = select(self.patched, names)
        except VariantError as exc:
            raise SmokeError(str(exc)) from None
        if ns.long_tokens < 1000:
            raise SmokeError("--long-tokens must be at least 1000 (the point is a long prompt)")
        self.probes = P.build(ns.long_tokens)
        self.results: dict[str, dict[str, Any]] = {}
        self.meta: dict[str, Any] = {
            "date": dt.datetime.now(dt.timezone.utc).strftime("%Y-%m-%d %H:%M UTC"),
            "command": shlex.join(["python", "-m", PROG, *sys.argv[1:]]),
            "profile": ns.profile,
            # ns.model_path already took GLMSERVE_MODEL_PATH; else the launcher uses the profile's.
            "model_path": ns.model_path or (str(default_model) if default_model else None),
            "server": ns.server,
            "decode_path": "patched flashinfer" if self.patched else "not the patched path",
            "port": self.port,
            "complete": False,
        }

    def save(self) -> list[verdict.Check]:
        checks = verdict.evaluate(self.variants, self.probes, self.results)
        self.out.mkdir(parents=True, exist_ok=True)
        data = {
            "meta": self.meta,
            "variants": [_variant_row(v) for v in self.variants],
            "probes": P.describe(self.probes),
            "results": self.results,
            "checks": [c.__dict__ for c in checks],
            "agreement": verdict.agreement(self.variants, self.probes, self.results),
        }
        (self.out / "smoke.json").write_text(json.dumps(data, indent=1) + "\n")
        md = verdict.render_markdown(self.meta, self.variants, self.probes, self.results, checks)
        if not self.meta["complete"]:
            md = md.replace("# Smoke test:", "# Smoke test (INCOMPLETE: interrupted):", 1)
        (self.out / "smoke.md").write_text(md)
        return checks

    def run_variant(self, v: Variant) -> None:
        import httpx

        build_info = self.out / "buildinfo" / f"{v.name}.json"
        if self.ns.server == "emulator":
            argv, env = emulator_command(v, self.ns, self.port, build_info, self.patched)
        else:
            argv, env = launcher_command(v, self.ns, self.port, build_info)
        url = f"http://127.0.0.1:{self.port}"
        r: dict[str, Any] = {"argv": shlex.join(argv), "env": dict(v.env), "probes": {}}
        self.results[v.name] = r
        srv = ServerProcess(argv, env, self.out / "logs" / f"{v.name}.log", url)
        say(f"{v.name}: starting ({v.what})")
        srv.start()
        try:
            if not srv.wait_ready(self.ns.ready_timeout_s):
                r["error"] = srv.error or "not ready"
                say(f"{v.name}: FAILED to start: {r['error'][:300]}")
                return
            r["ready_s"] = srv.ready_s
            r["server"] = server_info(url)
            with contextlib.suppress(OSError, ValueError):
                r["build_info"] = buildinfo.read_build_info(build_info)
            say(f"{v.name}: ready after {srv.ready_s:.0f} s ({r['server']})")
            with httpx.Client(timeout=httpx.Timeout(self.ns.request_timeout_s)) as client:
                for probe in self.probes:
                    res = P.run(url, probe, client, self.ns.request_timeout_s)
                    r["probes"][probe.id] = res
                    status = res.get("error") or (
                        f"{res['output_tokens']} tokens, prompt {res['prompt_tokens']}, "
                        f"cached {res['cached_tokens']}, answer "
                        f"{ {True: 'ok', False: 'MISSED', None: '-'}[res['answered']] }"
                    )
                    say(f"{v.name}/{probe.id}: {status}")
        finally:
            srv.stop(self.ns.stop_grace_s)
            self.save()

    def execute(self) -> int:
        if port_in_use(self.port):
            raise SmokeError(
                f"something already listens on 127.0.0.1:{self.port} (the sglang service? it "
                "holds the GPUs: docker compose stop sglang, or pick --port)"
            )
        say(f"{len(self.variants)} variants ({', '.join(v.name for v in self.variants)}), "
            f"{len(self.probes)} probes each; report in {self.out}")  # fmt: skip
        for v in self.variants:
            self.run_variant(v)
        self.meta["complete"] = True
        checks = self.save()
        for c in checks:
            say(f"check {c.name}: {'ok' if c.ok else 'FAIL'}: {c.detail}")
        ok = all(c.ok for c in checks)
        say(f"{'PASS' if ok else 'FAIL'}: report {self.out / 'smoke.md'}")
        return 0 if ok else 1


def _variant_row(v: Variant) -> dict[str, Any]:
    return {
        "name": v.name,
        "what": v.what,
        "env": dict(v.env),
        "args": list(v.args),
        "identical_to": v.identical_to,
    }


def say(msg: str) -> None:
    print(f"[{PROG} {time.strftime('%H:%M:%S')}] {msg}", flush=True)


def main(argv: Sequence[str] | None = None) -> int:
    environ = os.environ
    try:
        ns = _parser().parse_args(sys.argv[1:] if argv is None else argv)
        ns.profile = _env_or(ns.profile, environ, ENV_INPUTS["profile"])
        ns.model_path = _env_or(ns.model_path, environ, ENV_INPUTS["model_path"])
        ns.profiles_dir = _env_or(ns.profiles_dir, environ, ENV_INPUTS["profiles_dir"])
        ns.tp = _env_or(ns.tp, environ, ENV_INPUTS["tp"])
        if ns.server == "launcher" and not ns.profile:
            raise SmokeError("no profile given (--profile or GLMSERVE_PROFILE)")
        run = Run(ns, environ)
    except SmokeError as exc:
        print(f"{PROG}: error: {exc}", file=sys.stderr)
        return 2

    def on_term(signum: int, _frame: Any) -> None:
        raise KeyboardInterrupt(f"signal {signum}")

    signal.signal(signal.SIGTERM, on_term)
    try:
        return run.execute()
    except SmokeError as exc:
        print(f"{PROG}: error: {exc}", file=sys.stderr)
        return 2
    except KeyboardInterrupt:
        run.save()
        print(f"{PROG}: interrupted; partial report in {run.out / 'smoke.md'}", file=sys.stderr)
        return 130
