"""Generates monitoring/grafana/dashboards/tpot.json (the JSON is committed).

    python -m glmserve.dashboard --output monitoring/grafana/dashboards/tpot.json
    python -m glmserve.dashboard --check monitoring/grafana/dashboards/tpot.json

Written as code rather than exported from the UI so that the datasource is always the
`${datasource}` variable (never a uid baked in by one Grafana instance), queries carry no `\\r\\n`,
panel ids and grid positions are assigned mechanically, and a test can compare the committed file
with this output. Queries read the recording rules in monitoring/prometheus/rules/ where one
exists, so the dashboard and the alerts agree on every definition. It needs the exporter extra:
the SLO comes from glmserve.exporter.canary, the one place that defines it.
"""

from __future__ import annotations

import argparse
import json
import sys
from collections.abc import Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from glmserve.exporter.canary import TPOT_SLO_S
from glmserve.exporter.info import SPEC_ACCEPT_LENGTH_FLOOR

UID = "glmserve-tpot"
DS = {"type": "prometheus", "uid": "${datasource}"}

DEF_TPOT = (
    "TPOT (time per output token) of one request = (t_last_token - t_first_token) / "
    "(output_tokens - 1), output_tokens from the server's usage, not from chunk counts."
)
DEF_ITL = (
    "ITL (inter-token latency) = the gap between consecutive output tokens; a chunk carrying k "
    "tokens counts as k gaps of gap/k. mean(ITL) over a request equals its TPOT, but ITL "
    "quantiles are over tokens: ITL p99 shows single stalls (a prefill batch interrupting "
    "decode) that barely move a request's TPOT."
)
SLO_TEXT = f"SLO: TPOT <= {TPOT_SLO_S * 1000:g} ms per output token."


@dataclass
class Target:
    expr: str
    legend: str = ""
    instant: bool = False

    def to_json(self, ref: str) -> dict[str, Any]:
        out: dict[str, Any] = {
            "datasource": DS,
            "refId": ref,
            "expr": self.expr,
            "legendFormat": self.legend or "__auto",
            "range": not self.instant,
            "instant": self.instant,
        }
        return out


@dataclass
class Panel:
    title: str
    description: str
    targets: list[Target]
    kind: str = "timeseries"
    unit: str = "s"
    width: int = 12
    height: int = 8
    slo_line: bool = False
    extra_options: dict[str, Any] = field(default_factory=dict)
    min_value: float | None = 0
    # A floor drawn as a line: below it is bad (the SLO line's mirror image).
    floor_line: float | None = None
    # Series (by legend) drawn against a right-hand axis in another unit.
    right_axis: dict[str, str] = field(default_factory=dict)

    def to_json(self, pid: int, x: int, y: int) -> dict[str, Any]:
        steps: list[dict[str, Any]] = [{"color": "green", "value": None}]
        if self.slo_line:
            steps.append({"color": "red", "value": TPOT_SLO_S})
        if self.floor_line is not None:
            steps = [{"color": "red", "value": None}, {"color": "green", "value": self.floor_line}]
        custom: dict[str, Any] = {}
        if self.kind == "timeseries":
            custom = {
                "drawStyle": "line",
                "lineWidth": 2,
                "fillOpacity": 0,
                "showPoints": "never",
                "spanNulls": False,
                "thresholdsStyle": {"mode": "line" if self.slo_line or self.floor_line else "off"},
            }
        defaults: dict[str, Any] = {
            "unit": self.unit,
            "thresholds": {"mode": "absolute", "steps": steps},
            "custom": custom,
        }
        if self.min_value is not None:
            defaults["min"] = self.min_value
        options: dict[str, Any] = {}
        if self.kind == "timeseries":
            options = {
                "legend": {"displayMode": "table", "placement": "bottom", "calcs": ["lastNotNull"]},
                "tooltip": {"mode": "multi", "sort": "desc"},
            }
        options.update(self.extra_options)
        return {
            "id": pid,
            "type": self.kind,
            "title": self.title,
            "description": self.description,
            "datasource": DS,
            "gridPos": {"h": self.height, "w": self.width, "x": x, "y": y},
            "fieldConfig": {"defaults": defaults, "overrides": self._overrides()},
            "options": options,
            "targets": [t.to_json(chr(ord("A") + i)) for i, t in enumerate(self.targets)],
        }

    def _overrides(self) -> list[dict[str, Any]]:
        return [
            {
                "matcher": {"id": "byName", "options": legend},
                "properties": [
                    {"id": "custom.axisPlacement", "value": "right"},
                    {"id": "unit", "value": unit},
                ],
            }
            for legend, unit in self.right_axis.items()
        ]


def _quantiles(record: str, who: str) -> Target:
    return Target(record, f"{who} p{{{{quantile}}}}")


def _status_panels() -> list[Panel]:
    """What is serving, whether it is reachable, and the SLO at a glance (the top row)."""
    stat = {"reduceOptions": {"calcs": ["lastNotNull"], "fields": "", "values": False}}
    return [
        Panel(
            "Build / patch status",
            "What the target is, from the exporter's info series: GET /server_info joined with "
            "the build-info file the launcher writes (KV dtype, patch series, FP8 gather switch, "
            "KV pool size, FP8 decode path). 'FP8 KV, patched, native decode' is the intended "
            "production state; 'gather decode' means the native kernel failed its start-up "
            "self-test or was timed slower on this GPU (alert GlmserveFP8DecodeFellBackToGather; "
            "the build info says which); 'FP8 KV, unpatched' or 'gather off' means decode pays "
            "the full-pool FP8->BF16 cast (alert GlmserveFP8KVWithoutPatch).",
            [Target("max by (summary) (glmserve_server_info)", "{{summary}}", instant=True)],
            kind="stat",
            unit="none",
            width=10,
            height=4,
            extra_options={**stat, "textMode": "name", "colorMode": "none", "graphMode": "none"},
        ),
        Panel(
            "Targets up",
            "1 = reachable. sglang: Prometheus' scrape of SGLang /metrics. exporter probe: the "
            "sidecar's GET /server_info, which also fails when the API is wedged but /metrics "
            "still answers.",
            [
                Target('up{job="sglang"}', "sglang scrape"),
                Target("glmserve_target_up", "exporter probe"),
            ],
            kind="stat",
            unit="none",
            width=6,
            height=4,
            extra_options={**stat, "textMode": "value_and_name", "colorMode": "background"},
        ),
        Panel(
            "SLO attainment",
            f"{SLO_TEXT} canary: share of canary requests (5 m) whose TPOT met it. server: share "
            "of all output tokens (1 m) whose inter-token latency met it, from SGLang's "
            "inter_token_latency_seconds buckets (0.04 is a bucket boundary, so this is exact).",
            [
                Target("glmserve:canary_tpot_slo_attainment:ratio5m", "canary requests"),
                Target("glmserve:sglang_itl_slo_attainment:ratio1m", "server tokens"),
            ],
            kind="stat",
            unit="percentunit",
            width=8,
            height=4,
            extra_options={**stat, "textMode": "value_and_name", "colorMode": "value"},
        ),
    ]


def _latency_panels() -> list[Panel]:
    """Per-token and first-token latency: the canary against the server."""
    return [
        Panel(
            "TPOT p50/p90/p99 - canary (per request)",
            f"{DEF_TPOT} One fixed-length stream (ignore_eos) every canary interval, timed by "
            f"glmserve.streaming; quantiles over the last 5 m of canary requests. {SLO_TEXT}",
            [_quantiles("glmserve:canary_tpot_seconds:quantile5m", "canary")],
            slo_line=True,
            width=8,
        ),
        Panel(
            "TPOT - server side (all requests) vs canary",
            f"{DEF_TPOT} SGLang exports no per-request TPOT histogram, so the server side is the "
            "token-weighted mean over every request: sum/count of "
            "sglang:inter_token_latency_seconds (its count is one per token, its sum the whole "
            "interval). Shown next to the canary's mean; a gap between them means the canary's "
            "request is not representative (length, batch position) or the client side adds "
            f"time. {SLO_TEXT}",
            [
                Target("glmserve:sglang_tpot_seconds:mean1m", "server mean (all requests)"),
                Target("glmserve:canary_tpot_seconds:mean5m", "canary mean"),
            ],
            slo_line=True,
            width=8,
        ),
        _mtp_panel(),
        Panel(
            "ITL p50/p90/p99 - inter-token latency",
            f"{DEF_ITL} server: sglang:inter_token_latency_seconds (1 m, all requests). "
            "canary: the same definition measured client-side on the canary's stream (5 m), "
            "with SGLang's bucket bounds so the two compare 1:1.",
            [
                _quantiles("glmserve:sglang_itl_seconds:quantile1m", "server"),
                _quantiles("glmserve:canary_itl_seconds:quantile5m", "canary"),
            ],
            slo_line=True,
        ),
        Panel(
            "TTFT p50/p90/p99",
            "TTFT (time to first token) = request sent -> first event carrying an output token. "
            "The role-only first chunk of a chat stream is the 'ack', not a token. server: "
            "sglang:time_to_first_token_seconds (1 m; measured inside SGLang). canary: measured "
            "by the client (5 m).",
            [
                _quantiles("glmserve:sglang_ttft_seconds:quantile1m", "server"),
                _quantiles("glmserve:canary_ttft_seconds:quantile5m", "canary"),
            ],
        ),
    ]


ACCEPT_RATE = "acceptance rate (drafts)"


def _mtp_panel() -> Panel:
    """Beside TPOT: with MTP, TPOT is a verify pass's time over the tokens it kept."""
    return Panel(
        "MTP: tokens per verify pass",
        "Speculative decoding (MTP, the model's own NextN layer): each decode step is one "
        "verify pass that scores 1 + the draft tokens of every request and keeps the accepted "
        "drafts + 1. TPOT is a pass's time over the tokens it kept, so read the two together: "
        "TPOT alone hides where the speed comes from. acceptance length: SGLang's "
        "sglang:spec_accept_length (tokens kept per request and pass; the exporter re-exports "
        "it only while the server runs MTP), 5 m mean. canary tokens per step: the same seen "
        "by a client, tokens per decode step of the last canary request (glmserve.streaming; 1 "
        "without MTP). verify tokens: the ceiling (speculative_num_draft_tokens). acceptance "
        "rate (right axis): accepted / proposed drafts. Red below "
        f"{SPEC_ACCEPT_LENGTH_FLOOR:g}: alert GlmserveMTPAcceptanceCollapsed. Without MTP only "
        "the canary's line (at 1) is drawn.",
        [
            Target("glmserve:spec_accept_length:mean5m", "acceptance length (server, 5 m)"),
            Target("glmserve_canary_tokens_per_step", "canary tokens per step"),
            Target("max(glmserve_server_speculative_num_draft_tokens)", "verify tokens (ceiling)"),
            Target("glmserve:spec_accept_rate:mean5m", ACCEPT_RATE),
        ],
        unit="none",
        width=8,
        floor_line=SPEC_ACCEPT_LENGTH_FLOOR,
        right_axis={ACCEPT_RATE: "percentunit"},
    )


def _load_panels() -> list[Panel]:
    """What the server is doing: throughput, the batch and its CUDA graphs, the KV pool."""
    return [
        Panel(
            "Output tokens/s",
            "server: rate of sglang:generation_tokens_total over 1 m (all requests, counted when "
            "a request finishes, so long requests arrive in steps). canary decode: 1/TPOT of the "
            "last canary request - the speed one stream gets.",
            [
                Target("glmserve:sglang_output_tokens_per_second:rate1m", "server output tok/s"),
                Target(
                    "glmserve_canary_decode_tokens_per_second", "canary decode tok/s (1 stream)"
                ),
            ],
            unit="none",
        ),
        Panel(
            "Running and queued requests",
            "sglang:num_running_reqs (in the decode batch) and sglang:num_queue_reqs (waiting). "
            "Refreshed by the scheduler every 40 decode steps and every 30 s when idle. The "
            "limits come from /server_info: decode CUDA graphs are captured up to "
            "cuda_graph_max_bs; a running batch above that line decodes eagerly (several times "
            "slower), and the exporter's canary is one of the running requests.",
            [
                Target("glmserve:sglang_running_requests:sum", "running"),
                Target("glmserve:sglang_queued_requests:sum", "queued"),
                Target("max(glmserve_server_cuda_graph_max_bs)", "CUDA graphs up to"),
                Target("max(glmserve_server_max_running_requests)", "running limit"),
            ],
            unit="none",
        ),
        Panel(
            "Decode steps without CUDA graphs",
            "Share of decode forward passes (5 m) that SGLang ran eagerly because the running "
            "batch was larger than --cuda-graph-max-bs (sglang:cuda_graph_passes_total, "
            "mode=decode_none). Should be 0: the GLM-5 profiles cap --max-running-requests at "
            "the graph size. Alert GlmserveDecodeWithoutCudaGraphs above 1%.",
            [Target("glmserve:sglang_decode_without_cuda_graph:ratio5m", "eager decode share")],
            unit="percentunit",
        ),
        Panel(
            "KV cache tokens: used vs pool",
            "sglang:kv_used_tokens (token slots held by running requests) against "
            "sglang:max_total_num_tokens (the pool, fixed at startup). Free + evictable radix "
            "cache make up the rest.",
            [
                Target("glmserve:sglang_kv_used_tokens:sum", "used"),
                Target("glmserve:sglang_kv_pool_tokens:sum", "pool"),
            ],
            unit="none",
        ),
    ]


def _slo_panels() -> list[Panel]:
    """The SLO over time, and what the canary could not measure."""
    return [
        Panel(
            "SLO attainment over time",
            f"{SLO_TEXT} Same ratios as the stat above, over time.",
            [
                Target("glmserve:canary_tpot_slo_attainment:ratio5m", "canary requests"),
                Target("glmserve:sglang_itl_slo_attainment:ratio1m", "server tokens"),
            ],
            unit="percentunit",
            extra_options={},
        ),
        Panel(
            "Canary failures by reason",
            "Canary requests that produced no timing, per second, by reason: connect, timeout, "
            "http_status, stream_error, malformed_sse, broken_stream, no_tokens "
            "(glmserve.streaming.FAILURE_REASONS).",
            [
                Target(
                    "sum by (reason) (rate(glmserve_canary_failures_total[$__rate_interval]))",
                    "{{reason}}",
                )
            ],
            unit="reqps",
        ),
    ]


def panels() -> list[Panel]:
    """The panels, in reading order; layout flows left to right, 24 columns per row."""
    return [*_status_panels(), *_latency_panels(), *_load_panels(), *_slo_panels()]


FLEET_ROW = "Fleet: replicas behind the router (smg)"
DEF_WORKER = (
    "Per worker: `worker` is the worker's URL as the router knows it (docs/fleet.md); a "
    "single-server stack has no fleet series."
)


def fleet_panels() -> list[Panel]:
    """The fleet row: one line per replica, then the router (docs/fleet.md)."""
    stat = {"reduceOptions": {"calcs": ["lastNotNull"], "fields": "", "values": False}}
    return [
        Panel(
            "Replicas: TPOT",
            f"{DEF_WORKER} server: the token-weighted mean TPOT of all requests on the worker "
            "(ITL sum/count, 1 m). canary: p50 of that worker's own canary (5 m). Replicas of "
            "one profile should agree; alert GlmserveReplicaTPOTSkew fires at 1.5x the fastest "
            f"for 10 m. {SLO_TEXT}",
            [
                Target("glmserve:worker_tpot_seconds:mean1m", "{{worker}} server mean"),
                Target("glmserve:worker_canary_tpot_seconds:quantile5m", "{{worker}} canary p50"),
            ],
            slo_line=True,
        ),
        Panel(
            "Replicas: output tokens/s",
            f"{DEF_WORKER} rate of sglang:generation_tokens_total on each worker (1 m).",
            [Target("glmserve:worker_output_tokens_per_second:rate1m", "{{worker}}")],
            unit="none",
        ),
        Panel(
            "Replicas: queued and running requests",
            f"{DEF_WORKER} sglang:num_queue_reqs and sglang:num_running_reqs per worker.",
            [
                Target("glmserve:worker_queued_requests:sum", "{{worker}} queued"),
                Target("glmserve:worker_running_requests:sum", "{{worker}} running"),
            ],
            unit="none",
        ),
        Panel(
            "Replicas: KV pool in use",
            f"{DEF_WORKER} sglang:kv_used_tokens over sglang:max_total_num_tokens per worker.",
            [Target("glmserve:worker_kv_usage:ratio", "{{worker}}")],
            unit="percentunit",
        ),
        Panel(
            "Replicas: up",
            f"{DEF_WORKER} scrape: Prometheus reaches its /metrics. router: the router's health "
            "probe (smg_worker_health; 0 = out of rotation, alert GlmserveWorkerDown). probe: "
            "its exporter's GET /server_info.",
            [
                Target('up{job="sglang", worker!=""}', "{{worker}} scrape"),
                Target("smg_worker_health", "{{worker}} router"),
                Target('glmserve_target_up{worker!=""}', "{{worker}} probe"),
            ],
            kind="stat",
            unit="none",
            width=24,
            height=5,
            extra_options={**stat, "textMode": "value_and_name", "colorMode": "background"},
        ),
        Panel(
            "Router: requests/s and errors",
            "Requests the router accepted (smg_router_requests_total) and its non-2xx answers "
            "(smg_http_responses_total), 1 m rates.",
            [
                Target("glmserve:router_requests_per_second:rate1m", "requests"),
                Target("glmserve:router_error_responses_per_second:rate1m", "non-2xx answers"),
            ],
            unit="reqps",
        ),
        Panel(
            "Router: request latency p50/p90/p99",
            "smg_router_request_duration_seconds, as the router times a request it forwards "
            "(1 m). For a stream this includes the whole stream.",
            [Target("glmserve:router_request_duration_seconds:quantile1m", "p{{quantile}}")],
        ),
        Panel(
            "Router: retries",
            "Attempts the router repeated on another worker (smg_worker_retries_total) and "
            "requests that ran out of retries (smg_worker_retries_exhausted_total), per second. "
            "A killed worker shows up here first: its refused connections are retried.",
            [
                Target("glmserve:router_retries_per_second:rate1m", "retries"),
                Target("glmserve:router_retries_exhausted_per_second:rate1m", "exhausted"),
            ],
            unit="reqps",
        ),
        Panel(
            "Router: worker health",
            "1 = the router routes to the worker, 0 = its health probe or circuit breaker took "
            "it out (smg_worker_health), over time.",
            [Target("smg_worker_health", "{{worker}}")],
            unit="none",
        ),
    ]


def _layout(items: list[Panel], first_id: int, y: int) -> tuple[list[dict[str, Any]], int]:
    """Panels left to right, 24 columns per row; returns their JSON and the next free y."""
    out = []
    x = row_h = 0
    for pid, panel in enumerate(items, start=first_id):
        if x + panel.width > 24:
            x, y, row_h = 0, y + row_h, 0
        out.append(panel.to_json(pid, x, y))
        x += panel.width
        row_h = max(row_h, panel.height)
    return out, y + row_h


def build_dashboard() -> dict[str, Any]:
    out_panels, y = _layout(panels(), 1, 0)
    fleet, _ = _layout(fleet_panels(), len(out_panels) + 2, y + 1)
    # Collapsed: a single-server stack has no fleet series, and Grafana only queries the
    # panels of a row when it is opened.
    out_panels.append(
        {
            "id": len(out_panels) + 1,
            "type": "row",
            "title": FLEET_ROW,
            "collapsed": True,
            "gridPos": {"h": 1, "w": 24, "x": 0, "y": y},
            "panels": fleet,
        }
    )
    return {
        "uid": UID,
        "title": "TPOT",
        "description": "GLM-5 serving: TPOT (canary vs server), ITL, TTFT, throughput, KV "
        "cache, SLO attainment and the patch status; a fleet row per replica and for the "
        "router. Generated by "
        "python -m glmserve.dashboard; do not edit by hand.",
        "tags": ["glmserve", "sglang", "tpot"],
        "editable": False,
        "graphTooltip": 1,
        "refresh": "15s",
        "schemaVersion": 39,
        "version": 1,
        "time": {"from": "now-1h", "to": "now"},
        "timepicker": {},
        "timezone": "utc",
        "annotations": {"list": []},
        "links": [],
        "templating": {
            "list": [
                {
                    "name": "datasource",
                    "label": "Prometheus",
                    "type": "datasource",
                    "query": "prometheus",
                    "current": {},
                    "hide": 0,
                    "refresh": 1,
                    "regex": "",
                    "options": [],
                }
            ]
        },
        "panels": out_panels,
    }


def render() -> str:
    return json.dumps(build_dashboard(), indent=2, ensure_ascii=False) + "\n"


def main(argv: Sequence[str] | None = None) -> int:
    p = argparse.ArgumentParser(prog="python -m glmserve.dashboard")
    group = p.add_mutually_exclusive_group(required=True)
    group.add_argument("--output", metavar="PATH", help="write the dashboard JSON here")
    group.add_argument("--check", metavar="PATH", help="exit 1 if PATH differs from the output")
    args = p.parse_args(argv)
    text = render()
    if args.output:
        Path(args.output).write_text(text)
        return 0
    try:
        current = Path(args.check).read_text()
    except OSError as exc:
        print(f"dashboard: error: {exc}", file=sys.stderr)
        return 1
    if current != text:
        print(f"dashboard: {args.check} is stale; regenerate with --output", file=sys.stderr)
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(main())
