"""Our router argv against the pinned smg's own argument parser and validation.

The router is imported only for its parser (smg.launch_router.parse_router_args, what `smg
launch` and `python -m smg.launch_router` run before they start), never started here: a renamed
flag, an illegal value or an argv the release would reject fails in CI, not at `compose up`.
"""

from __future__ import annotations

import argparse
import importlib.metadata

import pytest

from glmserve.fleet.router import (
    CLIENT_MODEL_ALIAS,
    POLICIES,
    ROUTER_MODULE,
    ROUTER_PACKAGE,
    ROUTER_VERSION,
    SERVED_MODEL,
    FleetError,
    RouterConfig,
    check_worker_url,
    router_argv,
)

launch_router = pytest.importorskip("smg.launch_router", reason="pip install '.[router]'")

WORKERS = ["http://127.0.0.1:30001", "http://127.0.0.1:30002", "http://10.0.0.7:30000"]


class _Refused(Exception):
    pass


def parse(argv: list[str]):
    """What `python -m smg.launch_router ARGV` builds before it starts."""
    original = argparse.ArgumentParser.error

    def refuse(self, message):  # the release's parser exits; make that an exception here
        raise _Refused(message)

    argparse.ArgumentParser.error = refuse  # type: ignore[method-assign]
    try:
        args = launch_router.parse_router_args(argv)
    finally:
        argparse.ArgumentParser.error = original  # type: ignore[method-assign]
    args._validate_router_args()
    return args


def test_the_installed_router_is_the_pinned_one():
    assert importlib.metadata.version(ROUTER_PACKAGE) == ROUTER_VERSION


def test_the_release_defaults_are_why_we_override_them():
    """Guards the guard: if the release ever defaults to loopback, short timeouts or no SSE
    keep-alive, the comments in router.py (and docs/fleet.md) are stale."""
    defaults = parse([])
    assert defaults.host == "0.0.0.0"
    assert defaults.health_check_interval_secs == 60
    assert defaults.shutdown_grace_period_secs == 180
    assert defaults.request_timeout_secs == 1800
    assert defaults.sse_keepalive_secs == 15
    assert defaults.retry_max_retries == 5


def test_our_argv_parses_to_what_we_asked_for():
    cfg = RouterConfig(policy="round_robin", port=31000, metrics_port=31009, api_key="k3y")
    argv = router_argv(cfg, WORKERS, "python3")
    assert argv[:3] == ["python3", "-m", ROUTER_MODULE]
    got = parse(argv[3:])
    assert got.worker_urls == WORKERS
    assert (got.host, got.port) == ("127.0.0.1", 31000)
    assert (got.prometheus_host, got.prometheus_port) == ("127.0.0.1", 31009)
    assert got.policy == "round_robin"
    assert got.health_check_interval_secs == cfg.health_check_interval_s
    assert got.health_check_timeout_secs == cfg.health_check_timeout_s
    assert got.health_failure_threshold == cfg.health_failure_threshold
    assert got.cb_failure_threshold == cfg.cb_failure_threshold
    assert got.cb_timeout_duration_secs == cfg.cb_timeout_s
    assert got.retry_max_retries == cfg.retry_max_retries
    assert got.request_timeout_secs == cfg.request_timeout_s
    assert got.sse_keepalive_secs == 0
    assert got.shutdown_grace_period_secs == cfg.shutdown_grace_period_s
    assert got.model_aliases == {CLIENT_MODEL_ALIAS: SERVED_MODEL}
    assert got.api_key == "k3y"
    assert cfg.health_bound_s == 15


@pytest.mark.parametrize("policy", POLICIES)
def test_every_policy_we_offer_exists_in_the_release(policy):
    assert parse(router_argv(RouterConfig(policy=policy), WORKERS, "py")[3:]).policy == policy


def test_extra_args_reach_the_router_before_the_worker_list():
    cfg = RouterConfig(extra_args=("--retry-max-retries", "2"))
    got = parse(router_argv(cfg, WORKERS[:1], "py")[3:])
    assert got.retry_max_retries == 2
    assert got.worker_urls == WORKERS[:1]


def test_the_parser_rejects_what_it_should():
    """The check can fail: a typo'd flag, a bad choice and a bad alias are refused by the real
    parser."""
    with pytest.raises(_Refused):
        parse(["--policy", "cache-aware"])
    with pytest.raises(_Refused):
        parse(["--no-such-router-flag"])
    with pytest.raises(ValueError, match="Alias must differ"):
        parse(["--model-alias", "a=a"])


@pytest.mark.parametrize(
    ("url", "why"),
    [
        ("127.0.0.1:30000", "http://HOST:PORT"),
        ("http://127.0.0.1", "explicit port"),
        ("http://127.0.0.1:30000/v1", "path"),
        ("http://127.0.0.1:99999", "invalid port"),
        ("ftp://127.0.0.1:21", "http://HOST:PORT"),
    ],
)
def test_bad_worker_urls_are_refused_in_one_line(url, why):
    with pytest.raises(FleetError, match=why) as info:
        check_worker_url(url)
    assert "\n" not in str(info.value)


def test_router_config_refusals():
    with pytest.raises(FleetError, match="policy"):
        RouterConfig(policy="least_loaded")
    with pytest.raises(FleetError, match="share"):
        RouterConfig(port=30000, metrics_port=30000)
    with pytest.raises(FleetError, match="at least one"):
        router_argv(RouterConfig(), [], "py")
    with pytest.raises(FleetError, match="twice"):
        router_argv(RouterConfig(), [WORKERS[0], WORKERS[0] + "/"], "py")
    with pytest.raises(FleetError, match="API key"):
        RouterConfig(api_key="two words")
