"""Checks for the inputs of programs this project does not ship: Prometheus, Grafana, Locust's
own flags, and docker compose itself (image references, pull policies, the project name).

Their own parsers are not here to ask (Go binaries in images, or a Locust import that patches
the whole process with gevent), so each rule below is the program's documented grammar, and
each line says what the program would do with the value.
"""

from __future__ import annotations

import re
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any

from glmserve.netaddr import host_port_problem, host_problem, port_problem

# Prometheus' model.ParseDuration: units from the largest down, each at most once ("1y2w", "15d").
_PROM_DURATION = re.compile(r"(?:\d+y)?(?:\d+w)?(?:\d+d)?(?:\d+h)?(?:\d+m)?(?:\d+s)?(?:\d+ms)?")
# go-ini's Key.Bool(), which Grafana reads GF_* settings with; anything else reads as false.
_GO_INI_BOOLS = {
    "1", "t", "T", "true", "TRUE", "True", "YES", "yes", "Yes", "y", "ON", "on", "On",
    "0", "f", "F", "false", "FALSE", "False", "NO", "no", "No", "n", "OFF", "off", "Off",
}  # fmt: skip

# distribution/reference's grammar (what `docker pull` and compose parse an image with).
_ALNUM = r"[a-z0-9]+"
_PATH = rf"{_ALNUM}(?:(?:[._]|__|-+){_ALNUM})*"
_DOMAIN_PART = r"(?:[a-zA-Z0-9]|[a-zA-Z0-9][a-zA-Z0-9-]*[a-zA-Z0-9])"
_DOMAIN = rf"(?:{_DOMAIN_PART}(?:\.{_DOMAIN_PART})*|\[[0-9a-fA-F:]+\])(?::[0-9]+)?"
_REFERENCE = re.compile(
    rf"(?P<name>(?:{_DOMAIN}/)?{_PATH}(?:/{_PATH})*)"
    r"(?::(?P<tag>[\w][\w.-]{0,127}))?"
    r"(?:@(?P<digest>[A-Za-z][A-Za-z0-9]*(?:[-_+.][A-Za-z][A-Za-z0-9]*)*:[0-9a-fA-F]{32,}))?"
)
# compose's pull_policy values (compose-spec).
PULL_POLICIES = ("always", "never", "missing", "if_not_present", "build", "daily", "weekly")
_EVERY = re.compile(r"every_(?:\d+[wdhms])+")
# compose's project names: lower-case letters, digits, '-' and '_', starting with a letter or digit.
_PROJECT_NAME = re.compile(r"[a-z0-9][a-z0-9_-]*")
# NCCL_P2P_LEVEL (NCCL's environment variables documentation): a path type or its number.
NCCL_P2P_LEVELS = ("LOC", "NVL", "PIX", "PXB", "PHB", "SYS", "0", "1", "2", "3", "4", "5")


def _flags(argv: Sequence[str]) -> dict[str, str]:
    """--name=value entries of a compose command, by name."""
    out = {}
    for arg in argv:
        name, sep, value = str(arg).partition("=")
        if sep and name.startswith("--"):
            out[name] = value
    return out


def prometheus(argv: Sequence[str]) -> str | None:
    flags = _flags(argv)
    retention = flags.get("--storage.tsdb.retention.time")
    if retention is not None and not (retention and _PROM_DURATION.fullmatch(retention)):
        return (
            f"prometheus: --storage.tsdb.retention.time={retention!r} is not a duration "
            "(e.g. 15d, 12h, 1y2w); Prometheus would not start"
        )
    listen = flags.get("--web.listen-address")
    said = host_port_problem(listen) if listen is not None else None
    if said:
        return f"prometheus: --web.listen-address={listen!r}: {said}"
    return None


def grafana(environment: Mapping[str, Any]) -> str | None:
    env = {k: "" if v is None else str(v) for k, v in environment.items()}
    port = env.get("GF_SERVER_HTTP_PORT")
    if port is not None and port_problem(port):
        return f"grafana: http_port {port!r} {port_problem(port)}; Grafana would not start"
    addr = env.get("GF_SERVER_HTTP_ADDR")
    if addr is not None and host_problem(addr):
        return f"grafana: http_addr {addr!r} {host_problem(addr)}; Grafana would not start"
    anonymous = env.get("GF_AUTH_ANONYMOUS_ENABLED")
    if anonymous is not None and anonymous not in _GO_INI_BOOLS:
        return (
            f"grafana: auth.anonymous enabled={anonymous!r} is neither true nor false "
            "(Grafana would silently read it as false)"
        )
    if env.get("GF_SECURITY_ADMIN_USER") == "":
        return "grafana: admin_user is empty; Grafana would create no admin to log in as"
    return None


def locust(argv: Sequence[str], project_dir: Path) -> str | None:
    flags = _flags(argv)
    port = flags.get("--web-port")
    if port is not None and port_problem(port):
        return f"locust: --web-port {port!r} {port_problem(port)}"
    host = flags.get("--web-host")
    if host is not None and host_problem(host):
        return f"locust: --web-host {host!r} {host_problem(host)}"
    locustfile = flags.get("--locustfile", "")
    mount = "/opt/glmserve-app/loadtest/"
    if locustfile.startswith(mount):
        name = locustfile[len(mount) :]
        if not name or "/" in name or not (project_dir / "loadtest" / name).is_file():
            there = ", ".join(sorted(p.name for p in (project_dir / "loadtest").glob("*.py")))
            return f"locust: no locustfile {name!r} in loadtest/ (there: {there or 'none'})"
    return None


def image_problem(reference: str) -> str | None:
    """Why docker would refuse `reference`, or this project's policy would (never :latest)."""
    match = _REFERENCE.fullmatch(reference)
    if match is None or len(match["name"]) > 255:
        return f"{reference!r} is not an image reference (docker: invalid reference format)"
    if match["tag"] == "latest" or (match["tag"] is None and match["digest"] is None):
        return f"{reference!r} would run whatever :latest is today; pin a tag or a digest"
    return None


def pull_policy_problem(policy: str) -> str | None:
    if policy in PULL_POLICIES or _EVERY.fullmatch(policy):
        return None
    return f"pull_policy {policy!r} is not one of compose's: {', '.join(PULL_POLICIES)}, every_<duration>"


def project_name_problem(name: str) -> str | None:
    if _PROJECT_NAME.fullmatch(name):
        return None
    return (
        f"project name {name!r} must be lower-case letters, digits, '-' and '_', starting with a "
        "letter or digit (docker compose refuses it)"
    )


def nccl_p2p_level_problem(level: str) -> str | None:
    if level.upper() in NCCL_P2P_LEVELS:
        return None
    return f"NCCL_P2P_LEVEL {level!r} is not one of NCCL's: {', '.join(NCCL_P2P_LEVELS[:6])} or 0-5"
