#!/usr/bin/env python3
"""The current SGLang line's series end to end (issue 20): real servers of the current SGLang line (glmserve.sglang_lines.CURRENT_LINE) at GLM-5's
depth, on FlashAttention's MLA path (fa3, SGLang's SM90 default) and on flashinfer, each with the
upstream full-pool cast, the patched path and BF16 KV side by side. The case of upstream issue
#35291 (the fa3/flashinfer full-pool cast of a non-DSA MLA model), on a current line.

    python bench/e2e/lines.py --out DIR               # on the H200 (bench/device_run.sh lines)
    python bench/e2e/lines.py --out DIR --emulator    # local dry run of the whole flow

One phase per attention backend, its servers sharing the GPU (each started through our launcher,
profile tiny-mla-78l-sglang<line>: 78 layers, pool 495,552, CUDA graphs up to batch 64):

  fa3:        upstream (GLMSERVE_FP8_GATHER=0), patched (gather-then-cast through the page
              table: bit-identical by construction), bf16
  flashinfer: upstream, patched (the native FP8 decode kernel), gather (gather-then-cast,
              bit-identical), bf16

Measured per phase, round robin (every ratio from interleaved samples of one call): agreement of
each path with upstream on the recall model (bench/accuracy: one small server per path beside
the timing servers, same backend and switches; 16 queries per context at 2k and 8k, chunked
prefill, radix hits, one decode batch; native.py's check); TPOT of one stream after a 128-token and
after a 6,000-token prompt, of 16 streams (with tok/s), of 64 streams after 2,048-token prompts
(steady decode: glmserve.streaming's tail TPOT); upstream at 1 and 16 streams (it is ~10x slower).
Bars (the issue's): patched TPOT <= 1.05x BF16 KV and <= 0.15x upstream at 1 and 16 streams;
identical recall answers for the bit-identical paths, agreement reported for native.
Each server starts through the launcher's self-test (its class checks drive that line's backend
API; the 2026-12-01 run predates that and started with GLMSERVE_SKIP_SELFTEST=1).
Writes lines-e2e.json and lines-e2e.md under --out (rewritten after every step).
"""

from __future__ import annotations

import argparse
import datetime as dt
import json
import os
import shlex
import signal
import sys
import time
from dataclasses import replace
from pathlib import Path
from typing import Any

HERE = Path(__file__).resolve().parent
REPO = HERE.parent.parent
sys.path[:0] = [str(HERE), str(REPO / "bench" / "accuracy"), str(REPO / "src")]

import accuracy_bench as ab  # noqa: E402
import e2e_analysis as an  # noqa: E402
import harness  # noqa: E402
import native  # noqa: E402

from glmserve import sglang_lines  # noqa: E402

LINE = sglang_lines.CURRENT_LINE
PROFILE = f"tiny-mla-78l-sglang{LINE}"
LAYERS = 78
CUDA_GRAPH_MAX_BS = 64
# backend -> path -> (KV dtype, GLMSERVE_FP8_GATHER, GLMSERVE_FP8_ATTENTION, emulator cost model)
PHASES: dict[str, dict[str, tuple[str, str, str, str]]] = {
    "fa3": {
        "upstream": ("fp8_e4m3", "0", "gather", "upstream"),
        "patched": ("fp8_e4m3", "1", "gather", "patched"),
        "bf16": ("bf16", "1", "gather", "bf16"),
    },
    "flashinfer": {
        "upstream": ("fp8_e4m3", "0", "gather", "upstream"),
        "patched": ("fp8_e4m3", "1", "native", "patched"),
        "gather": ("fp8_e4m3", "1", "gather", "patched"),
        "bf16": ("bf16", "1", "native", "bf16"),
    },
}
# Paths whose KV rows are exactly upstream's: their greedy tokens must be identical.
BIT_IDENTICAL = {"fa3": ("patched",), "flashinfer": ("gather",)}
PORT_BASE = 31100


def log(msg: str) -> None:
    print(f"[lines-e2e +{time.monotonic() - T0:6.1f}s] {msg}", flush=True)


T0 = time.monotonic()


class Stop(Exception):
    """SIGTERM from the device job's hard stop: save what was measured and stop the servers."""


def _on_term(_signum: int, _frame: Any) -> None:
    raise Stop()


class Phase:
    def __init__(self, run: Run, backend: str) -> None:
        self.run, self.backend = run, backend
        self.paths = PHASES[backend]
        self.doc: dict[str, Any] = {"servers": {}, "greedy": {}, "timing": {}, "notes": []}
        self.servers: dict[str, harness.Server] = {}
        self.recall = None

    def start(self) -> None:
        a = self.run.args
        for i, (name, (kv, gather, attention, cost)) in enumerate(self.paths.items()):
            variant = {"fp8_e4m3": "fp8_patched", "bf16": "bf16"}[kv]
            port = harness.free_port() if a.emulator else PORT_BASE + 10 * len(self.run.phases) + i
            spec = an.ServerSpec(
                f"{self.backend}-{name}", f"lines-{self.backend}", variant, LAYERS, port,
                cuda_graph_max_bs=CUDA_GRAPH_MAX_BS, profile=a.profile,
            )  # fmt: skip
            out = self.run.out
            info = out / "buildinfo" / f"{self.backend}-{name}.json"
            env = dict(os.environ)
            env.update(
                GLMSERVE_FP8_GATHER=gather,
                GLMSERVE_FP8_ATTENTION=attention,
                GLMSERVE_EMULATOR_FP8_GATHER=gather,
                GLMSERVE_BUILD_INFO=str(info),
                # FA3 from sgl-kernel's flash_ops (bench/fa3_kernels.sh), not the kernels hub.
                SGLANG_USE_SGL_FA3_KERNEL="1",
            )
            paths = {
                "model": Path(a.model_dir) / "tiny-mla",
                "profiles": Path(a.profiles_dir),
                "build_info": info,
            }
            argv = harness.launch_argv(replace(spec), "emulator" if a.emulator else "device",
                                       paths, sys.executable)  # fmt: skip
            if a.emulator:
                argv[argv.index("--cost-model") + 1] = cost
            argv += ["--attention-backend", self.backend]  # after '--': SGLang's, last wins
            srv = harness.Server(spec, argv, env, out / "logs" / f"{self.backend}-{name}.log")
            self.servers[name] = srv
            self.doc["servers"][name] = {
                "argv": shlex.join(argv),
                "env": {"GLMSERVE_FP8_GATHER": gather, "GLMSERVE_FP8_ATTENTION": attention},
            }
            log(f"start {self.backend}/{name}: {shlex.join(argv)}")
            srv.start()
        # The agreement check's recall servers, on this backend (the profile's 78-layer override
        # undone: the checkpoint has its own 2 layers).
        self.recall = native.start_recall(
            a, self.run.out, {n: p[:3] for n, p in self.paths.items()}, self.doc,
            backend=self.backend, profile=a.profile, extra=("--json-model-override-args", "{}"),
            env={"SGLANG_USE_SGL_FA3_KERNEL": "1"},
            port_base=PORT_BASE + 50 + 10 * len(self.run.phases), prefix=f"recall-{self.backend}-",
        )  # fmt: skip

    def wait_ready(self, budget_s: float) -> list[str]:
        return native.wait_ready(self.servers, self.doc["servers"], budget_s, f"{self.backend}/")

    def greedy(self) -> None:
        """The agreement check on the recall servers (then stopped: they sit out the timing)."""
        if self.recall is not None:
            budget = self.run.args.ready_budget_s
            self.doc["greedy"] = native.measure_recall(self.recall, budget, self.doc)
        self.run.save()

    def timing(self, ready: list[str], prompts: dict[str, list[list[int]]]) -> None:
        a = self.run.args
        short, long = prompts["short"][0][:128], prompts["long"][0]
        for rep in range(a.reps):
            for name in [n for n in self.paths if n in ready]:  # round robin
                url = self.servers[name].url
                t = self.doc["timing"].setdefault(name, {})
                upstream = name == "upstream"
                try:
                    if not upstream or rep < a.upstream_reps:
                        t.setdefault("single_128", []).append(
                            native.stream_tpot(url, short, a.tokens)
                        )
                    if not upstream and rep < a.long_reps:
                        t.setdefault("single_6000", []).append(
                            native.stream_tpot(url, long, a.tokens)
                        )
                    if rep < (a.upstream_reps if upstream else a.conc_reps):
                        t.setdefault("conc_16", []).append(
                            native.concurrent_tpot(url, prompts["concurrent"], a.tokens)
                        )
                    if not upstream and rep < a.loaded_reps:
                        t.setdefault("loaded_64", []).append(
                            native.loaded_tpot(url, prompts["loaded"], native.LOADED_TOKENS, rep)
                        )
                except Exception as exc:
                    self.doc["notes"].append(
                        f"timing {name} rep {rep}: {type(exc).__name__}: {exc}"
                    )
            log(f"{self.backend}: timing round {rep + 1}/{a.reps}")
            self.summarize()
            self.run.save()

    def summarize(self) -> None:
        s: dict[str, Any] = {}
        for name, t in self.doc["timing"].items():
            conc, loaded = t.get("conc_16", []), t.get("loaded_64", [])
            s[name] = {
                "single_128_ms": native._ms(t.get("single_128")),
                "single_6000_ms": native._ms(t.get("single_6000")),
                "conc_16_ms": native._ms([c["tpot_median"] for c in conc]),
                "conc_16_tok_s": an.median(c["tok_s"] for c in conc) if conc else None,
                "loaded_64_steady_ms": native._ms([c["tail_tpot_median"] for c in loaded]),
                "loaded_64_tok_s": an.median(c["tok_s"] for c in loaded) if loaded else None,
            }
        bars = []
        p, b, u = s.get("patched", {}), s.get("bf16", {}), s.get("upstream", {})
        for key, label in (("single_128_ms", "1 stream"), ("conc_16_ms", "16 streams")):
            if p.get(key) and b.get(key):
                ratio = p[key] / b[key]
                bars.append({"bar": f"{self.backend}: patched TPOT <= 1.05x BF16 KV, {label}",
                             "value": ratio, "pass": ratio <= 1.05})  # fmt: skip
            if p.get(key) and u.get(key):
                ratio = p[key] / u[key]
                bars.append({"bar": f"{self.backend}: patched TPOT <= 0.15x upstream, {label}",
                             "value": ratio, "pass": ratio <= 0.15})  # fmt: skip
        for name in BIT_IDENTICAL[self.backend]:
            if self.doc["greedy"].get(name):
                same, total = ab.identical_everywhere(self.doc["greedy"], name)
                bars.append({"bar": f"{self.backend}: {name} greedy identical to upstream "
                             f"({total} recall queries)", "value": float(same), "pass": same})  # fmt: skip
        self.doc["summary"], self.doc["bars"] = s, bars

    def execute(self, http: Any, prompts: dict[str, list[list[int]]]) -> None:
        try:
            self.start()
            ready = self.wait_ready(self.run.args.ready_budget_s)
            self.run.save()
            self.greedy()
            self.timing(ready, prompts)
        finally:
            if self.recall is not None:
                self.recall.stop()
            harness.stop_all(list(self.servers.values()))
            for name, srv in self.servers.items():
                text = srv.log_path.read_text(errors="replace") if srv.log_path.exists() else ""
                self.doc["servers"][name]["log"] = an.log_facts(text)
                self.doc["servers"][name]["decode_path_log"] = [
                    ln for ln in text.splitlines()
                    if "glmserve FP8 KV decode" in ln or "cuda graph" in ln.lower()
                ][:3]  # fmt: skip
            self.summarize()
            self.run.save()


class Run:
    def __init__(self, args: argparse.Namespace) -> None:
        self.args = args
        self.out = Path(args.out)
        self.out.mkdir(parents=True, exist_ok=True)
        self.phases: dict[str, Phase] = {}
        self.doc: dict[str, Any] = {
            "what": f"SGLang {LINE}: upstream cast vs patched vs BF16 KV on fa3 and flashinfer, "
            "78 layers",
            "date": dt.datetime.now(dt.timezone.utc).strftime("%Y-%m-%d %H:%M UTC"),
            "command": shlex.join([sys.executable, *sys.argv]),
            "mode": "emulator" if args.emulator else "device",
            "profile": args.profile,
            "phases": {},
        }

    def save(self) -> None:
        self.doc["phases"] = {b: p.doc for b, p in self.phases.items()}
        self.doc["total_s"] = round(time.monotonic() - T0, 1)
        (self.out / "lines-e2e.json").write_text(json.dumps(self.doc, indent=1) + "\n")
        (self.out / "lines-e2e.md").write_text(markdown(self.doc))

    def execute(self) -> int:
        import httpx

        a = self.args
        vocab = json.loads((Path(a.model_dir) / "tiny-mla" / "config.json").read_text())
        prompts = native.token_prompts(vocab["vocab_size"], seed=11)
        signal.signal(signal.SIGTERM, _on_term)
        try:
            with httpx.Client() as http:
                for backend in a.backends:
                    phase = self.phases[backend] = Phase(self, backend)
                    phase.execute(http, prompts)
        except Stop:
            self.doc["stopped"] = "SIGTERM (the device job's hard stop): partial results"
        finally:
            self.save()
        print(markdown(self.doc))
        return 0


def markdown(doc: dict[str, Any]) -> str:
    def cell(v: Any, fmt: str) -> str:
        return "—" if v is None else format(v, fmt)

    lines = [
        f"# SGLang {LINE}: the full-pool cast on fa3 and flashinfer — {doc['date']} ({doc['mode']})",
        "",
        f"Command: `{doc['command']}`  ",
        f"Profile {doc['profile']}: tiny DeepSeek-V3-architecture MLA model, dummy weights, "
        f"{LAYERS} layers, pool {an.MAX_TOTAL_TOKENS:,}, CUDA graphs up to batch "
        f"{CUDA_GRAPH_MAX_BS}, each server through our launcher. TPOT in ms (median); 64 streams: "
        "2,048-token prompts, steady = the second half of each stream.",
        "",
        "| backend | path | 1 stream (128) | 1 stream (6,000) | 16 streams | 16 streams tok/s "
        "| 64 streams steady | 64 streams tok/s |",
        "|---|---|---|---|---|---|---|---|",
    ]
    for backend, ph in doc.get("phases", {}).items():
        for name, s in (ph.get("summary") or {}).items():
            lines.append(
                f"| {backend} | {name} | {cell(s['single_128_ms'], '.2f')} | "
                f"{cell(s['single_6000_ms'], '.2f')} | {cell(s['conc_16_ms'], '.2f')} | "
                f"{cell(s['conc_16_tok_s'], '.0f')} | {cell(s['loaded_64_steady_ms'], '.2f')} | "
                f"{cell(s['loaded_64_tok_s'], '.0f')} |"
            )
    lines += ["", "| bar | value | pass |", "|---|---|---|"]
    for ph in doc.get("phases", {}).values():
        for b in ph.get("bars", []):
            lines.append(f"| {b['bar']} | {b['value']:.3f} | {'PASS' if b['pass'] else 'MISS'} |")
    lines += ["", "## Agreement with upstream on the recall model (bench/accuracy)", ""]
    for backend, ph in doc.get("phases", {}).items():
        lines += [f"{backend}:", "", *ab.agreement_markdown(ph.get("greedy", {}), "upstream"), ""]
    lines += ["", "## Servers", ""]
    for backend, ph in doc.get("phases", {}).items():
        for name, s in ph.get("servers", {}).items():
            state = f"ready {s['ready_s']} s" if "ready_s" in s else s.get("error", "not started")
            lines.append(f"- {backend}/{name}: {s['env']}: {state}")
        lines += [f"- {backend}: {n}" for n in ph.get("notes", [])]
    if doc.get("stopped"):
        lines += ["", f"**{doc['stopped']}**"]
    return "\n".join(lines) + "\n"


def parse_args(argv: list[str]) -> argparse.Namespace:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--out", required=True)
    p.add_argument("--emulator", action="store_true", help="emulators stand in (dry run)")
    p.add_argument(
        "--backends",
        type=lambda v: [b for b in v.split(",") if b],
        default=list(PHASES),
        help="comma-separated phases, in order (default: fa3,flashinfer)",
    )
    p.add_argument("--profile", default=PROFILE)
    p.add_argument("--model-dir", default=str(REPO / "deploy" / "models"))
    p.add_argument("--profiles-dir", default=str(REPO / "deploy" / "profiles"))
    p.add_argument("--ready-budget-s", type=float, default=240.0)
    p.add_argument("--greedy-tokens", type=int, default=32, help="(unused: kept for old commands)")
    p.add_argument("--recall-model", default="/tmp/glmserve-recall/recall-mla",
                   help="the recall checkpoint for the agreement check (built there if absent)")  # fmt: skip
    p.add_argument("--recall-work", default="/tmp/glmserve-recall", help="its 16-head copy")
    p.add_argument("--tokens", type=int, default=128, help="output tokens per timed stream")
    p.add_argument("--reps", type=int, default=3)
    p.add_argument("--long-reps", type=int, default=2)
    p.add_argument("--conc-reps", type=int, default=2)
    p.add_argument("--loaded-reps", type=int, default=1)
    p.add_argument("--upstream-reps", type=int, default=1, help="upstream: 1 and 16 streams only")
    args = p.parse_args(argv)
    unknown = [b for b in args.backends if b not in PHASES]
    if unknown or not args.backends:
        p.error(f"--backends takes {', '.join(PHASES)} (got {', '.join(unknown) or 'none'})")
    return args


if __name__ == "__main__":
    sys.exit(Run(parse_args(sys.argv[1:])).execute())
