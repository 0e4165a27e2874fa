"""Native FP8 decode kernel development sweep: launch variants side by side, per layer, one run.

    python bench/fp8_decode_sweep.py --kernel PATH [--baseline PATH] --out DIR
        [--heads 16,8] [--variants NAME,...] [--deadline-s 300]

Needs torch + Triton on one CUDA GPU, nothing else (no FlashInfer, no SGLang): it compares
kernel variants among themselves and against a baseline kernel file in the same run, so a
variant's ratio to the baseline carries over to the full side-by-side table of
bench/fp8_decode.py (FlashInfer BF16 fa2/fa3 and FP8 fa3 there).

Every variant is first checked against the fp64 definition on fresh random inputs (mixed
lengths with an empty request, NaN-poisoned output), then timed on each workload: 8 distinct
layers (each its own 495,552 x 576 FP8 pool) in one CUDA graph, replay median under
triton.testing.do_bench, divided by 8. A variant that fails its check is not timed. Stops
starting new variants at --deadline-s and still writes what it has. Prints the table last.
"""

from __future__ import annotations

import argparse
import datetime as dt
import importlib.util
import json
import math
import sys
import time
from pathlib import Path

import torch
from triton.testing import do_bench

from glmserve.selftest.nativecheck import fp64_decode_attention

D = 576
SM_SCALE = 1.0 / math.sqrt(192 + 64)
POOL_ROWS = 495_552
LAYERS = 8
WORKLOADS = {  # name: per-request lengths (a callable of a generator for mixed ones)
    "1x512": [512],
    "1x8192": [8192],
    "1x65536": [65536],
    "8x4096": [4096] * 8,
    "64x2048": [2048] * 64,
    "64x7000": [7000] * 64,
    "128x4096": [4096] * 128,
    "64 mixed 100-8000": "mixed",
}


# LaunchConfig fields of the kernel under test: form 0 = heads in M, 1 = KV rows in M.
def _v(form, block_n, warps, stages, pps, min_chunk=64, overhead=64, ablate=0, chains=1):
    return dict(form=form, block_n=block_n, num_warps=warps, num_stages=stages,
                programs_per_sm=pps, min_chunk=min_chunk, overhead=overhead,
                ablate=ablate, qk_chains=chains)  # fmt: skip


VARIANTS = {
    "m1 n64 w4 s5 p1": _v(1, 64, 4, 5, 1),
    "m1 n64 w4 s5 p1 ch2": _v(1, 64, 4, 5, 1, chains=2),
    "m1 n64 w4 s5 p1 ch5": _v(1, 64, 4, 5, 1, chains=5),
    "m0 n32 w4 s5 p2": _v(0, 32, 4, 5, 2),
    "m0 n32 w4 s5 p2 ch2": _v(0, 32, 4, 5, 2, chains=2),
    "m0 n32 w4 s5 p2 ch5": _v(0, 32, 4, 5, 2, chains=5),
    "m4 n64 w4 s5 p1": _v(4, 64, 4, 5, 1),
    "m4 n64 w4 s5 p2": _v(4, 64, 4, 5, 2),
    "m4 n64 w4 s4 p2": _v(4, 64, 4, 4, 2),
    "m4 n32 w4 s5 p2": _v(4, 32, 4, 5, 2),
    "m4 n32 w4 s5 p3": _v(4, 32, 4, 5, 3),
    "m1 n32 w2 s5 p4": _v(1, 32, 2, 5, 4),
    "m1 n64 w4 s5 p1 A4 (fake cvt)": _v(1, 64, 4, 5, 1, ablate=4),
    "m0 n32 w4 s5 p2 A4 (fake cvt)": _v(0, 32, 4, 5, 2, ablate=4),
}


def load(path: str, name: str):
    spec = importlib.util.spec_from_file_location(name, path)
    module = importlib.util.module_from_spec(spec)
    sys.modules[name] = module  # dataclasses and triton.jit look their module up
    spec.loader.exec_module(module)
    return module


def lengths(spec, gen) -> list[int]:
    if spec == "mixed":
        return torch.randint(100, 8001, (64,), generator=gen).tolist()
    return list(spec)


class Layers:
    """LAYERS distinct FP8 pools, and per workload the indices and per-layer q."""

    def __init__(self, heads: int, seed: int) -> None:
        self.heads = heads
        self.gen = torch.Generator(device="cuda").manual_seed(seed)
        self.cpu_gen = torch.Generator().manual_seed(seed)
        self.pools = [
            (torch.randn((POOL_ROWS, 1, D), device="cuda", generator=self.gen)).to(
                torch.float8_e4m3fn
            )
            for _ in range(LAYERS)
        ]

    def inputs(self, lens: list[int]):
        total = sum(lens)
        perm = torch.cat(
            [
                torch.randperm(POOL_ROWS, device="cuda", generator=self.gen)
                for _ in range(-(-total // POOL_ROWS))
            ]
        )
        idx = perm[:total].to(torch.int32)
        indptr = torch.zeros(len(lens) + 1, dtype=torch.int32, device="cuda")
        indptr[1:] = torch.tensor(lens, device="cuda").cumsum(0)
        b = len(lens)
        q = [torch.randn(b, self.heads, 512, device="cuda", generator=self.gen).bfloat16()
             for _ in range(LAYERS)]  # fmt: skip
        qpe = [torch.randn(b, self.heads, 64, device="cuda", generator=self.gen).bfloat16()
               for _ in range(LAYERS)]  # fmt: skip
        return indptr, idx, q, qpe


def graph_us(step, rep_ms: int = 80) -> float:
    step()
    torch.cuda.synchronize()
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        step()
    graph.replay()
    torch.cuda.synchronize()
    t = do_bench(graph.replay, warmup=10, rep=rep_ms, return_mode="median") * 1e3 / LAYERS
    del graph
    return t


def check(module, config, heads: int, seed: int) -> dict:
    """fp64 agreement on mixed lengths; NaN propagation; extreme q; empty -> zeros."""
    gen = torch.Generator(device="cuda").manual_seed(seed)
    rows = 70_001
    pool = torch.randn((rows, 1, D), device="cuda", generator=gen).to(torch.float8_e4m3fn)
    lens = [1, 37, 0, 1500, 4096, 9000, 64, 65]
    b = len(lens)
    indptr = torch.zeros(b + 1, dtype=torch.int32, device="cuda")
    indptr[1:] = torch.tensor(lens, device="cuda").cumsum(0)
    idx = torch.randint(0, rows, (sum(lens),), dtype=torch.int32, device="cuda", generator=gen)
    qn = torch.randn(b, heads, 512, device="cuda", generator=gen).bfloat16()
    qp = torch.randn(b, heads, 64, device="cuda", generator=gen).bfloat16()
    kw = {"config": config} if config is not None else {}

    def run(qn, qp, pool):
        out = torch.full_like(qn, float("nan"))
        module.mla_decode_fp8(qn, qp, pool, indptr, idx, SM_SCALE, out, **kw)
        torch.cuda.synchronize()
        return out

    out = run(qn, qp, pool)
    ref = fp64_decode_attention(torch, qn, qp, pool, indptr, idx, SM_SCALE)
    live = torch.tensor(lens, device="cuda") > 0
    err = ((out.double() - ref).norm(dim=-1) / ref.norm(dim=-1).clamp_min(1e-300))[live]
    res = {
        "max_err": float(err.max()),
        "written": bool(torch.isfinite(out[live]).all()),
        "empty_zero": bool((out[~live] == 0).all()),
    }
    # NaN in one head's q, and one NaN e4m3 code in a row of request 5 (9000 rows, many
    # programs) and of request 1 (37 rows, one program): those heads/requests must be NaN.
    qn_nan = qn.clone()
    qn_nan[4, 0, 7] = float("nan")
    o = run(qn_nan, qp, pool)
    res["nan_q"] = bool(torch.isnan(o[4, 0]).all()) and bool(torch.isfinite(o[4, 1:]).all())
    raw = pool.view(torch.uint8).clone()
    for r in (int(idx[int(indptr[5]) + 4321]), int(idx[int(indptr[1]) + 3])):
        raw[r, 0, 500] = 0x7F
    o = run(qn, qp, raw.view(torch.float8_e4m3fn))
    res["nan_kv"] = bool(torch.isnan(o[5]).all()) and bool(torch.isnan(o[1]).all())
    # The q scaling must stay finite over the whole bf16 range wherever fp32 scores do: one
    # element at 2^126 (one-hot softmax), and whole rows at 2^100.
    big = qn.clone()
    big[:, :, 7] = 2.0**126
    o1 = run(big, qp, pool)
    o2 = run((qn.float() * 2.0**100).bfloat16(), (qp.float() * 2.0**100).bfloat16(), pool)
    res["q_2e126_finite"] = bool(torch.isfinite(o1[live]).all()) and bool(
        torch.isfinite(o2[live]).all()
    )
    res["ok"] = (
        res["max_err"] < 4e-3
        and res["written"]
        and res["empty_zero"]
        and res["nan_q"]
        and res["nan_kv"]
        and res["q_2e126_finite"]
    )
    return res


def time_variant(module, config, layers: Layers, workloads: dict) -> dict:
    kw = {"config": config} if config is not None else {}
    return {
        name: round(graph_us(layer_step(module, layers.pools, inputs, kw)), 2)
        for name, inputs in workloads.items()
    }


def layer_step(module, pools, inputs, kw):
    """One decode step over every layer (what a captured graph replays)."""
    indptr, idx, q, qpe = inputs
    outs = [torch.empty_like(x) for x in q]

    def step():
        for i, pool in enumerate(pools):
            module.mla_decode_fp8(q[i], qpe[i], pool, indptr, idx, SM_SCALE, outs[i], **kw)

    return step


def host_us(module, config, layers: Layers, lens: list[int], calls: int = 300) -> dict:
    """Eager cost per call: host submit time (no sync) and one call's latency after a sync."""
    indptr, idx, q, qpe = layers.inputs(lens)
    out = torch.empty_like(q[0])
    kw = {"config": config} if config is not None else {}
    pool = layers.pools[0]

    def call():
        module.mla_decode_fp8(q[0], qpe[0], pool, indptr, idx, SM_SCALE, out, **kw)

    for _ in range(20):
        call()
    torch.cuda.synchronize()
    submit = []
    for _ in range(calls):
        t = time.perf_counter()
        call()
        submit.append((time.perf_counter() - t) * 1e6)
        if len(submit) % 50 == 0:
            torch.cuda.synchronize()
    torch.cuda.synchronize()
    lat = []
    start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
    for _ in range(50):
        torch.cuda.synchronize()
        start.record()
        call()
        end.record()
        end.synchronize()
        lat.append(start.elapsed_time(end) * 1e3)
    submit.sort()
    lat.sort()
    return {"submit_us": round(submit[len(submit) // 2], 1), "event_us": round(lat[25], 1)}


def compiled_resources(module) -> list:
    """(kernel, registers, shared bytes) of what the fast-launch cache holds."""
    found = getattr(module, "_COMPILED", {})
    out = [(k[0].fn.__name__, v.n_regs, v.metadata.shared) for k, v in found.items()]
    found.clear()  # the next variant reports its own
    return sorted(set(out))


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--kernel", required=True)
    ap.add_argument("--baseline")
    ap.add_argument("--out", required=True)
    ap.add_argument("--heads", default="16,8")
    ap.add_argument("--variants", default="", help="names from the kernel's SWEEP dict")
    ap.add_argument("--workloads", default=",".join(WORKLOADS))
    ap.add_argument("--deadline-s", type=float, default=300.0)
    args = ap.parse_args()
    t0 = time.time()
    kernel = load(args.kernel, "fp8_mla_decode_sweep")
    candidates = [("baseline", load(args.baseline, "fp8_mla_decode_base"), None)] if (
        args.baseline
    ) else []  # fmt: skip
    names = [n for n in args.variants.split(",") if n] or list(VARIANTS)
    candidates += [(n, kernel, kernel.LaunchConfig(**VARIANTS[n])) for n in names]
    out_dir = Path(args.out)
    out_dir.mkdir(parents=True, exist_ok=True)
    doc = {
        "date": dt.datetime.now(dt.timezone.utc).isoformat(timespec="seconds"),
        "command": " ".join(sys.argv),
        "device": torch.cuda.get_device_name(),
        "torch": torch.__version__,
        "triton": __import__("triton").__version__,
        "rows": [],
    }
    for heads in [int(h) for h in args.heads.split(",")]:
        layers = Layers(heads, seed=heads)
        loads = {n: layers.inputs(lengths(WORKLOADS[n], layers.cpu_gen))
                 for n in args.workloads.split(",")}  # fmt: skip
        for name, module, config in candidates:
            if time.time() - t0 > args.deadline_s:
                print(f"deadline: skipping {name} heads={heads}", flush=True)
                continue
            row = {"heads": heads, "variant": name, "config": repr(config)}
            try:
                ablation = getattr(config, "ablate", 0)
                if not ablation:  # an ablation computes a wrong result on purpose: time only
                    row["check"] = check(module, config, heads, seed=len(doc["rows"]))
                if ablation or row["check"]["ok"] or name == "baseline":
                    row["us"] = time_variant(module, config, layers, loads)
                    row["host"] = host_us(module, config, layers, [4096] * 8)
                    if hasattr(module, "FAST_LAUNCH"):
                        module.FAST_LAUNCH = False
                        row["host_plain_launch"] = host_us(module, config, layers, [4096] * 8)
                        module.FAST_LAUNCH = True
                    row["compiled"] = compiled_resources(module)
            except Exception as exc:  # a variant that cannot compile/run is reported, not fatal
                row["error"] = f"{type(exc).__name__}: {str(exc)[:300]}"
            doc["rows"].append(row)
            print("row", json.dumps(row), flush=True)
            (out_dir / "sweep.json").write_text(json.dumps(doc, indent=1))
        del layers, loads
        torch.cuda.empty_cache()
    print_table(doc)
    return 0


def print_table(doc: dict) -> None:
    base = {r["heads"]: r.get("us", {}) for r in doc["rows"] if r["variant"] == "baseline"}
    for r in doc["rows"]:
        us = r.get("us")
        if not us:
            print(f"H{r['heads']} {r['variant']:<22} {r.get('error') or r.get('check')}")
            continue
        b = base.get(r["heads"], {})
        cells = " ".join(
            f"{k.split()[0]}={v:.1f}" + (f"({v / b[k]:.2f})" if b.get(k) else "")
            for k, v in us.items()
        )
        chk = r.get("check", {})
        print(f"H{r['heads']} {r['variant']:<22} err={chk.get('max_err', 0):.1e} "
              f"ok={chk.get('ok')} host={r.get('host')} {cells}")  # fmt: skip


if __name__ == "__main__":
    sys.exit(main())
