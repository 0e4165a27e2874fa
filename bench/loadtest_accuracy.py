"""Does the Locust decode suite measure what the server did? Checked against the emulator.

For each emulator timing (--tpot-ms, --ttft-ms, --tokens-per-chunk K) and each concurrency N,
this starts `python -m glmserve.emulator` on a free port, runs

    locust -f loadtest/decode.py --headless -H URL --shape concurrent -u N \
        --warmup-s W --measure-s M --max-tokens T

as a separate process, reads its summary.json and compares the measured p50 TPOT and p50
TTFT with the configured truth (error in %, pass when |error| <= 2 %). It also records what
the emulator itself measured server-side (mean TTFT from its sglang:time_to_first_token
histogram), so a miss can be attributed: client (Locust) or server (the emulator, sharing the
same CPUs), and the SSE events per second, which is what loads one Locust process.

    .venv/bin/python bench/loadtest_accuracy.py                       # default matrix
    .venv/bin/python bench/loadtest_accuracy.py --config 50:500:4 --concurrency 1 128 --write

--write stores bench/results/loadtest-accuracy-<date>.{json,md}.
"""

from __future__ import annotations

import argparse
import datetime as dt
import json
import os
import platform
import re
import resource
import statistics
import subprocess
import sys
import tempfile
import time
import urllib.request
from pathlib import Path

from glmserve.testing.emulator import start_process

ROOT = Path(__file__).resolve().parent.parent
RESULTS = ROOT / "bench" / "results"
LOCUSTFILE = ROOT / "loadtest" / "decode.py"
BOUND_PCT = 2.0


def parse_config(text: str) -> tuple[float, float, int]:
    try:
        tpot, ttft, k = text.split(":")
        return float(tpot), float(ttft), int(k)
    except ValueError:
        raise argparse.ArgumentTypeError(
            f"--config wants TPOT_MS:TTFT_MS:K, not {text!r}"
        ) from None


def server_ttft(url: str) -> tuple[float, float]:
    """(sum, count) of the emulator's own TTFT histogram."""
    with urllib.request.urlopen(url + "/metrics", timeout=10) as r:
        text = r.read().decode()
    out = []
    for part in ("sum", "count"):
        m = re.search(rf"^sglang:time_to_first_token_seconds_{part}\{{[^}}]*\}} (\S+)$", text, re.M)
        out.append(float(m.group(1)) if m else 0.0)
    return out[0], out[1]


PROBE = """
import json, sys, time
from glmserve.streaming import StreamRequest, StreamError, time_stream
import httpx
url, delay, duration, max_tokens = sys.argv[1], float(sys.argv[2]), float(sys.argv[3]), int(sys.argv[4])
time.sleep(delay)
end = time.monotonic() + duration
ttft, tpot = [], []
with httpx.Client(timeout=120) as client:
    while time.monotonic() < end:
        try:
            t = time_stream(url, StreamRequest(max_tokens=max_tokens, prompt="hi " * 128),
                            client=client)
        except StreamError:
            continue
        ttft.append(t.ttft_s * 1e3)
        tpot.append(t.tpot_s * 1e3)
print(json.dumps({"ttft": ttft, "tpot": tpot}))
"""


def start_probe(url: str, delay_s: float, duration_s: float, max_tokens: int):
    """A reference client in its own process: one httpx stream at a time, same StreamTimer.

    It shares the machine (and the emulator) with Locust, so a difference between it and
    Locust is Locust's own error; what both see above the truth is the server's or the box's.
    """
    argv = [sys.executable, "-c", PROBE, url, str(delay_s), str(duration_s), str(max_tokens)]
    return subprocess.Popen(argv, stdout=subprocess.PIPE, text=True)


def children_cpu_s() -> float:
    ru = resource.getrusage(resource.RUSAGE_CHILDREN)
    return ru.ru_utime + ru.ru_stime


def run_point(args: argparse.Namespace, tpot: float, ttft: float, k: int, n: int) -> dict:
    emu = start_process(
        [
            "--tpot-ms",
            str(tpot),
            "--ttft-ms",
            str(ttft),
            "--tokens-per-chunk",
            str(k),
            "--max-concurrency",
            str(max(n, 256)),
        ]
    )
    try:
        s0, c0 = server_ttft(emu.url)
        load0 = os.getloadavg()[0]
        with tempfile.TemporaryDirectory() as tmp:
            argv = [
                sys.executable, "-m", "locust", "-f", str(LOCUSTFILE), "--headless",
                "-H", emu.url, "--shape", "concurrent", "-u", str(n),
                "--warmup-s", str(args.warmup_s), "--measure-s", str(args.measure_s),
                "--max-tokens", str(args.max_tokens), "--report-dir", tmp,
                "--itl-stats", args.itl_stats, "--loglevel", "WARNING", "--only-summary",
            ]  # fmt: skip
            if args.processes:
                argv += ["--processes", str(args.processes)]
            # The probe's short streams fit the measured window, after Locust's start-up.
            probe = start_probe(emu.url, args.warmup_s + 3, args.measure_s - 6, 32)
            cpu0, t0 = children_cpu_s(), time.monotonic()
            proc = subprocess.run(argv, capture_output=True, text=True, timeout=600)
            cpu, wall = children_cpu_s() - cpu0, time.monotonic() - t0
            probe_out, _ = probe.communicate(timeout=120)
            ref = json.loads(probe_out)
            if proc.returncode not in (0, 1):
                raise RuntimeError(f"locust exited {proc.returncode}: {proc.stderr[-2000:]}")
            summary = json.loads(Path(tmp, "summary.json").read_text())
        s1, c1 = server_ttft(emu.url)
    finally:
        emu.stop()
    step = summary["steps"][0]
    tpot_p50, ttft_p50 = step["tpot_ms"]["p50"], step["ttft_ms"]["p50"]
    if tpot_p50 is None or ttft_p50 is None:
        raise SystemExit(f"{n} streams: no request completed inside the window; raise --measure-s")
    tps = step["output_tokens_per_s"]
    ref_ttft = statistics.median(ref["ttft"]) if ref["ttft"] else None
    ref_tpot = statistics.median(ref["tpot"]) if ref["tpot"] else None
    row = {
        "tpot_ms": tpot, "ttft_ms": ttft, "tokens_per_chunk": k, "streams": n,
        "requests": step["requests"], "failures": step["failures"],
        "tpot_p50_ms": tpot_p50, "tpot_err_pct": 100 * (tpot_p50 - tpot) / tpot,
        "ttft_p50_ms": ttft_p50, "ttft_err_pct": 100 * (ttft_p50 - ttft) / ttft,
        "itl_p50_ms": step["itl_ms"]["p50"], "itl_p99_ms": step["itl_ms"]["p99"],
        "server_ttft_mean_ms": 1e3 * (s1 - s0) / (c1 - c0) if c1 > c0 else None,
        "reference_ttft_p50_ms": ref_ttft, "reference_tpot_p50_ms": ref_tpot,
        "reference_requests": len(ref["ttft"]),
        "output_tokens_per_s": tps, "sse_events_per_s": tps / k,
        "locust_cpu_s": cpu, "locust_wall_s": wall, "loadavg_1m_start": load0,
    }  # fmt: skip
    row["within_bound"] = (
        abs(row["tpot_err_pct"]) <= BOUND_PCT and abs(row["ttft_err_pct"]) <= BOUND_PCT
    )
    return row


def fmt_row(r: dict) -> str:
    srv = r["server_ttft_mean_ms"]
    return (
        f"| {r['tpot_ms']:g}/{r['ttft_ms']:g}/{r['tokens_per_chunk']} | {r['streams']} "
        f"| {r['requests']} | {r['tpot_p50_ms']:.3f} ({r['tpot_err_pct']:+.2f}) "
        f"| {r['ttft_p50_ms']:.1f} ({r['ttft_err_pct']:+.2f}) "
        f"| {'-' if srv is None else f'{srv:.1f}'} | {_opt(r['reference_ttft_p50_ms'], 1)} "
        f"/ {_opt(r['reference_tpot_p50_ms'], 3)} | {r['itl_p99_ms']:.1f} "
        f"| {r['sse_events_per_s']:.0f} | {r['locust_cpu_s']:.1f}/{r['locust_wall_s']:.0f} "
        f"| {r['loadavg_1m_start']:.1f} | {'yes' if r['within_bound'] else 'NO'} |"
    )


def _opt(value: float | None, digits: int) -> str:
    return "-" if value is None else f"{value:.{digits}f}"


HEADER = (
    "| TPOT/TTFT/K | streams | requests | TPOT p50 ms (err %) | TTFT p50 ms (err %) "
    "| server TTFT mean ms | reference TTFT / TPOT p50 ms | ITL p99 ms | SSE events/s "
    "| Locust CPU s / wall s | load 1m | within ±2 % |\n"
    "|---|---|---|---|---|---|---|---|---|---|---|---|"
)


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--config", type=parse_config, nargs="+",
                    default=[(20.0, 200.0, 1), (50.0, 500.0, 4)],
                    help="TPOT_MS:TTFT_MS:K emulator timings")  # fmt: skip
    ap.add_argument("--concurrency", type=int, nargs="+", default=[1, 32, 64, 128, 256])
    ap.add_argument("--warmup-s", type=float, default=10.0)
    ap.add_argument("--measure-s", type=float, default=20.0)
    ap.add_argument("--max-tokens", type=int, default=256)
    ap.add_argument("--itl-stats", choices=("on", "off"), default="on")
    ap.add_argument("--processes", type=int, default=0, help="Locust --processes (0: one)")
    ap.add_argument("--write", action="store_true", help="write bench/results files")
    ap.add_argument("--note", default="", help="free text for the .md")
    args = ap.parse_args()

    rows = []
    print(HEADER, flush=True)
    for tpot, ttft, k in args.config:
        for n in args.concurrency:
            rows.append(run_point(args, tpot, ttft, k, n))
            print(fmt_row(rows[-1]), flush=True)
    best = {}
    for tpot, ttft, k in args.config:
        ok = [r["streams"] for r in rows
              if (r["tpot_ms"], r["ttft_ms"], r["tokens_per_chunk"]) == (tpot, ttft, k)
              and r["within_bound"]]  # fmt: skip
        best[f"{tpot:g}/{ttft:g}/{k}"] = max(ok, default=None)
    print("highest concurrency within ±2 % (one config each):", best)
    if args.write:
        write(args, rows, best)
    return 0


def write(args: argparse.Namespace, rows: list[dict], best: dict) -> None:
    import locust

    stamp = dt.datetime.now(dt.timezone.utc).strftime("%Y-%m-%d")
    cmd = "python bench/loadtest_accuracy.py " + " ".join(sys.argv[1:])
    meta = {
        "date_utc": dt.datetime.now(dt.timezone.utc).isoformat(timespec="seconds"),
        "command": cmd,
        "machine": f"{platform.machine()} {os.cpu_count()} CPUs, {platform.platform()}",
        "python": platform.python_version(),
        "locust": locust.__version__,
        "warmup_s": args.warmup_s, "measure_s": args.measure_s,
        "max_tokens": args.max_tokens, "itl_stats": args.itl_stats,
        "locust_processes": args.processes or 1, "bound_pct": BOUND_PCT, "note": args.note,
    }  # fmt: skip
    RESULTS.mkdir(parents=True, exist_ok=True)
    base = RESULTS / f"loadtest-accuracy-{stamp}"
    base.with_suffix(".json").write_text(
        json.dumps({"meta": meta, "rows": rows, "highest_within_bound": best}, indent=2) + "\n"
    )
    lines = [
        f"# Locust decode suite accuracy against the emulator ({stamp})",
        "",
        f"Command: `{cmd}`  ",
        f"Machine: {meta['machine']}; Python {meta['python']}, Locust {meta['locust']}; "
        f"one Locust process unless stated ({meta['locust_processes']}).  ",
        f"Per point: warm-up {args.warmup_s:g} s, measured {args.measure_s:g} s, "
        f"{args.max_tokens} output tokens (ignore_eos), ITL stats {args.itl_stats}.  ",
        "Truth = the emulator's --tpot-ms / --ttft-ms; error = (Locust p50 - truth) / truth. "
        "'server TTFT mean' is the emulator's own histogram (from request arrival, so without "
        "its HTTP intake). 'reference' is a second client in its own process (httpx, one "
        "32-token stream at a time, same StreamTimer) running during the measured window: "
        "Locust minus reference is Locust's own error; what both see above the truth comes "
        "from the server or the machine. 'load 1m' is the load average at the start of the "
        "point: the 2 CPUs are shared with other jobs.",
        "",
        HEADER,
        *[fmt_row(r) for r in rows],
        "",
        f"Highest concurrency within ±2 % per timing: {best}",
    ]
    if args.note:
        lines += ["", args.note]
    base.with_suffix(".md").write_text("\n".join(lines) + "\n")
    print(f"wrote {base}.json and .md")


if __name__ == "__main__":
    sys.exit(main())
