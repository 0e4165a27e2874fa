"""`python -m glmserve.exporter`: Prometheus-style flags over a config file and the environment.

Precedence, lowest first: built-in defaults, --config.file (JSON), GLMSERVE_EXPORTER_* variables
(and GLMSERVE_BUILD_INFO), then flags. A bad setting prints one line and exits 2.
"""

from __future__ import annotations

import argparse
import logging
import os
import signal
import sys
import threading
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any, NoReturn

from glmserve.exporter.config import ConfigError, ExporterConfig, env_name, resolve

PROG = "glmserve-exporter"


class _Parser(argparse.ArgumentParser):
    def error(self, message: str) -> NoReturn:
        # One line, like every other bad-input path, instead of argparse's usage block.
        self.exit(2, f"{PROG}: error: {message} (see --help)\n")


def build_parser() -> argparse.ArgumentParser:
    p = _Parser(
        prog=PROG,
        description="Sidecar exporter: canary TPOT/TTFT, target health and build info for SGLang.",
        # Only flags the user typed may override the file and the environment.
        argument_default=argparse.SUPPRESS,
    )
    p.add_argument("--config.file", dest="config.file", metavar="FILE", help="JSON settings")
    p.add_argument("--target", dest="target", metavar="URL", help="SGLang base URL")
    p.add_argument("--web.listen-address", dest="web.listen-address", metavar="HOST:PORT")
    p.add_argument(
        "--canary.enabled",
        dest="canary.enabled",
        action=argparse.BooleanOptionalAction,
        help="run the canary probe (--no-canary.enabled for health/info only)",
    )
    p.add_argument("--canary.interval", dest="canary.interval", metavar="DURATION")
    p.add_argument("--canary.max-tokens", dest="canary.max-tokens", metavar="N")
    p.add_argument("--canary.prompt", dest="canary.prompt", metavar="TEXT")
    p.add_argument(
        "--canary.route", dest="canary.route", metavar="ROUTE", help="chat|completions|generate"
    )
    p.add_argument("--canary.model", dest="canary.model", metavar="NAME")
    p.add_argument("--canary.timeout", dest="canary.timeout", metavar="DURATION")
    p.add_argument("--probe.timeout", dest="probe.timeout", metavar="DURATION")
    p.add_argument(
        "--probe.interval",
        dest="probe.interval",
        metavar="DURATION",
        help="how often /server_info is probed in the background (a scrape never waits for it)",
    )
    p.add_argument("--build-info.file", dest="build-info.file", metavar="PATH")
    p.add_argument(
        "--log.level", dest="log.level", default="info", choices=["debug", "info", "warning"]
    )
    return p


def load_config(argv: Sequence[str], environ: Mapping[str, str]) -> tuple[ExporterConfig, str]:
    args = vars(build_parser().parse_args(argv))
    log_level = args.pop("log.level")
    config_file = args.pop("config.file", None) or environ.get(env_name("config.file"))
    return resolve(args, environ, config_file), log_level


@dataclass
class Exporter:
    """The running pieces, so tests can start one in-process and stop it."""

    config: ExporterConfig
    server: Any
    thread: threading.Thread
    canary: Any
    prober: Any
    clients: list[Any]

    @property
    def port(self) -> int:
        return int(self.server.server_port)

    def stop(self) -> None:
        if self.canary is not None:
            self.canary.stop()
        self.prober.stop()
        self.server.shutdown()
        self.server.server_close()
        for client in self.clients:
            client.close()


def start(config: ExporterConfig) -> Exporter:
    """Build a registry, the collectors and the HTTP server; return once /metrics serves."""
    import httpx
    from prometheus_client import CollectorRegistry, disable_created_metrics, start_http_server

    from glmserve.exporter.canary import Canary, CanaryMetrics
    from glmserve.exporter.info import TargetInfoCollector
    from glmserve.streaming import StreamRequest

    # `_created` series double the exposition for no query we run (and are not reproducible).
    disable_created_metrics()
    registry = CollectorRegistry()
    probe_client = httpx.Client(timeout=httpx.Timeout(config.probe_timeout_s))
    prober = TargetInfoCollector(
        config.target,
        probe_client,
        registry,
        config.build_info_file,
        deadline_s=config.probe_timeout_s,
    )
    clients = [probe_client]
    canary = None
    if config.canary_enabled:
        # Read timeout per chunk; time_stream also enforces canary.timeout over the whole stream.
        canary_client = httpx.Client(
            timeout=httpx.Timeout(config.canary_timeout_s, connect=config.probe_timeout_s)
        )
        clients.append(canary_client)
        request = StreamRequest(
            route=config.canary_route,  # type: ignore[arg-type]
            model=config.canary_model,
            prompt=config.canary_prompt,
            max_tokens=config.canary_max_tokens,
            ignore_eos=True,
        )
        canary = Canary(
            config.target,
            request,
            CanaryMetrics(registry),
            canary_client,
            interval_s=config.canary_interval_s,
            timeout_s=config.canary_timeout_s,
        )
    host, port = config.listen_host_port
    server, thread = start_http_server(port, addr=host, registry=registry)
    prober.start(config.probe_interval_s)
    if canary is not None:
        canary.start()
    return Exporter(config, server, thread, canary, prober, clients)


def main(argv: Sequence[str] | None = None) -> int:
    try:
        config, log_level = load_config(sys.argv[1:] if argv is None else argv, os.environ)
    except ConfigError as exc:
        print(f"{PROG}: error: {exc}", file=sys.stderr)
        return 2
    logging.basicConfig(
        level=log_level.upper(), format="%(asctime)s %(levelname)s %(name)s: %(message)s"
    )
    # httpx logs every request it makes at INFO: one line per probe and canary is noise at info.
    logging.getLogger("httpx").setLevel(logging.DEBUG if log_level == "debug" else logging.WARNING)
    try:
        exporter = start(config)
    except OSError as exc:
        print(f"{PROG}: error: cannot listen on {config.listen_address}: {exc}", file=sys.stderr)
        return 1
    logging.getLogger(PROG).info(
        "serving /metrics on %s, target %s, canary %s",
        config.listen_address,
        config.target,
        f"every {config.canary_interval_s:g} s x {config.canary_max_tokens} tokens"
        if config.canary_enabled
        else "off",
    )
    stop = threading.Event()
    # As PID 1 in a container Python ignores SIGTERM unless told otherwise.
    signal.signal(signal.SIGTERM, lambda *_: stop.set())
    signal.signal(signal.SIGINT, lambda *_: stop.set())
    stop.wait()
    exporter.stop()
    return 0
