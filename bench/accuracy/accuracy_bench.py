#!/usr/bin/env python3
"""Task accuracy and logprob agreement of every FP8 KV path, through real SGLang servers that run
a model whose answers need the right KV rows (the recall model: bench/accuracy/recall_build.py).

    python bench/accuracy/accuracy_bench.py --out DIR --model M --site SITE   # lab GPU (device_run.sh accuracy)
    python bench/accuracy/accuracy_bench.py --out DIR --model M --emulator    # the client logic, no GPU

Servers (each through our launcher, profile tiny-mla with the real weights: --load-format auto;
started together, measured interleaved; self-test skipped, the decode path pinned instead):

  bf16        BF16 KV, flashinfer: the reference every KL is taken against
  upstream    FP8 KV, GLMSERVE_FP8_GATHER=0: SGLang's full-pool cast
  gather      FP8 KV, GLMSERVE_FP8_ATTENTION=gather: gather-then-cast + FlashInfer
  native      FP8 KV, GLMSERVE_FP8_ATTENTION=native: the native FP8 decode kernel
  triton      FP8 KV, SGLang's own --attention-backend triton (quantizes q to FP8): the peer
  *-8h        the same model with 8 heads (GLM-5 per rank at TP8; the native kernel's <= 8-head
              tile form); the 16-head servers run its exact widening (16-head tile form)
  *-mtp       MTP on: the NextN layer as EAGLE draft, 3 steps, top-1, 4 draft tokens
  miswired    native decode loading each row's first latent block from the second
              (miswire-native-latent-block.diff applied to a copy of the patched tree: a slip
              the launcher's preflight cannot see): the check must fail it (< 50 %)

Workload per context length (2k, 8k, 32k tokens): haystacks of key -> value records
(recall_task.bench_set, seeded), each asked about many keys. Per haystack, every server gets the
first query alone (a cold prefill, chunked by --chunked-prefill-size 4096 into extends over the
FP8 pool), then the rest concurrently (radix prefix hits: the haystack is cached; several
requests decode in one batch). Greedy, 8 new tokens, top-5 logprobs at every output position.
Extends with a cached prefix run the absorbed MLA path at every length
(SGLANG_CHUNKED_PREFIX_CACHE_THRESHOLD raised), so the patched extend path serves them all.
Measured: exact-match accuracy (all 8 answer tokens), per-token accuracy, KL(bf16 || server) over
the top-5 buckets and |d logprob| of bf16's chosen token (positions up to the first divergence),
radix-cached tokens, MTP acceptance length (meta_info spec_accept_length = completion tokens /
verify steps). Bars: BF16 >= 95 % at 8k; native and gather within 1 point of BF16 at every
length and KL no larger than upstream's; MTP acceptance >= 2.5 with BF16 KV; miswired < 50 %.
Writes accuracy.json and accuracy.md under --out after every phase.
"""

from __future__ import annotations

import argparse
import contextlib
import datetime as dt
import importlib.metadata
import json
import os
import shlex
import shutil
import signal
import subprocess
import sys
import time
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

HERE = Path(__file__).resolve().parent
REPO = HERE.parent.parent
sys.path[:0] = [str(HERE), str(REPO / "bench" / "e2e"), str(REPO / "src")]

import e2e_analysis as an  # noqa: E402
import recall_task as task  # noqa: E402

from glmserve import sglang_api  # noqa: E402
from glmserve.serverproc import ServerProcess, free_port, stop_all  # noqa: E402

MISWIRE_DIFF = HERE / "miswire-native-latent-block.diff"
PORT_BASE = 31200
TOP_K = 5
CONCURRENCY = 16
POOL_TOKENS = 131072  # 32k haystacks + every concurrent query's tail, radix-shared
CHUNK = 4096


@dataclass(frozen=True)
class Variant:
    what: str
    heads: int = 16
    kv: str = "fp8_e4m3"
    gather: str = "1"  # GLMSERVE_FP8_GATHER
    attention: str = "native"  # GLMSERVE_FP8_ATTENTION
    backend: str = "flashinfer"
    mtp: bool = False
    miswired: bool = False

    @property
    def cost(self) -> str:  # the emulator's cost model for this path
        if self.kv == "bf16":
            return "bf16"
        return "upstream" if self.gather == "0" else "patched"


VARIANTS: dict[str, Variant] = {
    "bf16": Variant("BF16 KV (the reference)", kv="bf16"),
    "upstream": Variant("FP8 KV, SGLang's full-pool cast", gather="0", attention="gather"),
    "gather": Variant("FP8 KV, gather-then-cast", attention="gather"),
    "native": Variant("FP8 KV, native FP8 decode"),
    "triton": Variant("FP8 KV, SGLang's triton backend (FP8 q)", backend="triton"),
    "bf16-8h": Variant("BF16 KV, 8 heads", heads=8, kv="bf16"),
    # Beside gather-8h: the gather is bit-identical to this cast by construction, so an answer
    # only gather-8h gets wrong is the gather's, one both get wrong is FlashInfer's on FP8 values.
    "upstream-8h": Variant(
        "FP8 KV, SGLang's full-pool cast, 8 heads", heads=8, gather="0", attention="gather"
    ),
    "gather-8h": Variant("FP8 KV, gather-then-cast, 8 heads", heads=8, attention="gather"),
    "native-8h": Variant("FP8 KV, native FP8 decode, 8 heads", heads=8),
    "bf16-mtp": Variant("BF16 KV, MTP (EAGLE 3 steps)", kv="bf16", mtp=True),
    "native-mtp": Variant("FP8 KV, native, MTP (verify and draft native too)", mtp=True),
    "miswired": Variant("FP8 KV, native loading latent block 1 as block 0", miswired=True),
}
REFERENCE = "bf16"
# name -> (haystacks, queries per haystack)
CONTEXTS = {2048: (4, 32), 8192: (3, 32), 32768: (2, 40)}
MTP_ARGS = [
    "--speculative-algorithm", "EAGLE", "--speculative-num-steps", "3",
    "--speculative-eagle-topk", "1", "--speculative-num-draft-tokens", "4",
]  # fmt: skip


def log(msg: str) -> None:
    print(f"[accuracy +{time.monotonic() - T0:6.1f}s] {msg}", flush=True)


T0 = time.monotonic()


class Stop(Exception):
    """SIGTERM (the device job's hard stop): save what was measured, stop the servers."""


# ---------------------------------------------------------------- servers


def sglang_args(v: Variant) -> list[str]:
    """After '--' on the launcher's command line: SGLang's, and the last of a flag wins."""
    args = [
        "--load-format", "auto",  # the profile's dummy weights replaced by the trained ones
        "--attention-backend", v.backend,
        "--kv-cache-dtype", "bf16" if v.kv == "bf16" else v.kv,
        "--max-total-tokens", str(POOL_TOKENS),
        # Servers share the GPU: each takes what it needs when it starts (the pool is capped).
        "--mem-fraction-static", "0.9",
        "--cuda-graph-max-bs", str(CONCURRENCY),
        "--max-running-requests", str(2 * CONCURRENCY),
        "--chunked-prefill-size", str(CHUNK),
        "--sleep-on-idle",
    ]  # fmt: skip
    return args + (MTP_ARGS if v.mtp else [])


def launch_argv(
    v: Variant, port: int, model: Path, build_info: Path, emulator: bool,
    profile: str = "tiny-mla", profiles_dir: str = str(REPO / "deploy" / "profiles"),
    extra: tuple[str, ...] = (),
) -> list[str]:  # fmt: skip
    py = sys.executable
    if emulator:
        return [
            py, "-m", "glmserve.emulator", "--host", "127.0.0.1", "--port", str(port),
            "--tpot-ms", "1.0", "--ttft-ms", "2", "--cost-model", v.cost, "--layers", "2",
            "--kv-cache-dtype", v.kv, "--tp-size", "1", "--max-total-tokens", str(POOL_TOKENS),
            "--model-path", str(model), "--build-info-file", str(build_info), "--health-delay-s", "0",
        ]  # fmt: skip
    return [
        py, "-m", "glmserve.launch", "--profile", profile, "--profiles-dir", profiles_dir,
        "--model-path", str(model), "--tp", "1", "--host", "127.0.0.1", "--port", str(port),
        "--build-info", str(build_info), "--", *sglang_args(v), *extra,
    ]  # fmt: skip


def server_env(v: Variant, build_info: Path, miswired_site: Path | None) -> dict[str, str]:
    env = dict(os.environ)
    env.update(
        GLMSERVE_FP8_GATHER=v.gather,
        GLMSERVE_FP8_ATTENTION=v.attention,
        GLMSERVE_EMULATOR_FP8_GATHER=v.gather,
        GLMSERVE_BUILD_INFO=str(build_info),
        # Not what this bench measures, and ~30 s of GPU time per server; the path is pinned.
        GLMSERVE_SKIP_SELFTEST="1",
        # Every extend over a cached prefix takes the absorbed MLA path (the patched one), also
        # past SGLang's default 8,192-token switch to its MHA-over-the-prefix path.
        SGLANG_CHUNKED_PREFIX_CACHE_THRESHOLD="1000000000",
        NCCL_NVLS_ENABLE="0",
        TORCH_SYMM_MEM_DISABLE_MULTICAST="1",
        NVSHMEM_DISABLE_NVLS="1",
    )
    if v.miswired and miswired_site is not None:
        env["PYTHONPATH"] = os.pathsep.join([str(miswired_site), env.get("PYTHONPATH", "")])
    return env


def prepare_miswired_site(site: Path, dest: Path, diff: Path = MISWIRE_DIFF) -> Path:
    """A copy of the patched `sglang` package (and its dist-info) with the miswiring applied by
    the strict unified-diff applier; raises PatchError if the diff no longer fits the tree.
    The copy's patch marker records the miswired bytes, as it would for a bug shipped inside
    the series: the launcher's preflight (file hashes, wiring rules) then judges the tree, and
    what a preflight cannot see is what this server exists to show."""
    from glmserve.series import read_marker
    from glmserve.series.engine import marker_bytes
    from glmserve.series.lock import MARKER_REL, sha256_bytes
    from glmserve.series.udiff import apply_file_patch, parse_patch

    if dest.exists():
        shutil.rmtree(dest)
    dest.mkdir(parents=True)
    ignore = shutil.ignore_patterns("__pycache__")
    shutil.copytree(site / "sglang", dest / "sglang", ignore=ignore)
    for info in site.glob("sglang-*.dist-info"):
        shutil.copytree(info, dest / info.name, ignore=ignore)
    for fp in parse_patch(diff.read_bytes(), diff.name):
        target = dest / fp.path
        new = apply_file_patch(target.read_bytes(), fp, diff.name)
        assert new is not None
        target.write_bytes(new)
        marker = read_marker(dest)
        if marker is not None and fp.path in marker.get("files", {}):
            marker["files"][fp.path]["after"] = sha256_bytes(new)
            (dest / MARKER_REL).write_bytes(marker_bytes(marker))
    return dest


# ---------------------------------------------------------------- requests


@dataclass
class Outcome:
    """One request's answer on one server."""

    ids: list[int] = field(default_factory=list)
    top: list[list[tuple[float, int]]] = field(default_factory=list)
    chosen: list[tuple[float, int]] = field(default_factory=list)
    cached: int = 0
    prompt: int = 0
    accept_length: float | None = None
    verify_ct: int | None = None
    completion: int = 0
    error: str = ""


def request_body(hay_json: str, key: int, logprobs: bool) -> bytes:
    """The /generate body, built around the haystack's ids serialized once (32k ints each)."""
    params = {"temperature": 0.0, "max_new_tokens": task.VALUE_LEN, "ignore_eos": True}
    extra = f',"return_logprob":true,"top_logprobs_num":{TOP_K}' if logprobs else ""
    return (
        f'{{"input_ids":[{hay_json},{task.QUERY_ID},{key}],'
        f'"sampling_params":{json.dumps(params)}{extra}}}'
    ).encode()


def generate(client: Any, url: str, body: bytes) -> Outcome:
    try:
        r = client.post(url + sglang_api.GENERATE, content=body, timeout=180.0,
                        headers={"content-type": "application/json"})  # fmt: skip
        r.raise_for_status()
        got = r.json()
    except Exception as exc:
        return Outcome(error=f"{type(exc).__name__}: {exc}"[:300])
    meta = got.get("meta_info") or {}
    return Outcome(
        ids=[int(t) for t in got.get("output_ids") or []],
        top=task.parse_top_logprobs(meta),
        chosen=task.parse_token_logprobs(meta),
        cached=int(meta.get("cached_tokens") or 0),
        prompt=int(meta.get("prompt_tokens") or 0),
        accept_length=meta.get("spec_accept_length"),
        verify_ct=meta.get("spec_verify_ct"),
        completion=int(meta.get("completion_tokens") or 0),
    )


def ask_haystack(url: str, hay_json: str, keys: list[int], logprobs: bool) -> list[Outcome]:
    """The first key alone (it prefills the haystack), then the rest at once (radix hits)."""
    import httpx

    with httpx.Client() as client:
        first = generate(client, url, request_body(hay_json, keys[0], logprobs))
    out = [first]

    def one(key: int) -> Outcome:
        with httpx.Client() as c:
            return generate(c, url, request_body(hay_json, key, logprobs))

    with ThreadPoolExecutor(CONCURRENCY) as pool:
        out += list(pool.map(one, keys[1:]))
    return out


# ---------------------------------------------------------------- a set of recall servers


class RecallCheck:
    """Recall-model servers, one per variant, and what they answered: this bench's whole run,
    and the agreement check bench/e2e/native.py and lines.py run beside their dummy-weight
    timing servers (whose outputs cannot depend on attention)."""

    def __init__(
        self, variants: dict[str, Variant], *, model: Path, work: Path, out: Path,
        emulator: bool, port_base: int, reference: str, profile: str = "tiny-mla",
        profiles_dir: str = str(REPO / "deploy" / "profiles"), site: str = "",
        extra: tuple[str, ...] = (), prefix: str = "", env: dict[str, str] | None = None,
    ) -> None:  # fmt: skip
        self.variants = dict(variants)
        self.model, self.work, self.out = Path(model), Path(work), Path(out)
        self.emulator, self.port_base, self.reference = emulator, port_base, reference
        self.profile, self.profiles_dir, self.site, self.extra = profile, profiles_dir, site, extra
        self.prefix = prefix  # log and file names: beside other servers of a bench
        self.env = env or {}  # more environment for every server (e.g. SGLANG_USE_SGL_FA3_KERNEL)
        self.servers: dict[str, ServerProcess] = {}
        self.docs: dict[str, dict[str, Any]] = {}
        self.notes: list[str] = []
        self.queries: dict[int, list[task.Query]] = {}
        self.outcomes: dict[str, dict[int, list[Outcome]]] = {n: {} for n in self.variants}

    def note(self, msg: str) -> None:
        self.notes.append(msg)
        log(msg)

    def start(self) -> None:
        wide = self.work / "recall-mla-16h"
        if any(v.heads == 16 for v in self.variants.values()):
            self.widen(self.model, wide)
        miswired_site = None
        if any(v.miswired for v in self.variants.values()) and not self.emulator:
            try:
                miswired_site = prepare_miswired_site(Path(self.site), self.work / "miswired-site")
                log(f"miswired tree ready: {miswired_site}")
            except Exception as exc:
                self.note(f"miswired server left out: {MISWIRE_DIFF.name} does not apply: {exc}")
                self.variants = {n: v for n, v in self.variants.items() if not v.miswired}
        for i, (name, v) in enumerate(self.variants.items()):
            port = free_port() if self.emulator else self.port_base + i
            tag = self.prefix + name
            info = self.out / "buildinfo" / f"{tag}.json"
            model = self.model if v.heads == 8 else wide
            argv = launch_argv(v, port, model, info, self.emulator, self.profile,
                               self.profiles_dir, self.extra)  # fmt: skip
            env = {**server_env(v, info, miswired_site), **self.env}
            srv = ServerProcess(argv, env, self.out / "logs" / f"{tag}.log", f"http://127.0.0.1:{port}",
                                pid_file=os.environ.get("E2E_PGID_FILE"))  # fmt: skip
            self.servers[name] = srv
            self.docs[name] = {"what": v.what, "argv": shlex.join(argv), "env": {
                k: env[k] for k in ("GLMSERVE_FP8_GATHER", "GLMSERVE_FP8_ATTENTION")}}  # fmt: skip
            srv.start()
        log(f"started {len(self.servers)} recall servers: {', '.join(self.servers)}")

    def widen(self, narrow: Path, wide: Path) -> None:
        """The 16-head checkpoint: recall_model.widen of the 8-head one (the same function)."""
        import recall_model as rm

        model = rm.read_checkpoint(narrow)
        if model.shape.heads != 8:
            raise SystemExit(f"accuracy_bench: {narrow} has {model.shape.heads} heads, not 8")
        rm.write_checkpoint(rm.widen(model), wide)
        log(f"16-head checkpoint written to {wide}")

    def poll(self, pending: dict[str, ServerProcess]) -> None:
        """One round of readiness polls over `pending` (ready or failed ones leave it)."""
        for name, srv in list(pending.items()):
            if srv.poll_ready():
                self.docs[name]["ready_s"] = round(srv.ready_s or 0, 1)
                log(f"{self.prefix}{name} ready after {srv.ready_s:.0f} s")
                del pending[name]
            elif srv.error:
                self.docs[name]["error"] = srv.error
                log(f"{self.prefix}{name} FAILED: {srv.error}")
                del pending[name]

    def wait_ready(self, budget_s: float) -> list[str]:
        end = time.monotonic() + budget_s
        pending = dict(self.servers)
        while pending and time.monotonic() < end:
            self.poll(pending)
            time.sleep(0.5)
        for name in pending:
            self.docs[name]["error"] = f"not ready within {budget_s:.0f} s"
        return self.ready()

    def ready(self) -> list[str]:
        return [n for n in self.servers if "ready_s" in self.docs[n]]

    def context(self, seed: int, ctx: int, stacks: int, per: int) -> None:
        """Every ready server asked the same queries at once (interleaved)."""
        hays, queries = task.bench_set(seed, ctx, stacks, per)
        self.queries[ctx] = queries
        ready = self.ready()
        for name in ready:
            self.outcomes[name][ctx] = [Outcome(error="not asked") for _ in queries]
        for h, hay in enumerate(hays):
            hay_json = ",".join(map(str, hay.ids))
            idx = [i for i, q in enumerate(queries) if q.haystack == h]
            keys = [queries[i].key for i in idx]

            def serve(
                name: str, hay_json: str = hay_json, keys: list[int] = keys
            ) -> tuple[str, list[Outcome]]:
                logprobs = not self.variants[name].mtp
                return name, ask_haystack(self.servers[name].url, hay_json, keys, logprobs)

            with ThreadPoolExecutor(max(1, len(ready))) as pool:
                for name, got in pool.map(serve, ready):
                    for i, o in zip(idx, got, strict=True):
                        self.outcomes[name][ctx][i] = o

    def results(self) -> dict[str, Any]:
        """Per server and context: accuracy, errors, radix hits, acceptance length, and
        agreement with the reference server (KL, |d logprob|, identical outputs)."""
        res: dict[str, Any] = {}
        for name in self.variants:
            per: dict[str, Any] = {}
            for ctx, outs in self.outcomes.get(name, {}).items():
                qs = self.queries[ctx]
                s = task.score([o.ids for o in outs], [q.answer for q in qs])
                r: dict[str, Any] = {**s.as_dict(), "errors": sum(bool(o.error) for o in outs)}
                errs = [o.error for o in outs if o.error]
                if errs:
                    r["first_error"] = errs[0]
                prompt = sum(o.prompt for o in outs)
                r["cached_fraction"] = sum(o.cached for o in outs) / prompt if prompt else None
                verify = sum(o.verify_ct or 0 for o in outs)
                if verify:
                    r["accept_length"] = sum(o.completion for o in outs if o.verify_ct) / verify
                ref = self.outcomes.get(self.reference, {}).get(ctx)
                if ref is not None and name != self.reference:
                    r["identical_to_reference"] = sum(
                        m.ids == t.ids for m, t in zip(outs, ref, strict=True) if not m.error
                    )
                    agree = task.Agreement()
                    for mine, theirs in zip(outs, ref, strict=True):
                        if mine.top and theirs.top:
                            agree.add(
                                theirs.ids,
                                mine.ids,
                                theirs.top,
                                mine.top,
                                theirs.chosen,
                                mine.chosen,
                            )
                    r["vs_reference"] = agree.as_dict() if agree.outputs else None
                    # Each divergent answer, to look at (a near tie, or one request of a batch).
                    r["divergent"] = [
                        {"haystack": q.haystack, "key": q.key, "answer": list(q.answer),
                         "ref": t.ids, "got": m.ids, "ref_top": t.top[:4], "got_top": m.top[:4]}
                        for q, m, t in zip(qs, outs, ref, strict=True)
                        if m.ids != t.ids and not m.error
                    ][:8]  # fmt: skip
                up = self.outcomes.get("upstream", {}).get(ctx)
                if up is not None and name != "upstream":
                    r["identical_to_upstream"] = sum(
                        m.ids == u.ids for m, u in zip(outs, up, strict=True) if not m.error
                    )
                per[str(ctx)] = r
            res[name] = per
        return res

    def stop(self) -> None:
        stop_all(list(self.servers.values()))
        for name, srv in self.servers.items():
            text = srv.log_path.read_text(errors="replace") if srv.log_path.exists() else ""
            d = self.docs[name]
            d["log"] = an.log_facts(text)
            d["decode_path_log"] = [
                ln for ln in text.splitlines()
                if "glmserve FP8 KV decode" in ln or "self-test" in ln or "Traceback" in ln
            ][:4]  # fmt: skip
            if "error" in d:
                d["log_tail"] = text.splitlines()[-15:]


def recall_variants(
    paths: dict[str, tuple[str, str, str]], backend: str = "flashinfer"
) -> dict[str, Variant]:
    """Recall servers for a timing bench's paths: name -> (KV dtype, GLMSERVE_FP8_GATHER,
    GLMSERVE_FP8_ATTENTION), 16 heads, on `backend`."""
    return {
        name: Variant(
            f"recall model, {name}", kv=kv, gather=gather, attention=attention, backend=backend
        )
        for name, (kv, gather, attention) in paths.items()
    }


def identical_everywhere(results: dict[str, Any], name: str) -> tuple[bool, int]:
    """(every answered query's output equals the reference's, queries compared)."""
    per = results.get(name) or {}
    total = sum(r["queries"] for r in per.values())
    same = bool(per) and all(
        r.get("identical_to_reference") == r["queries"] and not r["errors"] for r in per.values()
    )
    return same, total


def agreement_markdown(results: dict[str, Any], reference: str) -> list[str]:
    """The agreement table the timing benches print (recall model, greedy, against `reference`)."""
    lines = [
        f"| path | context | accuracy (tokens) | identical to {reference} / queries | "
        f"KL vs {reference} mean / max | errors |",
        "|---|---|---|---|---|---|",
    ]
    for name, per in results.items():
        for ctx, r in per.items():
            vs = r.get("vs_reference") or {}
            same = r.get("identical_to_reference")
            kl = f"{vs['kl_mean']:.2e} / {vs['kl_max']:.2e}" if vs else "—"
            lines.append(
                f"| {name} | {ctx} | {r['accuracy']:.3f} ({r['token_accuracy']:.3f}) | "
                f"{'—' if same is None else same} / {r['queries']} | {kl} | {r['errors']} |"
            )
    return lines


# ---------------------------------------------------------------- the run


class Run:
    def __init__(self, a: argparse.Namespace) -> None:
        self.a = a
        self.out = Path(a.out)
        self.out.mkdir(parents=True, exist_ok=True)
        names = [n for n in (a.only.split(",") if a.only else VARIANTS) if n]
        unknown = [n for n in names if n not in VARIANTS]
        if unknown:
            raise SystemExit(
                f"accuracy_bench: unknown server(s) {', '.join(unknown)}; known: {', '.join(VARIANTS)}"
            )
        self.contexts = [int(c) for c in a.contexts.split(",") if c]
        self.check = RecallCheck(
            {n: VARIANTS[n] for n in names}, model=Path(a.model), work=Path(a.work), out=self.out,
            emulator=a.emulator, port_base=PORT_BASE, reference=REFERENCE,
            profiles_dir=a.profiles_dir, site=a.site,
        )  # fmt: skip
        self.doc: dict[str, Any] = {
            "what": "recall-task accuracy and logprob agreement per KV path, real SGLang servers",
            "date": dt.datetime.now(dt.timezone.utc).strftime("%Y-%m-%d %H:%M UTC"),
            "command": shlex.join([sys.executable, *sys.argv]),
            "mode": "emulator" if a.emulator else "device",
            "meta": {},
            "plan": {},
            "servers": self.check.docs,
            "results": {},
            "bars": [],
            "notes": self.check.notes,
        }

    def save(self) -> None:
        self.doc["total_s"] = round(time.monotonic() - T0, 1)
        (self.out / "accuracy.json").write_text(json.dumps(self.doc, indent=1) + "\n")
        (self.out / "accuracy.md").write_text(markdown(self.doc))

    def meta(self) -> None:
        m = self.doc["meta"]
        m["python"] = sys.version.split()[0]
        for dist in ("sglang", "flashinfer-python", "torch", "triton", "sglang-kernel"):
            try:
                m[dist] = importlib.metadata.version(dist)
            except importlib.metadata.PackageNotFoundError:
                m[dist] = None
        try:
            q = subprocess.run(["nvidia-smi", "--query-gpu=name,driver_version,memory.total",
                                "--format=csv,noheader"], capture_output=True, text=True, timeout=20)  # fmt: skip
            m["device"] = q.stdout.strip() or "no GPU"
        except (OSError, subprocess.TimeoutExpired):
            m["device"] = "no GPU"
        with contextlib.suppress(OSError, ValueError):
            b = json.loads((Path(self.a.model) / "build.json").read_text())
            m["model_build"] = {k: b.get(k) for k in ("seed", "margins", "check")}
        m["model"] = str(self.a.model)

    def shape(self, ctx: int) -> tuple[int, int]:
        stacks, per = CONTEXTS[ctx]
        return min(stacks, self.a.haystacks or stacks), min(per, self.a.queries or per)

    def plan(self) -> None:
        """What runs, with the seconds each phase is expected to take (printed first)."""
        n = len(self.check.variants)
        self.need = {ctx: 8 + self.shape(ctx)[0] * (2 + ctx / 8192) for ctx in self.contexts}
        est = {f"start {n} servers at once (warm JIT cache)": 75.0}
        for ctx in self.contexts:
            stacks, per = self.shape(ctx)
            est[f"context {ctx}: {stacks} haystacks x {per} queries on {n} servers"] = self.need[
                ctx
            ]
        est["stop servers, report"] = 15.0
        self.doc["plan"] = {"servers": {k: v.what for k, v in self.check.variants.items()},
                            "estimate_s": est, "total_estimate_s": round(sum(est.values()))}  # fmt: skip
        log("plan: " + "; ".join(f"{k} ~{v:.0f} s" for k, v in est.items())
            + f"; total ~{sum(est.values()):.0f} s")  # fmt: skip

    def execute(self) -> int:
        def on_term(_s: int, _f: Any) -> None:
            raise Stop()

        signal.signal(signal.SIGTERM, on_term)
        self.meta()
        self.plan()
        self.save()
        check = self.check
        try:
            check.start()
            ready = check.wait_ready(self.a.ready_budget_s)
            self.save()
            if REFERENCE not in ready:
                check.note("the BF16 reference server is not up: accuracy only, no agreement")
            for ctx in self.contexts:
                left = self.a.deadline_s - (time.monotonic() - T0)
                if left < self.need[ctx]:
                    check.note(
                        f"context {ctx} skipped: {left:.0f} s left, needs ~{self.need[ctx]:.0f} s"
                    )
                    continue
                t = time.monotonic()
                log(f"context {ctx}")
                try:
                    check.context(self.a.seed, ctx, *self.shape(ctx))
                except Exception as exc:
                    check.note(f"context {ctx} failed: {type(exc).__name__}: {exc}"[:300])
                self.doc.setdefault("phase_s", {})[str(ctx)] = round(time.monotonic() - t, 1)
                self.summarize()
                self.save()
                log(f"context {ctx} done in {time.monotonic() - t:.0f} s: "
                    + ", ".join(f"{n} {self.doc['results'].get(n, {}).get(str(ctx), {}).get('accuracy', 0):.3f}"
                                for n in ready))  # fmt: skip
        except Stop:
            self.doc["stopped"] = "SIGTERM (the device job's hard stop): partial results"
        finally:
            check.stop()
            self.summarize()
            self.save()
        print(markdown(self.doc))
        return 0

    def summarize(self) -> None:
        self.doc["results"] = self.check.results()
        self.doc["bars"] = bars(self.doc["results"], self.contexts)


def bars(res: dict[str, Any], contexts: list[int]) -> list[dict[str, Any]]:
    out: list[dict[str, Any]] = []

    def acc(name: str, ctx: int) -> float | None:
        r = res.get(name, {}).get(str(ctx))
        return r["accuracy"] if r and r["queries"] and not r["errors"] else None

    b8 = acc(REFERENCE, 8192)
    if b8 is not None:
        out.append({"bar": "BF16 KV accuracy >= 0.95 at 8k", "value": b8, "pass": b8 >= 0.95})
    for name in ("native", "gather", "native-8h", "gather-8h"):
        for ctx in contexts:
            ref = acc(REFERENCE if not name.endswith("-8h") else "bf16-8h", ctx)
            ref = ref if ref is not None else acc(REFERENCE, ctx)
            mine = acc(name, ctx)
            if mine is not None and ref is not None:
                out.append({"bar": f"{name} accuracy within 1 point of BF16 KV at {ctx}",
                            "value": mine - ref, "pass": mine >= ref - 0.01})  # fmt: skip
        upstream = "upstream-8h" if name.endswith("-8h") else "upstream"
        for ctx in contexts:
            kl = (res.get(name, {}).get(str(ctx), {}).get("vs_reference") or {}).get("kl_mean")
            up = (res.get(upstream, {}).get(str(ctx), {}).get("vs_reference") or {}).get("kl_mean")
            if kl is not None and up is not None:
                # gather equals upstream bit for bit; native sums in another order: 5 % + 1e-6 of slack
                out.append({"bar": f"{name} KL vs BF16 <= {upstream}'s (+5 %) at {ctx}",
                            "value": kl / up if up else float(kl == 0), "pass": kl <= 1.05 * up + 1e-6})  # fmt: skip
    lengths = [
        r.get("accept_length") for r in res.get("bf16-mtp", {}).values() if r.get("accept_length")
    ]
    if lengths:
        m = min(lengths)
        out.append(
            {
                "bar": "MTP acceptance length >= 2.5 with BF16 KV (every context)",
                "value": m,
                "pass": m >= 2.5,
            }
        )
    for ctx in contexts:
        w = acc("miswired", ctx)
        if w is not None:
            out.append(
                {
                    "bar": f"miswired accuracy < 0.5 at {ctx} (the check can fail)",
                    "value": w,
                    "pass": w < 0.5,
                }
            )
    return out


def markdown(doc: dict[str, Any]) -> str:
    def f(v: Any, fmt: str) -> str:
        return "—" if v is None else format(v, fmt)

    m = doc.get("meta", {})
    lines = [
        f"# Recall-task accuracy per KV path, real SGLang — {doc['date']} ({doc['mode']})",
        "",
        f"Command: `{doc['command']}`  ",
        f"Device: {m.get('device')}; SGLang {m.get('sglang')}, FlashInfer {m.get('flashinfer-python')}, "
        f"torch {m.get('torch')}, Triton {m.get('triton')}, Python {m.get('python')}.  ",
        f"Model: {m.get('model')} (2 MLA layers + NextN, kv_lora_rank 512, rope 64; 16 heads = the exact "
        "widening of the 8-head checkpoint). Every server through the launcher (profile tiny-mla, "
        f"--load-format auto), KV pool {POOL_TOKENS:,}, chunked prefill {CHUNK}, greedy, 8 new tokens, top-{TOP_K} logprobs.",
        "",
    ]
    if m.get("model_build"):
        b = m["model_build"]
        lines += [f"Model built by bench/accuracy/recall_build.py, seed {b.get('seed')}; its margins "
                  f"(logits): {b.get('margins')}", ""]  # fmt: skip
    res = doc.get("results", {})
    ctxs = sorted({int(c) for r in res.values() for c in r}, key=int)
    head = (
        "| server | "
        + " | ".join(f"acc {c} (tokens)" for c in ctxs)
        + " | KL mean / max vs BF16 | abs d logprob mean / max | diverged / outputs | cached | accept len |"
    )
    lines += [head, "|" + "---|" * (6 + len(ctxs))]
    for name, per in res.items():
        cells = [
            f"{f(per.get(str(c), {}).get('accuracy'), '.3f')} ({f(per.get(str(c), {}).get('token_accuracy'), '.3f')})"
            for c in ctxs
        ]
        vs = [r.get("vs_reference") for r in per.values() if r.get("vs_reference")]
        kl_mean = max((v["kl_mean"] for v in vs), default=None)
        kl_max = max((v["kl_max"] for v in vs), default=None)
        d_mean = max((v["abs_dlogprob_mean"] for v in vs), default=None)
        d_max = max((v["abs_dlogprob_max"] for v in vs), default=None)
        div = sum(v["divergent_outputs"] for v in vs) if vs else None
        outs = sum(v["outputs"] for v in vs) if vs else None
        cached = [
            r.get("cached_fraction") for r in per.values() if r.get("cached_fraction") is not None
        ]
        acc_len = [r.get("accept_length") for r in per.values() if r.get("accept_length")]
        lines.append(
            f"| {name} | " + " | ".join(cells)
            + f" | {f(kl_mean, '.2e')} / {f(kl_max, '.2e')} | {f(d_mean, '.2e')} / {f(d_max, '.2e')}"
            + f" | {f(div, 'd')} / {f(outs, 'd')} | {f(min(cached) if cached else None, '.2f')}"
            + f" | {f(min(acc_len) if acc_len else None, '.2f')} |"
        )  # fmt: skip
    lines += ["", "KL and |d logprob|: the worst context's mean and max; cached: the smallest share of "
              "prompt tokens served from the radix cache; accept len: the smallest context's "
              "completion tokens / verify steps.", ""]  # fmt: skip
    lines += ["| bar | value | pass |", "|---|---|---|"]
    for b in doc.get("bars", []):
        lines.append(f"| {b['bar']} | {b['value']:.4g} | {'PASS' if b['pass'] else 'MISS'} |")
    lines += ["", "## Servers", ""]
    for name, s in doc.get("servers", {}).items():
        state = f"ready {s['ready_s']} s" if "ready_s" in s else s.get("error", "not started")
        lines.append(
            f"- {name} ({s.get('what')}): {s.get('env')}: {state}; "
            + "; ".join(s.get("decode_path_log", []))
        )
    if doc.get("notes"):
        lines += ["", "## Notes", ""] + [f"- {n}" for n in doc["notes"]]
    if doc.get("stopped"):
        lines += ["", f"**{doc['stopped']}**"]
    return "\n".join(lines) + "\n"


def parse_args(argv: list[str]) -> argparse.Namespace:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--out", required=True)
    p.add_argument(
        "--model",
        default=str(REPO / "bench" / "models" / "recall-mla"),
        help="the 8-head checkpoint",
    )
    p.add_argument("--site", default="", help="the patched SGLang site (for the miswired copy)")
    p.add_argument(
        "--work", default="/tmp/glmserve-accuracy", help="scratch: the 16-head and miswired copies"
    )
    p.add_argument(
        "--emulator", action="store_true", help="emulators stand in (the client logic, no GPU)"
    )
    p.add_argument("--only", default="", help="comma-separated servers (default: all)")
    p.add_argument("--contexts", default=",".join(str(c) for c in CONTEXTS))
    p.add_argument("--seed", type=int, default=1)
    p.add_argument(
        "--haystacks", type=int, default=0, help="at most this many per context (0: all)"
    )
    p.add_argument("--queries", type=int, default=0, help="at most this many per haystack (0: all)")
    p.add_argument("--profiles-dir", default=str(REPO / "deploy" / "profiles"))
    p.add_argument("--ready-budget-s", type=float, default=240.0)
    p.add_argument("--deadline-s", type=float, default=330.0, help="start no context past this")
    a = p.parse_args(argv)
    bad = [c for c in a.contexts.split(",") if c and int(c) not in CONTEXTS]
    if bad:
        p.error(f"--contexts takes {', '.join(map(str, CONTEXTS))}")
    if not (Path(a.model) / "model.safetensors").is_file():
        p.error(f"no checkpoint in {a.model} (build one: bench/accuracy/recall_build.py)")
    if not a.emulator and not a.site:
        import importlib.util

        spec = importlib.util.find_spec("sglang")
        a.site = str(Path(next(iter(spec.submodule_search_locations))).parent) if spec else ""
    return a


if __name__ == "__main__":
    sys.exit(Run(parse_args(sys.argv[1:])).execute())
