"""From per-variant probe results to pass/fail checks and a report (pure functions: tested on
recorded results, no server needed).

Checks, each over every variant that ran:
- served: the server came up and answered every probe;
- as asked: /server_info reports the KV dtype the variant asked for (a stale GLMSERVE_EXTRA_ARGS
  or profile cannot quietly turn an FP8 run into a BF16 one), and the launcher's build info the
  patch switches it asked for (a native self-test failure makes the launcher serve gather);
- prefix cache: the probes that reuse a prefix were served partly from the cache;
- long prompt: the server counted the long prompt at its intended length;
- identical: variants that claim bit-identity (the gather vs the upstream cast) gave the same
  tokens on every probe;
- answers: every expected answer the BF16 reference gives, each FP8 variant gives too.
Token agreement with the reference is reported, not judged: FP8 rounding may legitimately move
a greedy choice late in an output.
"""

from __future__ import annotations

import statistics
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any

from glmserve.smoke.probes import Probe
from glmserve.smoke.variants import REFERENCE, Variant
from glmserve.switches import FP8_ATTENTION, FP8_GATHER, GATHER_OFF, GATHER_ON

BF16_NAMES = ("bfloat16", "bf16")


@dataclass(frozen=True)
class Check:
    name: str
    ok: bool
    detail: str


def first_divergence(a: Sequence[Any], b: Sequence[Any]) -> int | None:
    """Index of the first differing token (or the shorter length), None when equal."""
    for i, (x, y) in enumerate(zip(a, b, strict=False)):
        if x != y:
            return i
    return None if len(a) == len(b) else min(len(a), len(b))


def _tokens(result: Mapping[str, Any]) -> Sequence[Any]:
    # Token ids where the route sends them, else the text's characters.
    return result.get("output_ids") or list(result.get("text") or "")


def _same_dtype(asked: str, served: str | None) -> bool:
    if served is None:
        return True  # nothing reported: nothing to contradict
    if asked in BF16_NAMES:
        return served in BF16_NAMES
    return served == asked


def evaluate(
    variants: Sequence[Variant],
    probes: Sequence[Probe],
    results: Mapping[str, Mapping[str, Any]],
) -> list[Check]:
    checks: list[Check] = []

    def per_variant(name: str, problems: list[str], ok_detail: str) -> None:
        checks.append(Check(name, not problems, "; ".join(problems) or ok_detail))

    served: list[str] = []
    for v in variants:
        r = results.get(v.name, {})
        if r.get("error"):
            served.append(f"{v.name}: {r['error'][:200]}")
            continue
        got = r.get("probes", {})
        failed = [p.id for p in probes if p.id not in got or got[p.id].get("error")]
        if failed:
            first = got.get(failed[0], {}).get("error", "not sent")
            served.append(f"{v.name}: {len(failed)} probe(s) failed ({failed[0]}: {first[:120]})")
    per_variant("served", served, f"{len(variants)} variant(s) x {len(probes)} probes")

    def ok_results(v: Variant) -> Mapping[str, Mapping[str, Any]]:
        r = results.get(v.name, {})
        if r.get("error"):
            return {}
        return {k: x for k, x in r.get("probes", {}).items() if not x.get("error")}

    asked = []
    for v in variants:
        r = results.get(v.name, {})
        served_dtype = (r.get("server") or {}).get("kv_cache_dtype")
        if not _same_dtype(v.kv_cache_dtype, served_dtype):
            asked.append(f"{v.name} asked for {v.kv_cache_dtype}, the server runs {served_dtype}")
        # The launcher's build info says which patch paths it really served (e.g. it falls back
        # to gather when the native self-test fails): a variant must have run what it names.
        build = r.get("build_info") or {}
        for env_key, field, value_of in (
            (FP8_GATHER.name, "fp8_gather", {GATHER_ON: "on", GATHER_OFF: "off"}.get),
            (FP8_ATTENTION.name, "fp8_attention", lambda x: x),
        ):
            want = value_of(v.env[env_key]) if env_key in v.env else None
            got = build.get(field)
            if want and got and want != got:
                asked.append(
                    f"{v.name} asked for {env_key}={v.env[env_key]}, the launcher recorded "
                    f"{field}={got} (see logs/{v.name}.log)"
                )
    per_variant(
        "as asked", asked, "every server runs the KV dtype and patch path its variant names"
    )

    cached = []
    for v in variants:
        got = ok_results(v)
        for p in probes:
            if p.expect_cached and p.id in got and not (got[p.id].get("cached_tokens") or 0) > 0:
                cached.append(f"{v.name}/{p.id}: cached_tokens={got[p.id].get('cached_tokens')}")
    per_variant("prefix cache", cached, "every shared-prefix probe was a cache hit")

    long_ = []
    for v in variants:
        got = ok_results(v)
        for p in probes:
            if p.min_prompt_tokens and p.id in got:
                n = got[p.id].get("prompt_tokens") or 0
                if n < p.min_prompt_tokens:
                    long_.append(f"{v.name}/{p.id}: {n} prompt tokens < {p.min_prompt_tokens}")
    per_variant("long prompt", long_, "the long prompt was served at full length")

    ident = []
    by_name = {v.name: v for v in variants}
    pairs = [(v, by_name[v.identical_to]) for v in variants if v.identical_to in by_name]
    for v, other in pairs:
        a, b = ok_results(v), ok_results(other)
        for p in probes:
            if p.id in a and p.id in b:
                at = first_divergence(_tokens(a[p.id]), _tokens(b[p.id]))
                if at is not None:
                    ident.append(f"{v.name} vs {other.name}, {p.id}: differs at token {at}")
    per_variant(
        "identical",
        ident,
        ", ".join(f"{v.name} == {o.name} on every probe" for v, o in pairs) or "no pair to compare",
    )

    answers = []
    ref = ok_results(by_name[REFERENCE]) if REFERENCE in by_name else {}
    expected = [p for p in probes if p.id in ref and ref[p.id].get("answered")]
    for v in variants:
        if v.name == REFERENCE:
            continue
        got = ok_results(v)
        missed = [p.id for p in expected if p.id in got and not got[p.id].get("answered")]
        if missed:
            answers.append(f"{v.name} misses {', '.join(missed)}")
    if expected:
        ok_detail = f"{len(expected)} answer(s) the reference gives, every variant gives"
    else:
        ok_detail = "the reference answered no probe (random weights?): nothing to compare"
    per_variant("answers", answers, ok_detail)
    return checks


def agreement(
    variants: Sequence[Variant],
    probes: Sequence[Probe],
    results: Mapping[str, Mapping[str, Any]],
) -> dict[str, dict[str, int | None]]:
    """variant -> probe -> first token where it leaves the reference (None = identical)."""
    ref = results.get(REFERENCE, {}).get("probes", {})
    out: dict[str, dict[str, int | None]] = {}
    for v in variants:
        if v.name == REFERENCE:
            continue
        got = results.get(v.name, {}).get("probes", {})
        out[v.name] = {
            p.id: first_divergence(_tokens(got[p.id]), _tokens(ref[p.id]))
            for p in probes
            if p.id in got and p.id in ref and not got[p.id].get("error")
            and not ref[p.id].get("error")
        }  # fmt: skip
    return out


def _ms(value: float | None) -> str:
    return "—" if value is None else f"{value * 1e3:.1f}"


def render_markdown(
    meta: Mapping[str, Any],
    variants: Sequence[Variant],
    probes: Sequence[Probe],
    results: Mapping[str, Mapping[str, Any]],
    checks: Sequence[Check],
) -> str:
    ok = all(c.ok for c in checks)
    lines = [
        f"# Smoke test: {'PASS' if ok else 'FAIL'}",
        "",
        f"{meta.get('date', '')}, profile `{meta.get('profile')}`, model `{meta.get('model_path')}`, "
        f"server `{meta.get('server')}`. Command: `{meta.get('command', '')}`",
        "",
        "| check | result | detail |",
        "|---|---|---|",
    ]
    lines += [f"| {c.name} | {'ok' if c.ok else '**FAIL**'} | {c.detail} |" for c in checks]
    lines += [
        "",
        "| variant | what | ready (s) | KV dtype / attention (server) | median TPOT short (ms) | TTFT long (ms) |",
        "|---|---|---|---|---|---|",
    ]
    for v in variants:
        r = results.get(v.name, {})
        got = r.get("probes", {})
        tpots = [x["tpot_s"] for x in got.values() if x.get("group") == "short" and x.get("tpot_s")]
        server = r.get("server") or {}
        ready = r.get("ready_s")
        lines.append(
            f"| {v.name} | {v.what} | {'—' if ready is None else f'{ready:.0f}'} | "
            f"{server.get('kv_cache_dtype', '?')} / {server.get('attention_backend', '?')} | "
            f"{_ms(statistics.median(tpots) if tpots else None)} | "
            f"{_ms(got.get('long', {}).get('ttft_s'))} |"
        )
    agree = agreement(variants, probes, results)
    if agree:
        names = list(agree)
        lines += [
            "",
            f"First token where each variant leaves the `{REFERENCE}` reference "
            "(= identical; reported, not judged):",
            "",
            "| probe | answer expected | " + " | ".join(names) + " |",
            "|---|---|" + "---|" * len(names),
        ]
        for p in probes:
            cells = []
            for n in names:
                at = agree[n].get(p.id, "—") if p.id in agree[n] else "—"
                got = results.get(n, {}).get("probes", {}).get(p.id, {})
                mark = {True: " ✓", False: " ✗"}.get(got.get("answered"), "")
                cells.append(("=" if at is None else f"≠ at {at}") + mark)
            ref = results.get(REFERENCE, {}).get("probes", {}).get(p.id, {})
            ref_mark = {True: " (ref ✓)", False: " (ref ✗)"}.get(ref.get("answered"), "")
            expect = ", ".join(p.expect_all) or "—"
            lines.append(f"| {p.id} | {expect}{ref_mark} | " + " | ".join(cells) + " |")
    lines += ["", "Outputs (first 120 characters):", ""]
    for p in probes:
        for v in variants:
            got = results.get(v.name, {}).get("probes", {}).get(p.id, {})
            text = (got.get("text") or got.get("error") or "").replace("\n", "\\n")[:120]
            lines.append(f"- `{p.id}` / `{v.name}`: {text}")
    return "\n".join(lines) + "\n"
