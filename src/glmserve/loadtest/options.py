"""The suite's command-line options, added to Locust's own parser, and their validation."""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Any

SHAPES = ("single", "concurrent", "sweep", "rate-sweep")
ROUTES = ("chat", "completions", "generate")
DEFAULT_REPORT_DIR = "loadtest-report"
ARRIVALS = ("poisson", "constant", "gamma")  # glmserve.loadtest.arrivals
# Open loop without -u: the senders, i.e. the most requests one Locust process keeps in flight
# (past that, arrivals are counted as missed); also the rate sweep's throughput streams.
DEFAULT_SENDERS = 128
# Locust binds its web UI and, as a master, its port for workers to all interfaces unless told
# otherwise; a load generator that any host on the network can start or join is not a safe
# default, so ours is loopback (workers on other hosts: --master-bind-host 0.0.0.0).
DEFAULT_BIND_HOST = "127.0.0.1"
# Exit code when an SLO percentile is breached: distinct from Locust's 1 (request failures)
# and 2 (unhandled exception) so CI can tell "too slow" from "broken".
EXIT_SLO_BREACH = 3
# The run happened but its report could not be written: a result nobody can read is a failure.
EXIT_REPORT_FAILED = 4
# A headless run that ended before its last step did (SIGTERM, -t, Ctrl-C): its report is
# written and marked incomplete, and a script must not take it for a whole run.
EXIT_INCOMPLETE = 5


class OptionsError(ValueError):
    """A bad option value; the message is the one line shown to the user."""


@dataclass(frozen=True)
class LoadTestOptions:
    shape: str = "concurrent"
    streams: int = 1
    warmup_s: float = 5.0
    measure_s: float = 60.0
    route: str = "chat"
    model: str = "default"
    max_tokens: int = 256
    input_tokens: int = 128
    prompt_file: str | None = None
    seed: int | None = None
    request_timeout_s: float = 600.0
    read_timeout_s: float = 60.0
    slo_ttft_ms: float | None = None
    slo_tpot_ms: float | None = None
    slo_percentile: float = 90.0
    report_dir: str = DEFAULT_REPORT_DIR
    build_info: str | None = None
    itl_stats: bool = True
    # Open loop and workloads (docs/loadtest.md, "Open loop" and "Workloads").
    rates: tuple[float, ...] = ()
    arrivals: str = "poisson"
    burstiness: float = 1.0
    senders: int = DEFAULT_SENDERS
    sweep_count: int = 4
    repeats: int = 1
    input_dist: str | None = None
    output_dist: str | None = None
    dataset: str | None = None
    turns: int = 1

    def __post_init__(self) -> None:
        problems: list[str] = self._workload_problems()
        if self.shape not in SHAPES:
            problems.append(f"--shape must be one of {', '.join(SHAPES)}")
        if self.route not in ROUTES:
            problems.append(f"--route must be one of {', '.join(ROUTES)}")
        if self.streams < 1:
            problems.append("--users (streams) must be >= 1")
        if not (self.warmup_s >= 0 and math.isfinite(self.warmup_s)):
            problems.append("--warmup-s must be >= 0")
        if not (self.measure_s >= 0 and math.isfinite(self.measure_s)):
            problems.append("--measure-s must be >= 0")
        if self.shape == "sweep" and self.measure_s == 0:
            problems.append("--measure-s 0 (run until stopped) does not work with --shape sweep")
        if self.max_tokens < 1:
            problems.append("--max-tokens must be >= 1")
        if self.input_tokens < 1:
            problems.append("--input-tokens must be >= 1")
        if not self.request_timeout_s > 0 or not self.read_timeout_s > 0:
            problems.append("--request-timeout-s and --read-timeout-s must be > 0")
        for name, value in (
            ("--slo-ttft-ms", self.slo_ttft_ms),
            ("--slo-tpot-ms", self.slo_tpot_ms),
        ):
            if value is not None and not value > 0:
                problems.append(f"{name} must be > 0")
        if not 0 < self.slo_percentile <= 100:
            problems.append("--slo-percentile must be in (0, 100]")
        if problems:
            raise OptionsError("; ".join(problems))

    def _workload_problems(self) -> list[str]:
        problems = []
        if self.rates and self.shape not in ("concurrent", "rate-sweep"):
            problems.append(
                "--rate works with --shape concurrent (one rate) or rate-sweep (a list of rates);"
                f" --shape {self.shape} sets streams, not rates"
            )
        if len(self.rates) > 1 and self.shape != "rate-sweep":
            problems.append("several --rate values need --shape rate-sweep")
        if not all(r > 0 and math.isfinite(r) for r in self.rates):
            problems.append("--rate must be requests per second > 0, e.g. 5 or 2,4,8")
        if self.arrivals not in ARRIVALS:
            problems.append(f"--arrivals must be one of {', '.join(ARRIVALS)}")
        if not (self.burstiness > 0 and math.isfinite(self.burstiness)):
            problems.append("--burstiness must be > 0 (1 = Poisson, below 1 = burstier)")
        if self.burstiness != 1.0 and self.arrivals != "gamma":
            problems.append("--burstiness shapes --arrivals gamma only")
        if self.senders < 1:
            problems.append("-u/--users (senders) must be >= 1")
        if self.sweep_count < 1:
            problems.append("--sweep-rates must be >= 1")
        if self.repeats < 1:
            problems.append("--repeats must be >= 1")
        if self.shape == "rate-sweep" and self.measure_s == 0:
            problems.append(
                "--measure-s 0 (run until stopped) does not work with --shape rate-sweep"
            )
        if self.repeats > 1 and self.measure_s == 0:
            problems.append("--repeats needs a finite --measure-s")
        if self.turns < 1:
            problems.append("--turns must be >= 1")
        if self.dataset and self.prompt_file:
            problems.append("--dataset and --prompt-file are two sources of prompts: give one")
        return problems

    @property
    def open_loop(self) -> bool:
        return bool(self.rates) or self.shape == "rate-sweep"

    @property
    def slo_set(self) -> bool:
        return self.slo_ttft_ms is not None or self.slo_tpot_ms is not None

    @classmethod
    def from_namespace(cls, ns: Any) -> LoadTestOptions:
        """Build from Locust's parsed options (`environment.parsed_options`)."""
        users = getattr(ns, "num_users", None)  # None: -u not given
        if users is not None and int(users) < 1:
            # `users or 1` once turned -u 0 into one silent stream.
            raise OptionsError(f"-u/--users must be >= 1, got {users}")
        return cls(
            shape=ns.shape,
            streams=1 if ns.shape == "single" or users is None else int(users),
            warmup_s=float(ns.warmup_s),
            measure_s=float(ns.measure_s),
            route=ns.route,
            model=ns.model,
            max_tokens=int(ns.max_tokens),
            input_tokens=int(ns.input_tokens),
            prompt_file=ns.prompt_file or None,
            seed=_optional(int, ns.seed, "--seed"),
            request_timeout_s=float(ns.request_timeout_s),
            read_timeout_s=float(ns.read_timeout_s),
            slo_ttft_ms=_optional(float, ns.slo_ttft_ms, "--slo-ttft-ms"),
            slo_tpot_ms=_optional(float, ns.slo_tpot_ms, "--slo-tpot-ms"),
            slo_percentile=float(ns.slo_percentile),
            report_dir=ns.report_dir or DEFAULT_REPORT_DIR,
            build_info=ns.build_info or None,
            itl_stats=ns.itl_stats == "on",
            **_workload_fields(ns, users),
        )


def _workload_fields(ns: Any, users: Any) -> dict[str, Any]:
    """The open-loop and workload options from Locust's namespace (absent: the defaults, as
    for an Environment built by hand)."""
    get = lambda name, default: getattr(ns, name, default)  # noqa: E731
    return {
        "rates": parse_rates(get("rate", "")),
        "arrivals": get("arrivals", "poisson"),
        "burstiness": _number(float, get("burstiness", 1.0), "--burstiness"),
        "senders": DEFAULT_SENDERS if users is None else int(users),
        "sweep_count": _number(int, get("sweep_rates", 4), "--sweep-rates"),
        "repeats": _number(int, get("repeats", 1), "--repeats"),
        "input_dist": get("input_dist", "") or None,
        "output_dist": get("output_dist", "") or None,
        "dataset": get("dataset", "") or None,
        "turns": _number(int, get("turns", 1), "--turns"),
    }


def parse_rates(text: Any) -> tuple[float, ...]:
    """'5' or '2,4,8' (requests/s) -> (5.0,) or (2.0, 4.0, 8.0); '' -> ()."""
    if text is None or str(text).strip() == "":
        return ()
    try:
        return tuple(float(part) for part in str(text).split(","))
    except ValueError:
        raise OptionsError(
            f"--rate {text!r} is not requests per second (a number, or a list like 2,4,8)"
        ) from None


def _optional(kind: type, value: Any, option: str) -> Any:
    # The web UI hands custom options back as strings, "" meaning unset.
    if value is None or value == "":
        return None
    return _number(kind, value, option)


def _number(kind: type, value: Any, option: str) -> Any:
    try:
        return kind(value)
    except (TypeError, ValueError) as exc:
        what = {"float": "a number", "int": "an integer"}.get(kind.__name__, kind.__name__)
        raise OptionsError(f"{option} {value!r} is not {what}") from exc


def add_arguments(parser: Any) -> None:
    """Add our options to Locust's (configargparse) parser and make the UI and the master's
    worker port loopback-only.

    `set_defaults` only changes the default: an explicit --web-host / --master-bind-host, their
    LOCUST_* variables or a locust.conf entry still win, because configargparse treats those as
    given values.
    """
    parser.set_defaults(web_host=DEFAULT_BIND_HOST, master_bind_host=DEFAULT_BIND_HOST)
    g = parser.add_argument_group("glmserve decode suite (docs/loadtest.md)")
    g.add_argument(
        "--shape",
        choices=SHAPES,
        default="concurrent",
        help="single: one stream; concurrent: -u streams held constant; "
        "sweep: 1, 2, 4, ..., -u streams, each with warm-up then measurement",
    )
    g.add_argument("--warmup-s", type=float, default=5.0, help="warm-up per step (not measured)")
    g.add_argument(
        "--measure-s",
        type=float,
        default=60.0,
        help="measured steady state per step; 0 = until stopped (single/concurrent only)",
    )
    g.add_argument("--route", choices=ROUTES, default="chat", help="chat = /v1/chat/completions")
    g.add_argument("--model", default="default", help="model name sent in OpenAI requests")
    g.add_argument("--max-tokens", type=int, default=256, help="output tokens (ignore_eos on)")
    g.add_argument("--input-tokens", type=int, default=128, help="synthetic prompt length (words)")
    g.add_argument("--prompt-file", default="", help='JSONL, one {"prompt": "..."} per line')
    g.add_argument("--seed", default="", help="seed for prompt choice and synthetic text")
    g.add_argument("--request-timeout-s", type=float, default=600.0, help="whole request")
    g.add_argument("--read-timeout-s", type=float, default=60.0, help="silence between bytes")
    g.add_argument("--slo-ttft-ms", default="", help="TTFT SLO (ms) at --slo-percentile")
    g.add_argument("--slo-tpot-ms", default="", help="TPOT SLO (ms) at --slo-percentile")
    g.add_argument(
        "--slo-percentile",
        type=float,
        default=90.0,
        help=f"percentile checked against the SLOs; a breach exits {EXIT_SLO_BREACH}",
    )
    g.add_argument("--report-dir", default=DEFAULT_REPORT_DIR, help="JSON, CSV and PNG go here")
    g.add_argument(
        "--build-info",
        default="",
        help="glmserve build-info JSON to record (default: $GLMSERVE_BUILD_INFO if it exists)",
    )
    add_workload_arguments(parser)
    g.add_argument(
        "--itl-stats",
        choices=("on", "off"),
        default="on",
        help="report every inter-token gap to Locust's stats (off saves CPU at high load)",
    )


def add_workload_arguments(parser: Any) -> None:
    """Open loop, rate sweep, repeats and workloads (docs/loadtest.md)."""
    g = parser.add_argument_group("glmserve open loop and workloads (docs/loadtest.md)")
    g.add_argument(
        "--rate",
        default="",
        help="open loop: arrivals per second, sent whether or not earlier requests finished "
        f"(-u = senders, the most in flight; default {DEFAULT_SENDERS}); a list like 2,4,8 with "
        "--shape rate-sweep",
    )
    g.add_argument(
        "--arrivals",
        choices=ARRIVALS,
        default="poisson",
        help="open-loop gaps: poisson (seeded by --seed), constant, or gamma (bursty)",
    )
    g.add_argument(
        "--burstiness",
        type=float,
        default=1.0,
        help="gamma shape: 1 = Poisson, below 1 = burstier (as vLLM's --burstiness)",
    )
    g.add_argument(
        "--sweep-rates",
        type=int,
        default=4,
        help="rate-sweep: rates between the synchronous and the throughput step's",
    )
    g.add_argument(
        "--repeats",
        type=int,
        default=1,
        help="run the whole shape this many times; the report gives 95%% confidence intervals",
    )
    g.add_argument(
        "--input-dist",
        default="",
        help="prompt lengths (words): fixed:N, uniform:LO:HI, normal:MEAN:SD, lognormal:MEDIAN:SIGMA",
    )
    g.add_argument(
        "--output-dist",
        default="",
        help="output lengths (tokens), same forms as --input-dist (default: --max-tokens)",
    )
    g.add_argument(
        "--dataset",
        default="",
        help='JSONL: {"prompt": ...} or {"input_tokens": N}, optional "output_tokens": M',
    )
    g.add_argument(
        "--turns",
        type=int,
        default=1,
        help="multi-turn: each conversation sends this many turns, each with the whole "
        "conversation so far as its prefix",
    )
