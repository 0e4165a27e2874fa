"""What the report adds to each step for open loop, rate sweeps, repeats and multi-turn runs:
the step's place in the plan, its arrivals and queue, per-user tok/s, the cache, and across
repeats a confidence interval on each headline figure; then the goodput table."""

from __future__ import annotations

import csv
import math
from collections.abc import Sequence
from pathlib import Path
from typing import TYPE_CHECKING, Any

from glmserve.loadtest.openloop import arrival_summary, capacity_line
from glmserve.loadtest.results import SLO, StepResult, window_of
from glmserve.streaming import confidence_interval, summarize

if TYPE_CHECKING:
    from glmserve.loadtest.session import Session

CONFIDENCE = 0.95
# The figures a confidence interval is given for across repeats: (name, how to read a step).
HEADLINE = (
    ("output_tokens_per_s", lambda d: d["output_tokens_per_s"]),
    ("per_user_tokens_per_s", lambda d: d.get("per_user_tokens_per_s")),
    ("requests_per_s", lambda d: d["requests_per_s"]),
    ("goodput_rps", lambda d: d.get("goodput_rps")),
    ("ttft_p50_ms", lambda d: d["ttft_ms"]["p50"]),
    ("tpot_p50_ms", lambda d: d["tpot_ms"]["p50"]),
    ("arrival_rps", lambda d: (d.get("arrivals") or {}).get("arrival_rps")),
)


def step_extras(session: Session, step: StepResult, slo: SLO | None) -> dict[str, Any]:
    """The fields a step gets beyond results.step_summary's."""
    stages = session.stages
    stage = stages[step.step] if step.step < len(stages) else None
    out: dict[str, Any] = {}
    if stage is not None:
        out.update(
            label=stage.label,
            mode="closed" if stage.rate is None else "open",
            role=stage.role or None,
            level=stage.level,
            repeat=stage.repeat,
        )
    speed = step.aggregate.per_user_tokens_per_s()
    out["per_user_tokens_per_s"] = None if math.isnan(speed) else speed
    timed = len(step.aggregate.timings)
    if slo is not None:
        ttft = None if slo.ttft_ms is None else slo.ttft_ms / 1e3
        tpot = None if slo.tpot_ms is None else slo.tpot_ms / 1e3
        out["goodput_share"] = step.aggregate.good(ttft, tpot) / timed if timed else None
    window = next((w for w in session.collector.windows if w.step == step.step), None)
    ledger = session.open_loop
    if (
        stage is not None
        and stage.rate is not None
        and not math.isnan(stage.rate)
        and ledger is not None
        and window is not None
        and window.measure_start is not None
        and window.end is not None
    ):
        out["arrivals"] = arrival_summary(
            ledger.records, step.step, window.measure_start, window.end, stage.rate, stage.streams
        )
    cache = cache_summary(session, step)
    if cache is not None:
        out["cache"] = cache
    return out


def cache_summary(session: Session, step: StepResult) -> dict[str, Any] | None:
    """Prompt tokens the server served from its prefix cache (its own counts: /generate's
    meta_info.cached_tokens, or usage.prompt_tokens_details with SGLang's
    --enable-cache-report), over the step and per turn; None when nothing reported any."""
    timings = step.aggregate.timings
    reported = [t for t in timings if t.cached_tokens is not None]
    multi_turn = session.options.turns > 1
    if not reported and not multi_turn:
        return None
    prompt = sum(t.prompt_tokens or 0 for t in reported)
    out: dict[str, Any] = {
        "requests_reporting": len(reported),
        "requests": len(timings),
        "cached_tokens_per_request": _clean(summarize(t.cached_tokens for t in reported)),
        "hit_share": sum(t.cached_tokens or 0 for t in reported) / prompt if prompt else None,
    }
    if multi_turn:
        by_turn: dict[int, list[Any]] = {}
        for rec in session.collector.records:
            if rec.timing is None or rec.turn is None:
                continue
            w = window_of(rec, session.collector.windows)
            if w is not None and w.step == step.step:
                by_turn.setdefault(rec.turn, []).append(rec.timing)
        out["by_turn"] = {
            str(turn): {
                "requests": len(ts),
                "prompt_tokens_mean": _mean(t.prompt_tokens for t in ts),
                "cached_tokens_mean": _mean(t.cached_tokens for t in ts),
            }
            for turn, ts in sorted(by_turn.items())
        }
    return out


def capacity(step_dicts: Sequence[dict[str, Any]]) -> dict[str, Any]:
    """Which open-loop steps were above the server's capacity (their queue grew), and which
    turned arrivals away for want of a free sender."""
    lines, above = [], False
    for d in step_dicts:
        arrivals = d.get("arrivals")
        if arrivals:
            above = above or bool(arrivals["queue_grows"])
            line = capacity_line(f"step {d['step']} ({d.get('label', '')})", arrivals)
            if line:
                lines.append(line)
    return {"above_capacity": above, "lines": lines}


def repeat_intervals(step_dicts: Sequence[dict[str, Any]]) -> list[dict[str, Any]]:
    """Per level run more than once: each headline figure's repeats, mean and 95% interval."""
    levels: dict[int, list[dict[str, Any]]] = {}
    for d in step_dicts:
        if "level" in d and d["requests"]:
            levels.setdefault(d["level"], []).append(d)
    out = []
    for level, runs in sorted(levels.items()):
        if len(runs) < 2:
            continue
        figures = {}
        for name, read in HEADLINE:
            values = [read(d) for d in runs]
            values = [v for v in values if v is not None and not math.isnan(v)]
            if len(values) < 2:
                continue
            interval = confidence_interval(values, CONFIDENCE)
            assert interval is not None
            figures[name] = {
                "mean": sum(values) / len(values),
                "ci95": list(interval),
                "values": values,
            }
        out.append(
            {"level": level, "label": runs[0].get("label"), "n": len(runs), "figures": figures}
        )
    return out


GOODPUT_COLUMNS = [
    "step", "label", "repeat", "rate_rps", "arrival_rps", "missed", "requests_per_s",
    "goodput_rps", "goodput_share", "output_tokens_per_s", "per_user_tokens_per_s",
    "ttft_p90_ms", "tpot_p90_ms", "queue", "slo_passed",
]  # fmt: skip


def goodput_rows(step_dicts: Sequence[dict[str, Any]]) -> list[dict[str, Any]]:
    rows = []
    for d in step_dicts:
        a = d.get("arrivals") or {}
        rows.append(
            {
                "step": d["step"],
                "label": d.get("label", f"{d['streams']} streams"),
                "repeat": d.get("repeat", 0),
                "rate_rps": a.get("rate_rps"),
                "arrival_rps": a.get("arrival_rps"),
                "missed": a.get("missed"),
                "requests_per_s": d["requests_per_s"],
                "goodput_rps": d.get("goodput_rps"),
                "goodput_share": d.get("goodput_share"),
                "output_tokens_per_s": d["output_tokens_per_s"],
                "per_user_tokens_per_s": d.get("per_user_tokens_per_s"),
                "ttft_p90_ms": d["ttft_ms"]["p90"],
                "tpot_p90_ms": d["tpot_ms"]["p90"],
                "queue": ("grows" if a.get("queue_grows") else "stable") if a else "",
                "slo_passed": d.get("slo_passed"),
            }
        )
    return rows


def write_goodput_csv(path: Path, step_dicts: Sequence[dict[str, Any]]) -> None:
    with path.open("w", newline="") as fh:
        w = csv.DictWriter(fh, GOODPUT_COLUMNS)
        w.writeheader()
        for row in goodput_rows(step_dicts):
            w.writerow({k: _cell(v) for k, v in row.items()})


def goodput_table(step_dicts: Sequence[dict[str, Any]]) -> list[str]:
    """The goodput table as aligned text lines, for the screen."""
    head = ["step", "load", "req/s in", "missed", "req/s done", "goodput/s", "good %", "tok/s",
            "tok/s/user", "TTFT p90", "TPOT p90", "queue"]  # fmt: skip
    rows = [head]
    for r in goodput_rows(step_dicts):
        rows.append(
            [
                str(r["step"]),
                str(r["label"]),
                _fmt(r["arrival_rps"]),
                "" if r["missed"] is None else str(r["missed"]),
                _fmt(r["requests_per_s"]),
                _fmt(r["goodput_rps"]),
                "" if r["goodput_share"] is None else f"{100 * r['goodput_share']:.0f}",
                _fmt(r["output_tokens_per_s"]),
                _fmt(r["per_user_tokens_per_s"]),
                _fmt(r["ttft_p90_ms"]),
                _fmt(r["tpot_p90_ms"]),
                r["queue"],
            ]
        )
    widths = [max(len(row[i]) for row in rows) for i in range(len(head))]
    return ["  ".join(cell.rjust(w) for cell, w in zip(row, widths, strict=True)) for row in rows]


def _fmt(value: Any) -> str:
    if value is None or (isinstance(value, float) and math.isnan(value)):
        return "-"
    return f"{value:.3g}" if abs(value) < 100 else f"{value:.0f}"


def _cell(value: Any) -> Any:
    if value is None or (isinstance(value, float) and math.isnan(value)):
        return ""
    return value


def _mean(values: Any) -> float | None:
    vals = [v for v in values if v is not None]
    return sum(vals) / len(vals) if vals else None


def _clean(summary: Any) -> dict[str, Any]:
    return {k: (None if isinstance(v, float) and math.isnan(v) else v)
            for k, v in summary.as_dict().items()}  # fmt: skip
