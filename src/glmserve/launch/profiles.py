"""Launch profiles: data files (JSON) that say which SGLang flags and env vars a deployment uses.

A profile is data, not code, so that the flags can be diffed, reviewed and checked against the
pinned SGLang's own argument parser (tests/launch/test_launch_server_args.py) without running
anything. JSON rather than TOML because the launcher runs inside the SGLang image, whose Python
may be 3.10 (no tomllib), and must stay stdlib-only.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Any

from glmserve import sglang_lines
from glmserve.launch.errors import LaunchError, read_json

if TYPE_CHECKING:
    from glmserve.launch.sglang_argv import ServerArgs

SCHEMA_VERSION = 1
PROFILES_DIR_ENV = "GLMSERVE_PROFILES_DIR"

# Flags the launcher sets itself from its own inputs (validated there: TP against the GPU count,
# the model dir against the profile). A profile or an extra arg that set them would bypass that.
LAUNCHER_OWNED_FLAGS = (
    "--model-path",
    "--model",
    "--tp-size",
    "--tensor-parallel-size",
    "--tp",
    "--host",
    "--port",
    # Multi-node TP: validated against the profile's node count and the visible GPUs.
    "--nnodes",
    "--node-rank",
    "--dist-init-addr",
    "--nccl-init-addr",
)

# With no explicit list a profile is for Blackwell only: SM100 (B200/B300) or SM120 (RTX PRO 6000).
DEFAULT_CAPABILITY_MAJORS = (10, 12)

_TOP_KEYS = {
    "schema",
    "name",
    "description",
    "sglang_version",
    "tp",
    "nodes",
    "gpu_memory_gib",
    "compute_capability_majors",
    "model",
    "args",
    "env",
    "notes",
}
_MODEL_KEYS = {"architectures", "quant_algo", "expect", "default_path"}


@dataclass(frozen=True)
class ModelSpec:
    """What the model dir must hold for this profile's flags to make sense."""

    architectures: tuple[str, ...]
    # "NVFP4" = a ModelOpt NVFP4 checkpoint is required; None = an unquantized model is required.
    quant_algo: str | None
    # config.json fields that must have exactly these values (e.g. the MLA widths the KV pool uses).
    expect: dict[str, Any] = field(default_factory=dict)
    # Relative paths resolve against the profile file, so deploy/ can be copied as a whole.
    default_path: Path | None = None


@dataclass(frozen=True)
class Profile:
    name: str
    path: Path
    description: str
    sglang_version: str | None  # None: the SGLang lines that list this profile
    tp: int
    capability_majors: tuple[int, ...]
    model: ModelSpec
    args: tuple[str, ...]
    env: dict[str, str]
    notes: dict[str, str]
    # How many nodes one server spans (SGLang's --nnodes); TP is split evenly over them.
    nodes: int = 1
    # Usable memory of one target GPU: with it the launcher checks that the model fits with KV
    # headroom (glmserve.launch.fit), from this nominal value when GPUs are not probed.
    gpu_memory_gib: float | None = None


def candidate_dirs(environ: Mapping[str, str], explicit: str | None) -> list[Path]:
    """Where profiles are looked for, first match wins."""
    if explicit:
        return [Path(explicit)]
    if environ.get(PROFILES_DIR_ENV):
        return [Path(environ[PROFILES_DIR_ENV])]
    # A source checkout or an editable install: src/glmserve/launch/ -> <repo>/deploy/profiles.
    here = Path(__file__).resolve()
    return [here.parents[3] / "deploy" / "profiles"]


def find_profiles_dir(environ: Mapping[str, str], explicit: str | None) -> Path:
    for candidate in candidate_dirs(environ, explicit):
        if candidate.is_dir():
            return candidate
    looked = ", ".join(str(p) for p in candidate_dirs(environ, explicit))
    raise LaunchError(
        f"no profiles directory found (looked in: {looked}); "
        f"set {PROFILES_DIR_ENV} or --profiles-dir to the folder holding the *.json profiles"
    )


def available(profiles_dir: Path) -> list[str]:
    return sorted(p.stem for p in profiles_dir.glob("*.json"))


def load_profile(profiles_dir: Path, name: str) -> Profile:
    names = available(profiles_dir)
    if name not in names:
        listing = ", ".join(names) if names else "(none)"
        raise LaunchError(f"unknown profile '{name}'; available: {listing} (in {profiles_dir})")
    return parse_profile_file(profiles_dir / f"{name}.json")


def parse_profile_file(path: Path) -> Profile:
    return _parse(read_json(path, "profile file"), path)


def _fail(path: Path, what: str) -> LaunchError:
    return LaunchError(f"malformed profile {path}: {what}")


def _str_list(value: Any) -> bool:
    return isinstance(value, list) and all(isinstance(v, str) for v in value)


def _parse(raw: Any, path: Path) -> Profile:
    if not isinstance(raw, dict):
        raise _fail(path, "the top level must be a JSON object")
    unknown = set(raw) - _TOP_KEYS
    if unknown:
        raise _fail(path, f"unknown keys {sorted(unknown)} (typo?)")
    missing = {"schema", "name", "tp", "model", "args"} - set(raw)
    if missing:
        raise _fail(path, f"missing keys {sorted(missing)}")
    if raw["schema"] != SCHEMA_VERSION:
        raise _fail(path, f"'schema' must be {SCHEMA_VERSION}, not {raw['schema']!r}")
    if raw["name"] != path.stem:
        raise _fail(path, f"'name' is {raw['name']!r} but the file is named {path.stem!r}")
    # Optional: the shipped profiles leave it out and the lines that list them decide
    # (glmserve.sglang_lines); a profile of one's own may pin its SGLang here.
    pinned = raw.get("sglang_version")
    if pinned is not None and (not isinstance(pinned, str) or not pinned):
        raise _fail(path, "'sglang_version' must be a non-empty string")
    tp = raw["tp"]
    if not isinstance(tp, int) or isinstance(tp, bool) or tp < 1:
        raise _fail(path, f"'tp' must be a positive integer, not {tp!r}")

    nodes = raw.get("nodes", 1)
    if not isinstance(nodes, int) or isinstance(nodes, bool) or nodes < 1:
        raise _fail(path, f"'nodes' must be a positive integer, not {nodes!r}")
    if tp % nodes:
        raise _fail(path, f"'tp' {tp} does not split evenly over {nodes} nodes")
    memory = raw.get("gpu_memory_gib")
    if memory is not None and (
        not isinstance(memory, (int, float)) or isinstance(memory, bool) or memory <= 0
    ):
        raise _fail(path, f"'gpu_memory_gib' must be a positive number, not {memory!r}")

    majors = raw.get("compute_capability_majors", list(DEFAULT_CAPABILITY_MAJORS))
    if (
        not isinstance(majors, list)
        or not majors
        or not all(isinstance(m, int) and not isinstance(m, bool) for m in majors)
    ):
        raise _fail(path, "'compute_capability_majors' must be a non-empty list of integers")

    args = raw["args"]
    if not _str_list(args):
        raise _fail(
            path, "'args' must be a list of strings (one argv entry each, never one string)"
        )
    for arg in args:
        flag = arg.split("=", 1)[0]
        if flag in LAUNCHER_OWNED_FLAGS:
            raise _fail(path, f"'args' sets {flag}, which the launcher owns (use its own input)")

    env = raw.get("env", {})
    if not isinstance(env, dict) or not all(
        isinstance(k, str) and isinstance(v, str) for k, v in env.items()
    ):
        raise _fail(path, "'env' must be an object of string to string")

    notes = raw.get("notes", {})
    if not isinstance(notes, dict) or not all(isinstance(v, str) for v in notes.values()):
        raise _fail(path, "'notes' must be an object of string to string")
    # Every flag and env var says why it is there: a profile without reasons rots into cargo cult.
    undocumented = [a for a in args if a.startswith("--") and a not in notes]
    undocumented += [k for k in env if k not in notes]
    if undocumented:
        raise _fail(path, f"no entry in 'notes' for {undocumented}")

    model = _parse_model(raw["model"], path)
    description = raw.get("description", "")
    if not isinstance(description, str):
        raise _fail(path, "'description' must be a string")
    return Profile(
        name=raw["name"],
        path=path,
        description=description,
        sglang_version=pinned,
        tp=tp,
        capability_majors=tuple(majors),
        model=model,
        args=tuple(args),
        env=dict(env),
        notes=dict(notes),
        nodes=nodes,
        gpu_memory_gib=None if memory is None else float(memory),
    )


def _parse_model(raw: Any, path: Path) -> ModelSpec:
    if not isinstance(raw, dict):
        raise _fail(path, "'model' must be an object")
    unknown = set(raw) - _MODEL_KEYS
    if unknown:
        raise _fail(path, f"unknown keys in 'model': {sorted(unknown)}")
    archs = raw.get("architectures")
    if not _str_list(archs) or not archs:
        raise _fail(path, "'model.architectures' must be a non-empty list of strings")
    quant = raw.get("quant_algo")
    if quant is not None and not isinstance(quant, str):
        raise _fail(path, "'model.quant_algo' must be a string or null")
    expect = raw.get("expect", {})
    if not isinstance(expect, dict):
        raise _fail(path, "'model.expect' must be an object")
    default = raw.get("default_path")
    if default is not None and not isinstance(default, str):
        raise _fail(path, "'model.default_path' must be a string or null")
    default_path = None
    if default:
        default_path = Path(default)
        if not default_path.is_absolute():
            default_path = (path.parent / default_path).resolve()
    return ModelSpec(
        architectures=tuple(archs),
        quant_algo=quant,
        expect=dict(expect),
        default_path=default_path,
    )


def decode_attention_backend(args: ServerArgs) -> str:
    """The decode attention backend an argv asks for, as SGLang's parser reads it ("" = left
    to SGLang, which picks nsa for GLM-5 and fa3/trtllm_mla for other MLA models: never the
    patched flashinfer path)."""
    return args.get("--decode-attention-backend") or args.get("--attention-backend") or ""


def uses_patched_path(args: ServerArgs, sglang_versions: Sequence[str] = ()) -> bool:
    """True when decode runs an MLA backend the patch series of one of these SGLang lines
    changes: flashinfer on every line, and from 0.5.17 on also fa3 (glmserve.sglang_lines). DSA
    (nsa/dsa) and every other backend read the KV pool through code the series does not touch.
    It decides whether the patch and the preflight are required, so it reads the argv as SGLang
    does: `--attention-back fa3` after `--attention-backend flashinfer` is fa3."""
    patched = {b for v in sglang_versions for b in sglang_lines.patched_backends(v)}
    return decode_attention_backend(args) in (patched or {"flashinfer"})  # every series: flashinfer


def sglang_versions(profile: Profile) -> tuple[str, ...]:
    """The SGLang versions this profile is written for: its own pin, else every line in
    glmserve.sglang_lines that lists it."""
    if profile.sglang_version:
        return (profile.sglang_version,)
    return tuple(line.version for line in sglang_lines.lines_for_profile(profile.name))
