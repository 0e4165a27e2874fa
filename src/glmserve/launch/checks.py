"""Checks that run before anything starts. Each one raises LaunchError with one line that says
what is wrong and what to do; none of them has side effects beyond probing a directory."""

from __future__ import annotations

import json
import tempfile
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any

from glmserve import switches
from glmserve.launch import speculative
from glmserve.launch.errors import LaunchError, read_json
from glmserve.launch.inventory import Gpu
from glmserve.launch.profiles import Profile, sglang_versions
from glmserve.launch.sglang_argv import ServerArgs, server_args
from glmserve.selftest.runner import CKV_DIM, KPE_DIM, MIN_E4M3_CAPABILITY, capability_note

ALLOW_ANY_ARCH_HINT = "--allow-any-arch (or GLMSERVE_ALLOW_ANY_ARCH=1)"


def check_gpus(
    profile: Profile, tp: int, gpus: Sequence[Gpu], allow_any_arch: bool, nnodes: int = 1
) -> None:
    if nnodes > 1:
        # SGLang puts tp/nnodes ranks on each node, on the first visible GPUs. More visible
        # GPUs than that is almost always a wrong --tp or --nnodes, not a wish to idle some.
        local = tp // nnodes
        if len(gpus) != local:
            raise LaunchError(
                f"TP {tp} over {nnodes} nodes runs {local} GPUs on each node, but {len(gpus)} "
                f"are visible here ({nnodes} x {len(gpus)} = {nnodes * len(gpus)} != TP {tp}); "
                "fix --tp or --nnodes, or expose exactly that many (CUDA_VISIBLE_DEVICES)"
            )
        tp = local
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
    """The ModelOpt quant_algo, found where the pinned SGLang looks for it.

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


def check_model(
    profile: Profile, model_dir: Path, args: ServerArgs | None = None
) -> dict[str, Any]:
    """The model dir holds what the profile's flags need; `args` is the SGLang argv as SGLang's
    parser reads it, for what the extra args add (MTP's NextN layer); default: the profile's
    own args, read by the stored parser of its line (the doctor's case, without SGLang)."""
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
            # The profile's note on the field says which checkpoints it is for, and what serves
            # the others (e.g. GLM-5.2's IndexShare layout against a GLM-5 DSA profile).
            why = profile.notes.get(f"model.expect.{key}")
            raise LaunchError(
                f"model in {model_dir} has {key}={config.get(key)!r}, but profile "
                f"'{profile.name}' needs {key}={value!r}" + (f" ({why})" if why else "")
            )
    if args is None:
        args = server_args(profile.args, sglang_versions(profile))
    speculative.check_draft_layer(config, model_dir, args, f"profile '{profile.name}'")
    return config


def check_patched_geometry(config: Mapping[str, Any], patched_path: bool) -> None:
    """The patched FP8 MLA path (its kernels and the start-up self-test) serves dense MLA whose
    latent row is kv_lora_rank 512 + qk_rope_head_dim 64, whatever the checkpoint: GLM-5, 5.1,
    5.2, DeepSeek-V3/R1 and Kimi-K2 share it. Another width would reach kernels never checked
    for it, so it is refused before anything starts."""
    if not patched_path:
        return
    got = (config.get("kv_lora_rank"), config.get("qk_rope_head_dim"))
    if got != (CKV_DIM, KPE_DIM):
        raise LaunchError(
            f"the patched FP8 MLA path is built for dense MLA with kv_lora_rank {CKV_DIM} + "
            f"qk_rope_head_dim {KPE_DIM}, but the model has {got[0]} + {got[1]}; run it on "
            "an attention backend the patch does not touch (e.g. --attention-backend triton)"
        )


def check_sglang(
    profile: Profile,
    site: Path | None,
    version: str | None,
    marker: Mapping[str, Any] | None,
    require_patch: bool = True,
) -> None:
    """The installed SGLang is the profile's, and (when its path runs the patched file) patched
    for that version. A profile whose attention backend the series does not touch (DSA) only
    needs the right version: a missing or stale marker is irrelevant to it."""
    if site is None or version is None:
        raise LaunchError("SGLang is not installed in this Python environment")
    wanted = sglang_versions(profile)
    if version not in wanted:
        raise LaunchError(
            f"installed SGLang is {version} (in {site}), but profile '{profile.name}' and the "
            f"patch series are for SGLang {' or '.join(wanted) or '(no line lists this profile)'}"
        )
    if not require_patch:
        return
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


def fp8_gather_unsupported(gpus: Sequence[Gpu]) -> str | None:
    """The one line saying the gather is off because a GPU lacks hardware e4m3, or None."""
    for gpu in gpus:
        if gpu.capability < MIN_E4M3_CAPABILITY:
            return f"FP8 KV gather off on GPU {gpu.index} ({gpu.name}): " + capability_note(
                *gpu.capability
            )
    return None


def fp8_gather_state(env: Mapping[str, str]) -> str:
    """'on' or 'off' for the build info, from the switch the patched SGLang reads."""
    try:
        return "on" if switches.fp8_gather_on(env) else "off"
    except switches.SwitchError as exc:
        raise LaunchError(str(exc)) from None


def fp8_attention_request(env: Mapping[str, str]) -> str:
    """What the deployment asks of the FP8 decode path: native or gather (pinned), or auto
    (unset or empty: the self-test times both on this GPU, the faster serves)."""
    try:
        return switches.fp8_attention_request(env)
    except switches.SwitchError as exc:
        raise LaunchError(str(exc)) from None


def choose_fp8_attention(
    request: str, native_verdict: str, timing: Mapping[str, Any]
) -> tuple[str, str]:
    """(path to serve, why) from the request and the self-test's native verdict and timing.

    A failed native check always means gather (just proven bit-identical); a pinned request is
    honoured otherwise; auto takes the path the self-test measured faster, and native where
    nothing was timed."""
    if native_verdict.startswith("failed"):
        return "gather", "native FP8 decode failed its self-test"
    if request in switches.FP8_PATHS:
        return request, f"pinned by {switches.FP8_ATTENTION.name}={request}"
    if timing.get("faster") in switches.FP8_PATHS:
        native_us, gather_us = sum(timing["native_us"]), sum(timing["gather_us"])
        return str(timing["faster"]), (
            f"faster on this GPU: native {native_us:.1f} µs vs gather {gather_us:.1f} µs per "
            f"layer over batches {timing['batches']} at {timing['heads']} heads"
        )
    if timing.get("error"):
        return "native", f"default (the paths could not be timed: {timing['error']})"
    return "native", "default (not timed)"


def decode_timing_env(args: ServerArgs, model_config: Mapping[str, Any], tp: int) -> dict[str, str]:
    """The self-test's timing shape: the model's heads per rank, the decode batches the server
    will run (1 and the largest captured CUDA-graph batch, 64 where the profile leaves it to
    SGLang) and, under MTP, the query tokens of a target verify pass
    (speculative.from_args(args).tokens_per_verify), which the native kernel serves too: the
    paths are then timed on decode and on verify, and the faster over both serves."""
    env = {}
    heads = model_config.get("num_attention_heads")
    if isinstance(heads, int) and heads > 0 and tp > 0:
        env.update(switches.SELFTEST_HEADS.setting([max(1, heads // tp)]))
    max_bs = args.get("--cuda-graph-max-bs")
    batches = [1, max_bs if isinstance(max_bs, int) and max_bs > 0 else 64]
    env.update(switches.SELFTEST_DECODE_BATCHES.setting(batches))
    spec = speculative.from_args(args)
    tokens = spec.tokens_per_verify if spec is not None else None
    if tokens and tokens > 1:
        env.update(switches.SELFTEST_VERIFY_TOKENS.setting([tokens]))
    return env


# Minimum Linux driver per CUDA major (NVIDIA's CUDA 13.0 / 12.x release notes, "CUDA Toolkit and
# Minimum Required Driver Version"). The pinned base image is cu130, so in practice: R580+.
MIN_DRIVER = {13: "580.65.06", 12: "525.60.13"}


def _version_tuple(text: str) -> tuple[int, ...]:
    parts = []
    for piece in text.strip().split("."):
        digits = "".join(ch for ch in piece if ch.isdigit())
        if not digits:
            break
        parts.append(int(digits))
    return tuple(parts)


def check_driver(driver: str | None, cuda: str | None) -> None:
    """Refuse a host driver older than the image's CUDA runtime needs. Unknown either way (no
    nvidia-smi, no CUDA in this environment): nothing to compare, the GPU check still runs."""
    if not driver or not cuda:
        return
    cuda_major = _version_tuple(cuda)[:1]
    needed = MIN_DRIVER.get(cuda_major[0]) if cuda_major else None
    have = _version_tuple(driver)
    if needed is None or not have or have >= _version_tuple(needed):
        return
    raise LaunchError(
        f"host NVIDIA driver {driver} is too old for this image's CUDA {cuda}: it needs "
        f"{needed} or newer (R{needed.split('.')[0]}+); upgrade the host driver (docs/deploy.md)"
    )


def cuda_graph_warning(args: ServerArgs) -> str | None:
    """One line when a running batch can outgrow the captured decode CUDA graphs.

    SGLang replays a graph only for batches up to --cuda-graph-max-bs; a larger batch decodes
    eagerly, several times slower (TPOT 6.9 -> 91 ms measured with 17 running vs 16 captured).
    The exporter's canary is one more running request, so N load streams + canary = N + 1.
    """
    if args.get("--disable-cuda-graph"):
        return None
    max_bs = args.get("--cuda-graph-max-bs")
    if max_bs is None:
        return None  # SGLang sizes both from the GPU: nothing the launcher can compare
    # With speculative decoding and no --max-running-requests SGLang caps the batch at 48;
    # the graphs count requests there too (each captured batch is scaled by the verify tokens).
    running = speculative.max_running_requests(args)
    if isinstance(running, int) and isinstance(max_bs, int) and running <= max_bs:
        return None
    if running is not None and not args.given("--max-running-requests"):
        allows = f"speculative decoding lets SGLang run {running} requests (its MTP default)"
    elif running is not None:
        allows = f"--max-running-requests {running} allows more"
    else:
        allows = "--max-running-requests is unset (SGLang sizes it from the KV pool)"
    return (
        f"decode CUDA graphs are captured up to batch {max_bs} but {allows}: a larger running "
        "batch (the exporter's canary counts as one request) decodes without graphs, several "
        f"times slower; set --max-running-requests {max_bs} to queue instead (docs/deploy.md)"
    )
