"""The smoke test's checks on recorded results: each check passes on good data and catches the
fault it exists for."""

from __future__ import annotations

import copy

import pytest

from glmserve.smoke import probes as P
from glmserve.smoke.variants import select
from glmserve.smoke.verdict import agreement, evaluate, first_divergence, render_markdown

VARIANTS = select(patched_path=True)
PROBES = P.build(2000)


def _probe_result(probe: P.Probe, ids: list[int], answer: bool | None) -> dict:
    return {
        "probe": probe.id,
        "group": probe.group,
        "text": " ".join(map(str, ids)),
        "output_ids": ids,
        "prompt_tokens": max(probe.min_prompt_tokens, 10) + 5,
        "cached_tokens": 40 if probe.expect_cached else 0,
        "output_tokens": len(ids),
        "ttft_s": 0.02,
        "tpot_s": 0.003,
        "answered": answer,
    }


def good_results() -> dict:
    results = {}
    for v in VARIANTS:
        gather = {"0": "off"}.get(v.env.get("GLMSERVE_FP8_GATHER", ""), "on")
        results[v.name] = {
            "ready_s": 1.0,
            "build_info": {
                "fp8_gather": gather,
                "fp8_attention": v.env.get("GLMSERVE_FP8_ATTENTION", "native")
                if gather == "on"
                else "",
            },
            "server": {"kv_cache_dtype": v.kv_cache_dtype, "attention_backend": "flashinfer"},
            "probes": {p.id: _probe_result(p, [1, 2, 3, 4], True) for p in PROBES},
        }
    return results


def by_name(checks) -> dict:
    return {c.name: c for c in checks}


def test_good_results_pass_every_check():
    checks = evaluate(VARIANTS, PROBES, good_results())
    assert [c.name for c in checks] == [
        "served",
        "as asked",
        "prefix cache",
        "long prompt",
        "identical",
        "answers",
    ]
    assert all(c.ok for c in checks), checks


def test_a_variant_that_never_started_fails_served():
    results = good_results()
    results["fp8-native"] = {"error": "exited with 1 before ready; tail: CUDA error"}
    checks = by_name(evaluate(VARIANTS, PROBES, results))
    assert not checks["served"].ok and "fp8-native: exited with 1" in checks["served"].detail


def test_gather_that_differs_from_the_upstream_cast_fails_identical_and_says_where():
    results = good_results()
    results["fp8-gather"]["probes"]["long"]["output_ids"] = [1, 2, 9, 4]
    checks = by_name(evaluate(VARIANTS, PROBES, results))
    assert not checks["identical"].ok
    assert "fp8-gather vs fp8-upstream-cast, long: differs at token 2" in checks["identical"].detail


def test_native_may_differ_in_tokens_but_not_in_answers():
    results = good_results()
    results["fp8-native"]["probes"]["capital"]["output_ids"] = [1, 7, 7, 7]
    assert all(c.ok for c in evaluate(VARIANTS, PROBES, results))
    assert agreement(VARIANTS, PROBES, results)["fp8-native"]["capital"] == 1
    results["fp8-native"]["probes"]["long"]["answered"] = False  # garbled at long context
    checks = by_name(evaluate(VARIANTS, PROBES, results))
    assert not checks["answers"].ok and "fp8-native misses long" in checks["answers"].detail


def test_answers_only_count_where_the_reference_answers():
    results = good_results()
    for v in results.values():
        v["probes"]["sum"]["answered"] = False  # nobody knows: no fault of FP8
    results["bf16-kv"]["probes"]["gold"]["answered"] = False
    results["fp8-gather"]["probes"]["gold"]["answered"] = False
    assert by_name(evaluate(VARIANTS, PROBES, results))["answers"].ok


@pytest.mark.parametrize(
    ("mutate", "check", "fragment"),
    [
        (lambda r: r["fp8-gather"]["probes"]["prefix-b"].update(cached_tokens=0),
         "prefix cache", "fp8-gather/prefix-b: cached_tokens=0"),
        (lambda r: r["bf16-kv"]["probes"]["long"].update(prompt_tokens=900),
         "long prompt", "bf16-kv/long: 900 prompt tokens"),
        (lambda r: r["fp8-native"]["server"].update(kv_cache_dtype="bfloat16"),
         "as asked", "fp8-native asked for fp8_e4m3, the server runs bfloat16"),
        # The launcher fell back to gather after a failed native self-test.
        (lambda r: r["fp8-native"].update(build_info={"fp8_gather": "on", "fp8_attention": "gather"}),
         "as asked", "fp8-native asked for GLMSERVE_FP8_ATTENTION=native, the launcher recorded "
         "fp8_attention=gather"),
        (lambda r: r["fp8-gather"].update(build_info={"fp8_gather": "off"}),
         "as asked", "fp8-gather asked for GLMSERVE_FP8_GATHER=1, the launcher recorded fp8_gather=off"),
    ],
)  # fmt: skip
def test_each_check_catches_its_fault(mutate, check, fragment):
    results = good_results()
    mutate(results)
    checks = by_name(evaluate(VARIANTS, PROBES, results))
    assert not checks[check].ok and fragment in checks[check].detail
    assert all(c.ok for name, c in checks.items() if name != check)


def test_first_divergence():
    assert first_divergence([1, 2, 3], [1, 2, 3]) is None
    assert first_divergence([1, 2, 3], [1, 5, 3]) == 1
    assert first_divergence([1, 2], [1, 2, 3]) == 2


def test_the_report_leads_with_the_verdict():
    results = good_results()
    md = render_markdown(
        {"profile": "p"}, VARIANTS, PROBES, results, evaluate(VARIANTS, PROBES, results)
    )
    assert md.startswith("# Smoke test: PASS")
    bad = copy.deepcopy(results)
    bad["fp8-gather"]["probes"]["code"]["output_ids"] = [0]
    md = render_markdown({}, VARIANTS, PROBES, bad, evaluate(VARIANTS, PROBES, bad))
    assert md.startswith("# Smoke test: FAIL") and "| identical | **FAIL** |" in md
