#!/usr/bin/env python3
"""End-to-end harness: real (or emulated) SGLang servers, measured with glmserve's own client.

    python bench/e2e/harness.py --mode device   --out DIR [--deadline-s 520]   # on the H200
    python bench/e2e/harness.py --mode emulator --out DIR --base-port 0         # local dry run

Every server of the plan (analysis.plan_servers) is started at once through our launcher
(`python -m glmserve.launch`, so its start-up self-test runs in the real GPU process); they sit
side by side on the GPU, and each is measured while the others are idle, round-robin, so that
the (a)/(b)/(c) ratios come from interleaved samples of the same call. Results are rewritten
after every phase, so whatever finished before a deadline or a crash is kept.
"""

from __future__ import annotations

import argparse
import contextlib
import datetime as dt
import importlib.metadata
import importlib.util
import json
import os
import shlex
import signal
import subprocess
import sys
import threading
import time
from collections.abc import Callable, Sequence
from dataclasses import asdict, replace
from pathlib import Path
from typing import Any

HERE = Path(__file__).resolve().parent
REPO = HERE.parent.parent
sys.path.insert(0, str(HERE))
if (REPO / "src" / "glmserve").is_dir() and importlib.util.find_spec("glmserve") is None:
    sys.path.insert(0, str(REPO / "src"))

import e2e_analysis as an  # noqa: E402

from glmserve import sglang_api, streaming  # noqa: E402
from glmserve.serverproc import ServerProcess, free_port, stop_all  # noqa: E402

ITL_METRIC = "sglang:inter_token_latency_seconds"


def log(msg: str) -> None:
    print(f"[e2e {time.strftime('%H:%M:%S')}] {msg}", flush=True)


# ---------------------------------------------------------------- launching


def launch_argv(spec: an.ServerSpec, mode: str, paths: dict[str, Path], python: str) -> list[str]:
    """The command line of one server. Device: our launcher, which execs sglang.launch_server.

    `paths`: model (the tiny MLA model dir), profiles (the launcher's profile folder),
    build_info (where the launcher writes build info for this server).
    """
    if mode == "emulator":
        # The emulator stands in for launcher + SGLang; its cost model plays the three variants.
        cost = {"fp8_upstream": "upstream", "fp8_patched": "patched", "bf16": "bf16"}[spec.variant]
        return [
            python, "-m", "glmserve.emulator", "--host", "127.0.0.1", "--port", str(spec.port),
            "--tpot-ms", "1.0", "--ttft-ms", "5", "--cost-model", cost,
            "--layers", str(spec.layers), "--kv-cache-dtype", spec.kv_cache_dtype,
            "--tp-size", str(spec.tp), "--max-total-tokens", str(an.MAX_TOTAL_TOKENS),
            "--model-path", str(paths["model"]), "--build-info-file", str(paths["build_info"]),
            "--health-delay-s", "0",
        ]  # fmt: skip
    # Our launcher owns --model-path/--tp/--host/--port (it validates them); the rest passes
    # through after '--' and, coming after the profile's flags, wins for store-type options.
    sglang_args = [
        "--kv-cache-dtype", spec.kv_cache_dtype,
        "--max-total-tokens", str(an.MAX_TOTAL_TOKENS),
        # Servers share the GPU, so each must leave room for the others: the pool is capped by
        # --max-total-tokens anyway, and SGLang's fraction is of the memory free at its start.
        "--mem-fraction-static", "0.9",
        "--cuda-graph-max-bs", str(spec.cuda_graph_max_bs),
        # Servers share the machine: an idle SGLang scheduler otherwise spins one core at 100%.
        # Only TP=1: a TP>1 follower rank has no socket to wake on and would sleep 1 s per poll.
        *(["--sleep-on-idle"] if spec.tp == 1 else []),
        # No custom all-reduce for TP=2: the tiny model's all-reduces are small, and it keeps
        # the run independent of IPC-buffer support in the lent VM.
        *(["--disable-custom-all-reduce"] if spec.tp > 1 else []),
    ]  # fmt: skip
    # The tiny profiles allow SM 9.x themselves (the H200), so no --allow-any-arch override.
    return [
        python, "-m", "glmserve.launch", "--profile", spec.profile,
        "--profiles-dir", str(paths["profiles"]), "--model-path", str(paths["model"]),
        "--tp", str(spec.tp), "--host", "127.0.0.1", "--port", str(spec.port),
        "--build-info", str(paths["build_info"]),
        "--", *sglang_args,
    ]  # fmt: skip


class Server(ServerProcess):
    """A server of the plan: glmserve.serverproc's process plus the spec it was started from."""

    def __init__(self, spec: an.ServerSpec, argv: list[str], env: dict[str, str], log_path: Path):
        # A run killed at the device tool's limit cannot stop its servers (they have their own
        # sessions); the next device.sh reads this file and stops these groups by id.
        url = f"http://127.0.0.1:{spec.port}"
        super().__init__(argv, env, log_path, url, pid_file=os.environ.get("E2E_PGID_FILE"))
        self.spec = spec


# ---------------------------------------------------------------- measuring


def greedy_ids(
    http: Any, url: str, prompts: Sequence[Sequence[int]], new_tokens: int
) -> list[list[int]]:
    """Greedy outputs, one request at a time: batch size 1 for every prompt on every server,
    so (a) and (b) run the same CUDA graph on the same inputs."""
    out = []
    for ids in prompts:
        body = {
            "input_ids": list(ids),
            "sampling_params": {
                "temperature": 0.0,
                "max_new_tokens": new_tokens,
                "ignore_eos": True,
            },
        }
        r = http.post(url + sglang_api.GENERATE, json=body, timeout=120.0)
        r.raise_for_status()
        got = r.json()
        if "output_ids" not in got:
            raise RuntimeError(f"/generate returned no output_ids: {str(got)[:200]}")
        out.append([int(t) for t in got["output_ids"]])
    return out


def stream_once(url: str, max_tokens: int, prompt: str, client: Any) -> streaming.StreamTiming:
    req = streaming.StreamRequest(route="generate", prompt=prompt, max_tokens=max_tokens)
    return streaming.time_stream(url, req, client=client, timeout_s=180.0)


def concurrent_streams(url: str, n: int, max_tokens: int, prompt: str) -> dict[str, Any]:
    """n text streams released together (see concurrent_requests)."""
    reqs = [
        streaming.StreamRequest(route="generate", prompt=f"{prompt} #{i}", max_tokens=max_tokens)
        for i in range(n)
    ]
    return concurrent_requests(url, reqs)


def concurrent_requests(
    url: str, requests: Sequence[streaming.StreamRequest], keep_timings: bool = False
) -> dict[str, Any]:
    """Streams released together; TPOT per stream and aggregate output tok/s over the window
    (with keep_timings, also every stream's StreamTiming, under "timings")."""
    import httpx

    n = len(requests)
    barrier = threading.Barrier(n)
    timings: list[streaming.StreamTiming | None] = [None] * n
    errors: list[str] = []

    def worker(i: int) -> None:
        with httpx.Client(timeout=httpx.Timeout(300.0)) as client:
            client.get(
                url + sglang_api.HEALTH, timeout=10.0
            )  # open the connection before the barrier
            barrier.wait()
            try:
                timings[i] = streaming.time_stream(url, requests[i], client=client, timeout_s=300.0)
            except streaming.StreamError as exc:
                errors.append(str(exc))

    threads = [threading.Thread(target=worker, args=(i,)) for i in range(n)]
    t0 = time.perf_counter()
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    window = time.perf_counter() - t0
    done = [t for t in timings if t is not None]
    together = streaming.Aggregate(list(done))
    return {
        "tpot_median": an.median(t.tpot_s for t in done),
        "tpot_mean": (sum(t.tpot_s or 0 for t in done) / len(done)) if done else None,
        # Where TPOT comes from under MTP (glmserve.streaming's definitions; None without).
        "tokens_per_step": together.tokens_per_step(),
        "accept_length": together.accept_length(),
        "tok_s": sum(t.output_tokens for t in done) / window if window > 0 else None,
        "window_s": window,
        "streams_ok": len(done),
        "errors": errors,
        **({"timings": done} if keep_timings else {}),
    }


def canary_probe(url: str, n: int, max_tokens: int) -> tuple[float | None, list[str], str]:
    """Mean TPOT as the exporter's canary exports it: its own Canary.run_once n times, read back
    from its glmserve_canary_tpot_seconds histogram (sum/count), plus failure reasons."""
    import httpx

    req = streaming.StreamRequest(route="generate", prompt="canary", max_tokens=max_tokens)
    try:
        from prometheus_client import CollectorRegistry

        from glmserve.exporter.canary import Canary, CanaryMetrics
    except ImportError:
        vals = []
        with httpx.Client(timeout=httpx.Timeout(60.0)) as client:
            for _ in range(n):
                t = streaming.time_stream(url, req, client=client, timeout_s=60.0)
                if t.tpot_s is not None:
                    vals.append(t.tpot_s)
        mean = sum(vals) / len(vals) if vals else None
        return mean, [], "canary-equivalent (glmserve.streaming; glmserve.exporter not importable)"
    registry = CollectorRegistry()
    failures = []
    with httpx.Client(timeout=httpx.Timeout(60.0)) as client:
        canary = Canary(url, req, CanaryMetrics(registry), client, timeout_s=60.0)
        for _ in range(n):
            reason = canary.run_once()
            if reason:
                failures.append(reason)
    total = registry.get_sample_value("glmserve_canary_tpot_seconds_sum") or 0.0
    count = registry.get_sample_value("glmserve_canary_tpot_seconds_count") or 0.0
    source = "glmserve.exporter.canary.Canary.run_once (route /generate), histogram sum/count"
    return (total / count if count else None), failures, source


def scrape_itl(http: Any, url: str) -> tuple[float, float]:
    r = http.get(url + sglang_api.METRICS, timeout=10.0)
    r.raise_for_status()
    return an.scrape_sum_count(r.text, ITL_METRIC)


# ---------------------------------------------------------------- the run


class Run:
    def __init__(self, args: argparse.Namespace) -> None:
        self.args = args
        self.out = Path(args.out)
        self.out.mkdir(parents=True, exist_ok=True)
        self.t0 = time.monotonic()
        self.deadline = self.t0 + args.deadline_s
        self.report = an.Report()
        self.servers: dict[str, Server] = {}
        self.specs: list[an.ServerSpec] = []

    def left(self) -> float:
        return self.deadline - time.monotonic()

    def save(self) -> None:
        data = {
            "meta": self.report.meta,
            "plan": [asdict(s) for s in self.specs],
            "servers": self.report.servers,
            "bars": self.report.groups,
            "agreement": self.report.agreement,
            "notes": self.report.notes,
        }
        (self.out / "e2e.json").write_text(json.dumps(data, indent=1, sort_keys=True) + "\n")
        (self.out / "e2e.md").write_text(an.render_markdown(self.report, self.specs))

    def res(self, key: str) -> dict[str, Any]:
        return self.report.servers.setdefault(key, {})

    def ready(self, keys: Sequence[str]) -> list[Server]:
        return [
            self.servers[k]
            for k in keys
            if k in self.servers and self.servers[k].ready_s is not None
        ]

    # -- phases

    def start_all(self, http: Any) -> None:
        a = self.args
        env_base = dict(os.environ)
        # NVLink multicast stays off on the lent machines (their docs); harmless with one GPU.
        env_base.update(
            NCCL_NVLS_ENABLE="0", TORCH_SYMM_MEM_DISABLE_MULTICAST="1", NVSHMEM_DISABLE_NVLS="1"
        )
        for spec in self.specs:
            env = dict(env_base)
            env["GLMSERVE_FP8_GATHER"] = spec.fp8_gather
            build_info = self.out / "buildinfo" / f"{spec.key}.json"
            env["GLMSERVE_BUILD_INFO"] = str(build_info)
            if a.mode == "device":
                env["CUDA_VISIBLE_DEVICES"] = spec.gpus
            if spec.tp > 1:
                # The GPUs are shared on purpose (other servers of the plan sit on them), so the
                # free memory differs between ranks; SGLang would refuse that by default.
                env["SGLANG_ENABLE_TP_MEMORY_INBALANCE_CHECK"] = "0"
            else:
                env["GLMSERVE_EMULATOR_FP8_GATHER"] = spec.fp8_gather
            paths = {
                "model": Path(a.model_dir) / a.model,
                "profiles": Path(a.profiles_dir),
                "build_info": build_info,
            }
            argv = launch_argv(spec, a.mode, paths, sys.executable)
            srv = Server(spec, argv, env, self.out / "logs" / f"{spec.key}.log")
            self.servers[spec.key] = srv
            self.res(spec.key).update(argv=shlex.join(argv), gpus=spec.gpus)
            log(f"start {spec.key}: GLMSERVE_FP8_GATHER={spec.fp8_gather} {shlex.join(argv)}")
            srv.start()
            if a.stagger_s:
                time.sleep(a.stagger_s)

    def wait_ready(self, http: Any, keys: Sequence[str], budget_s: float) -> None:
        end = min(self.deadline, time.monotonic() + budget_s)
        pending = [self.servers[k] for k in keys if k in self.servers]
        while pending and time.monotonic() < end:
            for srv in list(pending):
                if srv.poll_ready():
                    log(f"{srv.spec.key} ready after {srv.ready_s:.0f} s")
                    pending.remove(srv)
                    self.res(srv.spec.key)["ready_s"] = srv.ready_s
                    self.record_build_info(srv)
                elif srv.error:
                    log(f"{srv.spec.key} FAILED: {srv.error}")
                    pending.remove(srv)
                    self.res(srv.spec.key)["error"] = srv.error
            time.sleep(0.5)
        for srv in pending:
            self.res(srv.spec.key).setdefault(
                "error", f"not ready within the budget ({budget_s:.0f} s)"
            )

    def record_build_info(self, srv: Server) -> None:
        path = self.out / "buildinfo" / f"{srv.spec.key}.json"
        with contextlib.suppress(OSError, ValueError):
            self.res(srv.spec.key)["build_info"] = json.loads(path.read_text())
        # The launcher logs its self-test verdict before it execs SGLang: evidence that the
        # test ran in this very process on this GPU.
        with contextlib.suppress(OSError):
            line = an.log_facts(srv.log_path.read_text(errors="replace"))["selftest"]
            if line:
                self.res(srv.spec.key)["selftest"] = line.split(":")[0].replace("self-test ", "")
                self.res(srv.spec.key)["selftest_line"] = line

    def phase_greedy(
        self, http: Any, keys: Sequence[str], prompts: list[list[int]], new_tokens: int
    ) -> None:
        """Three passes, all at batch size 1 (every server runs the same CUDA graphs):

        1. `greedy_ids`: cold radix cache, so prefill is FlashInfer's ragged path (no KV cast);
        2. `greedy_ids_cached` (FP8 servers): the same prompts again, now a radix-cache prefix
           hit, so prefill reads the cached prefix through the *paged* path, the extend-side
           cast the patch also replaces;
        3. `greedy_ids_repeat` (patched server only): cache flushed, pass 1 again. A control: if
           (b) repeats itself but differs from (a), the difference is the patch, not noise.
        """
        for srv in self.ready(keys):
            t = time.monotonic()
            r = self.res(srv.spec.key)
            try:
                r["greedy_ids"] = greedy_ids(http, srv.url, prompts, new_tokens)
                if srv.spec.kv_cache_dtype.startswith("fp8"):
                    r["greedy_ids_cached"] = greedy_ids(http, srv.url, prompts, new_tokens)
                if srv.spec.variant == "fp8_patched":
                    flushed = http.post(srv.url + sglang_api.FLUSH_CACHE, timeout=30.0)
                    r["flush_cache_status"] = flushed.status_code
                    r["greedy_ids_repeat"] = greedy_ids(http, srv.url, prompts, new_tokens)
            except Exception as exc:
                r["greedy_error"] = f"{type(exc).__name__}: {exc}"[:300]
            log(
                f"{srv.spec.key}: greedy {len(prompts)} prompts x {new_tokens} in "
                f"{time.monotonic() - t:.1f} s"
            )

    def phase_single(self, http: Any, keys: Sequence[str], reps: int, max_tokens: int) -> None:
        """Round-robin single streams; the server's ITL histogram is read around its own window."""
        import httpx

        servers = self.ready(keys)
        before = {}
        for srv in servers:
            try:
                before[srv.spec.key] = scrape_itl(http, srv.url)
            except Exception as exc:
                self.res(srv.spec.key)["metrics_error"] = str(exc)[:200]
        samples: dict[str, list[streaming.StreamTiming]] = {s.spec.key: [] for s in servers}
        with httpx.Client(timeout=httpx.Timeout(180.0)) as client:
            for srv in servers:  # one untimed stream each: first-request effects stay out
                with contextlib.suppress(streaming.StreamError):
                    stream_once(srv.url, 8, "warm up", client)
            for srv in servers:
                with contextlib.suppress(Exception):
                    before[srv.spec.key] = scrape_itl(http, srv.url)
            for _ in range(reps):
                for srv in servers:
                    try:
                        samples[srv.spec.key].append(
                            stream_once(srv.url, max_tokens, "single stream", client)
                        )
                    except streaming.StreamError as exc:
                        self.res(srv.spec.key).setdefault("stream_errors", []).append(str(exc))
        for srv in servers:
            k, ts = srv.spec.key, samples[srv.spec.key]
            r = self.res(k)
            tpots = [t.tpot_s for t in ts if t.tpot_s is not None]
            r.update(
                tpot_1=an.median(tpots),
                tpot_1_mean=sum(tpots) / len(tpots) if tpots else None,
                tpot_1_all=tpots,
                ttft_1=an.median(t.ttft_s for t in ts),
                n_single=len(ts),
                out_tokens_single=max_tokens,
            )
            if k in before:
                with contextlib.suppress(Exception):
                    r["server_itl_mean"] = an.histogram_mean(before[k], scrape_itl(http, srv.url))
            log(f"{k}: TPOT {_fmt_ms(r['tpot_1'])} ms, TTFT {_fmt_ms(r['ttft_1'])} ms, "
                f"server ITL {_fmt_ms(r.get('server_itl_mean'))} ms")  # fmt: skip

    def phase_concurrent(self, keys: Sequence[str], reps: int, n: int, max_tokens: int) -> None:
        servers = [s for s in self.ready(keys) if s.spec.concurrency]
        runs: dict[str, list[dict[str, Any]]] = {s.spec.key: [] for s in servers}
        for _ in range(reps):
            for srv in servers:
                runs[srv.spec.key].append(
                    concurrent_streams(srv.url, n, max_tokens, "eight streams")
                )
        for srv in servers:
            rs = runs[srv.spec.key]
            r = self.res(srv.spec.key)
            r.update(
                tpot_8=an.median(x["tpot_median"] for x in rs),
                tok_s_8=an.median(x["tok_s"] for x in rs),
                conc_runs=rs,
            )
            log(
                f"{srv.spec.key}: {n} streams TPOT {_fmt_ms(r['tpot_8'])} ms, {r['tok_s_8'] or 0:.0f} tok/s"
            )

    def phase_canary(self, keys: Sequence[str], n: int, max_tokens: int) -> None:
        for srv in self.ready(keys):
            try:
                mean, failures, source = canary_probe(srv.url, n, max_tokens)
            except Exception as exc:
                self.res(srv.spec.key)["canary_error"] = f"{type(exc).__name__}: {exc}"[:200]
                continue
            self.report.meta["canary_source"] = source
            self.res(srv.spec.key).update(canary_tpot=mean, canary_n=n, canary_failures=failures)
            log(
                f"{srv.spec.key}: canary TPOT {_fmt_ms(mean)} ms ({n} probes, {len(failures)} failed)"
            )

    def evaluate(self) -> None:
        groups: dict[str, list[an.ServerSpec]] = {}
        for s in self.specs:
            groups.setdefault(s.group, []).append(s)
        self.report.groups = {}
        self.report.agreement = {}
        for grp, specs in groups.items():
            bars = an.evaluate_group(self.report.servers, specs)
            self.report.groups[grp] = [b.as_dict() for b in bars]
            ids = {s.variant: self.report.servers.get(s.key, {}).get("greedy_ids") for s in specs}
            for x, y in (("fp8_upstream", "fp8_patched"), ("fp8_patched", "bf16")):
                if ids.get(x) and ids.get(y) and len(ids[x]) == len(ids[y]):
                    name = f"{grp}: {an.VARIANTS[x]['label'][:3]} vs {an.VARIANTS[y]['label'][:3]}"
                    self.report.agreement[name] = an.compare_tokens(ids[x], ids[y]).as_dict()
            cached = {s.variant: self.report.servers.get(s.key, {}).get("greedy_ids_cached")
                      for s in specs}  # fmt: skip
            a_c, b_c = cached.get("fp8_upstream"), cached.get("fp8_patched")
            if a_c and b_c and len(a_c) == len(b_c):
                name = f"{grp}: (a) vs (b), prefix-cached prompts (paged extend)"
                self.report.agreement[name] = an.compare_tokens(a_c, b_c).as_dict()
            for s in specs:
                r = self.report.servers.get(s.key, {})
                if r.get("greedy_ids") and r.get("greedy_ids_repeat"):
                    name = f"{grp}: {s.key} vs itself (repeat)"
                    agree = an.compare_tokens(r["greedy_ids"], r["greedy_ids_repeat"])
                    self.report.agreement[name] = agree.as_dict()

    def meta(self) -> None:
        m = self.report.meta
        m.update(
            mode=self.args.mode,
            date=dt.datetime.now(dt.timezone.utc).strftime("%Y-%m-%d %H:%M UTC"),
            command=" ".join(shlex.quote(x) for x in sys.argv),
            client="glmserve.streaming.time_stream over /generate (the Locust suite is not carried)",
            python=sys.version.split()[0],
        )
        for dist in ("sglang", "flashinfer-python", "torch", "triton", "sglang-kernel", "httpx"):
            try:
                m[dist.replace("-python", "")] = importlib.metadata.version(dist)
            except importlib.metadata.PackageNotFoundError:
                m[dist.replace("-python", "")] = None
        try:
            q = subprocess.run(["nvidia-smi", "--query-gpu=name,driver_version,memory.total", "--format=csv,noheader"],
                               capture_output=True, text=True, timeout=20)  # fmt: skip
            gpus = [ln.strip() for ln in q.stdout.splitlines() if ln.strip()]
            m["gpus"] = gpus
            m["device"] = f"{len(gpus)}x {gpus[0].split(',')[0]}" if gpus else "no GPU"
        except (OSError, subprocess.TimeoutExpired):
            m["device"] = "no GPU (emulator)"
        spec = importlib.util.find_spec("sglang")
        if spec and spec.origin:
            marker = Path(spec.origin).parent / ".glmserve-patch.json"
            with contextlib.suppress(OSError, ValueError):
                mk = json.loads(marker.read_text())
                m["patch_series"] = mk.get("series")
                m["patch_lock_sha256"] = mk.get("lock_sha256")
                m["patched_files"] = sorted(mk.get("files", {}))

    def execute(self) -> int:
        import httpx

        a = self.args
        self.specs = self.plan()
        self.meta()
        self.save()
        keys = [s.key for s in self.specs]
        core = [s.key for s in self.specs if s.priority == 0]
        vocab = a.vocab_size or _vocab_of(Path(a.model_dir) / a.model) or 32000
        with httpx.Client() as http:
            try:
                self.start_all(http)
                # Everything starts at once and FlashInfer's JIT lock lets one process compile
                # while the others wait, so the wall time is about one cold start.
                self.wait_ready(http, core, budget_s=a.ready_budget_s)
                # Deep and TP=2 servers may still be capturing graphs: give them a bounded wait
                # so that their start-up (CPU-heavy) does not overlap the core timings.
                self.wait_ready(http, [k for k in keys if k not in core], budget_s=a.extra_wait_s)
                self.save()
                for name, need_s, keys_of_phase, fn in self.phases(vocab):
                    if not self.ready(keys_of_phase):
                        continue  # nothing to measure: the server errors are already recorded
                    if self.left() < need_s:
                        self.report.notes.append(
                            f"skipped {name}: {self.left():.0f} s left, needs ~{need_s:.0f} s"
                        )
                        log(self.report.notes[-1])
                        continue
                    t = time.monotonic()
                    log(f"phase {name}")
                    try:
                        fn(http)
                    except Exception as exc:  # one phase failing must not lose the others
                        self.report.notes.append(
                            f"phase {name} failed: {type(exc).__name__}: {exc}"[:300]
                        )
                        log(self.report.notes[-1])
                    self.report.meta.setdefault("phase_s", {})[name] = round(
                        time.monotonic() - t, 1
                    )
                    self.evaluate()
                    self.save()
            finally:
                stop_all(list(self.servers.values()))
                for srv in self.servers.values():
                    if srv.proc is not None:
                        self.res(srv.spec.key)["exit_code"] = srv.proc.returncode
                    with contextlib.suppress(OSError):
                        facts = an.log_facts(srv.log_path.read_text(errors="replace"))
                        self.res(srv.spec.key)["log"] = facts
                self.report.meta["total_s"] = round(time.monotonic() - self.t0, 1)
                self.evaluate()
                self.save()
        print((self.out / "e2e.md").read_text())
        return 0

    def plan(self) -> list[an.ServerSpec]:
        a = self.args
        specs = an.plan_servers(
            a.gpus, deep_layers=a.deep_layers, base_port=a.base_port or 30000, tp2=a.tp2
        )
        if a.only:
            want = set(a.only.split(","))
            specs = [s for s in specs if s.key in want]
        if a.base_port == 0:  # dry runs pick free ports so parallel test runs never collide
            specs = [replace(s, port=free_port()) for s in specs]
        return specs

    def phases(self, vocab: int) -> list[tuple[str, float, list[str], Callable[[Any], None]]]:
        """(name, seconds it needs, servers, function) in priority order; a phase is skipped
        when time runs short or none of its servers is up."""
        a = self.args
        g8 = [s.key for s in self.specs if s.group == "tp1-8L"]
        deep = [s.key for s in self.specs if s.group.startswith("tp1-") and s.key not in g8]
        tp2 = [s.key for s in self.specs if s.group == "tp2-8L"]
        prompts = an.make_prompts(a.prompts, vocab)
        deep_prompts = prompts[:: max(1, len(prompts) // 4)][:4]
        return [
            ("greedy-8L", 30, g8, lambda h: self.phase_greedy(h, g8, prompts, a.greedy_tokens)),
            ("single-8L", 30, g8, lambda h: self.phase_single(h, g8, a.reps, a.tokens)),
            ("conc-8L", 30, g8, lambda _h: self.phase_concurrent(g8, a.conc_reps, 8, a.tokens)),
            ("canary-8L", 15, g8, lambda _h: self.phase_canary(g8, a.canary_n, a.tokens)),
            ("single-deep", 60, deep, lambda h: self.phase_single(h, deep, a.deep_reps, 64)),
            ("greedy-deep", 40, deep, lambda h: self.phase_greedy(h, deep, deep_prompts, 16)),
            ("canary-deep", 30, deep, lambda _h: self.phase_canary(deep, 2, 64)),
            ("greedy-tp2", 25, tp2, lambda h: self.phase_greedy(h, tp2, prompts, a.greedy_tokens)),
            ("single-tp2", 20, tp2, lambda h: self.phase_single(h, tp2, a.reps, a.tokens)),
            ("conc-tp2", 20, tp2, lambda _h: self.phase_concurrent(tp2, a.conc_reps, 8, a.tokens)),
            ("canary-tp2", 10, tp2, lambda _h: self.phase_canary(tp2, a.canary_n, a.tokens)),
        ]


def _vocab_of(model_dir: Path) -> int | None:
    try:
        return int(json.loads((model_dir / "config.json").read_text())["vocab_size"])
    except (OSError, ValueError, KeyError):
        return None


def _fmt_ms(v: float | None) -> str:
    return "—" if v is None else f"{v * 1e3:.3f}"


def gpu_count() -> int:
    try:
        q = subprocess.run(["nvidia-smi", "-L"], capture_output=True, text=True, timeout=20)
        return max(1, sum(1 for ln in q.stdout.splitlines() if ln.startswith("GPU ")))
    except (OSError, subprocess.TimeoutExpired):
        return 1


def parse_args(argv: Sequence[str]) -> argparse.Namespace:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--mode", choices=("device", "emulator"), required=True)
    p.add_argument("--out", required=True, help="results folder (e2e.json, e2e.md, logs/)")
    p.add_argument(
        "--deadline-s", type=float, default=450.0, help="stop starting phases after this"
    )
    p.add_argument("--ready-budget-s", type=float, default=330.0)
    p.add_argument("--extra-wait-s", type=float, default=60.0)
    p.add_argument("--gpus", type=int, default=0, help="GPUs to plan for (0 = ask nvidia-smi)")
    p.add_argument("--deep-layers", type=int, default=78, help="0 = no deep model")
    p.add_argument("--no-tp2", dest="tp2", action="store_false")
    p.add_argument(
        "--only", default="", help="comma-separated server keys (default: the whole plan)"
    )
    p.add_argument("--base-port", type=int, default=30000, help="0 = free ports")
    p.add_argument("--stagger-s", type=float, default=0.0)
    p.add_argument("--model-dir", default=str(REPO / "deploy" / "models"))
    p.add_argument("--profiles-dir", default=str(REPO / "deploy" / "profiles"))
    p.add_argument("--model", default="tiny-mla")
    p.add_argument("--vocab-size", type=int, default=0)
    p.add_argument("--prompts", type=int, default=16)
    p.add_argument("--greedy-tokens", type=int, default=32)
    p.add_argument("--tokens", type=int, default=128, help="output tokens per timed stream")
    p.add_argument("--reps", type=int, default=7)
    p.add_argument("--conc-reps", type=int, default=3)
    p.add_argument("--deep-reps", type=int, default=3, help="single streams per 78-layer server")
    p.add_argument("--canary-n", type=int, default=5)
    args = p.parse_args(argv)
    if args.gpus == 0:
        args.gpus = gpu_count() if args.mode == "device" else 1
    return args


def main(argv: Sequence[str] | None = None) -> int:
    args = parse_args(sys.argv[1:] if argv is None else argv)
    run = Run(args)

    def on_term(signum: int, _frame: Any) -> None:  # the device tool kills us at its limit
        raise KeyboardInterrupt(f"signal {signum}")

    signal.signal(signal.SIGTERM, on_term)
    return run.execute()


if __name__ == "__main__":
    sys.exit(main())
