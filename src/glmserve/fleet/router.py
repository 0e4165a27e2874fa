"""The fleet's router as glmserve runs it: the pinned release, its argv, and why each flag is set.

The router is the Shepherd Model Gateway, `smg` from PyPI (sglang-router's maintained successor;
a Rust binary behind `python -m smg.launch_router`, what `smg launch` runs), never a balancer of
our own. Everything here is an argv list built from data, so tests can feed it to the pinned
release's own argument parser (tests/fleet/test_router_args.py) and the compose generator, the
bench and the Kubernetes manifests all start the router the same way.
"""

from __future__ import annotations

import ipaddress
from collections.abc import Sequence
from dataclasses import dataclass, field
from urllib.parse import urlsplit

ROUTER_PACKAGE = "smg"
ROUTER_VERSION = "1.13.0"
ROUTER_MODULE = "smg.launch_router"
POLICIES = ("cache_aware", "round_robin", "power_of_two", "random")
# The router's own defaults bind 0.0.0.0 for both the API and /metrics; ours are loopback.
DEFAULT_HOST = "127.0.0.1"
DEFAULT_PORT = 30000
DEFAULT_METRICS_PORT = 29000
# Every worker glmserve starts serves its model from /model (compose, Kubernetes), and SGLang
# names the model after that path; clients that send another name (our Locust suite and the
# canary send "default", which SGLang itself accepts) would get the router's 404.
SERVED_MODEL = "/model"
CLIENT_MODEL_ALIAS = "default"


class FleetError(ValueError):
    """Bad fleet input; the message is the one line shown to the user."""


@dataclass(frozen=True)
class RouterConfig:
    """The router's settings. Defaults trade a little health-check traffic for a bounded time
    to stop sending to a dead worker (docs/fleet.md, "Failure handling")."""

    host: str = DEFAULT_HOST
    port: int = DEFAULT_PORT
    metrics_host: str = DEFAULT_HOST
    metrics_port: int = DEFAULT_METRICS_PORT
    policy: str = "cache_aware"
    # Release defaults: 60 s interval, 3 failures. A killed worker refuses connections at once,
    # and a frozen one (SIGSTOP, a hung driver) stops answering its probe: either is marked
    # unhealthy after `failure_threshold` probes, <= 2 x 5 s + 5 s = 15 s here (health_bound_s).
    # The timeout stays >= 2 s: at 1 s the release failed to register emulator workers here.
    health_check_interval_s: int = 5
    health_check_timeout_s: int = 5
    health_failure_threshold: int = 2
    health_success_threshold: int = 1
    # Between health probes the circuit breaker stops picking a worker after 3 straight failed
    # attempts (default 10), and probes it again after 10 s (default 60), so a restarted worker
    # rejoins within about one probe interval plus that timeout.
    cb_failure_threshold: int = 3
    cb_timeout_s: int = 10
    # A refused attempt is retried on another worker, at most this many attempts in all
    # (default 5: against a dead fleet that multiplies every failure by five).
    retry_max_retries: int = 3
    # The release's whole-request timeout (default 1,800 s) counts the streamed body too
    # (measured: at 3 s it cut a healthy 2,000-token stream at 3.0 s), so it is a cap on one
    # generation, not a way to notice a frozen worker. That is the health probe's job for new
    # requests, and the client's read timeout's for the streams in flight on it: which is why
    # the SSE keep-alive is off (sse_keepalive_s 0; default 15 s), whose frames would make a
    # frozen worker's stream look alive to every client's read timeout.
    request_timeout_s: int = 900
    sse_keepalive_s: int = 0
    # A worker that is not up yet when the router starts is retried this often (default 30 s).
    worker_startup_check_interval_s: int = 5
    # In-flight streams get this long to finish on SIGTERM (default 180 s, longer than compose's
    # and Kubernetes' stop grace periods, which would SIGKILL them anyway).
    shutdown_grace_period_s: int = 10
    log_level: str = "warn"
    # The model the workers serve, reachable under CLIENT_MODEL_ALIAS as well (None: no alias).
    served_model: str | None = SERVED_MODEL
    # Clients must send `Authorization: Bearer <key>` (Kubernetes: from a Secret). None: open,
    # as on a loopback-only compose host.
    api_key: str | None = None
    extra_args: tuple[str, ...] = field(default_factory=tuple)

    @property
    def health_bound_s(self) -> int:
        """Longest time a dead or frozen worker stays in rotation: failed probes, then the last
        one's timeout."""
        return (
            self.health_check_interval_s * self.health_failure_threshold
            + self.health_check_timeout_s
        )

    def __post_init__(self) -> None:
        if self.policy not in POLICIES:
            raise FleetError(f"router policy {self.policy!r} is not one of {', '.join(POLICIES)}")
        for name in ("port", "metrics_port"):
            value = getattr(self, name)
            if not 1 <= value <= 65535:
                raise FleetError(f"router {name.replace('_', ' ')} must be 1-65535, not {value}")
        if (self.host, self.port) == (self.metrics_host, self.metrics_port):
            raise FleetError(f"router API and metrics cannot share {self.host}:{self.port}")
        if self.health_check_timeout_s < 2:
            raise FleetError(
                "router health check timeout must be >= 2 s (smg 1.13.0 registers no worker at 1 s)"
            )
        if self.api_key is not None and (
            not self.api_key or any(c.isspace() for c in self.api_key)
        ):
            raise FleetError("router API key must be non-empty and contain no whitespace")


def check_worker_url(url: str) -> str:
    """A worker URL as the router wants it: http(s)://host:port, no path. Returns it unchanged."""
    parts = urlsplit(url)
    if parts.scheme not in ("http", "https") or not parts.hostname:
        raise FleetError(f"worker URL {url!r} must look like http://HOST:PORT")
    try:
        port = parts.port
    except ValueError:
        raise FleetError(f"worker URL {url!r} has an invalid port") from None
    if port is None:
        raise FleetError(f"worker URL {url!r} needs an explicit port")
    if parts.path not in ("", "/") or parts.query or parts.fragment:
        raise FleetError(f"worker URL {url!r} must not have a path, query or fragment")
    return url.rstrip("/")


def is_loopback(url: str) -> bool:
    host = urlsplit(url).hostname or ""
    if host == "localhost":
        return True
    try:
        return ipaddress.ip_address(host).is_loopback
    except ValueError:
        return False


def router_argv(config: RouterConfig, workers: Sequence[str], python: str) -> list[str]:
    """The command line that starts the pinned router in front of `workers`."""
    if not workers:
        raise FleetError("the router needs at least one worker URL")
    urls = [check_worker_url(u) for u in workers]
    duplicates = sorted({u for u in urls if urls.count(u) > 1})
    if duplicates:
        raise FleetError(f"worker URL listed twice: {duplicates[0]}")
    c = config
    alias = (
        ["--model-alias", f"{CLIENT_MODEL_ALIAS}={c.served_model}"]
        if c.served_model and c.served_model != CLIENT_MODEL_ALIAS
        else []
    )
    return [
        python, "-m", ROUTER_MODULE,
        "--host", c.host, "--port", str(c.port),
        "--prometheus-host", c.metrics_host, "--prometheus-port", str(c.metrics_port),
        "--policy", c.policy,
        "--health-check-interval-secs", str(c.health_check_interval_s),
        "--health-check-timeout-secs", str(c.health_check_timeout_s),
        "--health-failure-threshold", str(c.health_failure_threshold),
        "--health-success-threshold", str(c.health_success_threshold),
        "--cb-failure-threshold", str(c.cb_failure_threshold),
        "--cb-timeout-duration-secs", str(c.cb_timeout_s),
        "--retry-max-retries", str(c.retry_max_retries),
        "--request-timeout-secs", str(c.request_timeout_s),
        "--sse-keepalive-secs", str(c.sse_keepalive_s),
        "--worker-startup-check-interval", str(c.worker_startup_check_interval_s),
        "--shutdown-grace-period-secs", str(c.shutdown_grace_period_s),
        "--log-level", c.log_level,
        *alias,
        *(["--api-key", c.api_key] if c.api_key else []),
        *c.extra_args,
        # Last: nargs="*" swallows everything after it.
        "--worker-urls", *urls,
    ]  # fmt: skip
