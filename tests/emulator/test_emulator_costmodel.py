"""The decode cost MODEL reproduces the lab table it is built from (H200; the table is in
glmserve.emulator.costmodel)."""

from __future__ import annotations

import pytest

from glmserve.emulator.config import EmulatorConfig
from glmserve.emulator.costmodel import (
    ATTENTION_POINTS,
    DecodeCostModel,
    attention_us,
    gather_us,
    upstream_cast_us,
)

# (active tokens, upstream full cast, fused gather-cast, BF16 no cast): median us per layer
LAB = [
    (512, 842, 17.3, 14.4),
    (65_536, 902, 108.0, 76.2),
    (131_072, 909, 147.4, 83.9),
    (448_000, 1087, 478.2, 259.5),
]


@pytest.mark.parametrize(("tokens", "upstream", "patched", "bf16"), LAB)
def test_model_matches_lab_rows(tokens, upstream, patched, bf16):
    assert DecodeCostModel("bf16").per_layer_us(tokens) == pytest.approx(bf16, rel=1e-9)
    # upstream = 826 us cast + attention: every lab row within 1 %
    assert DecodeCostModel("upstream").per_layer_us(tokens) == pytest.approx(upstream, rel=0.01)
    # patched = bytes at 3.5 TB/s + launch + attention: within 3.5 % (the kernel beats 3.5 TB/s
    # slightly at mid sizes)
    assert DecodeCostModel("patched").per_layer_us(tokens) == pytest.approx(patched, rel=0.035)


def test_attention_interpolates_and_extrapolates():
    xs = [p[0] for p in ATTENTION_POINTS]
    assert attention_us(0) == attention_us(xs[0])  # launch-bound floor
    mid = (xs[1] + xs[2]) // 2
    assert attention_us(xs[1]) < attention_us(mid) < attention_us(xs[2])
    assert attention_us(900_000) > attention_us(448_000)


def test_upstream_cast_scales_with_pool_rows_not_active_tokens():
    assert upstream_cast_us(495_552) == pytest.approx(826.0)
    assert upstream_cast_us(247_776) == pytest.approx(413.0)
    small_pool = DecodeCostModel("upstream", pool_rows=100_000)
    assert small_pool.per_layer_us(512) < DecodeCostModel("upstream").per_layer_us(512)


def test_gather_is_bytes_over_bandwidth():
    # 448,000 rows x 576 x 3 B at 3.5 TB/s = 221 us (+ launch)
    assert gather_us(448_000) == pytest.approx(221.2 + 2.6, rel=0.01)


def test_off_adds_nothing_and_bad_mode_is_refused():
    assert DecodeCostModel("off").extra_step_s(10**6) == 0.0
    with pytest.raises(ValueError, match="cost model"):
        DecodeCostModel("fast")


def test_fp8_gather_flag_follows_the_model():
    assert EmulatorConfig(cost_model=DecodeCostModel("patched")).fp8_gather == "on"
    for mode in ("off", "upstream", "bf16"):
        assert EmulatorConfig(cost_model=DecodeCostModel(mode)).fp8_gather == "off"


def test_gather_bandwidth_is_a_knob():
    slow = DecodeCostModel("patched", gather_bytes_per_s=1.75e12)
    fast = DecodeCostModel("patched")
    # half the bandwidth doubles the byte term (the launch cost stays)
    assert slow.per_layer_us(448_000) - fast.per_layer_us(448_000) == pytest.approx(221.2, rel=0.01)
    with pytest.raises(ValueError, match="bandwidth"):
        DecodeCostModel("patched", gather_bytes_per_s=0)
