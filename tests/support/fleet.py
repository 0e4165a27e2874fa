"""Support for the fleet tests (tests/fleet/).

Everything here runs on 127.0.0.1: emulators and the real router through their own testing
modules, Locust as a subprocess (importing it would gevent-patch pytest), and a sampler that
reads the router's Prometheus endpoint on a timeline.
"""

from __future__ import annotations

import csv
import json
import re
import subprocess
import sys
import threading
import time
import urllib.request
from dataclasses import dataclass, field
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
LOCUSTFILE = ROOT / "loadtest" / "decode.py"
# A model dir that exists here: the router loads the tokenizer at the path a worker reports,
# and would ask the Hugging Face Hub for a path it cannot find (see glmserve.testing.router).
LOCAL_MODEL = ROOT / "deploy" / "models" / "tiny-mla"


def emulator_args(tpot_ms: float = 10, ttft_ms: float = 20) -> list[str]:
    return ["--tpot-ms", str(tpot_ms), "--ttft-ms", str(ttft_ms), "--model-path", str(LOCAL_MODEL)]


def port_of(url: str) -> int:
    return int(url.rsplit(":", 1)[1])


def worker_requests(url: str) -> float:
    """The worker's own count of finished requests (sglang:num_requests_total)."""
    with urllib.request.urlopen(url + "/metrics", timeout=5) as r:
        text = r.read().decode()
    return sum(
        float(line.rsplit(" ", 1)[1])
        for line in text.splitlines()
        if line.startswith("sglang:num_requests_total")
    )


def samples(text: str, family: str) -> dict[tuple[tuple[str, str], ...], float]:
    """{sorted label pairs: value} for one metric family in Prometheus text format."""
    out = {}
    for m in re.finditer(rf"^{re.escape(family)}(?:\{{([^}}]*)\}})? (\S+)$", text, re.M):
        labels = tuple(sorted(re.findall(r'(\w+)="([^"]*)"', m.group(1) or "")))
        out[labels] = float(m.group(2))
    return out


def per_worker(text: str, family: str, **match: str) -> dict[str, float]:
    """{worker URL: value} for a router family labelled by `worker`, filtered by `match`."""
    out = {}
    for labels, value in samples(text, family).items():
        d = dict(labels)
        if all(d.get(k) == v for k, v in match.items()) and "worker" in d:
            out[d["worker"]] = value
    return out


@dataclass
class Sample:
    t: float
    health: dict[str, float]
    failed_attempts: dict[str, float]


@dataclass
class RouterSampler:
    """Polls the router's /metrics every `period_s`: per-worker health and failed attempts."""

    metrics_url: str
    period_s: float = 0.2
    timeline: list[Sample] = field(default_factory=list)
    _stop: threading.Event = field(default_factory=threading.Event)
    _thread: threading.Thread | None = None

    def __enter__(self) -> RouterSampler:
        self._thread = threading.Thread(target=self._run, daemon=True)
        self._thread.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self._stop.set()
        assert self._thread is not None
        self._thread.join(5)

    def _run(self) -> None:
        while not self._stop.is_set():
            try:
                with urllib.request.urlopen(self.metrics_url, timeout=2) as r:
                    text = r.read().decode()
            except OSError:
                text = None
            if text is not None:
                self.timeline.append(
                    Sample(
                        time.monotonic(),
                        per_worker(text, "smg_worker_health"),
                        per_worker(text, "smg_worker_cb_outcomes_total", outcome="failure"),
                    )
                )
            self._stop.wait(self.period_s)

    def first(self, after: float, worker: str, healthy: bool) -> float | None:
        """Monotonic time of the first sample after `after` with `worker` in that state."""
        want = 1.0 if healthy else 0.0
        for s in self.timeline:
            if s.t >= after and s.health.get(worker) == want:
                return s.t
        return None

    def attempts_between(self, worker: str, start: float, end: float) -> float:
        """Failed attempts the router made on `worker` between two moments."""
        inside = [s for s in self.timeline if start <= s.t <= end]
        if not inside:
            return 0.0
        return inside[-1].failed_attempts.get(worker, 0) - inside[0].failed_attempts.get(worker, 0)


@dataclass
class LocustRun:
    proc: subprocess.Popen[str]
    report: Path
    started_wall: float

    def wait(self, timeout_s: float = 120) -> str:
        out, _ = self.proc.communicate(timeout=timeout_s)
        return out

    @property
    def summary(self) -> dict:
        return json.loads((self.report / "summary.json").read_text())

    def requests(self) -> list[dict[str, str]]:
        with (self.report / "requests.csv").open() as fh:
            return list(csv.DictReader(fh))


def start_locust(host: str, report: Path, *args: str) -> LocustRun:
    """Our suite, headless, in the background; wait() for it, then read its report."""
    argv = [sys.executable, "-m", "locust", "-f", str(LOCUSTFILE), "--headless", "-H", host,
            "--report-dir", str(report), "--only-summary", *args]  # fmt: skip
    proc = subprocess.Popen(
        argv, cwd=ROOT, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True
    )
    return LocustRun(proc, report, time.time())


def shared_prefix_prompts(path: Path, groups: int, variants: int, prefix_words: int) -> Path:
    """A JSONL prompt file: `groups` long shared prefixes, each with `variants` short suffixes
    (many users of one system prompt; the shape the router's cache_aware policy is for)."""
    words = ("alpha", "beta", "gamma", "delta", "epsilon", "zeta", "eta", "theta", "iota")
    lines = []
    for g in range(groups):
        prefix = " ".join(f"{words[(g + i) % len(words)]}{g}" for i in range(prefix_words))
        lines += [
            json.dumps({"prompt": f"{prefix} question {v} of group {g}?"}) for v in range(variants)
        ]
    path.write_text("\n".join(lines) + "\n")
    return path
