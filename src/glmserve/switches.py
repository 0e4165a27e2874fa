"""The environment switches that more than one room reads or sets, each defined once: its name,
its values, its default and its parser. Everything in glmserve imports them from here.

Two of them are the patched SGLang's own (fp8_kv_gather.py, fp8_mla_decode.py in patches/),
which cannot import glmserve and keep a copy; tests/kernels/test_switches.py checks that the
copies agree. Stdlib only: the launcher and the preflight read these inside the SGLang image.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass


class SwitchError(ValueError):
    """A switch holds a value it does not take; the message is the one line to show."""


@dataclass(frozen=True)
class Choice:
    """A switch that takes one of a few words. Unset means `default`; `empty` is what a set but
    empty value means (None: empty is refused, like any other value not in `values`)."""

    name: str
    values: tuple[str, ...]
    default: str
    empty: str | None
    meaning: str  # what the values mean, for the refusal

    def read(self, env: Mapping[str, str]) -> str:
        raw = env.get(self.name)
        if raw is None:
            return self.default
        value = raw.strip().lower()
        if value == "" and self.empty is not None:
            return self.empty
        if value not in self.values:
            raise SwitchError(f"{self.name}={raw.strip()!r} must be {self.meaning}")
        return value

    def setting(self, value: str) -> dict[str, str]:
        """The environment entry that asks for `value` (for children and variants)."""
        if value not in self.values:
            raise ValueError(f"{self.name} takes {self.values}, not {value!r}")
        return {self.name: value}


@dataclass(frozen=True)
class PositiveInts:
    """A switch holding positive integers, comma-separated (`single`: exactly one)."""

    name: str
    default: tuple[int, ...]
    single: bool = False

    def read(self, env: Mapping[str, str]) -> tuple[int, ...]:
        raw = env.get(self.name)
        if raw is None:
            return self.default
        try:
            values = tuple(int(v) for v in raw.split(",") if v.strip())
        except ValueError:
            values = ()
        if not values or any(v <= 0 for v in values):
            raise SwitchError(
                f"{self.name} must be positive integers (comma-separated), got {raw!r}"
            )
        if self.single and len(values) != 1:
            raise SwitchError(f"{self.name} must be one positive integer, got {values}")
        return values

    def setting(self, values: tuple[int, ...] | list[int]) -> dict[str, str]:
        return {self.name: ",".join(str(v) for v in values)}


# --- the patched SGLang's switches (copies in patches/: fp8_kv_gather.py, fp8_mla_decode.py) ---
GATHER_ON, GATHER_OFF = "1", "0"
# The whole series on (gather-then-cast, native decode) or off (SGLang's own full-pool cast).
FP8_GATHER = Choice(
    "GLMSERVE_FP8_GATHER",
    values=(GATHER_ON, GATHER_OFF),
    default=GATHER_ON,
    empty=None,
    meaning="1 (gather, default) or 0 (upstream)",
)

NATIVE, GATHER, AUTO = "native", "gather", "auto"
FP8_PATHS = (NATIVE, GATHER)
# The decode path with the series on. Unset, empty or auto: the start-up self-test times both on
# this GPU and the launcher serves the faster; the patched module alone reads auto as native.
FP8_ATTENTION = Choice(
    "GLMSERVE_FP8_ATTENTION",
    values=(NATIVE, GATHER, AUTO),
    default=AUTO,
    empty=AUTO,
    meaning=(
        "native (the FP8 decode kernel), gather (gather-then-cast + FlashInfer), "
        "or empty/auto (the faster of the two on this GPU)"
    ),
)
PATCHED_MODULE_AUTO = NATIVE  # what fp8_mla_decode.decode_mode() serves for auto


def fp8_gather_on(env: Mapping[str, str]) -> bool:
    return FP8_GATHER.read(env) == GATHER_ON


def fp8_attention_request(env: Mapping[str, str]) -> str:
    """native or gather (pinned), or auto."""
    return FP8_ATTENTION.read(env)


def fp8_attention_path(env: Mapping[str, str]) -> str:
    """The decode path the patched backend takes when nothing chose for it: auto reads as
    native, exactly as the patched module does."""
    request = fp8_attention_request(env)
    return PATCHED_MODULE_AUTO if request == AUTO else request


# --- the self-test's timing shape (the launcher sets them from the model and the profile) ---
SELFTEST_HEADS = PositiveInts("GLMSERVE_SELFTEST_HEADS", default=(16,), single=True)
SELFTEST_DECODE_BATCHES = PositiveInts("GLMSERVE_SELFTEST_DECODE_BATCHES", default=(1, 16))
# Query tokens per request of a speculative (MTP) target verify pass; unset: no speculation.
SELFTEST_VERIFY_TOKENS = PositiveInts("GLMSERVE_SELFTEST_VERIFY_TOKENS", default=(), single=True)
