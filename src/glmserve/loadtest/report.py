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

from glmserve.loadtest.pareto import write_pareto
from glmserve.loadtest.results import SLO, STAT_KEYS, StepResult, step_summary
from glmserve.loadtest.stepinfo import capacity, repeat_intervals, step_extras, write_goodput_csv

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
    for d, step in zip(step_dicts, steps, strict=True):
        d.update(step_extras(session, step, slo))
    breaches = [line for d in step_dicts for line in d.get("slo_breaches", [])]
    if slo is not None and not steps:
        breaches.append("no measured step: the run ended before any measurement window")
    summary: dict[str, Any] = {
        "schema": SCHEMA,
        "definitions": "docs/metrics.md (TTFT = first content token; TPOT from usage tokens; "
        "tokens per step and acceptance length as glmserve.streaming defines them)",
        "started_at": _iso(session.started_at),
        "finished_at": _iso(time.time()),
        # False when the run stopped before its last step ended (SIGTERM, Ctrl-C, --run-time):
        # the steps measured are still valid, the ones never reached are missing.
        "complete": session.complete,
        "stopped_by": session.stopped_by,
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
        "capacity": capacity(step_dicts),
        "repeats": repeat_intervals(step_dicts),
        "steps": step_dicts,
    }
    summary["workload"].update(_open_loop_workload(session))
    return summary, steps


def _open_loop_workload(session: Session) -> dict[str, Any]:
    """The workload fields of the open-loop, workload and repeat options."""
    opts = session.options
    out: dict[str, Any] = {"repeats": opts.repeats}
    if session.workload is not None:
        out.update(session.workload.describe())
    if opts.open_loop:
        out.update(
            rates_rps=list(opts.rates) or None,
            arrivals=opts.arrivals,
            burstiness=opts.burstiness if opts.arrivals == "gamma" else None,
            senders=opts.senders,
            sweep_rates=opts.sweep_count if opts.shape == "rate-sweep" and not opts.rates else None,
            arrival_seed=session.open_loop.seed if session.open_loop else None,
        )
    return out


def write_report(session: Session, host: str, cwd: str) -> Outcome:
    directory = Path(cwd, session.options.report_dir)
    directory.mkdir(parents=True, exist_ok=True)
    summary, steps = build_summary(session, host)
    (directory / "summary.json").write_text(json.dumps(summary, indent=2, allow_nan=False) + "\n")
    write_steps_csv(directory / "steps.csv", summary["steps"])
    write_requests_csv(directory / "requests.csv", session)
    opts = session.options
    slo = SLO(opts.slo_ttft_ms, opts.slo_tpot_ms, opts.slo_percentile) if opts.slo_set else None
    write_goodput_csv(directory / "goodput.csv", summary["steps"])
    try:
        by_streams = not opts.open_loop and opts.repeats == 1
        incomplete = None if session.complete else session.stopped_by
        labels = [str(d.get("label") or _streams(d["streams"])) for d in summary["steps"]]
        write_plots(directory, steps, slo, incomplete, by_streams, labels)
        if len(summary["steps"]) > 1:
            write_pareto(directory, summary["steps"], opts.slo_tpot_ms)
    except ImportError as exc:  # matplotlib is in the loadtest extra; plots are optional
        log.warning("plots skipped: %s", exc)
    breaches = summary["slo"]["breaches"] if summary["slo"] else []
    return Outcome(directory, summary, breaches)


STEP_COLUMNS = ["step", "streams", "window_s", "requests", "output_tokens_per_s", "requests_per_s"]


# Next to TPOT: where its speed comes from under MTP (results.speculative_summary).
SPEC_COLUMNS = ["tokens_per_step", "accept_length", "accept_length_source", "accept_rate"]


def write_steps_csv(path: Path, steps: list[dict[str, Any]]) -> None:
    quantiles = ("p50", "p90", "p99", "mean")
    stat_cols = []
    for k in STAT_KEYS:
        stat_cols += [f"{k}_{q}_ms" for q in quantiles]
        if k == "tpot":
            stat_cols += SPEC_COLUMNS
    extra = ["goodput_rps", "slo_passed", "failures"]
    with path.open("w", newline="") as fh:
        w = csv.writer(fh)
        w.writerow(STEP_COLUMNS + stat_cols + extra)
        for s in steps:
            row = [s[c] for c in STEP_COLUMNS]
            for k in STAT_KEYS:
                row += [s[f"{k}_ms"][q] for q in quantiles]
                if k == "tpot":
                    row += ["" if s.get(c) is None else s[c] for c in SPEC_COLUMNS]
            failures = ";".join(f"{r}={n}" for r, n in s["failures"].items())
            row += [s.get("goodput_rps", ""), s.get("slo_passed", ""), failures]
            w.writerow(row)


# Failed requests carry no timing: past this many rows per (step, reason) the rest of them are
# one row each with their count, so a sick target cannot grow requests.csv without bound.
FAILED_ROWS_PER_REASON = 100


def write_requests_csv(path: Path, session: Session) -> None:
    """One row per timed request, and per failed request up to FAILED_ROWS_PER_REASON for each
    step and reason; then one row per (step, reason) counting the failures left out (`count`),
    started_at being the first of them."""
    collector = session.collector
    kept: dict[tuple[Any, str], int] = {}
    left_out: dict[tuple[Any, str], list[Any]] = {}
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
                "tokens_per_step",
                "accept_length",
                "e2e_ms",
                "output_tokens",
                "prompt_tokens",
                "count",
                "cached_tokens",
                "turn",
            ]
        )
        for rec in sorted(collector.records, key=lambda r: r.started_at):
            number = collector.step_of(rec)
            step = "" if number is None else number
            t = rec.timing
            if t is None:
                key = (step, rec.reason or "unknown")
                if kept.get(key, 0) >= FAILED_ROWS_PER_REASON:
                    left_out.setdefault(key, [rec.started_at, 0])[1] += 1
                    continue
                kept[key] = kept.get(key, 0) + 1
                w.writerow(
                    [f"{rec.started_at:.6f}", step, 0, rec.reason, *[""] * 8, 1, "", rec.turn or ""]
                )
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
                    _ratio(t.tokens_per_step),
                    _ratio(t.accept_length),
                    _ms(t.e2e_s),
                    t.output_tokens,
                    t.prompt_tokens,
                    1,
                    "" if t.cached_tokens is None else t.cached_tokens,
                    rec.turn or "",
                ]
            )
        for (step, reason), (first, count) in left_out.items():
            w.writerow([f"{first:.6f}", step, 0, reason, *[""] * 8, count, "", ""])


def _streams(n: int) -> str:
    return f"{n} stream" + ("" if n == 1 else "s")


def _plain(ax: Any, integer_y: bool = False, x: bool = True) -> None:
    """Tick labels as plain numbers (no offset like "+2e1", no scientific notation) and few
    enough of them that neighbours never overlap; integer ticks for counts. x=False leaves
    the x axis as the caller set it (categorical ticks)."""
    from matplotlib.ticker import MaxNLocator, ScalarFormatter

    for axis in (ax.xaxis, ax.yaxis) if x else (ax.yaxis,):
        if axis.get_scale() != "linear":
            continue
        fmt = ScalarFormatter(useOffset=False)
        fmt.set_scientific(False)
        axis.set_major_formatter(fmt)
    if x and ax.xaxis.get_scale() == "linear":
        ax.xaxis.set_major_locator(MaxNLocator(nbins=6))
    ax.yaxis.set_major_locator(MaxNLocator(nbins=6, integer=integer_y))


def _stream_axis(ax: Any, streams: list[int]) -> None:
    """Concurrency on a log2 axis, labelled with the levels actually run (1, 2, 4, ... not 2^k)."""
    from matplotlib.ticker import FixedLocator, FuncFormatter, NullLocator

    ax.set_xscale("log", base=2)
    ax.xaxis.set_major_locator(FixedLocator(streams))
    ax.xaxis.set_major_formatter(FuncFormatter(lambda v, _pos: f"{v:g}"))
    ax.xaxis.set_minor_locator(NullLocator())
    ax.set_xlabel("concurrent streams")


def _banner(steps: list[StepResult], incomplete: str | None) -> str:
    """Red text above the plots for what the latency curves cannot show."""
    lines = []
    if incomplete:
        lines.append(f"INCOMPLETE run, stopped early: {incomplete}")
    failed: dict[str, int] = {}
    for step in steps:
        for reason, n in step.aggregate.failures.items():
            failed[reason] = failed.get(reason, 0) + n
    if failed:
        ok = sum(len(s.aggregate.timings) for s in steps)
        detail = ", ".join(f"{r} {n}" for r, n in sorted(failed.items(), key=lambda x: -x[1]))
        lines.append(
            f"{sum(failed.values())} requests FAILED ({detail}) against {ok} timed: "
            "failures are not in the latency plots"
        )
    return "\n".join(lines)


def write_plots(
    directory: Path,
    steps: list[StepResult],
    slo: SLO | None = None,
    incomplete: str | None = None,
    by_streams: bool = True,
    labels: list[str] | None = None,
) -> list[Path]:
    """latency_histograms.png, and sweep.png when there is more than one step and the steps
    differ by their stream count alone (`by_streams`; open-loop and repeated steps are drawn
    by pareto.png instead)."""
    import matplotlib

    matplotlib.use("Agg")  # files only; never open a window
    import matplotlib.pyplot as plt

    figures = [("latency_histograms.png", latency_figure(steps, slo, incomplete, labels))]
    if len(steps) > 1 and by_streams:
        figures.append(("sweep.png", sweep_figure(steps, slo, incomplete)))
    written = []
    for name, fig in figures:
        written.append(directory / name)
        fig.savefig(written[-1], dpi=100)
        plt.close(fig)
    return written


def latency_figure(
    steps: list[StepResult],
    slo: SLO | None,
    incomplete: str | None,
    labels: list[str] | None = None,
) -> Any:
    """TTFT, TPOT and ITL histograms, one outline per step."""
    import matplotlib.pyplot as plt

    limits = _limits(slo)
    banner = _banner(steps, incomplete)
    fig, axes = plt.subplots(1, 3, figsize=(15, 4.6))
    for ax, key in zip(axes, ("ttft", "tpot", "itl"), strict=True):
        drawn = False
        every = [v for step in steps for v in step.latency_ms(key)]
        # One set of bin edges for every step, so their histograms compare bar for bar.
        lo, hi = (min(every), max(every)) if every else (0.0, 1.0)
        edges = [lo + (hi - lo) * i / 50 for i in range(51)] if hi > lo else 50
        for i, step in enumerate(steps):
            values = step.latency_ms(key)
            ok, bad = len(step.aggregate.timings), sum(step.aggregate.failures.values())
            name = labels[i] if labels else _streams(step.streams)  # a step's load: streams or rate
            label = f"{name}: {ok} ok" + (f", {bad} failed" if bad else "")
            if values:
                ax.hist(values, bins=edges, histtype="step", label=label)
                drawn = True
        if limits.get(key) is not None and drawn:
            ax.axvline(limits[key], color="red", linestyle="--", label=f"SLO {limits[key]:g} ms")
        ax.set_title(f"{key.upper()} (ms)")
        ax.set_xlabel("ms")
        ax.set_ylabel("count")
        if drawn:
            _plain(ax, integer_y=True)
            ax.legend(fontsize="small")
        else:
            ax.set_xticks([])
            ax.set_yticks([])
            ax.text(0.5, 0.5, "no completed request", ha="center", va="center",
                    transform=ax.transAxes)  # fmt: skip
    if banner:
        fig.suptitle(banner, color="red", fontsize="medium")
    fig.tight_layout()
    return fig


def sweep_figure(steps: list[StepResult], slo: SLO | None, incomplete: str | None) -> Any:
    """TPOT, TTFT and tok/s against concurrency, and the requests each step timed or lost."""
    import matplotlib.pyplot as plt

    from glmserve.streaming import percentile

    limits = _limits(slo)
    banner = _banner(steps, incomplete)
    streams = [s.streams for s in steps]
    fig, ((ax_tpot, ax_ttft), (ax_tps, ax_req)) = plt.subplots(2, 2, figsize=(12, 8))
    for ax, key, name in ((ax_tpot, "tpot", "TPOT"), (ax_ttft, "ttft", "TTFT")):
        for q in (50, 90, 99):
            ax.plot(streams, [percentile(s.latency_ms(key), q) for s in steps], "o-",
                    label=f"p{q}")  # fmt: skip
        if limits.get(key) is not None:
            assert slo is not None
            ax.axhline(limits[key], color="red", linestyle="--",
                       label=f"SLO {limits[key]:g} ms (p{slo.percentile:g})")  # fmt: skip
        ax.set(title=f"{name} vs concurrency", ylabel=f"{name} (ms)")
        ax.set_ylim(bottom=0)
        _stream_axis(ax, streams)
        _plain(ax)
        ax.legend(fontsize="small")
    tps = [s.aggregate.output_tokens_per_s(s.window_s) for s in steps]
    ax_tps.plot(streams, tps, "o-")
    ax_tps.set(title="output tok/s vs concurrency", ylabel="output tokens / s")
    ax_tps.set_ylim(bottom=0)
    _stream_axis(ax_tps, streams)
    _plain(ax_tps)
    # Requests per step as bars at evenly spaced positions, ok and failed stacked: a step
    # whose latencies look healthy but whose requests mostly failed shows here.
    pos = list(range(len(steps)))
    ok = [len(s.aggregate.timings) for s in steps]
    bad = [sum(s.aggregate.failures.values()) for s in steps]
    ax_req.bar(pos, ok, color="tab:green", label="timed")
    ax_req.bar(pos, bad, bottom=ok, color="tab:red", label="failed")
    # The x ticks are the levels run, not bar positions; _plain must leave that axis alone.
    ax_req.set_xticks(pos, [str(n) for n in streams])
    ax_req.set(title="requests per step", xlabel="concurrent streams", ylabel="requests")
    _plain(ax_req, integer_y=True, x=False)
    # A zero-height 'failed' bar on top of the tallest one pins autoscaling to its top edge
    # (matplotlib's sticky edges), cutting it off: leave room above it, and for the legend.
    ax_req.set_ylim(0, max(1, *(o + b for o, b in zip(ok, bad, strict=True))) * 1.2)
    ax_req.legend(fontsize="small", loc="upper left")
    if banner:
        fig.suptitle(banner, color="red", fontsize="medium")
    fig.tight_layout()
    return fig


def _limits(slo: SLO | None) -> dict[str, float | None]:
    return {"ttft": slo.ttft_ms, "tpot": slo.tpot_ms} if slo is not None else {}


def _ms(seconds: float | None) -> str:
    return "" if seconds is None or math.isnan(seconds) else f"{seconds * 1e3:.3f}"


def _ratio(value: float | None) -> str:
    return "" if value is None else f"{value:.4f}"


def _iso(epoch: float) -> str:
    return time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime(epoch))
