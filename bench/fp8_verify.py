"""FP8 MLA target verify (MTP) per layer: every path side by side in one run, plus numerics.

    python bench/fp8_verify.py --out DIR [--tokens 4] [--heads 8,16] [--variants NAME,...|all]
        [--deadline-s 420]

Needs one CUDA GPU with FlashInfer and the patched SGLang tree importable (`bash
bench/device_run.sh verify ARGS` sets both up: bench/README.md). A verify pass holds `--tokens`
causal query tokens per request (1 + the draft tokens; SGLang's flashinfer MLA backend plans it
causal, token t of q_len seeing the first kv_len - q_len + t + 1 slots). Paths, per layer:

  bf16_fa2   FlashInfer fa2 MLA, causal, on a BF16 pool (fa2 is SM120's kernel family)
  bf16_auto  FlashInfer backend="auto", causal, on a BF16 pool (what SGLang runs; fa3 on SM90)
  gather     gather-then-cast of the referenced rows + FlashInfer auto (the series before this
             kernel, and what serves verify when the native kernel does not)
  native     mla_decode_fp8(..., qo_indptr, max_q_len): the multi-token native kernel, its
             shipped configuration (and, at 8 heads, the --variants beside it)
  decode_*   the same requests with one query token (native and BF16 auto), for the record of
             what the extra query tokens cost

Timing: one CUDA graph holds 8 distinct layers (each its own 495,552 x 576 pool), replayed under
triton.testing.do_bench (median), divided by 8. Numerics: native and upstream (FlashInfer fa2 on
the BF16 cast) against fp64 on the same FP8 values; bar: native's worst row <= 1.5x upstream's.
CUDA-graph safety: one graph captured once and replayed with other lengths written into the same
indptr buffers, as the backend does. Writes fp8-verify.{json,md} under --out, table last.
"""

from __future__ import annotations

import argparse
import datetime as dt
import json
import math
import shlex
import sys
import time
from pathlib import Path

import torch
from fp8_decode import LAYERS_PER_GRAPH, POOL_ROWS, fp8_pool, graph_us, load_module, slot_lists
from gather_cast import versions

from glmserve.selftest.nativecheck import fp64_causal_attention

CKV, KPE = 512, 64
SM_SCALE = 1.0 / math.sqrt(192 + KPE)
# (name, requests, kv tokens per request including its draft tokens): the shapes.
WORKLOADS = [
    ("1x8192", 1, 8192),
    ("8x4096", 8, 4096),
    ("32x4096", 32, 4096),
    ("64x2048", 64, 2048),
    ("64x7000", 64, 7000),
]
# The bars, 8 heads: native <= 0.8x BF16 fa2 and <= 1.0x BF16 fa3 at every shape, and
# never slower than gather.
FA2_RATIO, FA3_RATIO = 0.8, 1.0


def variants(native) -> dict[str, object]:
    """Launch configurations of the multi-token form to time beside the shipped one (8 heads per
    program; the spill-free ones per the compile check, plus two that spill a few bytes)."""
    cfg = native.LaunchConfig
    hm, km = native.FORM_HEADS_M, native.FORM_KV_M
    return {
        "hm n64 w8 s2 p1": cfg(hm, 64, 8, 2, 1, heads=8),
        "hm n64 w8 s4 p1": cfg(hm, 64, 8, 4, 1, heads=8),
        "hm n32 w4 s4 p2": cfg(hm, 32, 4, 4, 2, heads=8),
        "hm n16 w4 s3 p2": cfg(hm, 16, 4, 3, 2, heads=8),
        "km n64 w8 s2 p1": cfg(km, 64, 8, 2, 1, heads=8),
        "km n32 w8 s2 p2": cfg(km, 32, 8, 2, 2, heads=8),
        "km n16 w4 s3 p2": cfg(km, 16, 4, 3, 2, heads=8),
    }


class Verify:
    """8 layers, each its own FP8 pool and its BF16 copy; FlashInfer wrappers planned causal."""

    def __init__(self, native, gather, tokens: int, seed: int) -> None:
        import flashinfer.mla

        self.native, self.gather, self.tokens = native, gather, tokens
        self.gen = torch.Generator(device="cuda").manual_seed(seed)
        self.pools = [fp8_pool(POOL_ROWS, "normal", self.gen) for _ in range(LAYERS_PER_GRAPH)]
        self.bf16 = [p.to(torch.bfloat16) for p in self.pools]
        self.ws = torch.empty(256 << 20, dtype=torch.uint8, device="cuda")
        self.mla = flashinfer.mla
        self.shadow = torch.empty(self.pools[0].shape, dtype=torch.bfloat16, device="cuda")
        self.rows = torch.zeros(1, dtype=torch.int32, device="cuda")

    def plan(self, backend: str, heads: int, qo, kv_indptr, idx):
        wrapper = self.mla.BatchMLAPagedAttentionWrapper(self.ws, backend=backend)
        wrapper.plan(
            qo, kv_indptr, idx, kv_indptr[1:] - kv_indptr[:-1], heads, CKV, KPE, 1,
            bool(qo[-1] > qo.numel() - 1), SM_SCALE, torch.bfloat16, torch.bfloat16,
        )  # fmt: skip
        return wrapper

    def inputs(self, bs: int, ctx: int, heads: int, tokens: int):
        idx = slot_lists(
            lambda: torch.randperm(POOL_ROWS, device="cuda", generator=self.gen), POOL_ROWS,
            bs, ctx, 0,
        )  # fmt: skip
        kv_indptr = torch.arange(bs + 1, dtype=torch.int32, device="cuda") * ctx
        qo = torch.arange(bs + 1, dtype=torch.int32, device="cuda") * tokens
        q = [
            torch.randn(bs * tokens, heads, CKV, device="cuda", generator=self.gen).bfloat16()
            for _ in self.pools
        ]
        qpe = [
            torch.randn(bs * tokens, heads, KPE, device="cuda", generator=self.gen).bfloat16()
            for _ in self.pools
        ]
        return kv_indptr, qo, idx, q, qpe

    def native_us(self, inputs, tokens: int, config=None) -> float:
        kv_indptr, qo, idx, q, qpe = inputs
        outs = [torch.empty_like(x) for x in q]
        extra = {"qo_indptr": qo, "max_q_len": tokens} if tokens > 1 else {}

        def step():
            for i, pool in enumerate(self.pools):
                self.native.mla_decode_fp8(
                    q[i], qpe[i], pool, kv_indptr, idx, SM_SCALE, outs[i], config=config, **extra
                )

        return graph_us(step)

    def flashinfer_us(self, wrapper, inputs, gathered: bool) -> float:
        kv_indptr, _, idx, q, qpe = inputs
        outs = [torch.empty_like(x) for x in q]
        self.rows.copy_(kv_indptr[-1:])

        def step():
            for i, pool in enumerate(self.pools):
                kv = self.gather.gather_cast(pool, idx, self.rows, self.shadow) if gathered else (
                    self.bf16[i]
                )  # fmt: skip
                wrapper.run(q[i], qpe[i], kv[:, :, :CKV], kv[:, :, CKV:], out=outs[i])

        return graph_us(step)

    def workload(self, name, bs, ctx, heads, sweep, deadline) -> dict:
        t = self.tokens
        inputs = self.inputs(bs, ctx, heads, t)
        kv_indptr, qo, idx, _, _ = inputs
        res = {"name": name, "bs": bs, "ctx": ctx, "heads": heads, "tokens": t}
        fa2 = self.plan("fa2", heads, qo, kv_indptr, idx)
        auto = self.plan("auto", heads, qo, kv_indptr, idx)
        res["auto_backend"] = str(getattr(auto, "_backend", "auto"))
        res["bf16_fa2_us"] = self.flashinfer_us(fa2, inputs, False)
        res["bf16_auto_us"] = self.flashinfer_us(auto, inputs, False)
        res["gather_us"] = self.flashinfer_us(auto, inputs, True)
        res["native_us"] = self.native_us(inputs, t)
        res["native_config"] = repr(self.native.launch_config(heads, torch.device("cuda"), t))
        # The same requests decoding one token: what the extra query tokens cost.
        one = self.inputs(bs, ctx, heads, 1)
        res["decode_native_us"] = self.native_us(one, 1)
        decode_auto = self.plan("auto", heads, one[1], one[0], one[2])
        res["decode_bf16_auto_us"] = self.flashinfer_us(decode_auto, one, False)
        res["variants_us"] = {}
        for vname, cfg in sweep.items():
            if time.monotonic() > deadline:
                res["variants_us"][vname] = None  # past the deadline: not timed
                continue
            try:
                res["variants_us"][vname] = self.native_us(inputs, t, cfg)
            except Exception as exc:  # a variant that does not compile or fit: recorded
                res["variants_us"][vname] = f"{type(exc).__name__}: {str(exc)[:120]}"
            torch.cuda.empty_cache()
        res["native_tbs"] = bs * ctx * (CKV + KPE + 4) / (res["native_us"] * 1e-6) / 1e12
        print("timing", json.dumps(res), flush=True)
        torch.cuda.empty_cache()
        return res


def numerics(native, tokens: int, heads: int, seed: int) -> list[dict]:
    """Native verify and upstream (fa2 on the BF16 cast) against fp64, mixed shapes."""
    import flashinfer.mla

    gen = torch.Generator(device="cuda").manual_seed(seed)
    ws = torch.empty(128 << 20, dtype=torch.uint8, device="cuda")
    rows_pool = 200_003
    out = []
    for kind in ("normal", "wide", "tiny"):
        pool = fp8_pool(rows_pool, kind, gen)
        for lens in ([tokens], [5000], [17, 4096, tokens, 900], [20000, 3, 65]):
            q_lens = [min(tokens, n) for n in lens]
            kv_indptr = torch.tensor([0, *torch.tensor(lens).cumsum(0).tolist()],
                                     dtype=torch.int32, device="cuda")  # fmt: skip
            qo = torch.tensor([0, *torch.tensor(q_lens).cumsum(0).tolist()], dtype=torch.int32,
                              device="cuda")  # fmt: skip
            idx = torch.randint(0, rows_pool, (sum(lens),), dtype=torch.int32, device="cuda",
                                generator=gen)  # fmt: skip
            scale = 30.0 if kind == "tiny" else 1.0
            q = torch.randn(sum(q_lens), heads, CKV, device="cuda", generator=gen) * scale
            qpe = torch.randn(sum(q_lens), heads, KPE, device="cuda", generator=gen) * scale
            q, qpe = q.bfloat16(), qpe.bfloat16()
            got = torch.full_like(q, float("nan"))
            native.mla_decode_fp8(q, qpe, pool, kv_indptr, idx, SM_SCALE, got, qo_indptr=qo,
                                  max_q_len=tokens)  # fmt: skip
            wrapper = flashinfer.mla.BatchMLAPagedAttentionWrapper(ws, backend="fa2")
            wrapper.plan(qo, kv_indptr, idx, kv_indptr[1:] - kv_indptr[:-1], heads, CKV, KPE, 1,
                         True, SM_SCALE, torch.bfloat16, torch.bfloat16)  # fmt: skip
            cast = pool.to(torch.bfloat16)
            up = torch.empty_like(q)
            wrapper.run(q, qpe, cast[:, :, :CKV], cast[:, :, CKV:], out=up)
            ref = fp64_causal_attention(torch, q, qpe, pool, qo, kv_indptr, idx, SM_SCALE)
            live = ref.norm(dim=-1) > 0

            def worst(x, ref=ref, live=live):
                return float(((x.double() - ref).norm(dim=-1) / ref.norm(dim=-1))[live].max())

            row = {"kind": kind, "lens": lens, "q_lens": q_lens, "heads": heads,
                   "native_err": worst(got), "upstream_err": worst(up),
                   "finite": bool(torch.isfinite(got).all())}  # fmt: skip
            row["ratio"] = row["native_err"] / max(row["upstream_err"], 1e-12)
            print("numerics", json.dumps(row), flush=True)
            out.append(row)
    return out


def graph_replays(native, tokens: int, heads: int, seed: int) -> dict:
    """One graph of the native verify, captured once; replays with other lengths written into
    the same indptr buffers (as the backend's note_plan does) must match fp64 each time."""
    gen = torch.Generator(device="cuda").manual_seed(seed)
    pool = fp8_pool(100_003, "normal", gen)
    bs, cap_len = 8, 512
    kv_buf = torch.arange(bs + 1, dtype=torch.int32, device="cuda") * cap_len
    qo_buf = torch.arange(bs + 1, dtype=torch.int32, device="cuda") * tokens
    idx = torch.randint(0, 100_003, (bs * 6000,), dtype=torch.int32, device="cuda", generator=gen)
    q = torch.randn(bs * tokens, heads, CKV, device="cuda", generator=gen).bfloat16()
    qpe = torch.randn(bs * tokens, heads, KPE, device="cuda", generator=gen).bfloat16()
    out = torch.empty_like(q)

    def step():
        native.mla_decode_fp8(q, qpe, pool, kv_buf, idx, SM_SCALE, out, qo_indptr=qo_buf,
                              max_q_len=tokens)  # fmt: skip

    step()
    torch.cuda.synchronize()
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        step()
    worst = 0.0
    for lens in ([tokens] * bs, [6000, 1, 70, 4096, 9, 300, 5000, tokens], [1000] * bs):
        q_lens = [min(tokens, n) for n in lens]
        kv_buf.copy_(torch.tensor([0, *torch.tensor(lens).cumsum(0).tolist()], dtype=torch.int32))
        qo_buf.copy_(torch.tensor([0, *torch.tensor(q_lens).cumsum(0).tolist()],
                                  dtype=torch.int32))  # fmt: skip
        out.fill_(float("nan"))
        graph.replay()
        torch.cuda.synchronize()
        ref = fp64_causal_attention(torch, q, qpe, pool, qo_buf, kv_buf, idx, SM_SCALE)
        used = int(qo_buf[-1])
        err = ((out[:used].double() - ref[:used]).norm(dim=-1) / ref[:used].norm(dim=-1)).max()
        worst = max(worst, float(err))
    return {"replays": 3, "worst_rel_err": worst, "ok": worst < 1e-2}


def bars(doc: dict) -> list[dict]:
    out = []
    for r in doc["timings"]:
        if r["heads"] != 8:
            continue
        n = r["native_us"]
        out.append({"workload": r["name"], "native/fa2": n / r["bf16_fa2_us"],
                    "native/fa3(auto)": n / r["bf16_auto_us"], "native/gather": n / r["gather_us"],
                    "ok": n <= FA2_RATIO * r["bf16_fa2_us"] and n <= FA3_RATIO * r["bf16_auto_us"]
                    and n <= r["gather_us"]})  # fmt: skip
    return out


def markdown(doc: dict) -> str:
    lines = [
        f"# FP8 MLA target verify per layer ({doc['device']}, {doc['date']})",
        "",
        f"Command: `{doc['command']}`  ",
        f"Versions: {json.dumps(doc['versions'])}  ",
        f"{doc['tokens']} causal query tokens per request, 8 layers of {POOL_ROWS:,} x 576 FP8 "
        "rows per CUDA graph, median µs per layer.",
        "",
        "| heads | workload | BF16 fa2 | BF16 auto | gather + auto | **native** | native / fa2 | "
        "native / auto | decode native | decode BF16 auto |",
        "|---|---|---|---|---|---|---|---|---|---|",
    ]
    for r in doc["timings"]:
        lines.append(
            f"| {r['heads']} | {r['name']} | {r['bf16_fa2_us']:.1f} | {r['bf16_auto_us']:.1f} | "
            f"{r['gather_us']:.1f} | **{r['native_us']:.1f}** | "
            f"{r['native_us'] / r['bf16_fa2_us']:.2f} | {r['native_us'] / r['bf16_auto_us']:.2f} | "
            f"{r['decode_native_us']:.1f} | {r['decode_bf16_auto_us']:.1f} |"
        )
    sweep = [r for r in doc["timings"] if r["variants_us"]]
    if sweep:
        names = list(sweep[0]["variants_us"])
        lines += ["", "Launch configurations of the multi-token form (8 heads, µs):", "",
                  "| workload | shipped | " + " | ".join(names) + " |",
                  "|---|---|" + "---|" * len(names)]  # fmt: skip
        for r in sweep:
            cells = [
                f"{v:.1f}" if isinstance(v, float) else ("-" if v is None else "err")
                for v in r["variants_us"].values()
            ]
            lines.append(f"| {r['name']} | {r['native_us']:.1f} | " + " | ".join(cells) + " |")
    lines += ["", "Numerics (worst row, relative to fp64): ", ""]
    for n in doc["numerics"]:
        lines.append(
            f"- {n['kind']} {n['lens']} x {n['q_lens']} tokens, {n['heads']} heads: native "
            f"{n['native_err']:.2e}, upstream {n['upstream_err']:.2e} ({n['ratio']:.2f}x)"
        )
    g = doc.get("graph") or {}
    lines += [
        "",
        f"CUDA-graph replays with new lengths: {json.dumps(g)}",
        "",
        "Bars (8 heads):",
        "",
    ]
    for b in doc["bars"]:
        lines.append(
            f"- {b['workload']}: native/fa2 {b['native/fa2']:.2f} (<= {FA2_RATIO}), native/auto "
            f"{b['native/fa3(auto)']:.2f} (<= {FA3_RATIO}), native/gather "
            f"{b['native/gather']:.2f}: {'met' if b['ok'] else 'MISSED'}"
        )
    return "\n".join(lines) + "\n"


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--out", required=True, type=Path)
    ap.add_argument("--tokens", type=int, default=4, help="query tokens per request (1 + drafts)")
    ap.add_argument("--heads", default="8,16")
    ap.add_argument("--variants", default="all", help="comma-separated names, all, or none")
    ap.add_argument("--deadline-s", type=float, default=420.0,
                    help="start no new variant after this many seconds")  # fmt: skip
    ap.add_argument("--seed", type=int, default=0)
    args = ap.parse_args()
    t0 = time.monotonic()
    args.out.mkdir(parents=True, exist_ok=True)
    native, native_path = load_module(None, "fp8_mla_decode.py")
    gather, _ = load_module(None, "fp8_kv_gather.py")
    every = variants(native)
    chosen = (
        {} if args.variants == "none"
        else every if args.variants == "all"
        else {n: every[n] for n in args.variants.split(",")}
    )  # fmt: skip
    doc = {
        "device": torch.cuda.get_device_name(),
        "date": dt.datetime.now(dt.timezone.utc).strftime("%Y-%m-%d %H:%M UTC"),
        "command": "python3 " + shlex.join(sys.argv),
        "versions": versions(),
        "native_module": native_path,
        "tokens": args.tokens,
        "timings": [],
        "numerics": [],
    }
    path = args.out / "fp8-verify.json"

    def save() -> None:
        doc["bars"] = bars(doc)
        path.write_text(json.dumps(doc, indent=2) + "\n")
        (args.out / "fp8-verify.md").write_text(markdown(doc))

    doc["graph"] = graph_replays(native, args.tokens, 8, args.seed)
    print("graph", json.dumps(doc["graph"]), flush=True)
    for heads in (8, 16):
        doc["numerics"] += numerics(native, args.tokens, heads, args.seed)
    save()
    bench = Verify(native, gather, args.tokens, args.seed)
    deadline = t0 + args.deadline_s
    for heads in [int(h) for h in args.heads.split(",")]:
        for name, bs, ctx in WORKLOADS:
            sweep = chosen if heads == 8 else {}
            doc["timings"].append(bench.workload(name, bs, ctx, heads, sweep, deadline))
            save()
    save()
    print(markdown(doc))
    ok = doc["graph"]["ok"] and all(n["finite"] and n["ratio"] <= 1.5 for n in doc["numerics"])
    return 0 if ok else 1


if __name__ == "__main__":
    sys.exit(main())
