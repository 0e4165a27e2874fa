#!/usr/bin/env python3
"""Native FP8 decode end to end: real SGLang servers at GLM-5's depth, every KV path side by side.

    python bench/e2e/native.py --out DIR               # on the H200 (bench/device_run.sh native)
    python bench/e2e/native.py --out DIR --emulator    # local dry run of the whole flow

Four servers share one GPU, each started through our launcher (profile tiny-mla-78l: 78 layers,
pool 495,552, CUDA graphs up to batch 64, self-test included):

  upstream  FP8 KV, GLMSERVE_FP8_GATHER=0: SGLang's full-pool cast (the greedy reference)
  gather    FP8 KV, GLMSERVE_FP8_ATTENTION=gather: gather-then-cast + FlashInfer
  native    FP8 KV, GLMSERVE_FP8_ATTENTION=native: the native FP8 decode kernel
  bf16      BF16 KV: the speed to beat

Measured, round robin so that every ratio comes from interleaved samples of one call:
  * agreement of every path with upstream on a model whose answers depend on attention (the
    dummy weights' outputs do not): beside the four timing servers, one recall-model server
    per path (bench/accuracy, 2 layers, same switches) answers the recall task at 2k and 8k
    context (chunked prefill, radix hits, 16 concurrent requests); accuracy, outputs identical
    to upstream's, top-5 KL against upstream (the model is built by
    bench/accuracy/recall_build.py where --recall-model points, if it holds none);
  * TPOT of one stream after a 128-token prompt and after a 6,000-token prompt, of 16
    concurrent streams with their output tok/s, and of 64 concurrent streams after 2,048-token
    prompts: whole-stream TPOT, steady-decode TPOT (the second half of each stream, once the
    other streams' prefills are done: glmserve.streaming's tail TPOT) and output tok/s
    (upstream is not timed: ~10x slower).
Writes native-e2e.json and native-e2e.md under --out (rewritten after every phase).
"""

from __future__ import annotations

import argparse
import datetime as dt
import json
import os
import random
import shlex
import statistics
import subprocess
import sys
import time
from dataclasses import replace
from pathlib import Path
from typing import Any

HERE = Path(__file__).resolve().parent
REPO = HERE.parent.parent
# The working tree's glmserve first: the bundle's copy may predate this script.
sys.path[:0] = [str(HERE), str(REPO / "bench" / "accuracy"), str(REPO / "src")]

import accuracy_bench as ab  # noqa: E402
import e2e_analysis as an  # noqa: E402
import harness  # noqa: E402

from glmserve import sglang_api, streaming  # noqa: E402

LAYERS = 78
CUDA_GRAPH_MAX_BS = 64  # the 64-stream workload decodes inside graphs
# name -> (KV dtype, GLMSERVE_FP8_GATHER, GLMSERVE_FP8_ATTENTION, emulator cost model)
PATHS = {
    "upstream": ("fp8_e4m3", "0", "gather", "upstream"),
    "gather": ("fp8_e4m3", "1", "gather", "patched"),
    "native": ("fp8_e4m3", "1", "native", "patched"),
    "bf16": ("bf16", "1", "native", "bf16"),
}
TIMED = ("bf16", "gather", "native")
FP8 = ("gather", "native")
# --mtp: MTP (EAGLE over the model's own NextN layer, the profiles' recipe) on BF16 KV, native
# and gather, beside BF16 KV and native without it; no upstream server (it is ~10x slower and
# needs no new number). The pool is smaller, so that the servers fit one 80 GB card, and there
# is no agreement check (the recall model's MTP answers are bench/accuracy's).
MTP_ARGS = (
    "--speculative-algorithm", "EAGLE", "--speculative-num-steps", "3",
    "--speculative-eagle-topk", "1", "--speculative-num-draft-tokens", "4",
    "--max-running-requests", "64",
    "--json-model-override-args", '{"num_hidden_layers": 78, "num_nextn_predict_layers": 1}',
)  # fmt: skip
MTP_PATHS = {
    "bf16-mtp": ("bf16", "1", "native", "bf16"),
    "native-mtp": ("fp8_e4m3", "1", "native", "patched"),
    "gather-mtp": ("fp8_e4m3", "1", "gather", "patched"),
    "bf16": ("bf16", "1", "native", "bf16"),
    "native": ("fp8_e4m3", "1", "native", "patched"),
}
MTP_POOL_TOKENS = 200_000
LONG_PROMPT = 6000
SHARED_PREFIX = 1024
STREAMS = 16
LOADED_STREAMS, LOADED_PROMPT, LOADED_TOKENS = 64, 2048, 256
# The agreement check: recall-model servers per path, asked 16 queries about one haystack per
# context (the first prefills it in chunks, the rest hit the radix cache, all decode together).
RECALL_CONTEXTS, RECALL_QUERIES, RECALL_PORT_BASE = (2048, 8192), 16, 31300


def log(msg: str) -> None:
    print(f"[native-e2e +{time.monotonic() - T0:6.1f}s] {msg}", flush=True)


T0 = time.monotonic()


def token_prompts(vocab: int, seed: int) -> dict[str, list[list[int]]]:
    """Deterministic token-id prompt sets (ids above the special tokens at the bottom)."""
    rng = random.Random(seed)

    def ids(n: int) -> list[int]:
        return [rng.randrange(100, vocab) for _ in range(n)]

    prefix = ids(SHARED_PREFIX)
    return {
        "short": [ids(rng.randint(16, 300)) for _ in range(6)],
        "long": [ids(LONG_PROMPT)],
        "shared_prefix": [prefix + ids(rng.randint(8, 64)) for _ in range(4)],
        "concurrent": [ids(rng.randint(32, 512)) for _ in range(STREAMS)],
        "loaded": [ids(LOADED_PROMPT) for _ in range(LOADED_STREAMS)],
    }


def stream_timing(url: str, ids: list[int], max_tokens: int) -> streaming.StreamTiming:
    req = streaming.StreamRequest(route="generate", input_ids=tuple(ids), max_tokens=max_tokens)
    return streaming.time_stream(url, req, timeout_s=300.0)


def stream_tpot(url: str, ids: list[int], max_tokens: int) -> float | None:
    return stream_timing(url, ids, max_tokens).tpot_s


def record_single(t: dict[str, Any], key: str, timing: streaming.StreamTiming) -> None:
    """One single-stream sample: its TPOT under `key`, and beside it where the TPOT comes
    from under MTP (tokens per decode step; SGLang's acceptance length, None without MTP)."""
    t.setdefault(key, []).append(timing.tpot_s)
    t.setdefault(f"{key}_tokens_per_step", []).append(timing.tokens_per_step)
    t.setdefault(f"{key}_accept_length", []).append(timing.accept_length)


def concurrent_tpot(url: str, prompts: list[list[int]], max_tokens: int) -> dict[str, Any]:
    reqs = [
        streaming.StreamRequest(route="generate", input_ids=tuple(p), max_tokens=max_tokens)
        for p in prompts
    ]
    return harness.concurrent_requests(url, reqs)


def loaded_tpot(url: str, prompts: list[list[int]], max_tokens: int, salt: int) -> dict[str, Any]:
    """64 streams after 2,048-token prompts: whole-stream and steady-decode (tail) TPOT.

    Each round's prompts start with a different token, so no round is served from the radix
    cache of an earlier one (every round prefills all 64 prompts, as the first did)."""
    fresh = [[100 + (salt % 7), *p[1:]] for p in prompts]
    got = harness.concurrent_requests(
        url,
        [streaming.StreamRequest(route="generate", input_ids=tuple(p), max_tokens=max_tokens)
         for p in fresh],
        keep_timings=True,
    )  # fmt: skip
    tails = [t.tail_tpot_s() for t in got.pop("timings")]
    got["tail_tpot_median"] = an.median(t for t in tails if t is not None)
    return got


def wait_ready(
    servers: dict[str, harness.Server],
    records: dict[str, dict[str, Any]],
    budget_s: float,
    label: str = "",
) -> list[str]:
    """Poll the started servers until each is ready or failed, or the budget is spent; record
    `ready_s` or `error` under its name; return the ready names in start order."""
    end = time.monotonic() + budget_s
    pending = dict(servers)
    while pending and time.monotonic() < end:
        for name, srv in list(pending.items()):
            if srv.poll_ready():
                records[name]["ready_s"] = round(srv.ready_s or 0, 1)
                log(f"{label}{name} ready after {srv.ready_s:.0f} s")
                del pending[name]
            elif srv.error:
                records[name]["error"] = srv.error
                log(f"{label}{name} FAILED: {srv.error}")
                del pending[name]
        time.sleep(0.5)
    for name in pending:
        records[name]["error"] = f"not ready within {budget_s:.0f} s"
    return [n for n in servers if "ready_s" in records[n]]


def start_recall(
    a: argparse.Namespace, out: Path, paths: dict[str, tuple[str, str, str]], doc: dict[str, Any],
    backend: str = "flashinfer", profile: str = "tiny-mla", extra: tuple[str, ...] = (),
    env: dict[str, str] | None = None, port_base: int = RECALL_PORT_BASE, prefix: str = "recall-",
) -> ab.RecallCheck | None:  # fmt: skip
    """One recall-model server per path (same switches), started beside the timing servers;
    the model is built where --recall-model points if it holds none (a second on the CPU);
    None (and a note) if that fails."""
    model = Path(a.recall_model)
    if not (model / "model.safetensors").is_file():
        built = subprocess.run(
            [sys.executable, str(REPO / "bench" / "accuracy" / "recall_build.py"), "--out", str(model)],
            capture_output=True, text=True,
        )  # fmt: skip
        if built.returncode:
            doc["notes"].append(
                f"no agreement check: building the recall model failed: {built.stderr[-300:]}"
            )
            return None
    check = ab.RecallCheck(
        ab.recall_variants(paths, backend), model=model, work=Path(a.recall_work) / prefix,
        out=out, emulator=a.emulator, port_base=port_base, reference="upstream",
        profile=profile, profiles_dir=a.profiles_dir, extra=extra, prefix=prefix, env=env,
    )  # fmt: skip
    check.start()
    return check


def measure_recall(check: ab.RecallCheck, budget_s: float, doc: dict[str, Any]) -> dict[str, Any]:
    """Wait for the recall servers, ask every context, stop them; per path and context:
    accuracy, outputs identical to upstream's, KL against upstream."""
    check.wait_ready(budget_s)
    for ctx in RECALL_CONTEXTS:
        try:
            check.context(seed=1, ctx=ctx, stacks=1, per=RECALL_QUERIES)
        except Exception as exc:
            doc["notes"].append(f"recall check at {ctx} failed: {type(exc).__name__}: {exc}"[:300])
    results = check.results()
    check.stop()
    doc["recall_servers"] = check.docs
    doc["notes"] += check.notes
    return results


class Run:
    def __init__(self, args: argparse.Namespace) -> None:
        self.args = args
        self.out = Path(args.out)
        self.out.mkdir(parents=True, exist_ok=True)
        self.doc: dict[str, Any] = {
            "what": "native FP8 decode vs gather vs upstream vs BF16 KV, real SGLang, 78 layers",
            "date": dt.datetime.now(dt.timezone.utc).strftime("%Y-%m-%d %H:%M UTC"),
            "command": shlex.join([sys.executable, *sys.argv]),
            "mode": "emulator" if args.emulator else "device",
            "servers": {},
            "greedy": {},
            "timing": {k: {} for k in TIMED},
            "notes": [],
        }
        self.servers: dict[str, harness.Server] = {}
        self.recall: ab.RecallCheck | None = None
        self.paths = MTP_PATHS if args.mtp else PATHS
        if args.only:  # a subset of the paths (one card holds fewer servers than the mode has)
            self.paths = {k: v for k, v in self.paths.items() if k in args.only.split(",")}
        self.timed = tuple(self.paths) if args.mtp else TIMED
        self.doc["timing"] = {k: {} for k in self.timed}
        if args.mtp:
            self.doc["pool_tokens"] = MTP_POOL_TOKENS
            self.doc["what"] = (
                "MTP (EAGLE, NextN draft, 4 tokens per verify) on and off: native FP8 vs gather vs "
                "BF16 KV, real SGLang, 78 layers"
            )

    def save(self) -> None:
        (self.out / "native-e2e.json").write_text(json.dumps(self.doc, indent=1) + "\n")
        (self.out / "native-e2e.md").write_text(markdown(self.doc))

    def start(self) -> None:
        a = self.args
        base = 31000 if not a.emulator else harness.free_port()
        for i, (name, (kv, gather, attention, cost)) in enumerate(self.paths.items()):
            variant = {"fp8_e4m3": "fp8_patched", "bf16": "bf16"}[kv]
            port = base + i if not a.emulator else harness.free_port()
            spec = an.ServerSpec(
                name, "native-78L", variant, LAYERS, port, cuda_graph_max_bs=CUDA_GRAPH_MAX_BS,
                profile="tiny-mla-78l",
            )  # fmt: skip
            env = dict(os.environ)
            env.update(
                GLMSERVE_FP8_GATHER=gather,
                GLMSERVE_FP8_ATTENTION=attention,
                GLMSERVE_EMULATOR_FP8_GATHER=gather,
                GLMSERVE_BUILD_INFO=str(self.out / "buildinfo" / f"{name}.json"),
            )
            paths = {
                "model": Path(a.model_dir) / "tiny-mla",
                "profiles": Path(a.profiles_dir),
                "build_info": self.out / "buildinfo" / f"{name}.json",
            }
            mode = "emulator" if a.emulator else "device"
            argv = harness.launch_argv(replace(spec), mode, paths, sys.executable)
            if a.emulator:  # the emulator plays each path's cost model
                argv[argv.index("--cost-model") + 1] = cost
            elif a.mtp:  # after the profile's flags: these win
                argv[argv.index("--max-total-tokens") + 1] = str(MTP_POOL_TOKENS)
                override = {"num_hidden_layers": LAYERS}
                if a.heads:  # dummy weights: any head count (GLM-5 at TP8 has 8 per rank)
                    override.update(num_attention_heads=a.heads, num_key_value_heads=a.heads)
                if name.endswith("-mtp"):
                    argv += list(MTP_ARGS)
                    override["num_nextn_predict_layers"] = 1
                argv += ["--json-model-override-args", json.dumps(override)]
            srv = harness.Server(spec, argv, env, self.out / "logs" / f"{name}.log")
            self.servers[name] = srv
            self.doc["servers"][name] = {"argv": shlex.join(argv), "env": {
                "GLMSERVE_FP8_GATHER": gather, "GLMSERVE_FP8_ATTENTION": attention}}  # fmt: skip
            log(f"start {name}: {shlex.join(argv)}")
            srv.start()
        if not a.mtp:
            self.recall = start_recall(a, self.out, {n: p[:3] for n, p in PATHS.items()}, self.doc)

    def wait_ready(self, budget_s: float) -> list[str]:
        return wait_ready(self.servers, self.doc["servers"], budget_s)

    def greedy(self, http: Any, ready: list[str], prompts: dict[str, list[list[int]]]) -> None:
        """The agreement check, on the recall servers (then stopped: they sit out the timing)."""
        if self.recall is not None:
            self.doc["greedy"] = measure_recall(self.recall, self.args.ready_budget_s, self.doc)
        self.save()

    def timing(self, ready: list[str], prompts: dict[str, list[list[int]]]) -> None:
        a = self.args
        timed = [n for n in self.timed if n in ready]
        short = prompts["short"][0][:128]
        long = prompts["long"][0]
        for rep in range(a.reps):
            for name in timed:  # round robin: every path sampled in every round
                url, t = self.servers[name].url, self.doc["timing"][name]
                try:
                    record_single(t, "single_128", stream_timing(url, short, a.tokens))
                    if rep < a.long_reps:
                        record_single(t, "single_6000", stream_timing(url, long, a.tokens))
                    if rep < a.conc_reps:
                        t.setdefault("conc_16", []).append(
                            concurrent_tpot(url, prompts["concurrent"], a.tokens)
                        )
                    if rep < a.loaded_reps:
                        t.setdefault("loaded_64", []).append(
                            loaded_tpot(url, prompts["loaded"], LOADED_TOKENS, salt=rep)
                        )
                except Exception as exc:
                    self.doc["notes"].append(
                        f"timing {name} rep {rep}: {type(exc).__name__}: {exc}"
                    )
            log(f"timing round {rep + 1}/{a.reps}")
            self.summarize()
            self.save()

    def summarize(self) -> None:
        s: dict[str, Any] = {}
        for name in self.timed:
            t = self.doc["timing"][name]
            conc = t.get("conc_16", [])
            loaded = t.get("loaded_64", [])
            s[name] = {
                "single_128_ms": _ms(t.get("single_128")),
                "single_6000_ms": _ms(t.get("single_6000")),
                "conc_16_ms": _ms([c["tpot_median"] for c in conc]),
                "conc_16_tok_s": statistics.median([c["tok_s"] for c in conc]) if conc else None,
                "loaded_64_ms": _ms([c["tpot_median"] for c in loaded]),
                "loaded_64_steady_ms": _ms([c["tail_tpot_median"] for c in loaded]),
                "loaded_64_tok_s": (
                    statistics.median([c["tok_s"] for c in loaded]) if loaded else None
                ),
                **mtp_summary(t, conc, loaded),
            }
        bars = []
        # (FP8 path, its BF16 KV twin, the steady-decode bar at 64 streams)
        pairs = (
            [("native-mtp", "bf16-mtp", 0.95), ("native", "bf16", 0.9)]
            if self.args.mtp
            else [("native", "bf16", 0.9)]
        )
        for fp8, bf16, loaded_limit in pairs:
            if fp8 not in s or bf16 not in s:
                continue
            for key, label, limit in (
                ("single_128_ms", "single stream, 128-token prompt", 1.0),
                ("single_6000_ms", "single stream, 6,000-token prompt", 1.0),
                ("conc_16_ms", "16 streams", 1.0),
                ("loaded_64_steady_ms", "64 streams x 2,048-token prompts, steady decode",
                 loaded_limit),
            ):  # fmt: skip
                n, b = s[fp8][key], s[bf16][key]
                if n and b:
                    bars.append({"bar": f"TPOT {fp8} <= {limit}x {bf16}, {label}",
                                 "value": n / b, "pass": n <= limit * b})  # fmt: skip
            for key, label in (("conc_16_tok_s", "16-stream"), ("loaded_64_tok_s", "64-stream")):
                n, b = s[fp8][key], s[bf16][key]
                if n and b:
                    bars.append({"bar": f"{label} tok/s {fp8} >= {bf16}", "value": n / b,
                                 "pass": n >= b})  # fmt: skip
        self.doc["summary"], self.doc["bars"] = s, bars

    def execute(self) -> int:
        import httpx

        a = self.args
        vocab = json.loads((Path(a.model_dir) / "tiny-mla" / "config.json").read_text())[
            "vocab_size"
        ]
        prompts = token_prompts(vocab, seed=11)
        try:
            with httpx.Client() as http:
                self.start()
                ready = self.wait_ready(a.ready_budget_s)
                self.save()
                self.greedy(http, ready, prompts)
                self.timing(ready, prompts)
        finally:
            if self.recall is not None:
                self.recall.stop()
            harness.stop_all(list(self.servers.values()))
            for name, srv in self.servers.items():
                facts = an.log_facts(srv.log_path.read_text(errors="replace"))
                self.doc["servers"][name]["log"] = facts
                lines = [
                    ln
                    for ln in srv.log_path.read_text(errors="replace").splitlines()
                    if "glmserve FP8 KV decode" in ln or "cuda graph" in ln.lower()
                ]
                self.doc["servers"][name]["decode_path_log"] = lines[:3]
            self.doc["total_s"] = round(time.monotonic() - T0, 1)
            self.summarize()
            self.save()
        print(markdown(self.doc))
        return 0


def _ms(values: list[float | None] | None) -> float | None:
    vals = [v for v in values or [] if v is not None]
    return statistics.median(vals) * 1e3 if vals else None


MTP_WORKLOADS = ("single_128", "single_6000", "conc_16", "loaded_64")


def mtp_summary(
    t: dict[str, Any], conc: list[dict[str, Any]], loaded: list[dict[str, Any]]
) -> dict[str, float | None]:
    """Per workload, medians of tokens per decode step and of SGLang's acceptance length
    (glmserve.streaming): 1 and None without MTP."""

    def med(values: list[Any]) -> float | None:
        present = [v for v in values if v is not None]
        return statistics.median(present) if present else None

    out: dict[str, float | None] = {}
    for name in ("single_128", "single_6000"):
        for fig in ("tokens_per_step", "accept_length"):
            out[f"{name}_{fig}"] = med(t.get(f"{name}_{fig}", []))
    for name, rounds in (("conc_16", conc), ("loaded_64", loaded)):
        for fig in ("tokens_per_step", "accept_length"):
            out[f"{name}_{fig}"] = med([c.get(fig) for c in rounds])
    return out


def markdown(doc: dict[str, Any]) -> str:
    lines = [
        f"# Native FP8 decode end to end — {doc['date']} ({doc['mode']})",
        "",
        f"Command: `{doc['command']}`  ",
        f"Real SGLang {sglang_api.SGLANG_VERSION} (device mode), tiny MLA model with dummy weights at 78 layers, "
        f"pool {doc.get('pool_tokens', 495_552):,}, CUDA graphs up to batch {CUDA_GRAPH_MAX_BS}, "
        "every server started "
        "through our launcher. 64 streams: 2,048-token prompts, 256 tokens each; steady = "
        "median over streams of the TPOT of each stream's second half.",
        "",
        "| path | single 128 TPOT ms | single 6,000 TPOT ms | 16 streams TPOT ms | 16 streams tok/s "
        "| 64 streams TPOT ms | 64 streams steady TPOT ms | 64 streams tok/s |",
        "|---|---|---|---|---|---|---|---|",
    ]
    for name, s in (doc.get("summary") or {}).items():
        ms = [s["single_128_ms"], s["single_6000_ms"], s["conc_16_ms"]]
        ms2 = [s.get("loaded_64_ms"), s.get("loaded_64_steady_ms")]

        def cell(v, fmt):
            return "—" if v is None else format(v, fmt)

        lines.append(
            f"| {name} | " + " | ".join(cell(v, ".3f") for v in ms)
            + f" | {cell(s['conc_16_tok_s'], '.0f')} | "
            + " | ".join(cell(v, ".3f") for v in ms2)
            + f" | {cell(s.get('loaded_64_tok_s'), '.0f')} |"
        )  # fmt: skip
    lines += [
        "",
        "Where the TPOT comes from (MTP): tokens per decode step as the client saw them / "
        "SGLang's acceptance length (meta_info.spec_verify_ct; — without speculative decoding).",
        "",
        "| path | " + " | ".join(MTP_WORKLOADS) + " |",
        "|---|" + "---|" * len(MTP_WORKLOADS),
    ]
    for name, s in (doc.get("summary") or {}).items():

        def pair(w: str, s: dict[str, Any] = s) -> str:
            steps, accept = s.get(f"{w}_tokens_per_step"), s.get(f"{w}_accept_length")
            return (
                ("—" if steps is None else f"{steps:.2f}")
                + " / "
                + ("—" if accept is None else f"{accept:.2f}")
            )

        lines.append(f"| {name} | " + " | ".join(pair(w) for w in MTP_WORKLOADS) + " |")
    lines += ["", "| bar | ratio | pass |", "|---|---|---|"]
    for b in doc.get("bars", []):
        lines.append(f"| {b['bar']} | {b['value']:.3f} | {'PASS' if b['pass'] else 'MISS'} |")
    lines += ["", "## Agreement with upstream (FP8 full-pool cast), recall model", ""]
    lines += [
        "Greedy answers of one recall-model server per path (2 layers, 16 heads, the same "
        "switches; bench/accuracy) to 16 queries about one haystack per context: the first "
        "prefills it in 4,096-token chunks, the rest hit the radix cache and decode together.",
        "",
    ]
    lines += ab.agreement_markdown(doc.get("greedy", {}), "upstream")
    lines += ["", "## Servers", ""]
    for name, s in doc.get("servers", {}).items():
        state = f"ready {s['ready_s']} s" if "ready_s" in s else s.get("error", "not started")
        lines.append(f"- {name}: {s['env']}: {state}; {'; '.join(s.get('decode_path_log', []))}")
    if doc.get("notes"):
        lines += ["", "## Notes", ""] + [f"- {n}" for n in doc["notes"]]
    return "\n".join(lines) + "\n"


def parse_args(argv: list[str]) -> argparse.Namespace:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--out", required=True)
    p.add_argument("--emulator", action="store_true", help="emulators stand in (dry run)")
    p.add_argument("--model-dir", default=str(REPO / "deploy" / "models"))
    p.add_argument("--profiles-dir", default=str(REPO / "deploy" / "profiles"))
    p.add_argument("--ready-budget-s", type=float, default=330.0)
    p.add_argument("--greedy-tokens", type=int, default=32, help="(unused: kept for old commands)")
    p.add_argument("--recall-model", default="/tmp/glmserve-recall/recall-mla",
                   help="the recall checkpoint for the agreement check (built there if absent)")  # fmt: skip
    p.add_argument("--recall-work", default="/tmp/glmserve-recall", help="its 16-head copy")
    p.add_argument("--tokens", type=int, default=128, help="output tokens per timed stream")
    p.add_argument("--reps", type=int, default=5)
    p.add_argument("--long-reps", type=int, default=3)
    p.add_argument("--conc-reps", type=int, default=3)
    p.add_argument("--loaded-reps", type=int, default=2)
    p.add_argument(
        "--mtp", action="store_true",
        help="MTP on (BF16 KV, native, gather) beside BF16 KV and native without it",
    )  # fmt: skip
    p.add_argument("--only", default="", help="comma-separated paths to start (default: all)")
    p.add_argument(
        "--heads", type=int, default=0, help="--mtp: attention heads (default: the model's)"
    )
    return p.parse_args(argv)


if __name__ == "__main__":
    sys.exit(Run(parse_args(sys.argv[1:])).execute())
