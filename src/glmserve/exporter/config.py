"""Exporter settings: defaults < config file < environment < command-line flags.

The config file is JSON whose keys are the flag names without the leading dashes
(`{"target": "http://127.0.0.1:30000", "canary.interval": "15s"}`), so one vocabulary
covers the file, the environment (`GLMSERVE_EXPORTER_CANARY_INTERVAL`) and the flags.
Every bad value is reported as a single ConfigError line naming where it came from.
"""

from __future__ import annotations

import json
import math
import os
import re
from collections.abc import Mapping
from dataclasses import dataclass, replace
from pathlib import Path
from typing import Any
from urllib.parse import urlsplit

from glmserve import buildinfo

ENV_PREFIX = "GLMSERVE_EXPORTER_"


class ConfigError(ValueError):
    """A setting that cannot be used; str() is the one line shown to the user."""


@dataclass(frozen=True)
class ExporterConfig:
    target: str = "http://127.0.0.1:30000"
    listen_address: str = "127.0.0.1:9464"
    canary_enabled: bool = True
    canary_interval_s: float = 15.0
    canary_max_tokens: int = 64
    canary_prompt: str = "Count from one to one hundred in words, separated by commas."
    canary_route: str = "chat"
    canary_model: str = "default"
    canary_timeout_s: float = 60.0
    probe_timeout_s: float = 3.0
    probe_interval_s: float = 5.0
    build_info_file: str = buildinfo.DEFAULT_PATH

    @property
    def listen_host_port(self) -> tuple[str, int]:
        host, _, port = self.listen_address.rpartition(":")
        return host.strip("[]"), int(port)


# key (flag name without dashes) -> (dataclass field, parser)
def _parse_bool(value: Any) -> bool:
    if isinstance(value, bool):
        return value
    text = str(value).strip().lower()
    if text in ("1", "true", "yes", "on"):
        return True
    if text in ("0", "false", "no", "off"):
        return False
    raise ValueError(f"expected true/false, got {value!r}")


_DURATION_RE = re.compile(r"^(\d+(?:\.\d+)?)(ms|s|m|h)$")
_UNIT_S = {"ms": 0.001, "s": 1.0, "m": 60.0, "h": 3600.0}


def parse_duration(value: Any) -> float:
    """Prometheus-style duration ("500ms", "15s", "1m", "1h") or a bare number of seconds."""
    if isinstance(value, bool):
        raise ValueError(f"not a duration: {value!r}")
    if isinstance(value, int | float):
        seconds = float(value)
    else:
        text = str(value).strip()
        match = _DURATION_RE.match(text)
        if match:
            seconds = float(match.group(1)) * _UNIT_S[match.group(2)]
        else:
            try:
                seconds = float(text)
            except ValueError:
                raise ValueError(f"not a duration: {value!r} (use e.g. 500ms, 15s, 1m)") from None
    # inf would overflow the thread waits that use it (and nan compares false everywhere).
    if not 0 < seconds < math.inf:
        raise ValueError(f"duration must be positive and finite, got {value!r}")
    return seconds


def _parse_int(value: Any) -> int:
    if isinstance(value, bool):
        raise ValueError(f"not an integer: {value!r}")
    try:
        return int(str(value).strip())
    except ValueError:
        raise ValueError(f"not an integer: {value!r}") from None


KEYS: dict[str, tuple[str, Any]] = {
    "target": ("target", str),
    "web.listen-address": ("listen_address", str),
    "canary.enabled": ("canary_enabled", _parse_bool),
    "canary.interval": ("canary_interval_s", parse_duration),
    "canary.max-tokens": ("canary_max_tokens", _parse_int),
    "canary.prompt": ("canary_prompt", str),
    "canary.route": ("canary_route", str),
    "canary.model": ("canary_model", str),
    "canary.timeout": ("canary_timeout_s", parse_duration),
    "probe.timeout": ("probe_timeout_s", parse_duration),
    "probe.interval": ("probe_interval_s", parse_duration),
    "build-info.file": ("build_info_file", str),
}


def env_name(key: str) -> str:
    """`canary.max-tokens` -> `GLMSERVE_EXPORTER_CANARY_MAX_TOKENS`."""
    return ENV_PREFIX + re.sub(r"[.\-]", "_", key).upper()


def _apply(config: ExporterConfig, values: Mapping[str, Any], origin: str) -> ExporterConfig:
    changes: dict[str, Any] = {}
    for key, raw in values.items():
        if key not in KEYS:
            known = ", ".join(sorted(KEYS))
            raise ConfigError(f"{origin}: unknown setting {key!r} (known: {known})")
        field_name, parse = KEYS[key]
        try:
            changes[field_name] = parse(raw)
        except ValueError as exc:
            raise ConfigError(f"{origin}: {key}: {exc}") from None
    return replace(config, **changes)


def load_file(path: str | os.PathLike[str]) -> dict[str, Any]:
    try:
        raw = json.loads(Path(path).read_text())
    except FileNotFoundError:
        raise ConfigError(f"config file {path}: not found") from None
    except (OSError, UnicodeDecodeError) as exc:
        raise ConfigError(f"config file {path}: cannot read: {exc}") from None
    except json.JSONDecodeError as exc:
        raise ConfigError(
            f"config file {path}: invalid JSON at line {exc.lineno}: {exc.msg}"
        ) from None
    if not isinstance(raw, dict):
        raise ConfigError(f"config file {path}: expected a JSON object of settings")
    return raw


def from_env(environ: Mapping[str, str]) -> dict[str, str]:
    values = {key: environ[env_name(key)] for key in KEYS if env_name(key) in environ}
    # The build-info path has a project-wide variable that the launcher and compose also use.
    if "build-info.file" not in values and buildinfo.ENV_VAR in environ:
        values["build-info.file"] = environ[buildinfo.ENV_VAR]
    return values


def resolve(
    flags: Mapping[str, Any],
    environ: Mapping[str, str],
    config_file: str | None = None,
) -> ExporterConfig:
    """Merge the layers; `flags` holds only the flags the user actually gave."""
    config = ExporterConfig()
    if config_file:
        config = _apply(config, load_file(config_file), f"config file {config_file}")
    config = _apply(config, from_env(environ), "environment")
    config = _apply(config, flags, "flag")
    validate(config)
    return config


def listen_address_problem(address: str) -> str | None:
    """HOST:PORT as glmserve.netaddr words it, with port 0 allowed (a free port: the tests)."""
    from glmserve.netaddr import host_port_problem

    host, sep, port = address.rpartition(":")
    if sep and port == "0":
        address = f"{host}:1"
    return host_port_problem(address)


def validate(config: ExporterConfig) -> None:
    url = urlsplit(config.target)
    if url.scheme not in ("http", "https") or not url.hostname:
        raise ConfigError(f"target: expected http://HOST:PORT, got {config.target!r}")
    said = listen_address_problem(config.listen_address)
    if said:
        raise ConfigError(f"web.listen-address: {config.listen_address!r}: {said}")
    # TPOT divides by (tokens - 1): a one-token canary measures nothing but TTFT.
    if not 2 <= config.canary_max_tokens <= 4096:
        raise ConfigError(f"canary.max-tokens: must be 2..4096, got {config.canary_max_tokens}")
    if config.canary_route not in ("chat", "completions", "generate"):
        raise ConfigError(
            f"canary.route: must be chat, completions or generate, got {config.canary_route!r}"
        )
    if not config.canary_prompt:
        raise ConfigError("canary.prompt: must not be empty")
