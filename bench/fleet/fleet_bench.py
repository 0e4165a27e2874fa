#!/usr/bin/env python3
"""Two SGLang replicas behind SGLang's router, driven by our Locust suite through the router.

    bash bench/device_run.sh fleet                                    # on the H200 (one call)
    python bench/fleet/fleet_bench.py --mode emulator --out DIR --quick   # CPU dry run
    python bench/fleet/fleet_bench.py --mode device --out DIR --render fleet.json   # redraw fleet.md

Device mode starts two real SGLang servers (the pinned line) on the one GPU through our launcher
(tiny-mla profile, each with its own pinned KV pool and --mem-fraction-static, so they split the
memory), and the pinned router (smg) binary in front. Every phase is one headless Locust run
through the router; the servers' own counters are read before and after it:

  T1  router -> [A]        throughput with one replica       (round_robin, same workload)
  T2  router -> [A, B]     throughput with two replicas
  C-rr, C-ca               router (round_robin | cache_aware) -> [A, B], caches flushed first,
                           a shared-prefix workload: 16 long prefixes whose KV is more than one
                           pool holds but about half of them fits, so where requests go decides
                           the hit rate. Hit rate = delta sglang:cached_tokens_total / delta
                           sglang:prompt_tokens_total, summed over both servers (their own
                           accounting); also requests per worker and Locust's TTFT.

The two replicas share one GPU: T2/T1 shows what the router and a second replica add on a GPU a
single tiny-model server leaves idle, not multi-GPU scaling. Results are rewritten after every
phase (fleet.json, fleet.md), so a deadline keeps whatever finished.
"""

from __future__ import annotations

import argparse
import json
import os
import signal
import subprocess
import sys
import time
import urllib.error
import urllib.request
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

HERE = Path(__file__).resolve().parent
REPO = HERE.parents[1]
if (REPO / "src" / "glmserve").is_dir():
    sys.path.insert(0, str(REPO / "src"))

from glmserve import sglang_api  # noqa: E402
from glmserve.fleet.router import ROUTER_PACKAGE  # noqa: E402
from glmserve.serverproc import ServerProcess, free_port, stop_all  # noqa: E402
from glmserve.testing.router import start_router  # noqa: E402

LOCUSTFILE = REPO / "loadtest" / "decode.py"
# Router health settings for the bench: fast registration, no effect on routed requests.
ROUTER = {"health_check_interval_s": 2, "worker_startup_check_interval_s": 1}


def log(msg: str) -> None:
    print(f"[fleet {time.strftime('%H:%M:%S')}] {msg}", flush=True)


@dataclass
class Plan:
    pool_tokens: int
    users: int
    max_tokens: int
    input_tokens: int
    warmup_s: float
    measure_s: float
    cache_users: int
    cache_measure_s: float
    groups: int
    variants: int
    prefix_tokens: int

    @classmethod
    def for_mode(cls, mode: str, quick: bool) -> Plan:
        if quick:  # the CPU check of this script's logic (tests/fleet/test_fleet_bench.py)
            return cls(20_000, 8, 16, 16, 1, 4, 4, 5, 4, 8, 200)
        # 16 prefixes x 3000 tokens = 48k: a 36k pool holds 12 of them, half (24k) fits easily.
        return cls(36_000, 32, 128, 64, 5, 20, 8, 30, 16, 24, 3000)


# ------------------------------------------------------------------ servers


class Server(ServerProcess):
    """glmserve.serverproc's process, under the name (A, B) the results use."""

    def __init__(self, name: str, port: int, argv: list[str], env: dict[str, str], log_path: Path):
        # device_run.sh stops these groups if a run is killed at the tool's limit.
        super().__init__(argv, env, log_path, f"http://127.0.0.1:{port}",
                         pid_file=os.environ.get("E2E_PGID_FILE"))  # fmt: skip
        self.name, self.port = name, port


def server_argv(mode: str, port: int, args: argparse.Namespace, plan: Plan, build_info: Path):
    if mode == "emulator":
        return [args.python, "-m", "glmserve.emulator", "--host", "127.0.0.1",
                "--port", str(port), "--tpot-ms", "2", "--ttft-ms", "10",
                "--max-concurrency", "64", "--max-total-tokens", str(plan.pool_tokens),
                "--model-path", str(args.model_dir / "tiny-mla"), "--health-delay-s", "0",
                "--build-info-file", str(build_info)]  # fmt: skip
    # Our launcher validates and execs sglang.launch_server; the rest passes through after '--'.
    return [args.python, "-m", "glmserve.launch", "--profile", "tiny-mla",
            "--profiles-dir", str(args.profiles_dir), "--model-path",
            str(args.model_dir / "tiny-mla"), "--host", "127.0.0.1", "--port", str(port),
            "--build-info", str(build_info), "--",
            # A pinned pool per server: the split of the GPU, and the cache pressure of C-*.
            "--max-total-tokens", str(plan.pool_tokens),
            # Each server may take 40 % of the memory free at its start; both fit together.
            "--mem-fraction-static", "0.4",
            # T1 puts every Locust user on one server: capture graphs for all of them.
            "--cuda-graph-max-bs", str(plan.users),
            # Two schedulers share the machine; idle ones must not spin a core each.
            "--sleep-on-idle"]  # fmt: skip


def metric_sum(url: str, name: str) -> float:
    """Sum of every series of a counter in the server's /metrics (0 when it has none yet)."""
    try:
        with urllib.request.urlopen(url + sglang_api.METRICS, timeout=10) as r:
            text = r.read().decode()
    except OSError:
        return float("nan")
    total = 0.0
    for line in text.splitlines():
        if line.startswith(name + "{") or line.startswith(name + " "):
            total += float(line.rsplit(" ", 1)[1])
    return total


COUNTERS = ("sglang:num_requests_total", "sglang:generation_tokens_total",
            "sglang:prompt_tokens_total", "sglang:cached_tokens_total")  # fmt: skip


def counters(servers: list[Server]) -> dict[str, dict[str, float]]:
    return {s.name: {c: metric_sum(s.url, c) for c in COUNTERS} for s in servers}


def flush_cache(server: Server) -> bool:
    req = urllib.request.Request(server.url + sglang_api.FLUSH_CACHE, method="POST")
    try:
        with urllib.request.urlopen(req, timeout=30) as r:
            return r.status == 200
    except (urllib.error.HTTPError, OSError):
        return False


# ------------------------------------------------------------------ workload


def prompt_file(path: Path, plan: Plan, vocab_words: list[str]) -> Path:
    """`groups` shared prefixes of `prefix_tokens` words (one token each in the tiny model's
    WordLevel vocabulary), each with `variants` short distinct questions."""
    lines = []
    n = len(vocab_words)
    for g in range(plan.groups):
        prefix = " ".join(vocab_words[(g * 7919 + i * 31) % n] for i in range(plan.prefix_tokens))
        for v in range(plan.variants):
            tail = " ".join(vocab_words[(g * 131 + v * 17 + j) % n] for j in range(8))
            lines.append(json.dumps({"prompt": f"{prefix} {tail}"}))
    path.write_text("\n".join(lines) + "\n")
    return path


def vocab(model_dir: Path) -> list[str]:
    """Plain words of the tiny tokenizer (w0, w1, ...), so a prompt's token count is known."""
    data = json.loads((model_dir / "tiny-mla" / "tokenizer.json").read_text())
    words = [w for w in data["model"]["vocab"] if w.startswith("w") and w[1:].isdigit()]
    return sorted(words, key=lambda w: int(w[1:]))[:20_000]


def run_locust(router_url: str, out: Path, python: str, env: dict[str, str], *args: str):
    argv = [python, "-m", "locust", "-f", str(LOCUSTFILE), "--headless", "-H", router_url,
            "--report-dir", str(out), "--only-summary", "--shape", "concurrent",
            "--route", "completions", "--seed", "7", *args]  # fmt: skip
    t0 = time.monotonic()
    proc = subprocess.run(argv, cwd=REPO, env=env, capture_output=True, text=True, timeout=300)
    out.mkdir(parents=True, exist_ok=True)
    (out / "locust.log").write_text(proc.stdout + proc.stderr)
    report = out / "summary.json"
    summary = json.loads(report.read_text()) if report.exists() else {}
    return proc.returncode, summary, time.monotonic() - t0


# ------------------------------------------------------------------ phases


@dataclass
class Results:
    out: Path
    meta: dict[str, Any]
    phases: dict[str, Any] = field(default_factory=dict)
    skipped: list[str] = field(default_factory=list)

    def save(self) -> None:
        data = {"meta": self.meta, "phases": self.phases, "skipped": self.skipped,
                "derived": derived(self.phases)}  # fmt: skip
        (self.out / "fleet.json").write_text(json.dumps(data, indent=2) + "\n")
        (self.out / "fleet.md").write_text(render_md(data))


def delta(before: dict[str, dict[str, float]], after: dict[str, dict[str, float]]):
    return {s: {c: after[s][c] - before[s][c] for c in after[s]} for s in after}


def phase(results: Results, name: str, router_workers: list[Server], all_servers: list[Server],
          policy: str, plan: Plan, args: argparse.Namespace, env: dict[str, str],
          locust_args: list[str]) -> None:  # fmt: skip
    log(f"{name}: router ({policy}) -> {[s.name for s in router_workers]}")
    router = start_router([s.url for s in router_workers], policy=policy, python=args.python,
                          log_level="warn", **ROUTER)  # fmt: skip
    try:
        before = counters(all_servers)
        rc, summary, wall = run_locust(router.url, results.out / "logs" / "locust" / name, args.python,
                                       env, *locust_args)  # fmt: skip
        after = counters(all_servers)
    finally:
        router.close()
    step = (summary.get("steps") or [{}])[0]
    d = delta(before, after)
    prompt = sum(v["sglang:prompt_tokens_total"] for v in d.values())
    cached = sum(v["sglang:cached_tokens_total"] for v in d.values())
    requests = {s: v["sglang:num_requests_total"] for s, v in d.items()}
    total_req = sum(requests.values()) or float("nan")
    results.phases[name] = {
        "policy": policy,
        "workers": [s.name for s in router_workers],
        "locust_rc": rc,
        "wall_s": round(wall, 1),
        "locust_output_tokens_per_s": step.get("output_tokens_per_s"),
        "locust_requests": step.get("requests"),
        "locust_ttft_p50_ms": (step.get("ttft_ms") or {}).get("p50"),
        "locust_tpot_p50_ms": (step.get("tpot_ms") or {}).get("p50"),
        "locust_failures": summary.get("failures_total"),
        "locust_server_info": summary.get("server"),
        "server_counters": d,
        "server_generation_tokens": sum(v["sglang:generation_tokens_total"] for v in d.values()),
        "request_share": {s: round(n / total_req, 3) for s, n in requests.items()},
        "cache_hit_rate": round(cached / prompt, 4) if prompt > 0 else None,
    }
    brief = ("locust_output_tokens_per_s", "request_share", "cache_hit_rate")
    log(f"{name}: {json.dumps({k: results.phases[name][k] for k in brief})}")
    results.save()


def derived(phases: dict[str, Any]) -> dict[str, Any]:
    out: dict[str, Any] = {}
    t1, t2 = phases.get("T1", {}), phases.get("T2", {})
    if t1.get("locust_output_tokens_per_s") and t2.get("locust_output_tokens_per_s"):
        out["throughput_two_vs_one"] = round(
            t2["locust_output_tokens_per_s"] / t1["locust_output_tokens_per_s"], 3
        )
    rr, ca = phases.get("C-rr", {}), phases.get("C-ca", {})
    if rr.get("cache_hit_rate") is not None and ca.get("cache_hit_rate") is not None:
        out["hit_rate_cache_aware"] = ca["cache_hit_rate"]
        out["hit_rate_round_robin"] = rr["cache_hit_rate"]
    if ca.get("request_share"):
        out["cache_aware_max_request_share"] = max(ca["request_share"].values())
    return out


def _num(value: float | None, digits: int) -> str:
    return "n/a" if value is None else f"{value:,.{digits}f}"


def render_md(data: dict[str, Any]) -> str:
    m = data["meta"]
    lines = [f"# Fleet bench ({m['mode']}): two replicas behind {m['router_version']}",
             "", f"- date: {m['date']}; device: {m.get('device', 'n/a')}",
             f"- command: `{m['command']}`",
             f"- servers: {m['servers']}", f"- plan: {m['plan']}", "",
             "| phase | router policy | workers | Locust tok/s | requests | TTFT p50 ms | "
             "TPOT p50 ms | failures | share per worker | cache hit rate | prompt tokens computed |",
             "|---|---|---|---|---|---|---|---|---|---|---|"]  # fmt: skip
    for name, p in data["phases"].items():
        share = ", ".join(f"{k} {v:.0%}" for k, v in p["request_share"].items())
        hit = "n/a" if p["cache_hit_rate"] is None else f"{p['cache_hit_rate']:.1%}"
        failures = sum((p["locust_failures"] or {}).values())
        # What the servers had to prefill: prompt tokens their radix caches did not hold.
        computed = sum(v["sglang:prompt_tokens_total"] - v["sglang:cached_tokens_total"]
                       for v in p["server_counters"].values())  # fmt: skip
        lines.append(
            f"| {name} | {p['policy']} | {'+'.join(p['workers'])} | "
            f"{_num(p['locust_output_tokens_per_s'], 0)} | {p['locust_requests']} | "
            f"{_num(p['locust_ttft_p50_ms'], 1)} | {_num(p['locust_tpot_p50_ms'], 2)} | "
            f"{failures} | {share} | {hit} | {_num(computed, 0)} |"
        )
    lines += ["", f"Derived: `{json.dumps(data['derived'])}`"]
    if data["skipped"]:
        lines.append(f"Skipped (deadline): {', '.join(data['skipped'])}")
    return "\n".join(lines) + "\n"


def gpu_name() -> str:
    try:
        proc = subprocess.run(["nvidia-smi", "--query-gpu=name,driver_version,memory.total",
                               "--format=csv,noheader"], capture_output=True, text=True, timeout=30)  # fmt: skip
    except (OSError, subprocess.SubprocessError):
        return ""
    return proc.stdout.strip().splitlines()[0] if proc.returncode == 0 and proc.stdout else ""


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--mode", choices=("device", "emulator"), required=True)
    p.add_argument("--out", type=Path, required=True)
    p.add_argument("--model-dir", type=Path, default=REPO / "deploy" / "models")
    p.add_argument("--profiles-dir", type=Path, default=REPO / "deploy" / "profiles")
    p.add_argument("--python", default=sys.executable)
    p.add_argument("--deadline-s", type=float, default=520.0, help="stop starting phases after")
    # Measured on the H200: 303 s for both (cold JIT + self-tests); 360 still leaves the
    # throughput phases inside the 520 s deadline, skipping (and saying so) what does not fit.
    p.add_argument("--ready-timeout-s", type=float, default=360.0)
    p.add_argument("--quick", action="store_true", help="short phases (CPU check)")
    p.add_argument("--render", type=Path, metavar="FLEET_JSON",
                   help="only rewrite OUT/fleet.md from an earlier run's fleet.json")  # fmt: skip
    args = p.parse_args(argv)
    if args.render:
        args.out.mkdir(parents=True, exist_ok=True)
        (args.out / "fleet.md").write_text(render_md(json.loads(args.render.read_text())))
        return 0
    t_start = time.monotonic()
    args.out.mkdir(parents=True, exist_ok=True)
    plan = Plan.for_mode(args.mode, args.quick)
    env = {**os.environ, "PYTHONUNBUFFERED": "1"}
    import importlib.metadata

    results = Results(args.out, {
        "mode": args.mode, "date": time.strftime("%Y-%m-%d %H:%M UTC", time.gmtime()),
        "command": " ".join([Path(sys.argv[0]).name, *(argv or sys.argv[1:])]),
        "router_version": f"{ROUTER_PACKAGE} {importlib.metadata.version(ROUTER_PACKAGE)}",
        "plan": plan.__dict__, "device": gpu_name(),
    })  # fmt: skip
    servers = []
    for name in ("A", "B"):
        port = free_port()
        argv_s = server_argv(args.mode, port, args, plan, args.out / "buildinfo" / f"{name}.json")
        servers.append(Server(name, port, argv_s, env, args.out / "logs" / f"{name}.log"))
    results.meta["servers"] = " ".join(servers[0].argv[1:]).replace(str(servers[0].port), "PORT")
    interrupted: list[int] = []

    def on_term(signum: int, _frame: Any) -> None:
        # device_run.sh's timeout sends SIGTERM before the tool's limit: stop and save.
        interrupted.append(signum)
        raise KeyboardInterrupt

    signal.signal(signal.SIGTERM, on_term)
    try:
        for s in servers:  # both at once: the second waits on the first's JIT lock, not longer
            s.start()
        t_ready = time.monotonic() + args.ready_timeout_s
        waiting = list(servers)
        while waiting:
            for s in [s for s in waiting if s.poll_ready()]:
                log(f"{s.name} ready after {s.ready_s:.1f} s")
                waiting.remove(s)
            failed = [s for s in waiting if s.error]
            if failed:
                raise RuntimeError(f"{failed[0].name} {failed[0].error}; see {failed[0].log_path}")
            if waiting and time.monotonic() > t_ready:
                raise RuntimeError(f"servers not ready in {args.ready_timeout_s:g} s")
            time.sleep(1)
        results.meta["ready_s"] = {s.name: round(s.ready_s or 0.0, 1) for s in servers}
        a, b = servers
        throughput = ["-u", str(plan.users), "--warmup-s", str(plan.warmup_s),
                      "--measure-s", str(plan.measure_s), "--max-tokens", str(plan.max_tokens),
                      "--input-tokens", str(plan.input_tokens)]  # fmt: skip
        prompts = prompt_file(args.out / "shared-prefix.jsonl", plan, vocab(args.model_dir))
        cache = ["-u", str(plan.cache_users), "--warmup-s", "0",
                 "--measure-s", str(plan.cache_measure_s), "--max-tokens", "16",
                 "--prompt-file", str(prompts)]  # fmt: skip
        todo = [("T1", [a], "round_robin", throughput), ("T2", [a, b], "round_robin", throughput),
                ("C-rr", [a, b], "round_robin", cache), ("C-ca", [a, b], "cache_aware", cache)]  # fmt: skip
        for name, workers, policy, locust_args in todo:
            budget = plan.warmup_s + plan.measure_s + 25
            if time.monotonic() - t_start + budget > args.deadline_s:
                results.skipped.append(name)
                results.save()
                continue
            if name.startswith("C-"):
                flushed = [flush_cache(s) for s in servers]
                results.meta.setdefault("flushed", {})[name] = flushed
            phase(results, name, workers, servers, policy, plan, args, env, locust_args)
    except KeyboardInterrupt:
        log("interrupted: saving what finished")
    finally:
        stop_all(servers, grace_s=20)
        results.meta["wall_s"] = round(time.monotonic() - t_start, 1)
        results.save()
    print((args.out / "fleet.md").read_text())
    return 0 if results.phases and not interrupted else 1


if __name__ == "__main__":
    sys.exit(main())
