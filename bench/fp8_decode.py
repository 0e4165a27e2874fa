"""FP8 MLA decode attention per layer, every path side by side in one run, plus the numerics proof.

    python bench/fp8_decode.py --out DIR [--heads 16,8] [--native PATH] [--gather PATH]
        [--previous PATH] [--anchor-site DIR]

Needs one CUDA GPU with FlashInfer and the patched SGLang tree importable (`bash
bench/device_run.sh fp8-decode ARGS` sets both up on the H200: bench/README.md). Paths, per layer:

  bf16_fa2   FlashInfer fa2 MLA on a BF16 pool (BF16 KV; fa2 is the SM120 kernel family)
  bf16_auto  FlashInfer backend="auto" on a BF16 pool (what SGLang runs; fa3 on SM90)
  upstream   pool.to(bf16) of the whole FP8 pool + fa2                 (pinned SGLang)
  gather     gather-then-cast of the referenced rows + fa2             (the series)
  native     mla_decode_fp8: reads the FP8 pool directly              (the series)
  previous   --previous PATH: an earlier mla_decode_fp8 file, for the record of a change
  fi_fp8     --anchor-site DIR: FlashInfer's own FP8 MLA decode (fa3, SM90 only; FlashInfer
             0.6.14+) and its BF16 fa3, run in a child process with DIR first on PYTHONPATH
             (a bench-only FlashInfer: the image keeps its pin)

Timing: one CUDA graph holds 8 distinct layers (each its own 495,552 x 576 pool, so L2 cannot
flatter small cases), replayed under triton.testing.do_bench (median, L2 flushed), divided by 8.
Eager host cost: per call, the time the Python call takes to return (launches queued, no sync)
and one call's latency after a sync (CUDA events), native beside FlashInfer's ``run()``.

Numerics: every path's output against an fp64 reference computed from the same FP8 values;
the bar is native max error <= 1.5x upstream's (FlashInfer on the BF16 cast). CUDA-graph
safety: one graph captured once and replayed with other lengths, slots and counts.

Writes fp8-decode.{json,md,png} under --out; prints the table and the bars last.
"""

from __future__ import annotations

import argparse
import datetime as dt
import importlib.util
import json
import math
import os
import random
import shlex
import statistics
import subprocess
import sys
import time
from pathlib import Path

import gather_cast  # bench/gather_cast.py: the timing and environment helpers
import torch
from gather_cast import copy_ceiling_tbs, versions

from glmserve.selftest.nativecheck import fp64_decode_attention

CKV, KPE, D = 512, 64, 576
SM_SCALE = 1.0 / math.sqrt(192 + KPE)  # GLM-5: qk_nope 192 + rope 64
POOL_ROWS = 495_552
LAYERS_PER_GRAPH = 8
LAYERS_GLM5 = 78
# (name, batch, context per request, shared prefix per request)
WORKLOADS = [
    ("1x512", 1, 512, 0),
    ("1x8192", 1, 8192, 0),
    ("1x65536", 1, 65536, 0),
    ("1x131072", 1, 131072, 0),
    ("8x4096", 8, 4096, 0),
    ("64x2048", 64, 2048, 0),
    ("64x7000", 64, 7000, 0),
    ("128x4096", 128, 4096, 0),
]
# Bars of the issue on the native kernel, per layer, against FlashInfer's BF16 fa3 ("auto" on
# SM90) in this run: <= 0.6x and >= 2.5 TB/s of FP8 at batch >= 64, <= 0.8x below.
BAR_LOADED = ("64x2048", "64x7000", "128x4096")
BAR_LIGHT = ("1x512", "1x8192", "1x65536", "8x4096")
LOADED_RATIO, LIGHT_RATIO, LOADED_TBS = 0.6, 0.8, 2.5
HOST_WORKLOADS = (("1x8192", 1, 8192), ("64x2048", 64, 2048))


def load_module(path: str | None, name: str):
    """The series-added SGLang module `name` (installed tree by default), loaded as a file."""
    if path is None:
        spec = importlib.util.find_spec("sglang")
        if spec is None or not spec.submodule_search_locations:
            sys.exit("fp8_decode: no sglang on sys.path")
        path = str(Path(next(iter(spec.submodule_search_locations)), "srt/layers/attention", name))
    if not Path(path).is_file():
        sys.exit(f"fp8_decode: {path} not found (is the patch series applied?)")
    spec = importlib.util.spec_from_file_location(Path(path).stem + "_bench", path)
    module = importlib.util.module_from_spec(spec)
    sys.modules[spec.name] = module  # dataclasses and triton.jit look their module up
    spec.loader.exec_module(module)
    return module, path


def slot_lists(perm_source, pool_rows: int, bs: int, ctx: int, shared: int) -> torch.Tensor:
    """bs lists of ctx distinct-within-request slots (a shared prefix first), as many
    permutations of the pool as the total needs (128 x 4,096 rows exceed the pool)."""
    per = ctx - shared
    need = shared + bs * per
    perm = torch.cat([perm_source() for _ in range(-(-need // pool_rows))])
    lists = [torch.cat([perm[:shared], perm[shared + b * per :][:per]]) for b in range(bs)]
    return torch.cat(lists).to(torch.int32)


def graph_us(step, rep_ms: int = 120) -> float:
    """Capture `step` (all layers) once; median replay time per layer in µs."""
    t, graph = gather_cast.graph_us(step, LAYERS_PER_GRAPH, rep_ms)
    del graph
    return t


def fp8_pool(rows: int, kind: str, gen: torch.Generator) -> torch.Tensor:
    """An FP8 pool [rows, 1, 576] with real-valued content (never zeros, never NaN).

    normal: N(0, 1) latents, the usual case; wide: random bytes (all of e4m3, +-448, very
    spread scores); tiny: N(0, 0.01), mostly e4m3 subnormals (exactness of the convert).
    """
    if kind == "wide":
        raw = torch.randint(0, 256, (rows, 1, D), dtype=torch.uint8, device="cuda", generator=gen)
        raw[(raw & 0x7F) == 0x7F] ^= 1  # e4m3 has no inf; 0x7F/0xFF are NaN
        return raw.view(torch.float8_e4m3fn)
    scale = {"normal": 1.0, "tiny": 0.01}[kind]
    x = torch.randn((rows, 1, D), device="cuda", generator=gen) * scale
    return x.to(torch.float8_e4m3fn)


class Paths:
    """FlashInfer MLA wrappers planned the way SGLang plans them."""

    def __init__(self, heads: int) -> None:
        import flashinfer.mla

        self.heads = heads
        self.ws = torch.empty(128 << 20, dtype=torch.uint8, device="cuda")
        self.mla = flashinfer.mla

    def plan(self, backend: str, kv_indptr, kv_indices):
        batch = kv_indptr.numel() - 1
        qo_indptr = torch.arange(batch + 1, dtype=torch.int32, device="cuda")
        wrapper = self.mla.BatchMLAPagedAttentionWrapper(self.ws, backend=backend)
        wrapper.plan(
            qo_indptr, kv_indptr, kv_indices, kv_indptr[1:] - kv_indptr[:-1], self.heads,
            CKV, KPE, 1, False, SM_SCALE, torch.bfloat16, torch.bfloat16,
        )  # fmt: skip
        return wrapper


def rel_errors(out: torch.Tensor, ref: torch.Tensor, live: torch.Tensor) -> tuple[float, float]:
    """(max, median) over live (request, head) rows of ||out - ref|| / ||ref||."""
    o, r = out.double()[live], ref[live]
    per_row = (o - r).norm(dim=-1) / r.norm(dim=-1).clamp_min(1e-300)
    return float(per_row.max()), float(per_row.median())


def reference(q_nope, q_pe, pool, kv_indptr, kv_indices) -> torch.Tensor:
    """fp64 MLA decode on the FP8 values (the same function every path computes)."""
    return fp64_decode_attention(torch, q_nope, q_pe, pool, kv_indptr, kv_indices, SM_SCALE)


def numerics_cases(seed: int) -> list[dict]:
    """Lengths 1 ... 131,072, batch 1 ... 64, duplicate slots, empty requests, three value kinds."""
    rng = random.Random(seed)
    lens_sets = [
        ("1x1", [1]),
        ("1x7", [7]),
        ("1x512", [512]),
        ("1x8192", [8192]),
        ("1x65536", [65536]),
        ("1x131072", [131072]),
        ("8 mixed", [rng.randint(1, 4096) for _ in range(8)]),
        ("64x2048", [2048] * 64),
        ("64 mixed + empty", [0, 3] + [rng.randint(1, 3000) for _ in range(62)]),
    ]
    cases = []
    for name, lens in lens_sets:
        for kind in ("normal", "wide", "tiny"):
            if kind != "normal" and name not in ("1x8192", "8 mixed", "64 mixed + empty"):
                continue
            cases.append({"name": name, "lens": lens, "kind": kind, "dup": False})
    cases.append(
        {
            "name": "64x1024 shared 768-slot prefix",
            "lens": [1024] * 64,
            "kind": "normal",
            "dup": True,
        }
    )
    cases.append({"name": "all empty", "lens": [0, 0, 0], "kind": "normal", "dup": False})
    return cases


def check_numerics(native, heads: int, pool_rows: int, seed: int) -> list[dict]:
    gen = torch.Generator(device="cuda").manual_seed(seed)
    paths = Paths(heads)
    results = []
    pools = {kind: fp8_pool(pool_rows, kind, gen) for kind in ("normal", "wide", "tiny")}
    for case in numerics_cases(seed):
        pool = pools[case["kind"]]
        lens = case["lens"]
        batch = len(lens)
        kv_indptr = torch.zeros(batch + 1, dtype=torch.int32, device="cuda")
        kv_indptr[1:] = torch.tensor(lens, device="cuda").cumsum(0)
        total = int(kv_indptr[-1])
        kv_indices = torch.randint(
            0, pool_rows, (max(total, 1),), dtype=torch.int32, device="cuda", generator=gen
        )
        if case["dup"]:  # radix prefix sharing: every request starts with the same slots
            prefix = kv_indices[:768].clone()
            for b in range(batch):
                kv_indices[b * 1024 : b * 1024 + 768] = prefix
        kv_indices[total // 2 if total else 0] = pool_rows - 1  # the last pool row is in play
        q_scale = 30.0 if case["kind"] == "tiny" else 1.0  # keep tiny pools' scores O(1)
        q_nope = (torch.randn(batch, heads, CKV, device="cuda", generator=gen) * q_scale).bfloat16()
        q_pe = (torch.randn(batch, heads, KPE, device="cuda", generator=gen) * q_scale).bfloat16()
        ref = reference(q_nope, q_pe, pool, kv_indptr, kv_indices)
        live = torch.tensor(lens, device="cuda").gt(0)[:, None].expand(batch, heads)
        row = {
            "case": case["name"],
            "kind": case["kind"],
            "heads": heads,
            "batch": batch,
            "tokens": total,
        }

        out = torch.full_like(q_nope, float("nan"))
        native.mla_decode_fp8(q_nope, q_pe, pool, kv_indptr, kv_indices, SM_SCALE, out)
        row["native_all_written"] = bool(torch.isfinite(out).all())
        row["native_empty_zero"] = bool((out[~live] == 0).all()) if (~live).any() else None
        if live.any():
            row["native_max"], row["native_median"] = rel_errors(out, ref, live)
            # Upstream (FlashInfer on the BF16 cast) on the non-empty requests only: SGLang
            # never plans an empty one, and FlashInfer's behaviour there is not ours to test.
            keep = [b for b in range(batch) if lens[b] > 0]
            bounds = kv_indptr.tolist()
            sub_indices = torch.cat([kv_indices[bounds[b] : bounds[b + 1]] for b in keep])
            sub_indptr = torch.zeros(len(keep) + 1, dtype=torch.int32, device="cuda")
            sub_indptr[1:] = torch.tensor([lens[b] for b in keep], device="cuda").cumsum(0)
            cast = pool.to(torch.bfloat16)
            for backend in ("fa2", "auto"):
                try:
                    wrapper = paths.plan(backend, sub_indptr, sub_indices)
                except Exception as exc:  # recorded; the fa2 column still carries the bar
                    row[f"upstream_{backend}_error"] = str(exc)[:120]
                    row[f"upstream_{backend}_max"] = row[f"upstream_{backend}_median"] = float(
                        "nan"
                    )
                    continue
                up = torch.full_like(q_nope[keep], float("nan"))
                wrapper.run(q_nope[keep], q_pe[keep], cast[:, :, :CKV], cast[:, :, CKV:], out=up)
                got = rel_errors(up, ref[keep], live[keep])
                row[f"upstream_{backend}_max"], row[f"upstream_{backend}_median"] = got
            del cast
            row["ratio_vs_fa2"] = row["native_max"] / max(row["upstream_fa2_max"], 1e-30)
            row["ratio_vs_auto"] = row["native_max"] / max(row["upstream_auto_max"], 1e-30)
        results.append(row)
        print("numerics", json.dumps(row), flush=True)
    results.append(check_graph_replays(native, heads, pools["normal"], gen))
    return results


def check_graph_replays(native, heads: int, pool: torch.Tensor, gen) -> dict:
    """One graph captured at batch 8, replayed with other lengths, slots and counts."""
    batch, cap = 8, 70_000
    kv_indptr = torch.zeros(batch + 1, dtype=torch.int32, device="cuda")
    kv_indices = torch.zeros(batch * cap, dtype=torch.int32, device="cuda")
    q_nope = torch.empty(batch, heads, CKV, dtype=torch.bfloat16, device="cuda")
    q_pe = torch.empty(batch, heads, KPE, dtype=torch.bfloat16, device="cuda")
    out = torch.empty_like(q_nope)

    def load(lens):
        kv_indptr[1:] = torch.tensor(lens, device="cuda").cumsum(0)
        total = sum(lens)
        kv_indices[:total] = torch.randint(
            0, pool.shape[0], (total,), dtype=torch.int32, device="cuda", generator=gen
        )
        q_nope.copy_(torch.randn(q_nope.shape, device="cuda", generator=gen))
        q_pe.copy_(torch.randn(q_pe.shape, device="cuda", generator=gen))

    def step():
        native.mla_decode_fp8(q_nope, q_pe, pool, kv_indptr, kv_indices, SM_SCALE, out)

    load([16] * batch)
    step()
    torch.cuda.synchronize()
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        step()
    worst = 0.0
    replays = [
        [1] * 8,
        [65536, 1, 2, 3, 4, 5, 6, 7],
        [0, 4096, 0, 9000, 1, 300, 70_000, 12],
        [2048] * 8,
    ]
    all_written = True
    for lens in replays:
        load(lens)
        out.fill_(float("nan"))
        graph.replay()
        torch.cuda.synchronize()
        live = torch.tensor(lens, device="cuda").gt(0)[:, None].expand(batch, heads)
        ref = reference(q_nope, q_pe, pool, kv_indptr, kv_indices[: sum(lens)])
        all_written &= bool(torch.isfinite(out).all()) and bool((out[~live] == 0).all())
        worst = max(worst, rel_errors(out, ref, live)[0])
    row = {
        "case": "graph replay x4 (batch 8)",
        "heads": heads,
        "native_max": worst,
        "native_all_written": all_written,
    }
    print("numerics", json.dumps(row), flush=True)
    return row


class Timer:
    """8 layers, each its own FP8 pool and BF16 pool, for every workload and path."""

    def __init__(self, native, gather, previous, heads: int, pool_rows: int, seed: int) -> None:
        self.native, self.gather, self.previous = native, gather, previous
        self.heads, self.p = heads, pool_rows
        self.gen = torch.Generator(device="cuda").manual_seed(seed)
        self.pools = [fp8_pool(pool_rows, "normal", self.gen) for _ in range(LAYERS_PER_GRAPH)]
        self.bf16 = [p.to(torch.bfloat16) for p in self.pools]
        self.paths = Paths(heads)
        self.shadow = torch.empty(self.pools[0].shape, dtype=torch.bfloat16, device="cuda")
        self.rows = torch.zeros(1, dtype=torch.int32, device="cuda")

    def inputs(self, bs: int, ctx: int, shared: int):
        idx = slot_lists(
            lambda: torch.randperm(self.p, device="cuda", generator=self.gen), self.p, bs, ctx,
            shared,
        )  # fmt: skip
        kv_indptr = torch.arange(bs + 1, dtype=torch.int32, device="cuda") * ctx
        q = [
            torch.randn(bs, self.heads, CKV, device="cuda", generator=self.gen).bfloat16()
            for _ in self.pools
        ]
        qpe = [
            torch.randn(bs, self.heads, KPE, device="cuda", generator=self.gen).bfloat16()
            for _ in self.pools
        ]
        return kv_indptr, idx, q, qpe

    def kernel_us(self, module, inputs) -> float:
        kv_indptr, idx, q, qpe = inputs
        outs = [torch.empty_like(x) for x in q]

        def step():
            for i, pool in enumerate(self.pools):
                module.mla_decode_fp8(q[i], qpe[i], pool, kv_indptr, idx, SM_SCALE, outs[i])

        return graph_us(step)

    def workload(self, name, bs, ctx, shared) -> dict:
        kv_indptr, idx, q, qpe = inputs = self.inputs(bs, ctx, shared)
        self.rows.copy_(kv_indptr[-1:])
        res = {"name": name, "bs": bs, "ctx": ctx, "rows": bs * ctx, "heads": self.heads}
        outs = [torch.empty_like(x) for x in q]
        fa2 = self.paths.plan("fa2", kv_indptr, idx)
        try:
            auto = self.paths.plan("auto", kv_indptr, idx)
            res["auto_backend"] = getattr(auto, "_backend", "auto")
        except Exception as exc:  # keep the run: the column then repeats fa2, and says so
            auto, res["auto_backend"] = fa2, f"fa2 (auto failed: {str(exc)[:80]})"

        def run(wrapper, kv, i):
            wrapper.run(q[i], qpe[i], kv[:, :, :CKV], kv[:, :, CKV:], out=outs[i])

        steps = {
            "bf16_fa2": lambda: [run(fa2, kv, i) for i, kv in enumerate(self.bf16)],
            "bf16_auto": lambda: [run(auto, kv, i) for i, kv in enumerate(self.bf16)],
            "upstream": lambda: [
                run(fa2, p.to(torch.bfloat16), i) for i, p in enumerate(self.pools)
            ],
            "gather": lambda: [
                run(fa2, self.gather.gather_cast(p, idx, self.rows, self.shadow), i)
                for i, p in enumerate(self.pools)
            ],
        }
        for key, step in steps.items():
            res[f"{key}_us"] = graph_us(step)
            torch.cuda.empty_cache()
        res["native_us"] = self.kernel_us(self.native, inputs)
        if self.previous is not None:
            res["previous_us"] = self.kernel_us(self.previous, inputs)
        # Bytes the native kernel must move: each referenced FP8 row once plus its index.
        res["native_tbs"] = fp8_tbs(bs * ctx, res["native_us"])
        res["bf16_auto_tbs"] = bs * ctx * (2 * D + 4) / (res["bf16_auto_us"] * 1e-6) / 1e12
        print("timing", json.dumps(res), flush=True)
        return res

    def host_costs(self) -> list[dict]:
        """Eager cost per call, native beside FlashInfer's run() (BF16 auto), one layer."""
        rows = []
        for name, bs, ctx in HOST_WORKLOADS:
            for path, call in self.host_calls(self.inputs(bs, ctx, 0)).items():
                row = {"heads": self.heads, "workload": name, "path": path, **eager_cost(call)}
                rows.append(row)
                print("host", json.dumps(row), flush=True)
        return rows

    def host_calls(self, inputs) -> dict:
        kv_indptr, idx, q, qpe = inputs
        out = torch.empty_like(q[0])
        auto = self.paths.plan("auto", kv_indptr, idx)
        kv, pool = self.bf16[0], self.pools[0]
        return {
            "native": lambda: self.native.mla_decode_fp8(
                q[0], qpe[0], pool, kv_indptr, idx, SM_SCALE, out
            ),
            "flashinfer_bf16_auto_run": lambda: auto.run(
                q[0], qpe[0], kv[:, :, :CKV], kv[:, :, CKV:], out=out
            ),
        }


def fp8_tbs(rows: int, us: float) -> float:
    return rows * (D + 4) / (us * 1e-6) / 1e12


def eager_cost(call, calls: int = 400) -> dict:
    """Host submit time per call (launches queued, no sync; median) and the latency of one
    call after a sync (CUDA events; median)."""
    for _ in range(20):
        call()
    torch.cuda.synchronize()
    submit = []
    for i in range(calls):
        t = time.perf_counter()
        call()
        submit.append((time.perf_counter() - t) * 1e6)
        if i % 50 == 49:  # never let the launch queue fill (that would time the GPU)
            torch.cuda.synchronize()
    start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
    latency = []
    for _ in range(60):
        torch.cuda.synchronize()
        start.record()
        call()
        end.record()
        end.synchronize()
        latency.append(start.elapsed_time(end) * 1e3)
    return {"submit_us": statistics.median(submit), "event_us": statistics.median(latency)}


def anchor_only(args) -> int:
    """Child mode: FlashInfer's own FP8 MLA decode (fa3) and its BF16 fa3, whatever FlashInfer
    this process imports (the --anchor-site one), on the main run's workloads."""
    import flashinfer

    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    doc = {"flashinfer": flashinfer.__version__, "timings": []}
    for heads in [int(h) for h in args.heads.split(",")]:
        doc["timings"] += Anchor(heads, args.pool_rows, args.seed).run_all()
        torch.cuda.empty_cache()
    (out / "anchor.json").write_text(json.dumps(doc, indent=1) + "\n")
    return 0


class Anchor:
    """FlashInfer's fa3 MLA on the FP8 pools (its FP8 path) and on BF16 copies of them."""

    def __init__(self, heads: int, pool_rows: int, seed: int) -> None:
        import flashinfer.mla

        self.mla, self.heads, self.rows = flashinfer.mla, heads, pool_rows
        self.gen = torch.Generator(device="cuda").manual_seed(seed)
        self.pools = [fp8_pool(pool_rows, "normal", self.gen) for _ in range(LAYERS_PER_GRAPH)]
        self.bf16 = [p.to(torch.bfloat16) for p in self.pools]
        self.ws = torch.empty(128 << 20, dtype=torch.uint8, device="cuda")

    def plan(self, kv_dtype, kv_indptr, kv_indices):
        batch = kv_indptr.numel() - 1
        qo = torch.arange(batch + 1, dtype=torch.int32, device="cuda")
        w = self.mla.BatchMLAPagedAttentionWrapper(self.ws, backend="fa3")
        w.plan(qo, kv_indptr, kv_indices, kv_indptr[1:] - kv_indptr[:-1], self.heads, CKV, KPE,
               1, False, SM_SCALE, torch.bfloat16, kv_dtype)  # fmt: skip
        return w

    def run_all(self) -> list[dict]:
        rows = []
        for name, bs, ctx, shared in WORKLOADS:
            idx = slot_lists(
                lambda: torch.randperm(self.rows, device="cuda", generator=self.gen),
                self.rows, bs, ctx, shared,
            )  # fmt: skip
            kv_indptr = torch.arange(bs + 1, dtype=torch.int32, device="cuda") * ctx
            rows.append(self.workload(name, bs, kv_indptr, idx))
            print("anchor", json.dumps(rows[-1]), flush=True)
        return rows

    def workload(self, name: str, bs: int, kv_indptr, idx) -> dict:
        q = [torch.randn(bs, self.heads, CKV, device="cuda", generator=self.gen).bfloat16()
             for _ in self.pools]  # fmt: skip
        qpe = [torch.randn(bs, self.heads, KPE, device="cuda", generator=self.gen).bfloat16()
               for _ in self.pools]  # fmt: skip
        outs = [torch.empty_like(x) for x in q]
        w8 = self.plan(torch.float8_e4m3fn, kv_indptr, idx)
        w16 = self.plan(torch.bfloat16, kv_indptr, idx)

        def fp8(i):
            p = self.pools[i]
            w8.run(q[i], qpe[i], p[:, :, :CKV], p[:, :, CKV:], out=outs[i], ckv_scale=1.0,
                   kpe_scale=1.0)  # fmt: skip

        def bf16(i):
            p = self.bf16[i]
            w16.run(q[i], qpe[i], p[:, :, :CKV], p[:, :, CKV:], out=outs[i])

        layers = range(LAYERS_PER_GRAPH)
        row = {
            "name": name,
            "heads": self.heads,
            "fi_fp8_fa3_us": graph_us(lambda: [fp8(i) for i in layers]),
            "fi_bf16_fa3_us": graph_us(lambda: [bf16(i) for i in layers]),
        }
        if name == "8x4096":  # its numerics, against the same fp64 definition
            outs[0].fill_(float("nan"))
            fp8(0)
            ref = reference(q[0], qpe[0], self.pools[0], kv_indptr, idx)
            live = torch.ones(bs, self.heads, dtype=torch.bool, device="cuda")
            row["fi_fp8_fa3_max_err"] = rel_errors(outs[0], ref, live)[0]
        if any(name == h[0] for h in HOST_WORKLOADS):
            row["fi_fp8_fa3_eager"] = eager_cost(lambda: fp8(0))
        return row


def run_anchor(args, out: Path) -> dict | None:
    """The anchor child with --anchor-site first on PYTHONPATH; its JSON, or None (said why)."""
    env = dict(os.environ)
    env["PYTHONPATH"] = os.pathsep.join([args.anchor_site, env.get("PYTHONPATH", "")])
    cmd = [sys.executable, __file__, "--anchor-only", "--out", str(out / "anchor"),
           "--heads", args.heads, "--pool-rows", str(args.pool_rows), "--seed", str(args.seed)]  # fmt: skip
    print("anchor:", " ".join(cmd), flush=True)
    done = subprocess.run(cmd, env=env, timeout=args.anchor_timeout_s)
    path = out / "anchor" / "anchor.json"
    if done.returncode != 0 or not path.is_file():
        print(f"anchor: child failed (rc {done.returncode}); no FlashInfer FP8 column", flush=True)
        return None
    return json.loads(path.read_text())


def merge_anchor(doc: dict, anchor: dict) -> None:
    doc["versions"]["flashinfer (anchor)"] = anchor["flashinfer"]
    by_key = {(a["name"], a["heads"]): a for a in anchor["timings"]}
    for r in doc["timings"]:
        a = by_key.get((r["name"], r["heads"]))
        if a:
            r["fi_fp8_fa3_us"], r["fi_bf16_fa3_us"] = a["fi_fp8_fa3_us"], a["fi_bf16_fa3_us"]
            if "fi_fp8_fa3_max_err" in a:
                r["fi_fp8_fa3_max_err"] = a["fi_fp8_fa3_max_err"]
            if "fi_fp8_fa3_eager" in a:
                doc["host"].append({"heads": r["heads"], "workload": r["name"],
                                    "path": "flashinfer_fp8_fa3_run", **a["fi_fp8_fa3_eager"]})  # fmt: skip


def bars(doc: dict) -> list[dict]:
    out = []

    def bar(text, value, limit, ok):
        out.append({"bar": text, "value": value, "limit": limit, "pass": bool(ok)})

    for r in doc["timings"]:
        ratio = r["native_us"] / r["bf16_auto_us"]
        head = f"H={r['heads']} {r['name']}"
        if r["name"] in BAR_LOADED:
            bar(f"{head}: native / BF16 fa3", f"{ratio:.2f}x", f"{LOADED_RATIO}x",
                ratio <= LOADED_RATIO)  # fmt: skip
            bar(f"{head}: FP8 read TB/s", f"{r['native_tbs']:.2f}", f">= {LOADED_TBS}",
                r["native_tbs"] >= LOADED_TBS)  # fmt: skip
        elif r["name"] in BAR_LIGHT:
            bar(f"{head}: native / BF16 fa3", f"{ratio:.2f}x", f"{LIGHT_RATIO}x",
                ratio <= LIGHT_RATIO)  # fmt: skip
        gx = r["native_us"] / r["gather_us"]
        bar(f"{head}: native / gather-then-cast", f"{gx:.2f}x", "1.0x", gx <= 1.0)
    rated = [n for n in doc["numerics"] if "ratio_vs_fa2" in n]
    if rated:
        worst = max(rated, key=lambda n: n["ratio_vs_fa2"])
        bar(
            f"numerics: native max rel err <= 1.5x upstream fa2's (worst: {worst['case']} {worst['kind']} H={worst['heads']})",
            f"{worst['ratio_vs_fa2']:.2f}x", "1.5x", worst["ratio_vs_fa2"] <= 1.5,
        )  # fmt: skip
    written = all(n.get("native_all_written", True) for n in doc["numerics"])
    zeros = all(n.get("native_empty_zero") in (None, True) for n in doc["numerics"])
    bar("numerics: every output written (NaN-poisoned), empty requests zero",
        str(written and zeros), "True", written and zeros)  # fmt: skip
    for h in doc["host"]:
        if h["path"] != "native":
            continue
        refs = [x for x in doc["host"] if x["path"] != "native" and x["heads"] == h["heads"]
                and x["workload"] == h["workload"]]  # fmt: skip
        best_ref = max((x["submit_us"] for x in refs), default=0.0)
        ok = h["submit_us"] <= 30.0 or h["submit_us"] <= best_ref
        anchors = ", ".join(f"{x['path']} {x['submit_us']:.1f}" for x in refs)
        bar(f"H={h['heads']} {h['workload']}: eager host cost per call (FlashInfer run(): "
            f"{anchors} µs)", f"{h['submit_us']:.1f} µs", "<= 30 µs or <= FlashInfer", ok)  # fmt: skip
    return out


def plot(doc: dict, path: Path) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    heads = sorted({r["heads"] for r in doc["timings"]}, reverse=True)
    fig, axes = plt.subplots(1, len(heads), figsize=(7 * len(heads), 5), squeeze=False)
    series = [
        ("upstream_us", "upstream: full-pool cast + fa2", "#b22222"),
        ("gather_us", "gather-then-cast + fa2", "#e69f00"),
        ("fi_fp8_fa3_us", "FlashInfer's own FP8 MLA (fa3)", "#cc79a7"),
        ("bf16_fa2_us", "BF16 KV, fa2 (SM120 family)", "#56b4e9"),
        ("bf16_auto_us", "BF16 KV, auto (fa3 on SM90)", "#0072b2"),
        ("previous_us", "native FP8, previous kernel", "#999999"),
        ("native_us", "native FP8 kernel (fp8_mla_decode)", "#009e73"),
    ]
    series = [x for x in series if any(x[0] in r for r in doc["timings"])]
    for ax, h in zip(axes[0], heads, strict=True):
        rows = [r for r in doc["timings"] if r["heads"] == h]
        width = 0.8 / len(series)
        for i, (key, label, color) in enumerate(series):
            xs = [j + (i - (len(series) - 1) / 2) * width for j in range(len(rows))]
            ax.bar(xs, [r.get(key, 0.0) for r in rows], width, label=label, color=color)
        ax.set_xticks(range(len(rows)), [r["name"] for r in rows], rotation=20)
        ax.set_yscale("log")
        ax.set_ylabel("µs per layer (CUDA-graph replay, median)")
        ax.set_title(f"{h} heads per rank")
        ax.grid(True, axis="y", which="both", alpha=0.3)
    handles, labels = axes[0][0].get_legend_handles_labels()
    fig.legend(handles, labels, loc="lower center", ncol=len(series), fontsize=8, frameon=False)
    fig.suptitle(
        f"FP8 MLA decode attention per layer, pool {doc['pool_rows']:,} x 576 — {doc['device']}"
    )
    fig.tight_layout(rect=(0, 0.06, 1, 1))
    fig.savefig(path, dpi=120)


def markdown(doc: dict) -> str:
    has_fi = any("fi_fp8_fa3_us" in r for r in doc["timings"])
    has_prev = any("previous_us" in r for r in doc["timings"])
    lines = [
        f"# FP8 MLA decode attention — {doc['device']} — {doc['date']}",
        "",
        f"Command: `{doc['command']}`  ",
        f"Versions: {', '.join(f'{k} {v}' for k, v in doc['versions'].items())}  ",
        f"Native kernel: `{doc['native']}` (configurations: {doc['native_defaults']})  ",
        f"Pool {doc['pool_rows']:,} x 576 FP8 per layer, {LAYERS_PER_GRAPH} distinct layers per graph, "
        "medians of CUDA-graph replays (L2 flushed), µs per layer.  ",
        f"Copy ceiling in this run: {doc['copy_ceiling_tbs']:.2f} TB/s (read + write).",
        "",
    ]
    cols = ["BF16 fa2", "BF16 fa3 (auto)", "upstream", "gather"]
    cols += ["FlashInfer FP8 fa3"] if has_fi else []
    cols += ["previous native"] if has_prev else []
    cols += ["**native**", "native/fa3", "native/gather"]
    cols += ["native/FlashInfer FP8"] if has_fi else []
    cols += ["native TB/s (FP8 read)", "78-layer saving vs BF16 fa3"]
    lines += ["| heads | workload | " + " | ".join(cols) + " |", "|---" * (len(cols) + 2) + "|"]
    for r in doc["timings"]:
        cells = [f"{r['bf16_fa2_us']:.1f}", f"{r['bf16_auto_us']:.1f}", f"{r['upstream_us']:.1f}",
                 f"{r['gather_us']:.1f}"]  # fmt: skip
        if has_fi:
            cells.append(f"{r.get('fi_fp8_fa3_us', float('nan')):.1f}")
        if has_prev:
            cells.append(f"{r.get('previous_us', float('nan')):.1f}")
        cells += [f"**{r['native_us']:.1f}**", f"{r['native_us'] / r['bf16_auto_us']:.2f}x",
                  f"{r['native_us'] / r['gather_us']:.2f}x"]  # fmt: skip
        if has_fi:
            cells.append(f"{r['native_us'] / r.get('fi_fp8_fa3_us', float('nan')):.2f}x")
        cells += [f"{r['native_tbs']:.2f}",
                  f"{LAYERS_GLM5 * (r['bf16_auto_us'] - r['native_us']) / 1e3:+.2f} ms"]  # fmt: skip
        lines.append(f"| {r['heads']} | {r['name']} | " + " | ".join(cells) + " |")
    if doc["host"]:
        lines += ["", "## Eager host cost per call (no CUDA graph; medians)", "",
                  "| heads | workload | path | host submit µs | one call after a sync µs |",
                  "|---|---|---|---|---|"]  # fmt: skip
        for h in doc["host"]:
            lines.append(f"| {h['heads']} | {h['workload']} | {h['path']} | {h['submit_us']:.1f} "
                         f"| {h['event_us']:.1f} |")  # fmt: skip
    lines += ["", "## Numerics (max / median relative error per (request, head) row vs fp64)", ""]
    lines += [
        "| case | kind | heads | tokens | native max | native median | upstream fa2 max | upstream auto max | native / fa2 |",
        "|---|---|---|---|---|---|---|---|---|",
    ]
    for n in doc["numerics"]:
        if "upstream_fa2_max" in n:
            lines.append(
                f"| {n['case']} | {n['kind']} | {n['heads']} | {n['tokens']:,} | {n['native_max']:.2e} | {n['native_median']:.2e} "
                f"| {n['upstream_fa2_max']:.2e} | {n['upstream_auto_max']:.2e} | {n['ratio_vs_fa2']:.2f}x |"
            )
        else:
            lines.append(
                f"| {n['case']} | {n.get('kind', '')} | {n['heads']} | {n.get('tokens', '')} | "
                f"{n.get('native_max', float('nan')):.2e} | | | | written={n['native_all_written']} |"
            )
    fi_err = [r for r in doc["timings"] if "fi_fp8_fa3_max_err" in r]
    for r in fi_err:
        lines.append(f"| {r['name']} (FlashInfer FP8 fa3) | normal | {r['heads']} | {r['rows']:,} "
                     f"| | | | | its max {r['fi_fp8_fa3_max_err']:.2e} |")  # fmt: skip
    lines += [
        "",
        "## Bars (ratios from this one run)",
        "",
        "| bar | value | limit | pass |",
        "|---|---|---|---|",
    ]
    lines += [
        f"| {b['bar']} | {b['value']} | {b['limit']} | {'PASS' if b['pass'] else 'MISS'} |"
        for b in doc["bars"]
    ]
    return "\n".join(lines) + "\n"


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--out", required=True)
    parser.add_argument("--native", help="fp8_mla_decode.py (default: the installed SGLang's)")
    parser.add_argument("--gather", help="fp8_kv_gather.py (default: the installed SGLang's)")
    parser.add_argument("--previous", help="an earlier fp8_mla_decode.py, timed beside")
    parser.add_argument("--anchor-site", help="a FlashInfer >= 0.6.14 site: its FP8 MLA, beside")
    parser.add_argument("--anchor-timeout-s", type=float, default=300.0)
    parser.add_argument("--anchor-only", action="store_true", help=argparse.SUPPRESS)
    parser.add_argument(
        "--heads", default="16,8", help="heads per rank to run (tiny model 16, GLM-5 TP8 8)"
    )
    parser.add_argument("--pool-rows", type=int, default=POOL_ROWS)
    parser.add_argument("--no-numerics", action="store_true")
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--replot", help="redraw .md/.png under --out from this JSON (no GPU)")
    args = parser.parse_args()
    if args.replot:
        doc = json.loads(Path(args.replot).read_text())
        out = Path(args.out)
        out.mkdir(parents=True, exist_ok=True)
        stem = Path(args.replot).stem
        (out / f"{stem}.md").write_text(markdown(doc))
        plot(doc, out / f"{stem}.png")
        return 0
    if not torch.cuda.is_available():
        print("fp8_decode: needs a CUDA GPU", file=sys.stderr)
        return 2
    if args.anchor_only:
        return anchor_only(args)
    native, native_path = load_module(args.native, "fp8_mla_decode.py")
    gather, _ = load_module(args.gather, "fp8_kv_gather.py")
    previous = load_module(args.previous, "fp8_mla_decode.py")[0] if args.previous else None
    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    device = torch.cuda.get_device_name()
    ceiling = copy_ceiling_tbs()
    print(f"copy ceiling {ceiling:.2f} TB/s on {device}", flush=True)
    heads_list = [int(h) for h in args.heads.split(",")]
    cuda = torch.device("cuda")
    doc = {
        "device": device,
        "date": dt.datetime.now(dt.timezone.utc).strftime("%Y-%m-%d %H:%M UTC"),
        "command": " ".join(shlex.quote(a) for a in [sys.executable, *sys.argv]),
        "versions": versions(),
        "native": native_path,
        "native_defaults": {f"{h} heads": str(native.launch_config(h, cuda)) for h in heads_list},
        "previous": args.previous,
        "pool_rows": args.pool_rows,
        "copy_ceiling_tbs": ceiling,
        "numerics": [],
        "timings": [],
        "host": [],
    }
    if not args.no_numerics:
        for h in heads_list:
            doc["numerics"] += check_numerics(native, h, args.pool_rows, args.seed + h)
        torch.cuda.empty_cache()
    for h in heads_list:
        timer = Timer(native, gather, previous, h, args.pool_rows, args.seed)
        for name, bs, ctx, shared in WORKLOADS:
            doc["timings"].append(timer.workload(name, bs, ctx, shared))
        doc["host"] += timer.host_costs()
        del timer
        torch.cuda.empty_cache()
    if args.anchor_site:
        anchor = run_anchor(args, out)
        if anchor:
            merge_anchor(doc, anchor)
    doc["bars"] = bars(doc)
    (out / "fp8-decode.json").write_text(json.dumps(doc, indent=1) + "\n")
    (out / "fp8-decode.md").write_text(markdown(doc))
    plot(doc, out / "fp8-decode.png")
    print(markdown(doc))
    return 0


if __name__ == "__main__":
    sys.exit(main())
