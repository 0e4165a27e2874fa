"""What the report records about the target: SGLang's /server_info, plus glmserve build info.

The pinned SGLang answers /server_info (and the deprecated /get_server_info) with its
server_args, the scheduler info (max_total_num_tokens = KV pool size in tokens),
internal_states (memory_usage.token_capacity, the same pool size) and "version"; which of those
fields glmserve reads, and how, is glmserve.sglang_api's to say.
The patch series is not in there: it comes from the glmserve build-info file, when this
process can read it (--build-info, or $GLMSERVE_BUILD_INFO). glmserve's emulator adds a
"glmserve_emulator" object (its configured timing), which the report keeps.

Through the fleet's router (smg, docs/fleet.md) the target answers GET /workers with the worker set
instead of a server info: the report then records the router and every worker, with each
worker's own server info (asked of the worker directly), and takes the top-level fields from
the first worker that answers, so a fleet's report reads like a single server's plus the set.
"""

from __future__ import annotations

import json
import os
import urllib.error
import urllib.request
from typing import Any

from glmserve import buildinfo, sglang_api

# A real server info is tens of kilobytes: a body past this is no server info, and an endless
# one must not hold the run's start (or its memory).
MAX_INFO_BYTES = 1 << 20
MAX_METRICS_BYTES = 16 << 20  # SGLang's /metrics, read only under speculative decoding


def _read_capped(response: Any, cap: int = MAX_INFO_BYTES) -> bytes:
    body = response.read(cap + 1)
    if len(body) > cap:
        raise ValueError(f"answer larger than {cap} bytes")
    return body


def fetch_server_info(base_url: str, timeout_s: float = 5.0) -> dict[str, Any]:
    """GET the server info; raises OSError/ValueError with a readable message."""
    last: Exception | None = None
    for path in sglang_api.SERVER_INFO_PATHS:
        try:
            with urllib.request.urlopen(base_url.rstrip("/") + path, timeout=timeout_s) as r:
                obj = json.loads(_read_capped(r))
        except urllib.error.HTTPError as exc:
            last = exc
            continue
        if not isinstance(obj, dict):
            raise ValueError(f"{path}: not a JSON object")
        return obj
    raise OSError(f"no server info ({last})")


def extract(info: dict[str, Any]) -> dict[str, Any]:
    """The fields a reader of a load-test report needs, from a raw server-info answer."""
    out: dict[str, Any] = {"sglang_version": sglang_api.info_version(info)}
    for key in sglang_api.SERVER_ARGS_READ:
        if key in info:
            out[key] = info[key]
    out["kv_pool_tokens"] = sglang_api.info_kv_pool_tokens(info)
    emulator = info.get("glmserve_emulator")
    if isinstance(emulator, dict):  # the target is glmserve's emulator, with its timing truth
        out["emulator"] = emulator
    return out


def runs_speculative(server: dict[str, Any] | None) -> bool:
    """Whether the recorded server info says the target runs speculative decoding (MTP)."""
    return bool((server or {}).get("speculative_algorithm"))


def fetch_spec_metrics(base_url: str, timeout_s: float = 5.0) -> dict[str, float] | None:
    """SGLang's acceptance gauges now (the last decode-log interval: 40 decode steps), as
    {"accept_length": ..., "accept_rate": ...}; None when /metrics cannot be read."""
    try:
        url = base_url.rstrip("/") + sglang_api.METRICS
        with urllib.request.urlopen(url, timeout=timeout_s) as r:
            text = _read_capped(r, MAX_METRICS_BYTES).decode("utf-8", "replace")
    except (OSError, ValueError):
        return None
    gauges = sglang_api.spec_gauges(text)
    names = {
        sglang_api.SPEC_ACCEPT_LENGTH: "accept_length",
        sglang_api.SPEC_ACCEPT_RATE: "accept_rate",
    }
    return {names[k]: v for k, v in gauges.items()}


def fetch_router_workers(base_url: str, timeout_s: float = 5.0) -> list[dict[str, Any]] | None:
    """The router's worker set (GET /workers of smg), or None if this is no router."""
    try:
        with urllib.request.urlopen(base_url.rstrip("/") + "/workers", timeout=timeout_s) as r:
            obj = json.loads(_read_capped(r))
    except (OSError, ValueError):
        return None
    workers = obj.get("workers") if isinstance(obj, dict) else None
    if not isinstance(workers, list):
        return None
    return [
        {"url": w.get("url"), "healthy": w.get("is_healthy"), "model": w.get("model_id")}
        for w in workers
        if isinstance(w, dict)
    ]


def gather_server_info(base_url: str, build_info_path: str | None) -> dict[str, Any]:
    """Best effort: a report is still written when the target does not answer."""
    result: dict[str, Any] = {"url": base_url}
    workers = fetch_router_workers(base_url)
    if workers is not None:
        result["router"] = {"workers": workers}
        for worker in workers:
            try:
                worker["server"] = extract(fetch_server_info(str(worker["url"])))
            except (OSError, ValueError) as exc:
                worker["error"] = str(exc)
        first = next((w["server"] for w in workers if "server" in w), None)
        if first is not None:
            result.update(first)
        else:
            result["error"] = "no worker behind the router answered its server info"
    else:
        try:
            result.update(extract(fetch_server_info(base_url)))
        except (OSError, ValueError) as exc:
            result["error"] = str(exc)
    path = build_info_path or os.environ.get(buildinfo.ENV_VAR)
    if path:
        try:
            local = buildinfo.read_build_info(path)
        except (OSError, ValueError) as exc:
            result["build_info_error"] = f"{path}: {exc}"
        else:
            if local is not None:
                result["build_info"] = local
    return result
