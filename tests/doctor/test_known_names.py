""".env.example is the doctor's list of known names: every name compose.yaml reads is in it,
every name in it is read by compose.yaml or by the fleet tool, and the doctor service is
given all of them but the secrets."""

from __future__ import annotations

import re
from pathlib import Path
from typing import Any

from glmserve.doctor import compose
from glmserve.doctor.names import COMPOSE_HOST_ONLY, known_names
from glmserve.envfile import SECRETS

REPO = Path(__file__).resolve().parents[2]
KNOWN = known_names(REPO / ".env.example")
SERVICES = compose.load(REPO / "compose.yaml")["services"]
# Read by docker compose itself rather than interpolated.
COMPOSE_OWN = {"COMPOSE_PROFILES", *COMPOSE_HOST_ONLY}


def passed_through(service: dict[str, Any]) -> set[str]:
    """Names a service takes from the shell or .env without ${}: bare environment entries and
    build args given without a value."""
    env = service.get("environment") or {}
    names = {k for k, v in env.items() if v is None} if isinstance(env, dict) else set(env)
    build = service.get("build")
    if isinstance(build, dict):
        names |= {a for a in build.get("args") or [] if "=" not in a}
    return names


def read_by_compose() -> set[str]:
    others = {n: s for n, s in SERVICES.items() if n != "doctor"}
    text = (REPO / "compose.yaml").read_text()
    # x-... anchors are merged into services; their names count where they are written.
    anchors = {k: v for k, v in compose.load(REPO / "compose.yaml").items() if k.startswith("x-")}
    names = compose.names_in(others) | compose.names_in(anchors)
    names |= set().union(*(passed_through(s) for s in others.values()))
    assert names <= set(re.findall(r"[A-Z][A-Z0-9_]+", text))  # control: really in the file
    return names


def read_by_the_fleet_tool() -> set[str]:
    source = "\n".join(p.read_text() for p in (REPO / "src/glmserve/fleet").glob("*.py"))
    return {name for name in KNOWN if re.search(rf"\b{name}\b", source)}


def test_every_name_compose_reads_is_known():
    assert read_by_compose() - KNOWN == set()


def test_every_known_name_has_a_reader():
    unread = KNOWN - read_by_compose() - COMPOSE_OWN - read_by_the_fleet_tool()
    assert unread == set(), f".env.example lists names nothing reads: {sorted(unread)}"


def test_the_doctor_service_sees_every_known_name_but_the_secrets():
    given = SERVICES["doctor"]["environment"]
    assert len(given) == len(set(given)), "a name listed twice"
    host_only = set(COMPOSE_HOST_ONLY)
    assert set(given) == {n for n in KNOWN if not SECRETS.search(n)} - host_only
    assert {"GRAFANA_ADMIN_PASSWORD", "HF_TOKEN"} <= KNOWN - set(given)
