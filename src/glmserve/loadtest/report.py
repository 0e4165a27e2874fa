"""The report directory: summary.json, steps.csv, requests.csv and PNG plots.

Latencies are in milliseconds (keys end in _ms); definitions are glmserve.streaming's, compared
with other tools in docs/metrics.md.
"""

from __future__ import annotations

import csv
import json
import logging
import math
import time
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any

from glmserve.loadtest.results import SLO, STAT_KEYS, StepResult, step_summary

if TYPE_CHECKING:
    from glmserve.loadtest.session import Session

log = logging.getLogger(__name__)
SCHEMA = "glmserve.loadtest.summary/1"


@dataclass(frozen=True)
class Outcome:
    directory: Path
    summary: dict[str, Any]
    breaches: list[str]


def build_summary(session: Session, host: str) -> tuple[dict[str, Any], list[StepResult]]:
    opts = session.options
    slo = SLO(opts.slo_ttft_ms, opts.slo_tpot_ms, opts.slo_percentile) if opts.slo_set else None
    steps = session.collector.steps()
    step_dicts = [step_summary(s, slo) for s in steps]
    breaches = [line for d in step_dicts for line in d.get("slo_breaches", [])]
    if slo is not None and not steps:
        breaches.append("no measured step: the run ended before any measurement window")
    summary: dict[str, Any] = {
        "schema": SCHEMA,
        "definitions": "docs/metrics.md (TTFT = first content token; TPOT from usage tokens)",
        "started_at": _iso(session.started_at),
        "finished_at": _iso(time.time()),
        "target": host,
        "server": session.server,
        "workload": {
            "shape": opts.shape,
            "streams": opts.streams,
            "warmup_s": opts.warmup_s,
            "measure_s": opts.measure_s,
            "route": opts.route,
            "model": opts.model,
            "max_tokens": opts.max_tokens,
            "ignore_eos": True,
            "input": f"file {opts.prompt_file}"
            if opts.prompt_file
            else f"synthetic {opts.input_tokens} words",
            "seed": opts.seed,
        },
        "slo": None
        if slo is None
        else {
            "ttft_ms": slo.ttft_ms,
            "tpot_ms": slo.tpot_ms,
            "percentile": slo.percentile,
            "passed": not breaches,
            "breaches": breaches,
            "max_streams_within_slo": max(
                (d["streams"] for d in step_dicts if d["slo_passed"] and d["requests"]),
                default=None,
            ),
        },
        "failures_total": session.collector.failures_total(),
        "steps": step_dicts,
    }
    return summary, steps


def write_report(session: Session, host: str, cwd: str) -> Outcome:
    directory = Path(cwd, session.options.report_dir)
    directory.mkdir(parents=True, exist_ok=True)
    summary, steps = build_summary(session, host)
    (directory / "summary.json").write_text(json.dumps(summary, indent=2, allow_nan=False) + "\n")
    write_steps_csv(directory / "steps.csv", summary["steps"])
    write_requests_csv(directory / "requests.csv", session)
    try:
        write_plots(directory, steps)
    except ImportError as exc:  # matplotlib is in the loadtest extra; plots are optional
        log.warning("plots skipped: %s", exc)
    breaches = summary["slo"]["breaches"] if summary["slo"] else []
    return Outcome(directory, summary, breaches)


STEP_COLUMNS = ["step", "streams", "window_s", "requests", "output_tokens_per_s", "requests_per_s"]


def write_steps_csv(path: Path, steps: list[dict[str, Any]]) -> None:
    stat_cols = [f"{k}_{q}_ms" for k in STAT_KEYS for q in ("p50", "p90", "p99", "mean")]
    extra = ["goodput_rps", "slo_passed", "failures"]
    with path.open("w", newline="") as fh:
        w = csv.writer(fh)
        w.writerow(STEP_COLUMNS + stat_cols + extra)
        for s in steps:
            row = [s[c] for c in STEP_COLUMNS]
            row += [s[f"{k}_ms"][q] for k in STAT_KEYS for q in ("p50", "p90", "p99", "mean")]
            failures = ";".join(f"{r}={n}" for r, n in s["failures"].items())
            row += [s.get("goodput_rps", ""), s.get("slo_passed", ""), failures]
            w.writerow(row)


def write_requests_csv(path: Path, session: Session) -> None:
    collector = session.collector
    with path.open("w", newline="") as fh:
        w = csv.writer(fh)
        w.writerow(
            [
                "started_at",
                "step",
                "ok",
                "reason",
                "ack_ms",
                "ttft_ms",
                "tpot_ms",
                "e2e_ms",
                "output_tokens",
                "prompt_tokens",
            ]
        )
        for rec in sorted(collector.records, key=lambda r: r.started_at):
            number = collector.step_of(rec)
            step = "" if number is None else number
            t = rec.timing
            if t is None:
                w.writerow([f"{rec.started_at:.6f}", step, 0, rec.reason, "", "", "", "", "", ""])
                continue
            w.writerow(
                [
                    f"{rec.started_at:.6f}",
                    step,
                    1,
                    "",
                    _ms(t.ack_s),
                    _ms(t.ttft_s),
                    _ms(t.tpot_s),
                    _ms(t.e2e_s),
                    t.output_tokens,
                    t.prompt_tokens,
                ]
            )


def write_plots(directory: Path, steps: list[StepResult]) -> list[Path]:
    import matplotlib

    matplotlib.use("Agg")  # files only; never open a window
    import matplotlib.pyplot as plt

    written = []
    fig, axes = plt.subplots(1, 3, figsize=(15, 4))
    for ax, key in zip(axes, ("ttft", "tpot", "itl"), strict=True):
        for step in steps:
            values = step.latency_ms(key)
            if values:
                ax.hist(values, bins=50, histtype="step", label=f"{step.streams} streams")
        ax.set_title(f"{key.upper()} (ms)")
        ax.set_xlabel("ms")
        ax.set_ylabel("count")
        if any(step.latency_ms(key) for step in steps):
            ax.legend(fontsize="small")
    fig.tight_layout()
    written.append(directory / "latency_histograms.png")
    fig.savefig(written[-1], dpi=100)
    plt.close(fig)

    if len(steps) > 1:
        from glmserve.streaming import percentile

        streams = [s.streams for s in steps]
        fig, (ax1, ax2) = plt.subplots(1, 2, figsize=(11, 4))
        for q in (50, 90, 99):
            ax1.plot(streams, [percentile(s.latency_ms("tpot"), q) for s in steps], "o-",
                     label=f"p{q}")  # fmt: skip
        ax1.set(title="TPOT vs concurrency", xlabel="concurrent streams", ylabel="TPOT (ms)")
        ax1.set_xscale("log", base=2)
        ax1.legend()
        tps = [s.aggregate.output_tokens_per_s(s.window_s) for s in steps]
        ax2.plot(streams, tps, "o-")
        ax2.set(title="output tok/s vs concurrency", xlabel="concurrent streams",
                ylabel="output tokens / s")  # fmt: skip
        ax2.set_xscale("log", base=2)
        fig.tight_layout()
        written.append(directory / "sweep.png")
        fig.savefig(written[-1], dpi=100)
        plt.close(fig)
    return written


def _ms(seconds: float | None) -> str:
    return "" if seconds is None or math.isnan(seconds) else f"{seconds * 1e3:.3f}"


def _iso(epoch: float) -> str:
    return time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime(epoch))
