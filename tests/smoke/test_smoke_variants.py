"""The variant table: which variants run for which decode path, and bad selections."""

from __future__ import annotations

import pytest

from glmserve.smoke.variants import REFERENCE, VARIANTS, VariantError, select


def names(variants) -> list[str]:
    return [v.name for v in variants]


def test_the_patched_path_compares_bf16_the_upstream_cast_the_gather_and_native():
    assert names(select(patched_path=True)) == [
        REFERENCE,
        "fp8-upstream-cast",
        "fp8-gather",
        "fp8-native",
    ]


def test_dsa_runs_only_what_means_something_there():
    """No patch switch on the nsa path: BF16 against FP8 as shipped."""
    assert names(select(patched_path=False)) == [REFERENCE, "fp8"]


def test_every_variant_pins_its_kv_dtype_and_the_gather_claims_bit_identity():
    for v in VARIANTS:
        assert v.kv_cache_dtype in ("bfloat16", "fp8_e4m3"), v.name
    gather = next(v for v in VARIANTS if v.name == "fp8-gather")
    assert gather.identical_to == "fp8-upstream-cast"
    assert gather.env["GLMSERVE_FP8_ATTENTION"] == "gather"


def test_a_subset_keeps_the_reference():
    assert names(select(True, ["fp8-native"])) == [REFERENCE, "fp8-native"]


@pytest.mark.parametrize(
    ("patched", "wanted", "fragment"),
    [
        (True, ["fp8-nativ"], "unknown variant 'fp8-nativ'"),
        (False, ["fp8-gather"], "does not apply to this profile's other decode path"),
        (True, ["fp8-gather"], "compared with 'fp8-upstream-cast': run both"),
    ],
)
def test_bad_selections_are_refused_in_one_line(patched, wanted, fragment):
    with pytest.raises(VariantError) as err:
        select(patched, wanted)
    assert fragment in str(err.value) and "\n" not in str(err.value)
