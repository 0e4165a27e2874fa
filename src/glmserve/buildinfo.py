"""Build info: which SGLang, which patch series, whether its path runs, and the gather switch.

The launcher writes it inside the server container (the emulator writes one in the demo); the
exporter reads it from a volume shared read-only, because the patch marker lives inside the
SGLang package where no other container can see it.
"""

from __future__ import annotations

import json
import os
import tempfile
from pathlib import Path

DEFAULT_PATH = "/run/glmserve/build-info.json"
ENV_VAR = "GLMSERVE_BUILD_INFO"
# attention_backend: the decode backend the launcher asked SGLang for ("flashinfer" = the patched
# path; "nsa" = DSA, which the series does not touch; "" = unknown or left to SGLang).
# fp8_attention: the patched path's FP8 decode ("native" kernel or "gather"-then-cast; "" where
# the patch does not run); fp8_attention_requested: what the deployment asked ("native" or
# "gather" pinned, "auto" = the faster on this GPU); fp8_attention_why: one line on why that path
# runs; fp8_attention_timing: the self-test's timing of both paths as compact JSON ("" if none).
# patch_in_use: "yes" when decode runs a backend the line's series patches (flashinfer; fa3 too
# from SGLang 0.5.17), "no" when it does not (DSA), "" where unknown (an emulator, an old file).
# speculative_algorithm / speculative_num_draft_tokens: what the deployment asked of speculative
# decoding (MTP: "EAGLE" and the tokens one verify pass scores per request; "" = none asked), so
# the dashboard and the alerts know a profile wanted MTP even while the server says nothing.
FIELDS = (
    "sglang_version",
    "patch_series",
    "patch_lock_sha256",
    "fp8_gather",
    "fp8_attention",
    "fp8_attention_requested",
    "fp8_attention_why",
    "fp8_attention_timing",
    "attention_backend",
    "patch_in_use",
    "speculative_algorithm",
    "speculative_num_draft_tokens",
    "source",
)


def default_path() -> Path:
    return Path(os.environ.get(ENV_VAR, DEFAULT_PATH))


def write_build_info(path: str | os.PathLike[str], info: dict[str, str]) -> Path:
    """Write atomically (a reader never sees half a file). Unknown keys are refused."""
    unknown = set(info) - set(FIELDS)
    if unknown:
        raise ValueError(f"unknown build-info keys: {sorted(unknown)}")
    record = {key: _field_text(info.get(key, "")) for key in FIELDS}
    if record["fp8_gather"] not in ("on", "off", ""):
        raise ValueError(f"fp8_gather must be 'on' or 'off', not {record['fp8_gather']!r}")
    if record["fp8_attention"] not in ("native", "gather", ""):
        raise ValueError(
            f"fp8_attention must be 'native' or 'gather', not {record['fp8_attention']!r}"
        )
    if record["fp8_attention_requested"] not in ("native", "gather", "auto", ""):
        raise ValueError(
            "fp8_attention_requested must be 'native', 'gather' or 'auto', not "
            f"{record['fp8_attention_requested']!r}"
        )
    if record["patch_in_use"] not in ("yes", "no", ""):
        raise ValueError(f"patch_in_use must be 'yes' or 'no', not {record['patch_in_use']!r}")
    target = Path(path)
    _write_json(target, record)
    return target


def _field_text(value: object) -> str:
    """A field as the file holds it: text; a mapping (the timing) as compact JSON."""
    if isinstance(value, dict):
        return json.dumps(value, sort_keys=True, separators=(",", ":")) if value else ""
    return str(value)


def _write_json(target: Path, record: dict[str, str]) -> None:
    target.parent.mkdir(parents=True, exist_ok=True)
    fd, tmp = tempfile.mkstemp(dir=target.parent, prefix=f".{target.stem}.")
    # mkstemp creates 0600; the exporter reads this file as another user through a shared volume.
    os.fchmod(fd, 0o644)
    with os.fdopen(fd, "w") as fh:
        json.dump(record, fh, indent=2, sort_keys=True)
        fh.write("\n")
    os.replace(tmp, target)


# The launcher's refusal, when it holds instead of exiting (GLMSERVE_HOLD_ON_ERROR, compose):
# written beside the build info so the exporter, which sees that folder, can show it; removed
# by the next start that passes its checks.
LAUNCH_ERROR_NAME = "launch-error.json"


def launch_error_path(build_info_path: str | os.PathLike[str]) -> Path:
    return Path(build_info_path).with_name(LAUNCH_ERROR_NAME)


def write_launch_error(build_info_path: str | os.PathLike[str], message: str, at: float) -> Path:
    target = launch_error_path(build_info_path)
    _write_json(target, {"error": message, "time": f"{at:.0f}"})
    return target


def clear_launch_error(build_info_path: str | os.PathLike[str]) -> None:
    launch_error_path(build_info_path).unlink(missing_ok=True)


def read_launch_error(build_info_path: str | os.PathLike[str]) -> dict[str, str] | None:
    try:
        raw = json.loads(launch_error_path(build_info_path).read_text())
    except (FileNotFoundError, ValueError):
        return None
    if not isinstance(raw, dict) or not raw.get("error"):
        return None
    return {"error": str(raw["error"]), "time": str(raw.get("time", ""))}


def read_build_info(path: str | os.PathLike[str]) -> dict[str, str] | None:
    """The recorded fields, or None when there is no file yet (the server has not started)."""
    try:
        raw = json.loads(Path(path).read_text())
    except FileNotFoundError:
        return None
    if not isinstance(raw, dict):
        raise ValueError(f"{path}: build info is not a JSON object")
    return {key: str(raw.get(key, "")) for key in FIELDS}
