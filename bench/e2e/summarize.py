#!/usr/bin/env python3
"""Merge the e2e.json of several device calls into one results pair (JSON + Markdown tables).

    python bench/e2e/summarize.py --out bench/results/e2e-h200-DATE NAME=RAW.json [NAME=RAW.json ...]

The raw files stay next to it (every sample, every server's argv and log facts); this keeps what a
reader needs: versions, commands, the bars of every call side by side, per-server numbers with
their spread, and the greedy agreement.
"""

from __future__ import annotations

import argparse
import json
import statistics
import sys
from pathlib import Path
from typing import Any

KEYS = ("device", "date", "sglang", "flashinfer", "torch", "triton", "sglang-kernel", "python",
        "patch_series", "patch_lock_sha256", "command", "total_s", "canary_source")  # fmt: skip


def _ms(v: float | None, nd: int = 3) -> str:
    return "—" if v is None else f"{v * 1e3:.{nd}f}"


def server_rows(raw: dict[str, Any]) -> list[dict[str, Any]]:
    rows = []
    labels = {p["key"]: p for p in raw["plan"]}
    for key, r in raw["servers"].items():
        spec = labels.get(key, {})
        tp = r.get("tpot_1_all") or []
        lg = r.get("log") or {}
        rows.append(
            {
                "server": key,
                "variant": spec.get("variant"),
                "layers": spec.get("layers"),
                "tp": spec.get("tp"),
                "pool": lg.get("max_total_num_tokens"),
                "graph_decode_lines": f"{lg.get('decode_lines_graph', 0)}/"
                f"{lg.get('decode_lines_graph', 0) + lg.get('decode_lines_eager', 0)}",
                "capture_bs": lg.get("capture_bs"),
                "ready_s": r.get("ready_s"),
                "selftest": r.get("selftest"),
                "ttft_1_s": r.get("ttft_1"),
                "tpot_1_median_s": r.get("tpot_1"),
                "tpot_1_min_s": min(tp) if tp else None,
                "tpot_1_max_s": max(tp) if tp else None,
                "tpot_1_stdev_s": statistics.stdev(tp) if len(tp) > 1 else None,
                "n_single": len(tp),
                "tpot_1_mean_s": r.get("tpot_1_mean"),
                "server_itl_mean_s": r.get("server_itl_mean"),
                "canary_tpot_mean_s": r.get("canary_tpot"),
                "tpot_8_median_s": r.get("tpot_8"),
                "tok_s_8": r.get("tok_s_8"),
                "error": r.get("error"),
            }
        )
    return rows


def render(calls: dict[str, dict[str, Any]], provenance: list[str] | None = None) -> str:
    ran = sorted({str(c["meta"].get("sglang", "?")) for c in calls.values()})
    out = [f"# End-to-end results: patched SGLang {', '.join(ran)} on the lent H200", ""]
    out += [f"- {line}" for line in provenance or []]
    for name, raw in calls.items():
        m = raw["meta"]
        out.append(f"- **{name}**: {m.get('device')}, {m.get('date')}; SGLang {m.get('sglang')}, "
                   f"FlashInfer {m.get('flashinfer')}, torch {m.get('torch')}, Triton {m.get('triton')}, "
                   f"sglang-kernel {m.get('sglang-kernel')}, Python {m.get('python')}; series "
                   f"`{m.get('patch_series')}` (lock sha256 `{str(m.get('patch_lock_sha256'))[:16]}…`); "
                   f"harness wall {m.get('total_s')} s")  # fmt: skip
        args = _args_of(m.get("command", "")) or "(harness defaults)"
        out.append(f"  - command: `bash bench/e2e/device.sh` {args}")
    out += ["", "## Bars (each call's ratios come from that call alone)", ""]
    names = list(calls)
    out.append("| group | bar | limit | " + " | ".join(names) + " |")
    out.append("|---|---|---|" + "---|" * len(names))
    seen: list[tuple[str, str]] = []
    table: dict[tuple[str, str], dict[str, str]] = {}
    limits: dict[tuple[str, str], str] = {}
    for name, raw in calls.items():
        for grp, bars in raw["bars"].items():
            for b in bars:
                k = (grp, b["name"])
                if k not in table:
                    seen.append(k)
                    table[k] = {}
                limits[k] = b["limit"]
                val = b["value"]
                shown = f"{val:.3f}" if isinstance(val, float) else str(val)
                verdict = {True: "pass", False: "**FAIL**", None: "n/m"}[b["passed"]]
                table[k][name] = f"{shown} {verdict}"
    for k in seen:
        cells = [table[k].get(n, "—") for n in names]
        out.append(f"| {k[0]} | {k[1]} | {limits[k]} | " + " | ".join(cells) + " |")
    for name, raw in calls.items():
        out += ["", f"## Servers, {name}", ""]
        out.append("| server | layers | TP | pool | graph decode | ready s | self-test | TTFT ms "
                   "| TPOT 1 median (min-max) ms | n | client mean | server ITL mean | canary mean "
                   "| TPOT 8 ms | tok/s 8 |")  # fmt: skip
        out.append("|---|---|---|---|---|---|---|---|---|---|---|---|---|---|---|")
        for r in server_rows(raw):
            if r["error"]:
                out.append(f"| {r['server']} | error: {str(r['error'])[:150]} |" + " |" * 13)
                continue
            out.append(
                f"| {r['server']} | {r['layers']} | {r['tp']} | {r['pool']} | {r['graph_decode_lines']} "
                f"| {r['ready_s']:.0f} | {r['selftest']} | {_ms(r['ttft_1_s'], 1)} "
                f"| {_ms(r['tpot_1_median_s'])} ({_ms(r['tpot_1_min_s'], 2)}-{_ms(r['tpot_1_max_s'], 2)}) "
                f"| {r['n_single']} | {_ms(r['tpot_1_mean_s'])} | {_ms(r['server_itl_mean_s'])} "
                f"| {_ms(r['canary_tpot_mean_s'])} | {_ms(r['tpot_8_median_s'])} "
                f"| {'—' if r['tok_s_8'] is None else round(r['tok_s_8'])} |"
            )
    out += ["", "## Greedy token agreement", "", "| call | pair | identical prompts | position match |",
            "|---|---|---|---|"]  # fmt: skip
    for name, raw in calls.items():
        for pair, ag in raw["agreement"].items():
            out.append(
                f"| {name} | {pair} | {ag['identical']}/{ag['prompts']} | {ag['position_match']:.3f} |"
            )
    return "\n".join(out) + "\n"


def _args_of(command: str) -> str:
    # The harness records its own argv; device.sh adds --mode/--out/--model-dir/--profiles-dir.
    parts = command.split()
    keep, skip = [], 0
    for i, p in enumerate(parts):
        if skip:
            skip -= 1
            continue
        if i == 0 or p in ("--mode", "--out", "--model-dir", "--profiles-dir"):
            skip = 0 if i == 0 else 1
            continue
        keep.append(p)
    return " ".join(keep)


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--out", required=True, help="output path without extension")
    p.add_argument("--provenance", action="append", default=[], help="a line for the header")
    p.add_argument("calls", nargs="+", help="NAME=path/to/e2e.json")
    a = p.parse_args(argv)
    calls: dict[str, dict[str, Any]] = {}
    for item in a.calls:
        name, sep, path = item.partition("=")
        if not sep or not name:
            print(f"summarize: expected NAME=PATH, got {item!r}", file=sys.stderr)
            return 2
        try:
            calls[name] = json.loads(Path(path).read_text())
        except (OSError, ValueError) as exc:
            print(f"summarize: cannot read {path}: {exc}", file=sys.stderr)
            return 2
    summary = {
        name: {
            "raw": Path(item.partition("=")[2]).name,
            "meta": {k: raw["meta"].get(k) for k in KEYS},
            "bars": raw["bars"],
            "servers": server_rows(raw),
            "agreement": {
                k: {x: v[x] for x in ("prompts", "identical", "position_match")}
                for k, v in raw["agreement"].items()
            },
        }
        for (name, raw), item in zip(calls.items(), a.calls, strict=True)
    }
    Path(a.out + ".json").write_text(json.dumps(summary, indent=1, sort_keys=True) + "\n")
    Path(a.out + ".md").write_text(render(calls, a.provenance))
    print(f"wrote {a.out}.json and {a.out}.md")
    return 0


if __name__ == "__main__":
    sys.exit(main())
