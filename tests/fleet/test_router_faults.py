"""Faults through the REAL router (smg 1.13.0) in front of three emulator processes.

Everything listens on 127.0.0.1. Each test drives load with our Locust suite (a subprocess)
and reads what happened from three independent places: the router's own Prometheus metrics,
each emulator's own request counter, and Locust's report. The bounds come from the router's
settings (glmserve.fleet.router.RouterConfig), tightened here so the run stays short.
"""

from __future__ import annotations

import os
import re
import signal
import threading
import time
from collections.abc import Iterator

import httpx
import pytest
from support.fleet import (
    RouterSampler,
    emulator_args,
    port_of,
    shared_prefix_prompts,
    start_locust,
    worker_requests,
)

from glmserve.fleet.router import RouterConfig
from glmserve.streaming import FAILURE_REASONS
from glmserve.testing.emulator import RunningEmulator, start_process
from glmserve.testing.router import start_router

pytest.importorskip("smg", reason="pip install '.[router]'")
pytestmark = pytest.mark.slow

# Tight router settings for a short test; the bound each test checks is derived from these.
FAST = {
    "health_check_interval_s": 1,
    "health_check_timeout_s": 2,
    "health_failure_threshold": 2,
    "health_success_threshold": 1,
    "cb_timeout_s": 2,
    "worker_startup_check_interval_s": 1,
    "shutdown_grace_period_s": 2,
}
# A 2-core CI box runs three emulators, Locust and the router at once: scheduling slack.
SLACK_S = 3.0
DETECT_BOUND_S = (
    FAST["health_check_interval_s"] * FAST["health_failure_threshold"]
    + FAST["health_check_timeout_s"]
    + SLACK_S
)
REJOIN_BOUND_S = FAST["health_check_interval_s"] * FAST["health_success_threshold"] + SLACK_S


@pytest.fixture(scope="module")
def workers() -> Iterator[list[RunningEmulator]]:
    emus = [start_process(emulator_args()) for _ in range(3)]
    yield emus
    for emu in emus:
        emu.stop()


def shares(before: dict[str, float], after: dict[str, float]) -> dict[str, float]:
    done = {url: after[url] - before[url] for url in after}
    total = sum(done.values())
    assert total > 0, f"no request reached any worker: {done}"
    return {url: n / total for url, n in done.items()}


@pytest.mark.parametrize(("policy", "sticky"), [("cache_aware", True), ("round_robin", False)])
def test_cache_aware_keeps_a_shared_prefix_on_one_worker(workers, tmp_path, policy, sticky):
    """One long shared prefix, many short suffixes: cache_aware sends (nearly) all of it to one
    worker, so one radix cache holds the prefix. Measured by each emulator's own request
    counter; round_robin on the same workload is the control that shows the measure can fail."""
    urls = [w.url for w in workers]
    prompts = shared_prefix_prompts(tmp_path / "p.jsonl", groups=1, variants=64, prefix_words=300)
    router = start_router(urls, policy=policy, **FAST)
    try:
        before = {u: worker_requests(u) for u in urls}
        run = start_locust(router.url, tmp_path / "report", "--shape", "concurrent", "-u", "4",
                           "--warmup-s", "0", "--measure-s", "6", "--route", "completions",
                           "--max-tokens", "8", "--prompt-file", str(prompts), "--seed", "1")  # fmt: skip
        out = run.wait()
        after = {u: worker_requests(u) for u in urls}
    finally:
        router.close()
    assert run.proc.returncode == 0, out[-2000:]
    # Locust's report records the router and its worker set, each with its own server info.
    recorded = run.summary["server"]
    assert {w["url"] for w in recorded["router"]["workers"]} == set(urls)
    assert all(w["server"]["kv_pool_tokens"] for w in recorded["router"]["workers"])
    assert (
        recorded["kv_pool_tokens"] == recorded["router"]["workers"][0]["server"]["kv_pool_tokens"]
    )
    share = shares(before, after)
    print(f"{policy}: per-worker share of requests {sorted(share.values(), reverse=True)}")
    if sticky:
        # smg 1.13.0 measured 1.0 in most runs, and 0.82 once, when the first concurrent
        # requests raced to an empty prefix tree and two workers got the prefix.
        assert max(share.values()) >= 0.75, share
    else:
        assert max(share.values()) <= 0.5, share


def test_a_killed_worker_is_dropped_in_bounded_time_and_rejoins(workers, tmp_path):
    """SIGKILL one of three workers under load: the router marks it unhealthy within
    interval x threshold + timeout and stops attempting it; Locust's failures are only the
    streams that were on it (each labelled with a streaming.FAILURE_REASONS reason); after a
    restart on the same port it is healthy again and receives requests."""
    urls = [w.url for w in workers]
    victim = workers[1]
    users = 9
    router = start_router(urls, policy="round_robin", **FAST)
    try:
        with RouterSampler(router.metrics_url) as sampler:
            run = start_locust(router.url, tmp_path / "report", "--shape", "concurrent",
                               "-u", str(users), "--warmup-s", "0", "--measure-s", "16",
                               "--route", "completions", "--max-tokens", "48",
                               "--input-tokens", "16")  # fmt: skip
            time.sleep(5)
            os.kill(victim.pid, signal.SIGKILL)
            t_kill = time.monotonic()
            victim.stop()  # reaps it
            time.sleep(5)
            t_restart = time.monotonic()
            workers[1] = start_process(emulator_args(), port=port_of(victim.url))
            out = run.wait()
            served_after_rejoin = worker_requests(workers[1].url)
    finally:
        router.close()
    assert run.proc.returncode in (0, 1), out[-2000:]  # 1: Locust saw request failures

    t_down = sampler.first(t_kill, victim.url, healthy=False)
    assert t_down is not None, "the router never marked the killed worker unhealthy"
    print(f"marked unhealthy {t_down - t_kill:.1f} s after the kill (bound {DETECT_BOUND_S:g} s)")
    assert t_down - t_kill <= DETECT_BOUND_S
    # Once it is marked down the router stops trying it (no new failed attempts).
    assert sampler.attempts_between(victim.url, t_down + 0.5, t_restart) == 0

    t_up = sampler.first(t_restart, victim.url, healthy=True)
    assert t_up is not None, "the restarted worker never rejoined"
    print(f"healthy again {t_up - t_restart:.1f} s after the restart (bound {REJOIN_BOUND_S:g} s)")
    assert t_up - t_restart <= REJOIN_BOUND_S
    assert served_after_rejoin > 0, "the rejoined worker got no requests"

    failures = run.summary["failures_total"]
    ok = sum(1 for r in run.requests() if r["ok"] == "1")
    print(f"locust: {ok} ok, failures {failures}")
    assert set(failures) <= set(FAILURE_REASONS), failures
    # Bounded: at most the streams in flight on the victim (one per user at most); retries on
    # the router turn refused connections into successes on the other workers.
    assert sum(failures.values()) <= users
    assert ok > 20 * sum(failures.values())


def test_router_restart_gives_clean_errors_and_clients_recover(workers, tmp_path):
    """SIGKILL the router mid-run and start it again on the same port: every request in the gap
    fails fast with a labelled reason (no hang), and Locust, a plain client and the exporter's
    canary all succeed again once it is back."""
    from glmserve.exporter.cli import start as start_exporter
    from glmserve.exporter.config import ExporterConfig

    urls = [w.url for w in workers]
    router = start_router(urls, policy="round_robin", **FAST)
    port, metrics_port = router.config.port, router.config.metrics_port
    exporter = start_exporter(
        ExporterConfig(
            target=router.url,
            listen_address="127.0.0.1:0",
            canary_interval_s=0.3,
            canary_max_tokens=8,
            canary_timeout_s=5.0,
            probe_timeout_s=2.0,
            probe_interval_s=0.1,
        )
    )
    probe: list[tuple[float, str, float]] = []  # (monotonic start, outcome, seconds)
    stop = threading.Event()

    def plain_client() -> None:
        while not stop.is_set():
            t0 = time.monotonic()
            body = {"model": "default", "prompt": "hello", "max_tokens": 16, "stream": True}
            try:
                url = router.url + "/v1/completions"
                with httpx.stream("POST", url, json=body, timeout=10) as resp:
                    done = any(line == "data: [DONE]" for line in resp.iter_lines())
                outcome = "ok" if resp.status_code == 200 and done else f"http_{resp.status_code}"
            except httpx.HTTPError as exc:
                outcome = type(exc).__name__
            probe.append((t0, outcome, time.monotonic() - t0))
            stop.wait(0.05)

    thread = threading.Thread(target=plain_client, daemon=True)
    thread.start()
    try:
        run = start_locust(router.url, tmp_path / "report", "--shape", "concurrent", "-u", "6",
                           "--warmup-s", "0", "--measure-s", "14", "--route", "completions",
                           "--max-tokens", "32", "--input-tokens", "16")  # fmt: skip
        time.sleep(4)
        router.stop(signal.SIGKILL)
        t_kill = time.monotonic()
        time.sleep(3)
        router.close()
        router = start_router(
            urls, port=port, metrics_port=metrics_port, policy="round_robin", **FAST
        )
        t_back, wall_back = time.monotonic(), time.time()
        out = run.wait()
        time.sleep(1)
        canary = exporter_samples(exporter.port)
    finally:
        stop.set()
        thread.join(15)
        exporter.stop()
        router.close()
    assert run.proc.returncode in (0, 1), out[-2000:]

    gap = [p for p in probe if t_kill <= p[0] < t_back - 0.5]
    assert gap, "the plain client made no request while the router was down"
    assert all(outcome != "ok" for _, outcome, _ in gap), gap
    slowest = max(seconds for _, _, seconds in gap)
    print(f"plain client: {len(gap)} requests in the gap, slowest failed in {slowest:.3f} s")
    assert slowest < 2.0, "a request hung while the router was down"
    assert any(o == "ok" and t0 > t_back for t0, o, _ in probe), "plain client did not recover"

    failures = run.summary["failures_total"]
    assert failures and set(failures) <= set(FAILURE_REASONS), failures
    ok_starts = [float(r["started_at"]) for r in run.requests() if r["ok"] == "1"]
    assert any(t > wall_back for t in ok_starts), "Locust did not recover after the restart"

    assert canary["glmserve_canary_failures_total{reason=connect}"] >= 1
    assert canary["glmserve_target_up"] == 1
    assert canary["glmserve_canary_last_success_timestamp_seconds"] > time.time() - 5


def stream_clients(url: str, count: int, read_timeout_s: float, stop: threading.Event):
    """`count` threads streaming completions through `url` until `stop`, each request bounded by
    `read_timeout_s` of silence (as Locust's --read-timeout-s bounds it); (start, outcome, s)."""
    log: list[tuple[float, str, float]] = []

    def client(i: int) -> None:
        while not stop.is_set():
            t0 = time.monotonic()
            body = {"model": "default", "prompt": f"hi {i} {t0}", "max_tokens": 64,
                    "ignore_eos": True, "stream": True}  # fmt: skip
            try:
                with httpx.stream("POST", url + "/v1/completions", json=body,
                                  timeout=httpx.Timeout(read_timeout_s)) as resp:  # fmt: skip
                    done = any(line == "data: [DONE]" for line in resp.iter_lines())
                outcome = "ok" if resp.status_code == 200 and done else f"http_{resp.status_code}"
            except httpx.HTTPError as exc:
                outcome = type(exc).__name__
            log.append((t0, outcome, time.monotonic() - t0))

    threads = [threading.Thread(target=client, args=(i,), daemon=True) for i in range(count)]
    for t in threads:
        t.start()
    return log, threads


@pytest.mark.parametrize(("keepalive_s", "bounded"), [(0, True), (1, False)])
def test_a_frozen_worker_costs_no_more_than_its_health_bound(workers, keepalive_s, bounded):
    """SIGSTOP one of three workers under load (a hung driver, a stuck process): its socket still
    accepts, nothing answers. The router takes it out of rotation within its health bound, so
    no request started after that goes there; the streams already on it fail by the client's
    read timeout (set to the health bound), since the router sends no SSE keep-alive that would
    hide the silence; nothing waits out the freeze (the probe saw 25-26 s before). The control
    (a 1 s keep-alive, the release's default being 15 s) shows the measure can fail: there the
    frozen streams live through the whole freeze."""
    urls = [w.url for w in workers]
    victim = workers[2]
    config = RouterConfig(**FAST)
    read_timeout_s = float(config.health_bound_s)
    freeze_s = 10.0
    router = start_router(urls, policy="round_robin", sse_keepalive_s=keepalive_s, **FAST)
    stop = threading.Event()
    try:
        with RouterSampler(router.metrics_url) as sampler:
            log, threads = stream_clients(router.url, 6, read_timeout_s, stop)
            time.sleep(3)
            os.kill(victim.pid, signal.SIGSTOP)
            t_freeze = time.monotonic()
            time.sleep(freeze_s)
            os.kill(victim.pid, signal.SIGCONT)
            t_thaw = time.monotonic()
            time.sleep(4)
            stop.set()
            for t in threads:
                t.join(read_timeout_s + freeze_s + 5)
    finally:
        os.kill(victim.pid, signal.SIGCONT)
        router.close()
    during = [(t0 - t_freeze, outcome, s) for t0, outcome, s in log if t_freeze - 2 <= t0 < t_thaw]
    longest = max(s for _, _, s in during)
    failed = [d for d in during if d[1] != "ok"]
    print(f"keep-alive {keepalive_s} s: {len(during)} requests during the freeze, {len(failed)} "
          f"failed, longest {longest:.1f} s (read timeout {read_timeout_s:g} s)")  # fmt: skip
    if not bounded:
        assert longest >= freeze_s - 1, "the control did not hang: the measure cannot fail"
        return
    t_down = sampler.first(t_freeze, victim.url, healthy=False)
    assert t_down is not None, "the router never marked the frozen worker unhealthy"
    print(f"marked unhealthy {t_down - t_freeze:.1f} s after the freeze (bound {DETECT_BOUND_S:g})")
    assert t_down - t_freeze <= DETECT_BOUND_S
    assert longest <= read_timeout_s + SLACK_S, during
    # Requests the router sent after it took the worker out all succeeded elsewhere.
    late = [d for d in during if d[0] > t_down - t_freeze + 0.5]
    assert late and all(outcome == "ok" for _, outcome, _ in late), late
    assert failed and len(failed) <= 6 * 2, failed  # the streams on it, and the few before t_down
    assert sampler.first(t_thaw, victim.url, healthy=True) is not None, "it never rejoined"


def exporter_samples(port: int) -> dict[str, float]:
    """The exporter's /metrics as {name{label=value}: value} (label quotes dropped)."""
    text = httpx.get(f"http://127.0.0.1:{port}/metrics", timeout=5).text
    out = {}
    for line in text.splitlines():
        if line and not line.startswith("#"):
            key, value = line.rsplit(" ", 1)
            out[key.replace('"', "")] = float(value)
    return out


def test_the_router_never_asks_the_hub_for_a_tokenizer(workers):
    """The network rule: smg 1.13.0 routes HTTP workers by text, so it loads no tokenizer at all
    (its tokenizer job is skipped; GET /v1/tokenizers lists none) and has no reason to reach the
    Hugging Face Hub; NO_EGRESS would make a slip fail at once instead of leaving the host."""
    router = start_router([w.url for w in workers], policy="round_robin", log_level="debug", **FAST)
    try:
        deadline = time.monotonic() + 10
        while "step_id=submit_tokenizer_job result=" not in plain(router.log()):
            assert time.monotonic() < deadline, "the router never got to its tokenizer step"
            time.sleep(0.2)
        log = plain(router.log())
        tokenizers = httpx.get(router.url + "/v1/tokenizers", timeout=5).json()
    finally:
        router.close()
    assert "step_id=submit_tokenizer_job result=Skip" in log
    assert tokenizers == {"tokenizers": []}
    assert "huggingface" not in log.lower(), [x for x in log.splitlines() if "ugging" in x][:2]


def plain(log: str) -> str:
    """The router's log without its colour codes."""
    return re.sub(r"\x1b\[[0-9;]*m", "", log)
