"""What GPUs this process can see, and what compute capability they have.

torch is asked first because it applies CUDA_VISIBLE_DEVICES exactly as SGLang will. Without torch
(a slim image, or a host check) nvidia-smi is asked instead; it ignores CUDA_VISIBLE_DEVICES, so the
mask is applied here with CUDA's own rules.
"""

from __future__ import annotations

import shutil
import subprocess
from collections.abc import Mapping
from dataclasses import dataclass

from glmserve.launch.errors import LaunchError

NVIDIA_SMI_QUERY = [
    "--query-gpu=index,uuid,name,compute_cap,memory.total",
    "--format=csv,noheader,nounits",
]


@dataclass(frozen=True)
class Gpu:
    index: int
    name: str
    capability: tuple[int, int]
    uuid: str = ""
    memory_mib: int | None = None  # total memory; None when the source does not say

    @property
    def capability_str(self) -> str:
        return f"{self.capability[0]}.{self.capability[1]}"


def detect_gpus(environ: Mapping[str, str]) -> list[Gpu]:
    """The GPUs visible to a child started with this environment, in CUDA order."""
    try:
        import torch
    except ImportError:
        return _from_nvidia_smi(environ)
    # torch reads CUDA_VISIBLE_DEVICES from the real process environment, which is the one the
    # exec'd server inherits too (the launcher never changes that variable).
    if not torch.cuda.is_available():
        return []
    return [
        Gpu(
            index=i,
            name=torch.cuda.get_device_name(i),
            capability=tuple(torch.cuda.get_device_capability(i)),  # type: ignore[arg-type]
            memory_mib=torch.cuda.get_device_properties(i).total_memory // 2**20,
        )
        for i in range(torch.cuda.device_count())
    ]


def _from_nvidia_smi(environ: Mapping[str, str]) -> list[Gpu]:
    exe = shutil.which("nvidia-smi")
    if exe is None:
        raise LaunchError(
            "cannot count GPUs: torch is not importable and nvidia-smi is not on PATH"
        )
    try:
        out = subprocess.run(
            [exe, *NVIDIA_SMI_QUERY], capture_output=True, text=True, timeout=30, check=True
        ).stdout
    except (subprocess.SubprocessError, OSError) as exc:
        raise LaunchError(f"cannot count GPUs: nvidia-smi failed ({exc})") from None
    return apply_visible_devices(parse_nvidia_smi(out), environ.get("CUDA_VISIBLE_DEVICES"))


def parse_nvidia_smi(text: str) -> list[Gpu]:
    """Parse `nvidia-smi --query-gpu=index,uuid,name,compute_cap[,memory.total] --format=csv,
    noheader,nounits`. A name may itself hold commas; memory (MiB) is the one integer field after
    the capability, which always has a dot."""
    gpus = []
    for line in text.splitlines():
        if not line.strip():
            continue
        parts = [p.strip() for p in line.split(",")]
        memory = None
        if len(parts) >= 5 and parts[-1].isdigit():
            memory = int(parts.pop())
        if len(parts) < 4:
            raise LaunchError(f"cannot parse nvidia-smi output line: {line!r}")
        index, uuid, cap = parts[0], parts[1], parts[-1]
        name = ", ".join(parts[2:-1])
        try:
            major, minor = (int(x) for x in cap.split("."))
            gpus.append(
                Gpu(
                    index=int(index),
                    name=name,
                    capability=(major, minor),
                    uuid=uuid,
                    memory_mib=memory,
                )
            )
        except ValueError:
            raise LaunchError(f"cannot parse nvidia-smi output line: {line!r}") from None
    return gpus


def apply_visible_devices(gpus: list[Gpu], mask: str | None) -> list[Gpu]:
    """Apply CUDA_VISIBLE_DEVICES the way the CUDA runtime does.

    Unset means all devices; an empty string means none. Entries are indices or (prefixes of)
    GPU UUIDs; enumeration stops at the first entry that names no device, as CUDA's does.
    """
    if mask is None:
        return list(gpus)
    visible: list[Gpu] = []
    for token in (t.strip() for t in mask.split(",")):
        match = _lookup(gpus, token)
        if match is None or match in visible:
            break
        visible.append(match)
    return visible


def _lookup(gpus: list[Gpu], token: str) -> Gpu | None:
    if not token:
        return None
    if token.lstrip("-").isdigit():
        index = int(token)
        return next((g for g in gpus if g.index == index), None)
    if token.startswith("GPU-"):
        hits = [g for g in gpus if g.uuid.startswith(token)]
        return hits[0] if len(hits) == 1 else None
    # MIG-... and anything else: not resolvable to a capability here, so stop like CUDA would on
    # an unknown entry rather than guess.
    return None


def driver_version() -> str | None:
    """The host's NVIDIA driver version from nvidia-smi, or None when it cannot be asked.

    Asked before torch: with a driver too old for the image's CUDA, torch just reports no GPUs,
    which would read as a GPU-count problem instead of the driver problem it is.
    """
    exe = shutil.which("nvidia-smi")
    if exe is None:
        return None
    try:
        out = subprocess.run(
            [exe, "--query-gpu=driver_version", "--format=csv,noheader"],
            capture_output=True,
            text=True,
            timeout=30,
            check=True,
        ).stdout
    except (subprocess.SubprocessError, OSError):
        return None
    lines = [ln.strip() for ln in out.splitlines() if ln.strip()]
    return lines[0] if lines else None


def cuda_runtime_version(environ: Mapping[str, str]) -> str | None:
    """The CUDA runtime SGLang will run on: torch's build, else the image's CUDA_VERSION
    (NVIDIA's base images set it), else unknown."""
    try:
        import torch
    except ImportError:
        return environ.get("CUDA_VERSION") or None
    return getattr(torch.version, "cuda", None) or environ.get("CUDA_VERSION") or None
