"""Listen addresses as every service here takes them: a host (an IP address or a DNS name) and
a port in 1-65535. One wording for all of them: the launcher, the doctor and the exporter say
the same thing about the same mistake. Stdlib only (the launcher runs in the SGLang image)."""

from __future__ import annotations

import ipaddress
import re

# RFC 1123 host names: dot-separated labels of letters, digits and inner hyphens.
_LABEL = re.compile(r"(?!-)[A-Za-z0-9-]{1,63}(?<!-)")


def host_problem(host: str) -> str | None:
    """Why `host` cannot be bound or dialled, or None."""
    if not host:
        return "is empty"
    try:
        ipaddress.ip_address(host.strip("[]") if host.startswith("[") else host)
        return None
    except ValueError:
        pass
    labels = host.rstrip(".").split(".")
    if len(host) <= 253 and all(_LABEL.fullmatch(label) for label in labels):
        return None
    return "is neither an IP address nor a host name"


def port_problem(raw: str) -> str | None:
    """Why `raw` is not a TCP port one can listen on (1-65535), or None."""
    if not raw.isdigit():
        return "is not a port number"
    if not 1 <= int(raw) <= 65535:
        return "is not in 1-65535"
    return None


def host_port_problem(address: str) -> str | None:
    """Why HOST:PORT (IPv6 hosts in brackets) is not one, or None."""
    host, sep, port = address.rpartition(":")
    if not sep:
        return "is not HOST:PORT"
    said = port_problem(port)
    if said:
        return f"port {port!r} {said}"
    said = host_problem(host)
    return f"host {host!r} {said}" if said else None
