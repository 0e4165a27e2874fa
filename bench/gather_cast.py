"""Per-layer cost of the FP8 MLA KV path in CUDA-graph replay: upstream full cast vs gather-cast.

    python bench/gather_cast.py --out DIR [--sweep] [--module PATH]

Runs on one GPU with FlashInfer and the PATCHED SGLang tree importable (bench/device_run.sh sets
that up on the H200). Every row is timed as SGLang runs decode: one CUDA graph holding 8
distinct layers (each with its own 495,552 x 576 FP8 pool, so L2 cannot flatter small cases),
replayed and timed with triton.testing.do_bench (median; L2 flushed before each replay),
divided by 8. Rows:

  upstream  pool.to(bf16) of the whole pool, then FlashInfer fa2 MLA        (pinned SGLang)
  patched   the shipped gather-cast kernel into the shared shadow, then fa2 (this patch)
  bf16_kv   fa2 on a BF16 pool, no cast                                     (the target)
  fp8_fa2   fa2 reading the FP8 pool natively (SM90 only; SM120's fa2 cannot)
  gather    the gather-cast kernel alone (for its bandwidth)

Every workload also checks torch.equal(patched output, upstream output). Writes
gather-cast.json / .md / .png under --out and prints the table and the bars last.
"""

from __future__ import annotations

import argparse
import datetime as dt
import json
import math
import os
import platform
import shlex
import subprocess
import sys
from pathlib import Path

import torch
import triton
from triton.testing import do_bench

CKV, KPE, D, HEADS = 512, 64, 576, 16
SM_SCALE = 1.0 / math.sqrt(192 + KPE)
LAYERS_GLM5 = 78
WORKLOADS = [  # (name, batch, ctx per request, shared prefix per request)
    ("1x512", 1, 512, 0),
    ("1x8192", 1, 8192, 0),
    ("1x65536", 1, 65536, 0),
    ("8x4096", 8, 4096, 0),
    ("64x2048", 64, 2048, 0),
    ("64x7000", 64, 7000, 0),
    # More referenced slots than pool rows (a shared 1024-slot prefix): the full-pool mode.
    ("64x8192 shared", 64, 8192, 1024),
]
SWEEP_ROWS = [512, 2048, 8192, 32768, 131072, 262144, 448000, 495552]


def load_kernel(path: str | None):
    sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "src"))
    from glmserve.selftest import runner

    found = Path(path) if path else runner.installed_kernel_path()
    if found is None:
        sys.exit("gather_cast: no patched SGLang on sys.path (apply the series first)")
    return runner.load_kernel_module(found), found


def versions() -> dict[str, str]:
    out = {
        "python": platform.python_version(),
        "torch": torch.__version__,
        "triton": triton.__version__,
    }
    for name in ("flashinfer", "sglang"):
        try:
            from importlib.metadata import version

            out[name] = version(name if name != "flashinfer" else "flashinfer-python")
        except Exception as exc:
            out[name] = f"unknown ({type(exc).__name__})"
    try:
        smi = subprocess.run(
            ["nvidia-smi", "--query-gpu=name,driver_version,clocks.max.sm,memory.total", "--format=csv,noheader"],
            capture_output=True, text=True, timeout=20,
        )  # fmt: skip
        out["nvidia-smi"] = smi.stdout.strip()
    except Exception:
        out["nvidia-smi"] = "unavailable"
    out["cuda"] = str(torch.version.cuda)
    return out


def median_us(fn, rep_ms: int = 150) -> float:
    return do_bench(fn, warmup=25, rep=rep_ms, return_mode="median") * 1e3


def graph_us(step, n_layers: int, rep_ms: int = 150) -> tuple[float, torch.cuda.CUDAGraph]:
    """Capture `step` (all layers) once, return median replay time per layer in µs."""
    step()  # eager warm-up: Triton compile, FlashInfer module load, allocator state
    torch.cuda.synchronize()
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        step()
    graph.replay()
    torch.cuda.synchronize()
    return median_us(graph.replay, rep_ms) / n_layers, graph


def copy_ceiling_tbs() -> float:
    n = 1 << 30
    src = torch.randint(0, 255, (n,), dtype=torch.uint8, device="cuda")
    dst = torch.empty_like(src)
    t_us = median_us(lambda: dst.copy_(src))
    return 2 * n / (t_us * 1e-6) / 1e12


class Bench:
    def __init__(self, kernel, pool_rows: int, n_layers: int, seed: int = 0) -> None:
        import flashinfer.mla

        self.k = kernel
        self.p = pool_rows
        self.n_layers = n_layers
        self.gen = torch.Generator(device="cuda").manual_seed(seed)
        self.pools = []
        for _ in range(n_layers):
            raw = torch.randint(
                0, 256, (pool_rows, 1, D), dtype=torch.uint8, device="cuda", generator=self.gen
            )
            raw[(raw & 0x7F) == 0x7F] ^= 1
            self.pools.append(raw.view(torch.float8_e4m3fn))
        self.bf16_pools = [p.to(torch.bfloat16) for p in self.pools]
        self.shadow = torch.empty((pool_rows, 1, D), dtype=torch.bfloat16, device="cuda")
        self.rows = torch.zeros(1, dtype=torch.int32, device="cuda")
        self.ws = torch.empty(128 << 20, dtype=torch.uint8, device="cuda")
        self.mla = flashinfer.mla
        self.fp8_native: str | None = None  # why the native row is missing, if it is

    def indices(self, bs: int, ctx: int, shared: int) -> torch.Tensor:
        perm = torch.randperm(self.p, device="cuda", generator=self.gen)
        prefix, rest = perm[:shared], perm[shared:]
        per = ctx - shared
        lists = []
        for b in range(bs):
            own = rest[(b * per) % len(rest) :][:per]
            if len(own) < per:  # wrap (only in the > pool workloads)
                own = torch.cat([own, rest[: per - len(own)]])
            lists.append(torch.cat([prefix, own]))
        idx = torch.cat(lists).to(torch.int32)
        idx[ctx // 2] = self.p - 1  # the last pool row is always in play
        return idx

    def workload(
        self, bs: int, ctx: int, shared: int = 0, rows_only: bool = False, launch=None
    ) -> dict:
        idx = self.indices(bs, ctx, shared)
        kv_indptr = torch.arange(bs + 1, dtype=torch.int32, device="cuda") * ctx
        qo_indptr = torch.arange(bs + 1, dtype=torch.int32, device="cuda")
        kv_lens = kv_indptr[1:] - kv_indptr[:-1]
        self.rows.copy_(kv_indptr[-1:])
        q = [
            torch.randn(bs, HEADS, CKV, device="cuda", generator=self.gen).bfloat16()
            for _ in range(self.n_layers)
        ]
        qpe = [
            torch.randn(bs, HEADS, KPE, device="cuda", generator=self.gen).bfloat16()
            for _ in range(self.n_layers)
        ]
        outs = {
            name: [torch.empty_like(x) for x in q]
            for name in ("upstream", "patched", "bf16_kv", "fp8_fa2")
        }
        wrapper = self.mla.BatchMLAPagedAttentionWrapper(self.ws, backend="fa2")
        wrapper.plan(
            qo_indptr,
            kv_indptr,
            idx,
            kv_lens,
            HEADS,
            CKV,
            KPE,
            1,
            False,
            SM_SCALE,
            torch.bfloat16,
            torch.bfloat16,
        )
        gather_kw = launch or {}
        res: dict = {"bs": bs, "ctx": ctx, "shared": shared, "rows": bs * ctx}
        res["full_pool_mode"] = bs * ctx >= self.p

        def gather_only():
            for pool in self.pools:
                self.k.gather_cast(pool, idx, self.rows, self.shadow, **gather_kw)

        def upstream():
            for i, pool in enumerate(self.pools):
                kv = pool.to(torch.bfloat16)
                wrapper.run(q[i], qpe[i], kv[:, :, :CKV], kv[:, :, CKV:], out=outs["upstream"][i])

        def patched():
            for i, pool in enumerate(self.pools):
                kv = self.k.gather_cast(pool, idx, self.rows, self.shadow, **gather_kw)
                wrapper.run(q[i], qpe[i], kv[:, :, :CKV], kv[:, :, CKV:], out=outs["patched"][i])

        def bf16_kv():
            for i, kv in enumerate(self.bf16_pools):
                wrapper.run(q[i], qpe[i], kv[:, :, :CKV], kv[:, :, CKV:], out=outs["bf16_kv"][i])

        res["gather_us"], g = graph_us(gather_only, self.n_layers)
        del g
        eff_rows = min(bs * ctx, self.p)
        moved = eff_rows * (D + 2 * D) + (0 if res["full_pool_mode"] else bs * ctx * 4)
        res["gather_tbs"] = moved / (res["gather_us"] * 1e-6) / 1e12
        if rows_only:
            return res
        for name, fn in (("upstream", upstream), ("patched", patched), ("bf16_kv", bf16_kv)):
            res[f"{name}_us"], g = graph_us(fn, self.n_layers)
            del g
            torch.cuda.empty_cache()
        res["bitwise_equal"] = all(
            torch.equal(a, b) for a, b in zip(outs["patched"], outs["upstream"], strict=True)
        )
        res["finite"] = all(bool(torch.isfinite(o).all()) for o in outs["upstream"])
        res["fp8_fa2_us"] = None
        if self.fp8_native is None:
            try:
                w8 = self.mla.BatchMLAPagedAttentionWrapper(self.ws, backend="fa2")
                w8.plan(
                    qo_indptr,
                    kv_indptr,
                    idx,
                    kv_lens,
                    HEADS,
                    CKV,
                    KPE,
                    1,
                    False,
                    SM_SCALE,
                    torch.bfloat16,
                    torch.float8_e4m3fn,
                )

                def fp8_fa2():
                    for i, pool in enumerate(self.pools):
                        w8.run(
                            q[i], qpe[i], pool[:, :, :CKV], pool[:, :, CKV:], out=outs["fp8_fa2"][i]
                        )

                res["fp8_fa2_us"], g = graph_us(fp8_fa2, self.n_layers)
                del g
            except Exception as exc:  # the row is informative only; record why it is missing
                self.fp8_native = f"{type(exc).__name__}: {str(exc).splitlines()[0][:200]}"
        return res


def sweep_configs(bench: Bench) -> list[dict]:
    """Launch-shape sweep of the shipped kernel (gather only, 8 layers per graph)."""
    sms = torch.cuda.get_device_properties(0).multi_processor_count
    found = []
    for block_rows in (8, 16, 32):
        for warps in (4, 8):
            for per_sm in (2, 4, 8, 16):
                launch = {"block_rows": block_rows, "num_warps": warps, "grid": sms * per_sm}
                row = {"block_rows": block_rows, "num_warps": warps, "programs_per_sm": per_sm}
                for bs, ctx in ((1, 512), (1, 8192), (64, 7000)):
                    r = bench.workload(bs, ctx, rows_only=True, launch=launch)
                    row[f"{bs}x{ctx}_us"] = r["gather_us"]
                    row[f"{bs}x{ctx}_tbs"] = r["gather_tbs"]
                found.append(row)
                print(f"sweep {row}", flush=True)
    return found


VARIANT_LAUNCHES = [
    (8, 4, 8),
    (8, 4, 16),
    (16, 4, 8),
    (16, 8, 8),
    (16, 4, 16),
    (32, 8, 8),
    (32, 8, 16),
    (32, 4, 8),
]
VARIANT_SIZES = [(1, 512), (1, 8192), (64, 2048), (64, 7000), (8, 495_552 // 8)]
LAUNCH_CONSTANTS = ("BLOCK_ROWS", "NUM_WARPS", "PROGRAMS_PER_SM")


def check_variant(module, pool_rows: int) -> bool:
    """The variant's gather vs .to() on the referenced rows (dups, count 0, last row, full pool)."""
    gen = torch.Generator(device="cuda").manual_seed(123)
    raw = torch.randint(0, 256, (pool_rows, 1, D), dtype=torch.uint8, device="cuda", generator=gen)
    raw[(raw & 0x7F) == 0x7F] ^= 1
    pool = raw.view(torch.float8_e4m3fn)
    ref = pool.to(torch.bfloat16).view(torch.int16)
    hot = torch.randint(0, pool_rows, (50_000,), device="cuda", generator=gen)
    slots = hot[torch.randint(0, len(hot), (2 * pool_rows,), device="cuda", generator=gen)].to(
        torch.int32
    )
    slots[3] = pool_rows - 1
    out = torch.empty(pool.shape, dtype=torch.bfloat16, device="cuda")
    for count in (0, 777, 131_072, pool_rows + 5):
        out.fill_(float("nan"))
        module.gather_cast(
            pool, slots, torch.tensor([count], dtype=torch.int32, device="cuda"), out
        )
        want = (
            torch.arange(pool_rows, device="cuda")
            if count >= pool_rows
            else torch.unique(slots[:count].long())
        )
        got = out.view(torch.int16)
        untouched = torch.ones(pool_rows, dtype=torch.bool, device="cuda")
        untouched[want] = False
        if not torch.equal(got[want], ref[want]) or not bool(torch.isnan(out[untouched]).all()):
            return False
    return True


def variant_sweep(bench: Bench, paths: list[str]) -> list[dict]:
    """Every variant x launch shape: bitwise check, then gather-only µs per layer."""
    sms = torch.cuda.get_device_properties(0).multi_processor_count
    rows = []
    for path in paths:
        module, _ = load_kernel(path)
        ok = check_variant(module, bench.p)
        saved = bench.k
        bench.k = module
        for block_rows, warps, per_sm in VARIANT_LAUNCHES:
            launch = {"block_rows": block_rows, "num_warps": warps, "grid": sms * per_sm}
            row = {
                "variant": Path(path).name,
                "bitwise_ok": ok,
                "block_rows": block_rows,
                "num_warps": warps,
                "programs_per_sm": per_sm,
            }
            times = []
            for bs, ctx in VARIANT_SIZES:
                r = bench.workload(bs, ctx, rows_only=True, launch=launch)
                row[f"{bs}x{ctx}_us"] = round(r["gather_us"], 2)
                row[f"{bs}x{ctx}_tbs"] = round(r["gather_tbs"], 3)
                times.append(r["gather_us"])
            row["geomean_us"] = math.exp(sum(math.log(t) for t in times) / len(times))
            rows.append(row)
            print(f"variant {row}", flush=True)
        bench.k = saved
    return rows


def write_best(rows: list[dict], variant_dir: str, target: Path) -> dict:
    """Install the fastest bitwise-correct variant with its launch shape written into the source."""
    best = min((r for r in rows if r["bitwise_ok"]), key=lambda r: r["geomean_us"])
    source = Path(variant_dir, best["variant"]).read_text()
    values = (best["block_rows"], best["num_warps"], best["programs_per_sm"])
    for name, value in zip(LAUNCH_CONSTANTS, values, strict=True):
        lines = [ln for ln in source.splitlines() if ln.startswith(f"{name} = ")]
        if len(lines) != 1:
            raise SystemExit(f"gather_cast: {best['variant']} has no single '{name} = ' line")
        source = source.replace(lines[0] + "\n", f"{name} = {value}\n")
    target.write_text(source)
    return best


def bars(results: list[dict], sweep: list[dict], ceiling: float) -> list[dict]:
    by = {r["name"]: r for r in results}
    out = []

    def bar(text, value, limit, ok):
        out.append({"bar": text, "value": value, "limit": limit, "pass": bool(ok)})

    r = by["1x512"]
    ratio = r["patched_us"] / r["upstream_us"]
    bar("patched <= 1/40 of upstream at 1x512", f"1/{1 / ratio:.0f}", "1/40", ratio <= 1 / 40)
    for name in ("1x512", "1x8192", "1x65536", "8x4096"):
        x = by[name]["patched_us"] / by[name]["bf16_kv_us"]
        bar(f"patched <= 1.25x BF16-KV at {name}", f"{x:.2f}x", "1.25x", x <= 1.25)
    x = by["64x2048"]["patched_us"] / by["64x2048"]["bf16_kv_us"]
    bar("patched <= 1.5x BF16-KV at 64x2048", f"{x:.2f}x", "1.5x", x <= 1.5)
    worst = max(
        [r["patched_us"] / r["upstream_us"] for r in results]
        + [s["patched_us"] / s["upstream_us"] for s in sweep if "upstream_us" in s]
    )
    bar(
        "never slower than upstream (worst patched/upstream, all occupancies)",
        f"{worst:.3f}",
        "1.0",
        worst <= 1.0,
    )
    big = [r for r in results + sweep if r["rows"] >= 100_000]
    worst_bw = min(r["gather_tbs"] / ceiling for r in big)
    bar(
        "kernel >= 85% of the copy ceiling at >= 100k rows (worst)",
        f"{100 * worst_bw:.0f}%",
        "85%",
        worst_bw >= 0.85,
    )
    worst_bf = max(r["patched_us"] / r["bf16_kv_us"] for r in results)
    bar(
        "stretch: patched <= 1.10x BF16-KV everywhere (worst)",
        f"{worst_bf:.2f}x",
        "1.10x",
        worst_bf <= 1.10,
    )
    return out


def plot(results: list[dict], sweep: list[dict], path: Path, device: str) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, ax = plt.subplots(figsize=(8, 5))
    pts = sorted([s for s in sweep if "upstream_us" in s], key=lambda s: s["rows"])
    x = [s["rows"] for s in pts]
    for key, label, style in (
        ("upstream_us", "upstream full-pool cast + fa2", "o-"),
        ("patched_us", "patched gather-cast + fa2", "s-"),
        ("bf16_kv_us", "BF16 KV, no cast (target)", "^--"),
        ("gather_us", "gather-cast kernel alone", "x:"),
    ):
        ax.plot(x, [s[key] for s in pts], style, label=label)
    for r in results:
        ax.annotate(r["name"], (r["rows"], r["patched_us"]), fontsize=7, alpha=0.6)
    ax.scatter(
        [r["rows"] for r in results],
        [r["patched_us"] for r in results],
        s=12,
        c="k",
        zorder=5,
        label="issue workloads (patched)",
    )
    ax.set_xscale("log")
    ax.set_yscale("log")
    ax.set_xlabel("active KV rows per layer (batch x context); pool = 495,552 rows")
    ax.set_ylabel("µs per layer (CUDA-graph replay, median, 8 layers/graph)")
    ax.set_title(f"FP8 MLA KV per layer, 16 heads, FlashInfer fa2 — {device}")
    ax.grid(True, which="both", alpha=0.3)
    ax.legend(fontsize=8)
    fig.tight_layout()
    fig.savefig(path, dpi=130)


def markdown(doc: dict) -> str:
    lines = [
        f"# Gather-then-cast benchmark — {doc['device']} — {doc['date']}",
        "",
        f"Command: `{doc['command']}`  ",
        f"Versions: {', '.join(f'{k} {v}' for k, v in doc['versions'].items())}  ",
        f"Kernel: `{doc['kernel']}` (launch: {doc['launch']})  ",
        f"Pool {doc['pool_rows']:,} x 576 FP8 per layer, {doc['layers_per_graph']} distinct layers per graph, "
        f"16 heads, FlashInfer fa2 MLA, medians of CUDA-graph replays (L2 flushed), µs per layer.  ",
        f"Copy ceiling measured in the same run: {doc['copy_ceiling_tbs']:.2f} TB/s (read + write).",
        "",
        "| workload | rows | upstream | patched | BF16 KV | native FP8 fa2 | patched/upstream | patched/BF16 "
        "| floor/BF16 | kernel µs | kernel TB/s (% ceiling) | 78-layer step saving | bit-identical |",
        "|---|---|---|---|---|---|---|---|---|---|---|---|---|",
    ]
    for r in doc["workloads"]:
        fp8 = f"{r['fp8_fa2_us']:.1f}" if r.get("fp8_fa2_us") else "n/a"
        lines.append(
            f"| {r['name']}{' (full-pool mode)' if r['full_pool_mode'] else ''} | {r['rows']:,} | {r['upstream_us']:.1f} "
            f"| {r['patched_us']:.1f} | {r['bf16_kv_us']:.1f} | {fp8} | {r['patched_us'] / r['upstream_us']:.3f} "
            f"| {r['patched_us'] / r['bf16_kv_us']:.2f}x | {r['floor_ratio_vs_bf16']:.2f}x | {r['gather_us']:.1f} "
            f"| {r['gather_tbs']:.2f} ({100 * r['gather_tbs'] / doc['copy_ceiling_tbs']:.0f}%) "
            f"| {r['step_saving_ms_78']:.1f} ms | {r['bitwise_equal']} |"
        )
    if doc.get("fp8_native_missing"):
        lines += ["", f"Native FP8 fa2 row missing: {doc['fp8_native_missing']}"]
    lines += [
        "",
        "floor/BF16: the best any gather-then-cast can do: (BF16-KV attention + the gather's bytes at "
        "the measured copy ceiling) / BF16-KV attention. Each referenced slot is read as FP8 once and "
        "written as BF16 once before FlashInfer reads it again.",
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
    lines += [
        "",
        "## Occupancy sweep (batch 8)",
        "",
        "| rows | upstream | patched | BF16 KV | kernel µs | kernel TB/s |",
        "|---|---|---|---|---|---|",
    ]
    for s in doc["sweep"]:
        lines.append(
            f"| {s['rows']:,} | {s['upstream_us']:.1f} | {s['patched_us']:.1f} | {s['bf16_kv_us']:.1f} "
            f"| {s['gather_us']:.1f} | {s['gather_tbs']:.2f} |"
        )
    if doc.get("config_sweep"):
        lines += ["", "## Launch-shape sweep (kernel alone, µs per layer)", ""]
        keys = [k for k in doc["config_sweep"][0] if k.endswith("_us")]
        lines += [
            "| block_rows | warps | programs/SM | " + " | ".join(keys) + " |",
            "|---" * (3 + len(keys)) + "|",
        ]
        for c in doc["config_sweep"]:
            lines.append(
                f"| {c['block_rows']} | {c['num_warps']} | {c['programs_per_sm']} | "
                + " | ".join(f"{c[k]:.1f}" for k in keys)
                + " |"
            )
    return "\n".join(lines) + "\n"


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--out", required=True, help="folder for gather-cast.{json,md,png}")
    parser.add_argument("--module", help="fp8_kv_gather.py to bench (default: the installed one)")
    parser.add_argument("--pool-rows", type=int, default=495_552)
    parser.add_argument("--layers", type=int, default=8)
    parser.add_argument("--sweep", action="store_true", help="also sweep the kernel launch shape")
    parser.add_argument("--variants", nargs="*", default=[], help="kernel variant files to compare")
    parser.add_argument("--write-best", help="install the best variant here, then stop")
    parser.add_argument("--no-fp8-native", action="store_true", help="skip the native FP8 fa2 row")
    args = parser.parse_args()
    if not torch.cuda.is_available():
        print("gather_cast: needs a CUDA GPU", file=sys.stderr)
        return 2
    kernel, kernel_path = load_kernel(args.module)
    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    device = torch.cuda.get_device_name()
    ceiling = copy_ceiling_tbs()
    print(f"copy ceiling {ceiling:.2f} TB/s on {device}", flush=True)
    bench = Bench(kernel, args.pool_rows, args.layers)
    if args.no_fp8_native:
        bench.fp8_native = "skipped (--no-fp8-native)"
    if args.variants:
        rows = variant_sweep(bench, args.variants)
        doc = {"device": device, "copy_ceiling_tbs": ceiling, "variants": rows}
        if args.write_best:
            doc["best"] = write_best(
                rows, str(Path(args.variants[0]).parent), Path(args.write_best)
            )
            print(f"installed {doc['best']} as {args.write_best}", flush=True)
        (out / "variants.json").write_text(json.dumps(doc, indent=1) + "\n")
        return 0
    config_sweep = sweep_configs(bench) if args.sweep else []
    results = []
    for name, bs, ctx, shared in WORKLOADS:
        r = bench.workload(bs, ctx, shared)
        r["name"] = name
        r["step_saving_ms_78"] = LAYERS_GLM5 * (r["upstream_us"] - r["patched_us"]) / 1e3
        # Lower bound of any gather-then-cast: BF16 attention + the gather's bytes at the copy ceiling.
        eff = min(r["rows"], args.pool_rows)
        floor_us = (
            (eff * 3 * D + (0 if r["full_pool_mode"] else r["rows"] * 4)) / (ceiling * 1e12) * 1e6
        )
        r["floor_ratio_vs_bf16"] = (r["bf16_kv_us"] + floor_us) / r["bf16_kv_us"]
        results.append(r)
        print(json.dumps(r), flush=True)
    sweep = []
    for rows in SWEEP_ROWS:
        r = bench.workload(8, rows // 8)
        sweep.append(r)
        print(json.dumps(r), flush=True)
    doc = {
        "device": device,
        "date": dt.datetime.now(dt.timezone.utc).strftime("%Y-%m-%d %H:%M UTC"),
        "command": " ".join(shlex.quote(a) for a in [sys.executable, *sys.argv]),
        "versions": versions(),
        "kernel": str(kernel_path),
        "launch": {
            "block_rows": kernel.BLOCK_ROWS,
            "num_warps": kernel.NUM_WARPS,
            "programs_per_sm": kernel.PROGRAMS_PER_SM,
        },
        "pool_rows": args.pool_rows,
        "layers_per_graph": args.layers,
        "copy_ceiling_tbs": ceiling,
        "workloads": results,
        "sweep": sweep,
        "config_sweep": config_sweep,
        "fp8_native_missing": bench.fp8_native,
        "env": {
            k: v
            for k, v in os.environ.items()
            if k.startswith(("GLMSERVE_", "TRITON_", "FLASHINFER_"))
        },
    }
    doc["bars"] = bars(results, sweep, ceiling)
    (out / "gather-cast.json").write_text(json.dumps(doc, indent=1) + "\n")
    (out / "gather-cast.md").write_text(markdown(doc))
    plot(results, sweep, out / "gather-cast.png", device)
    print(markdown(doc))
    return 0 if all(r["bitwise_equal"] for r in results) else 1


if __name__ == "__main__":
    sys.exit(main())
