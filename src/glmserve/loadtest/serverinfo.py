"""What the report records about the target: SGLang's /get_server_info, plus glmserve build info.

SGLang 0.5.12.post1 answers /server_info (and the deprecated /get_server_info) with its
server_args, the scheduler info (max_total_num_tokens = KV pool size in tokens),
internal_states (memory_usage.token_capacity, the same pool size) and "version".
The patch series is not in there: it comes from the glmserve build-info file, when this
process can read it (--build-info, or $GLMSERVE_BUILD_INFO). glmserve's emulator adds a
"glmserve_emulator" object (its configured timing), which the report keeps.
"""

from __future__ import annotations

import json
import os
import urllib.error
import urllib.request
from typing import Any

from glmserve import buildinfo

PATHS = ("/server_info", "/get_server_info")
KEEP = (
    "model_path",
    "served_model_name",
    "kv_cache_dtype",
    "attention_backend",
    "tp_size",
    "dp_size",
    "quantization",
    "max_running_requests",
    "context_length",
    "page_size",
    "chunked_prefill_size",
    "disable_cuda_graph",
)


def fetch_server_info(base_url: str, timeout_s: float = 5.0) -> dict[str, Any]:
    """GET the server info; raises OSError/ValueError with a readable message."""
    last: Exception | None = None
    for path in PATHS:
        try:
            with urllib.request.urlopen(base_url.rstrip("/") + path, timeout=timeout_s) as r:
                obj = json.loads(r.read())
        except urllib.error.HTTPError as exc:
            last = exc
            continue
        if not isinstance(obj, dict):
            raise ValueError(f"{path}: not a JSON object")
        return obj
    raise OSError(f"no server info ({last})")


def extract(info: dict[str, Any]) -> dict[str, Any]:
    """The fields a reader of a load-test report needs, from a raw server-info answer."""
    out: dict[str, Any] = {"sglang_version": info.get("version")}
    for key in KEEP:
        if key in info:
            out[key] = info[key]
    pool = info.get("max_total_num_tokens")
    if pool is None:
        states = info.get("internal_states") or []
        if states and isinstance(states[0], dict):
            pool = (states[0].get("memory_usage") or {}).get("token_capacity")
    out["kv_pool_tokens"] = pool
    emulator = info.get("glmserve_emulator")
    if isinstance(emulator, dict):  # the target is glmserve's emulator, with its timing truth
        out["emulator"] = emulator
    return out


def gather_server_info(base_url: str, build_info_path: str | None) -> dict[str, Any]:
    """Best effort: a report is still written when the target does not answer."""
    result: dict[str, Any] = {"url": base_url}
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
