"""GPU inventory without torch: nvidia-smi output, masked by CUDA_VISIBLE_DEVICES as CUDA does."""

from __future__ import annotations

import pytest

from glmserve.launch import LaunchError
from glmserve.launch.inventory import apply_visible_devices, parse_nvidia_smi

SMI = """\
0, GPU-aaaa1111-0000-0000-0000-000000000000, NVIDIA RTX PRO 6000 Blackwell Workstation Edition, 12.0
1, GPU-bbbb2222-0000-0000-0000-000000000000, NVIDIA RTX PRO 6000 Blackwell Workstation Edition, 12.0
2, GPU-cccc3333-0000-0000-0000-000000000000, NVIDIA H200, 9.0
3, GPU-dddd4444-0000-0000-0000-000000000000, NVIDIA B200, 10.0
"""


def test_parse_nvidia_smi():
    gpus = parse_nvidia_smi(SMI)
    assert [g.index for g in gpus] == [0, 1, 2, 3]
    assert gpus[2].name == "NVIDIA H200" and gpus[2].capability == (9, 0)
    assert gpus[3].capability_str == "10.0" and gpus[0].uuid.startswith("GPU-aaaa")


def test_unparseable_nvidia_smi_is_one_line():
    with pytest.raises(LaunchError, match="cannot parse nvidia-smi output line"):
        parse_nvidia_smi("0, GPU-x, Some GPU, [N/A]\n")


@pytest.mark.parametrize(
    "mask, expected",
    [
        (None, [0, 1, 2, 3]),  # unset: everything
        ("", []),  # empty: nothing
        ("3,0", [3, 0]),  # order follows the mask
        ("1, 2", [1, 2]),  # spaces tolerated
        ("0,7,1", [0]),  # CUDA stops at the first unknown entry
        ("0,-1,1", [0]),  # -1 hides the rest
        ("0,0", [0]),  # a repeated device is counted once (enumeration stops there)
        ("GPU-cccc", [2]),  # UUID prefix
        ("GPU-", []),  # ambiguous prefix: stop
        ("MIG-abc", []),  # MIG handles: not resolvable here
    ],
)
def test_cuda_visible_devices(mask, expected):
    gpus = parse_nvidia_smi(SMI)
    assert [g.index for g in apply_visible_devices(gpus, mask)] == expected
