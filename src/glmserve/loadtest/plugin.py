"""Wires the suite into Locust: options, per-run session, shape callbacks, worker -> master
records, and the report + SLO exit code when Locust quits."""

from __future__ import annotations

import contextlib
import logging
import math
import os
import random
import signal
import socket
import sys
import tempfile
import time
from pathlib import Path
from typing import Any, NoReturn
from urllib.parse import urlsplit

import gevent
import locust
import psutil
from locust.env import Environment
from locust.runners import MasterRunner, WorkerRunner

from glmserve.loadtest.openloop import OpenLoop
from glmserve.loadtest.options import (
    EXIT_INCOMPLETE,
    EXIT_REPORT_FAILED,
    EXIT_SLO_BREACH,
    LoadTestOptions,
    OptionsError,
    add_arguments,
)
from glmserve.loadtest.prompts import load_prompt_file
from glmserve.loadtest.session import Session, attach, find_session, sessions
from glmserve.loadtest.shapes import DecodeShape
from glmserve.loadtest.users import check_geventhttpclient
from glmserve.loadtest.workload import Workload

log = logging.getLogger(__name__)
WIRE_KEY = "glmserve_records"


def _on_parser(parser: Any, **_: Any) -> None:
    add_arguments(parser)


def _on_init(environment: Environment, **_: Any) -> None:
    ns = environment.parsed_options
    if ns is None:  # Environment built by hand (library use): caller sets up the session
        return
    try:
        options = LoadTestOptions.from_namespace(ns)
        prompts = load_prompt_file(options.prompt_file) if options.prompt_file else None
        workload = Workload.from_options(options, prompts)  # a bad dataset: one line, now
        if options.open_loop and isinstance(environment.runner, WorkerRunner):
            sys.exit(2)  # the master refuses, in one line for the whole run
        if options.open_loop and isinstance(environment.runner, MasterRunner):
            raise OptionsError(
                "open loop (--rate, --shape rate-sweep) runs in one Locust process: drop "
                "--processes/--master/--worker (one process sends thousands of requests/s)"
            )
    except OptionsError as exc:
        _refuse(environment, str(exc))
    if options.open_loop and getattr(ns, "num_users", None) is None:
        # Locust turns an absent -u into 1 before the shape starts, and the options are read
        # again then: keep the open-loop default of senders instead.
        ns.num_users = options.senders
    scheme = urlsplit(environment.host or "").scheme
    if environment.host and scheme not in ("http", "https"):
        # Anything else sends no request at all: a run with 0 requests that calls itself complete.
        _refuse(
            environment,
            f"target {environment.host!r} is not an http:// or https:// URL"
            " (e.g. -H http://127.0.0.1:30000)",
        )
    if not isinstance(environment.runner, WorkerRunner):
        problem = report_dir_problem(options.report_dir)
        if problem:
            # Found now, not after the whole run (a sweep's results were once lost this way).
            _refuse(environment, problem)
    if ns.headless and not isinstance(environment.runner, WorkerRunner):
        problem = unreachable(environment.host or "")
        if problem:
            # A run against nothing would only fill a report with connect failures. A target
            # that dies mid-run is different: those requests are counted as `connect` failures.
            _refuse(environment, problem)
    session = start_session(environment, options, prompts, workload)
    if not isinstance(environment.runner, WorkerRunner):
        _stop_on_sigterm(environment, session)


def _refuse(environment: Environment, problem: str) -> NoReturn:
    """The whole run refused before it starts: one line, exit 2, no process left behind."""
    sys.stderr.write(f"locust decode suite: {problem}\n")
    if isinstance(environment.runner, MasterRunner):
        _stop_forked_workers()
    sys.exit(2)


def _stop_forked_workers() -> None:
    """With --processes, Locust forks the workers before the init event. One that has not
    reached the master yet retries for minutes after the master is gone (Locust's exit hook
    drops the children it cannot reap at once), holding the terminal or a caller's pipes.
    They are stopped here but not reaped: that exit hook reaps them, and logs a traceback in a
    loop for 3 s for each child it cannot find."""
    children = psutil.Process().children()
    for child in children:
        child.terminate()
    if not _exited(children, timeout_s=3):
        for child in children:
            with contextlib.suppress(psutil.NoSuchProcess):
                child.kill()
        _exited(children, timeout_s=3)


def _exited(children: list[psutil.Process], timeout_s: float) -> bool:
    """Whether every child has exited (a zombie, or reaped) within the time, without reaping."""

    def gone(child: psutil.Process) -> bool:
        try:
            return child.status() == psutil.STATUS_ZOMBIE
        except psutil.NoSuchProcess:
            return True

    deadline = time.monotonic() + timeout_s
    while not all(gone(c) for c in children):
        if time.monotonic() > deadline:
            return False
        time.sleep(0.05)
    return True


def _stop_on_sigterm(environment: Environment, session: Session) -> None:
    """Locust installs its SIGTERM handler only after a headless shape run has ended, so until
    then SIGTERM (docker stop, a CI timeout) killed the process and no report was written.
    Stop the run instead: Locust then quits the normal way and the report is written, marked
    incomplete."""

    def on_term() -> None:
        session.stopped_by = "SIGTERM"
        log.warning("SIGTERM: stopping the run; the report will be marked incomplete")
        if environment.runner is not None:
            gevent.spawn(environment.runner.quit)

    gevent.signal_handler(signal.SIGTERM, on_term)


def report_dir_problem(report_dir: str) -> str | None:
    """Why the report could not be written into `report_dir`, or None. Nothing is left behind:
    a file is written and removed in it, or in the nearest folder that exists when it does not
    yet (permissions alone do not show a read-only mount)."""
    path = Path(report_dir).absolute()
    existing = next(p for p in (path, *path.parents) if p.exists())
    try:
        if not existing.is_dir():
            raise NotADirectoryError(20, "Not a directory")
        with tempfile.NamedTemporaryFile(dir=existing, prefix=".glmserve-write-test-"):
            pass
    except OSError as exc:
        reason = exc.strerror or type(exc).__name__
        return f"--report-dir {report_dir} is not writable ({reason}); the report goes there"
    return None


def slo_verdict(summary: dict[str, Any]) -> str | None:
    """The run's SLO verdict in one line, for the screen (the summary holds the details)."""
    slo = summary.get("slo")
    if not slo:
        return None
    limits = ", ".join(
        f"{key.upper()} <= {slo[f'{key}_ms']:g} ms"
        for key in ("ttft", "tpot")
        if slo.get(f"{key}_ms") is not None
    )
    if slo["passed"]:
        best = slo.get("max_streams_within_slo")
        within = f"; up to {best} streams within it" if best else ""
        return f"SLO met: p{slo['percentile']:g} {limits} in every measured step{within}"
    breaches = slo["breaches"]
    more = f" (and {len(breaches) - 3} more)" if len(breaches) > 3 else ""
    return (
        f"SLO breached (p{slo['percentile']:g} {limits}; exit {EXIT_SLO_BREACH}): "
        + "; ".join(breaches[:3])
        + more
    )


def unreachable(url: str, timeout_s: float = 5.0) -> str | None:
    """Why a TCP connection to the target fails, or None when something listens there."""
    parts = urlsplit(url)
    if not parts.hostname:
        return f"no target host in {url!r}: pass -H http://127.0.0.1:30000"
    port = parts.port or (443 if parts.scheme == "https" else 80)
    try:
        socket.create_connection((parts.hostname, port), timeout=timeout_s).close()
    except OSError as exc:
        reason = exc.strerror or type(exc).__name__
        return f"target {url} is not reachable ({reason}); is the server up?"
    return None


def start_session(
    environment: Environment,
    options: LoadTestOptions,
    prompts: list[str] | None = None,
    workload: Workload | None = None,
) -> Session:
    session = Session(options, isinstance(environment.runner, WorkerRunner), prompts)
    _set_up_requests(session, workload)
    attach(environment, session)
    shape = environment.shape_class
    if isinstance(shape, DecodeShape):
        _configure_shape(environment, session, shape)
        shape.on_reset = lambda: _restart(environment, session, shape)
    return session


def _set_up_requests(session: Session, workload: Workload | None = None) -> None:
    """The session's workload, and for open-loop runs its arrival ledger. An unseeded open-loop
    run picks a seed and records it, so its arrivals can be replayed (--seed)."""
    options = session.options
    session.workload = workload or Workload.from_options(options, session.prompts)
    if options.open_loop:
        seed = options.seed if options.seed is not None else random.getrandbits(31)
        session.open_loop = OpenLoop(options.arrivals, seed, options.burstiness)
    else:
        session.open_loop = None


def _configure_shape(environment: Environment, session: Session, shape: DecodeShape) -> None:
    ns = environment.parsed_options
    player = shape.configure(session.options, getattr(ns, "run_time", None))
    player.on_phase = lambda tick, at: session.on_phase(tick, at, environment)
    player.on_end = session.close
    player.resolve = session.resolve_rates
    session.player = player


def _restart(environment: Environment, session: Session, shape: DecodeShape) -> None:
    """A shape run starts (headless start, or each start in the web UI, whose form may have
    changed the users and our options): re-read the options, start a fresh record."""
    ns = environment.parsed_options
    if ns is not None:
        try:
            options = LoadTestOptions.from_namespace(ns)
            if options.prompt_file and options.prompt_file != session.options.prompt_file:
                session.prompts = load_prompt_file(options.prompt_file)
        except OptionsError as exc:
            log.error("options not changed: %s", exc)
        else:
            session.options = options
            try:
                _set_up_requests(session)
            except OptionsError as exc:
                log.error("workload not changed: %s", exc)
    session.collector.clear()
    if session.open_loop is not None:
        session.open_loop.clear()
    _configure_shape(environment, session, shape)


def _on_test_start(environment: Environment, **_: Any) -> None:
    session = find_session(environment)
    if session is None or session.is_worker:
        return
    from glmserve.loadtest.serverinfo import (
        fetch_spec_metrics,
        gather_server_info,
        runs_speculative,
    )

    session.started_at = time.time()
    session.server = gather_server_info(environment.host or "", session.options.build_info)
    if runs_speculative(session.server):  # MTP: the steps state the server's acceptance
        host = environment.host or ""
        session.server_sampler = lambda: fetch_spec_metrics(host)


def _on_test_stop(environment: Environment, **_: Any) -> None:
    session = find_session(environment)
    if session is None or session.is_worker:
        return
    session.close(time.time())
    ns = environment.parsed_options
    if ns is not None and not ns.headless:
        # A web-UI user reads the report after pressing stop, not only when Locust exits.
        _finish(environment, session)


def _on_report_to_master(client_id: str, data: dict[str, Any], **_: Any) -> None:
    for env, session in sessions():
        if session.is_worker and env.runner is not None and env.runner.client_id == client_id:
            data[WIRE_KEY] = session.collector.take_pending()


def _on_worker_report(client_id: str, data: dict[str, Any], **_: Any) -> None:
    rows = data.get(WIRE_KEY)
    if not rows:
        return
    for env, session in sessions():
        if isinstance(env.runner, MasterRunner):
            session.collector.add_wire(rows)


def _on_quitting(environment: Environment, **_: Any) -> None:
    session = find_session(environment)
    if session is None or session.is_worker:
        return
    session.close(time.time())
    _finish(environment, session)


def completion(environment: Environment, session: Session) -> tuple[bool, str | None]:
    """(complete, how it ended when not by itself). A run is complete when its shape reached
    the end, or reached an open-ended step (--measure-s 0), which any stop ends normally."""
    shape = environment.shape_class
    player = shape.player if isinstance(shape, DecodeShape) else None
    if player is None:
        return True, session.stopped_by
    if player.cut_short:
        return False, session.stopped_by or player.stop_reason or f"--run-time {player.limit_s:g} s"
    if player.finished:
        return True, session.stopped_by
    open_ended = bool(player.stages) and math.isinf(player.stages[-1].measure_s)
    if open_ended and player.reached_last:
        return True, session.stopped_by
    return False, session.stopped_by or (
        "stopped before the last step ended (Ctrl-C, a stop in the web UI, or an error)"
    )


def _finish(environment: Environment, session: Session) -> None:
    from glmserve.loadtest.report import write_report

    session.complete, session.stopped_by = completion(environment, session)
    if not session.complete:
        log.warning("the run ended early (%s): report marked incomplete", session.stopped_by)

    try:
        outcome = write_report(session, environment.host or "", os.getcwd())
    except OSError as exc:  # e.g. a read-only working directory in a container
        log.error(
            "could not write the report (--report-dir %s): %s", session.options.report_dir, exc
        )
        environment.process_exit_code = EXIT_REPORT_FAILED
        return
    for line in outcome.breaches:
        log.error("SLO breach: %s", line)
    _show_steps(outcome.summary)
    log.info("report written to %s", outcome.directory)
    verdict = slo_verdict(outcome.summary)
    if verdict:  # on screen whatever --loglevel says, not only in summary.json
        sys.stderr.write(f"locust decode suite: {verdict}\n")
    ns = environment.parsed_options
    if outcome.breaches:
        environment.process_exit_code = EXIT_SLO_BREACH
    elif not session.complete and (ns is None or ns.headless):
        environment.process_exit_code = EXIT_INCOMPLETE


def _show_steps(summary: dict[str, Any]) -> None:
    """The goodput table, and a line per step above the server's capacity, on the screen."""
    from glmserve.loadtest.stepinfo import goodput_table

    if summary["steps"]:
        log.info("goodput per step (goodput.csv):\n%s", "\n".join(goodput_table(summary["steps"])))
    for line in summary["capacity"]["lines"]:
        log.warning("%s", line)


_registered = False


def register() -> None:
    """Attach the suite's listeners to Locust's global events (idempotent), after checking that
    the installed geventhttpclient is the one the stream reader was written against."""
    global _registered
    check_geventhttpclient()
    if _registered:
        return
    _registered = True
    ev = locust.events
    ev.init_command_line_parser.add_listener(_on_parser)
    ev.init.add_listener(_on_init)
    ev.test_start.add_listener(_on_test_start)
    ev.test_stop.add_listener(_on_test_stop)
    ev.report_to_master.add_listener(_on_report_to_master)
    ev.worker_report.add_listener(_on_worker_report)
    ev.quitting.add_listener(_on_quitting)
