"""The server variants the smoke test compares: one row each, so a new decode path is one entry.

Every variant states its KV dtype explicitly (after any GLMSERVE_EXTRA_ARGS, so it wins): an
operator who already switched to the BF16 fallback in .env still gets real FP8 runs here.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field

from glmserve.switches import FP8_ATTENTION, FP8_GATHER, GATHER, GATHER_OFF, GATHER_ON, NATIVE

KV_FP8 = ("--kv-cache-dtype", "fp8_e4m3")
KV_BF16 = ("--kv-cache-dtype", "bfloat16")


@dataclass(frozen=True)
class Variant:
    name: str
    what: str
    # Extra environment for the server (the patch's switches) and extra SGLang args (after '--').
    env: Mapping[str, str] = field(default_factory=dict)
    args: tuple[str, ...] = ()
    # Which decode paths the variant means something on: "patched" = the flashinfer MLA backend
    # the series changes (RTX PRO 6000, the B200 dense A/B), "other" = DSA (nsa) and the rest.
    paths: tuple[str, ...] = ("patched", "other")
    # Must produce exactly the same tokens as that variant on every probe (a bit-identity claim).
    identical_to: str | None = None

    @property
    def kv_cache_dtype(self) -> str:
        return self.args[self.args.index("--kv-cache-dtype") + 1]


# The reference: BF16 KV is what the public recipes ran and the documented fallback. A probe
# whose expected answer the reference gives must get it from every other variant too.
REFERENCE = "bf16-kv"

VARIANTS: tuple[Variant, ...] = (
    Variant(
        REFERENCE, "BF16 KV cache: the documented fallback, and the answer reference", args=KV_BF16
    ),
    Variant(
        "fp8",
        "FP8 KV as the profile ships it (DSA reads the FP8 pool natively; no patch involved)",
        args=KV_FP8,
        paths=("other",),
    ),
    Variant(
        "fp8-upstream-cast",
        "FP8 KV, the series switched off: SGLang's own full-pool FP8->BF16 cast (slow, upstream)",
        env=FP8_GATHER.setting(GATHER_OFF),
        args=KV_FP8,
        paths=("patched",),
    ),
    Variant(
        "fp8-gather",
        "FP8 KV, the patch's gather-then-cast decode (bit-identical to the upstream cast)",
        env={**FP8_GATHER.setting(GATHER_ON), **FP8_ATTENTION.setting(GATHER)},
        args=KV_FP8,
        paths=("patched",),
        identical_to="fp8-upstream-cast",
    ),
    Variant(
        "fp8-native",
        "FP8 KV, the patch's native FP8 decode kernel (the series default; not bit-identical)",
        env={**FP8_GATHER.setting(GATHER_ON), **FP8_ATTENTION.setting(NATIVE)},
        args=KV_FP8,
        paths=("patched",),
    ),
)


class VariantError(ValueError):
    """Bad --variants input; the message is the one line shown."""


def select(patched_path: bool, names: Sequence[str] = ()) -> list[Variant]:
    """The variants to run, reference first. `names` narrows the table (the reference is always
    kept: every answer check is relative to it)."""
    path = "patched" if patched_path else "other"
    fitting = [v for v in VARIANTS if path in v.paths]
    if names:
        known = {v.name for v in VARIANTS}
        unknown = [n for n in names if n not in known]
        if unknown:
            raise VariantError(f"unknown variant {unknown[0]!r}; known: {', '.join(sorted(known))}")
        unfit = [n for n in names if n not in {v.name for v in fitting}]
        if unfit:
            raise VariantError(
                f"variant {unfit[0]!r} does not apply to this profile's {path} decode path; "
                f"these do: {', '.join(v.name for v in fitting)}"
            )
        fitting = [v for v in fitting if v.name in names or v.name == REFERENCE]
    by_name = {v.name: v for v in fitting}
    for v in fitting:
        if v.identical_to and v.identical_to not in by_name:
            raise VariantError(f"variant {v.name!r} is compared with {v.identical_to!r}: run both")
    return fitting
