"""Checks that run before anything starts. Each one raises LaunchError with one line that says
what is wrong and what to do; none of them has side effects beyond probing a directory."""

from __future__ import annotations

import json
import tempfile
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any

from glmserve.launch.errors import LaunchError, read_json
from glmserve.launch.inventory import Gpu
from glmserve.launch.profiles import Profile

ALLOW_ANY_ARCH_HINT = "--allow-any-arch (or GLMSERVE_ALLOW_ANY_ARCH=1)"


def check_gpus(profile: Profile, tp: int, gpus: Sequence[Gpu], allow_any_arch: bool) -> None:
    if len(gpus) < tp:
        found = ", ".join(f"{g.index}:{g.name}" for g in gpus) or "none"
        raise LaunchError(
            f"TP {tp} needs {tp} visible GPUs but {len(gpus)} are visible ({found}); "
            "lower --tp or expose more GPUs (CUDA_VISIBLE_DEVICES, compose device reservation)"
        )
    if allow_any_arch:
        return
    wanted = " or ".join(f"{m}.x" for m in profile.capability_majors)
    for gpu in gpus[:tp]:
        if gpu.capability[0] not in profile.capability_majors:
            raise LaunchError(
                f"GPU {gpu.index} ({gpu.name}) has compute capability {gpu.capability_str}, "
                f"but profile '{profile.name}' is built for {wanted}; "
                f"override with {ALLOW_ANY_ARCH_HINT} only if you know the kernels exist for it"
            )


def read_model_config(model_dir: Path) -> dict[str, Any]:
    if not model_dir.exists():
        raise LaunchError(f"model dir {model_dir} does not exist (is the volume mounted?)")
    if not model_dir.is_dir():
        raise LaunchError(f"model path {model_dir} is not a directory")
    config_path = model_dir / "config.json"
    if not config_path.is_file():
        raise LaunchError(
            f"model dir {model_dir} has no config.json (not a Hugging Face model dir)"
        )
    config = read_json(config_path, "model config")
    if not isinstance(config, dict):
        raise LaunchError(f"{config_path} is not a JSON object")
    return config


def detect_quant_algo(model_dir: Path, config: Mapping[str, Any]) -> str | None:
    """The ModelOpt quant_algo, found where SGLang 0.5.12.post1 looks for it.

    SGLang (configs/model_config.py, _parse_quant_hf_config) reads config.json's
    quantization_config when its quant_method is absent or "modelopt", and otherwise falls back to
    a standalone hf_quant_config.json ({"quantization": {"quant_algo": ...}}).
    """
    quant_cfg = config.get("quantization_config")
    if isinstance(quant_cfg, dict):
        if quant_cfg.get("quant_method", "modelopt") == "modelopt":
            algo = quant_cfg.get("quant_algo")
            return str(algo) if algo else None
        return f"{quant_cfg.get('quant_method')}"
    side = model_dir / "hf_quant_config.json"
    if side.is_file():
        try:
            raw = json.loads(side.read_text(encoding="utf-8"))
        except (json.JSONDecodeError, OSError):
            raise LaunchError(f"{side} is not readable JSON") from None
        algo = (raw.get("quantization") or {}).get("quant_algo") if isinstance(raw, dict) else None
        return str(algo) if algo else None
    return None


def check_model(profile: Profile, model_dir: Path) -> dict[str, Any]:
    config = read_model_config(model_dir)
    archs = config.get("architectures") or []
    arch = archs[0] if isinstance(archs, list) and archs else None
    if arch not in profile.model.architectures:
        raise LaunchError(
            f"model in {model_dir} is {arch or 'of unknown architecture'}, but profile "
            f"'{profile.name}' is for {', '.join(profile.model.architectures)}"
        )
    algo = detect_quant_algo(model_dir, config)
    wanted = profile.model.quant_algo
    if wanted is None and algo is not None:
        raise LaunchError(
            f"model in {model_dir} is quantized ({algo}) but profile '{profile.name}' expects an "
            "unquantized model"
        )
    if wanted is not None and (algo is None or algo.upper() != wanted.upper()):
        raise LaunchError(
            f"model in {model_dir} has quant_algo {algo or 'none'} (config.json "
            f"quantization_config / hf_quant_config.json), but profile '{profile.name}' needs {wanted}"
        )
    for key, value in profile.model.expect.items():
        if config.get(key) != value:
            raise LaunchError(
                f"model in {model_dir} has {key}={config.get(key)!r}, but profile "
                f"'{profile.name}' needs {key}={value!r}"
            )
    return config


def check_sglang(
    profile: Profile,
    site: Path | None,
    version: str | None,
    marker: Mapping[str, Any] | None,
) -> None:
    if site is None or version is None:
        raise LaunchError("SGLang is not installed in this Python environment")
    if version != profile.sglang_version:
        raise LaunchError(
            f"installed SGLang is {version} (in {site}), but profile '{profile.name}' and the "
            f"patch series are for SGLang {profile.sglang_version}"
        )
    if marker is None:
        raise LaunchError(
            f"SGLang {version} in {site} is not patched (no sglang/.glmserve-patch.json); "
            f"run: python3 patches/apply.py --target {site}"
        )
    marked = marker.get("sglang_version")
    if marked != version:
        raise LaunchError(
            f"the patch marker in {site} was written for SGLang {marked}, but {version} is "
            "installed (reinstalled after patching?); re-apply the series"
        )
    if not marker.get("series"):
        raise LaunchError(f"the patch marker in {site} names no series; re-apply the series")


def flashinfer_cache_dir(env: Mapping[str, str]) -> Path:
    """Where FlashInfer 0.6.11 keeps its JIT cache.

    flashinfer/jit/env.py: FLASHINFER_BASE_DIR = $FLASHINFER_WORKSPACE_BASE or the home dir, and
    the cache is <base>/.cache/flashinfer (compiled ops under <version>/<archs>/cached_ops).
    """
    base = env.get("FLASHINFER_WORKSPACE_BASE") or env.get("HOME") or str(Path.home())
    return Path(base) / ".cache" / "flashinfer"


def check_writable_dir(path: Path, what: str) -> None:
    """Create the dir if needed and prove a file can be written there (os.access lies on
    read-only bind mounts and some network filesystems)."""
    try:
        path.mkdir(parents=True, exist_ok=True)
        with tempfile.NamedTemporaryFile(dir=path, prefix=".glmserve-probe-"):
            pass
    except OSError as exc:
        raise LaunchError(f"{what} {path} is not writable ({exc.strerror or exc})") from None


def check_build_info_target(path: Path) -> None:
    check_writable_dir(path.parent, "build-info directory")


def parse_bool(name: str, value: str | None) -> bool:
    if value is None:
        return False
    lowered = value.strip().lower()
    if lowered in ("1", "true", "yes", "on"):
        return True
    if lowered in ("", "0", "false", "no", "off"):
        return False
    raise LaunchError(f"{name}={value!r} is not a boolean (use 1 or 0)")


def fp8_gather_state(env: Mapping[str, str]) -> str:
    """'on' or 'off' for the build info, from the switch the patched SGLang reads."""
    raw = env.get("GLMSERVE_FP8_GATHER", "1").strip()
    if raw not in ("0", "1"):
        raise LaunchError(
            f"GLMSERVE_FP8_GATHER={raw!r} must be 1 (gather, default) or 0 (upstream)"
        )
    return "on" if raw == "1" else "off"
