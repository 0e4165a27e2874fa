"""The e2e harness's pure logic: plan, prompts, token comparison, histogram math, bars, report."""

from __future__ import annotations

import e2e_analysis as an  # bench/e2e (pytest's pythonpath)
import pytest


def test_plan_one_gpu_has_the_triple_and_the_deep_group_on_gpu0() -> None:
    specs = an.plan_servers(1)
    keys = [s.key for s in specs]
    assert keys[:3] == ["a8", "b8", "c8"]
    assert {"a78", "b78", "c78"} <= set(keys)
    assert not any(s.tp > 1 for s in specs)  # no TP=2 on one GPU
    assert all(s.gpus == "0" for s in specs)
    assert len({s.port for s in specs}) == len(specs)
    deep = [s for s in specs if s.layers == 78]
    assert all(s.cuda_graph_max_bs == 1 and not s.concurrency for s in deep)
    # The core triple is what the bars need: it must never be the first thing dropped.
    assert {s.priority for s in specs if s.layers == 8} == {0}


def test_plan_two_gpus_adds_tp2_pair_and_moves_deep_group() -> None:
    specs = an.plan_servers(2)
    tp2 = [s for s in specs if s.tp == 2]
    assert sorted(s.variant for s in tp2) == ["fp8_patched", "fp8_upstream"]
    assert all(s.gpus == "0,1" for s in tp2)
    assert all(s.gpus == "1" for s in specs if s.layers == 78)
    assert [s.key for s in an.plan_servers(2, tp2=False, deep_layers=0)] == ["a8", "b8", "c8"]


def test_variant_switches() -> None:
    by = {s.key: s for s in an.plan_servers(1)}
    assert (by["a8"].kv_cache_dtype, by["a8"].fp8_gather) == ("fp8_e4m3", "0")
    assert (by["b8"].kv_cache_dtype, by["b8"].fp8_gather) == ("fp8_e4m3", "1")
    assert by["c8"].kv_cache_dtype == "bf16"


def test_prompts_are_deterministic_varied_and_avoid_special_ids() -> None:
    p1 = an.make_prompts(8, 32000)
    assert p1 == an.make_prompts(8, 32000)
    assert p1 != an.make_prompts(8, 32000, seed=8)
    lengths = [len(p) for p in p1]
    assert lengths[0] == 16 and lengths[-1] == 1536 and lengths == sorted(lengths)
    assert all(100 <= t < 32000 for p in p1 for t in p)
    with pytest.raises(ValueError):
        an.make_prompts(0, 32000)


def test_compare_tokens_counts_identity_and_first_divergence() -> None:
    a = [[1, 2, 3, 4], [5, 6, 7], [8, 9]]
    b = [[1, 2, 3, 4], [5, 0, 7], [8, 9, 10]]
    ag = an.compare_tokens(a, b)
    assert ag.identical == 1
    assert ag.first_divergence == (None, 1, 2)
    # 4 + 2 + 2 matches of 4 + 3 + 3 positions: a missing token is a mismatch, not skipped
    assert ag.position_match == pytest.approx(8 / 10)
    with pytest.raises(ValueError):
        an.compare_tokens(a, b[:2])


SCRAPE = """# HELP sglang:inter_token_latency_seconds Histogram of inter-token latency in seconds.
# TYPE sglang:inter_token_latency_seconds histogram
sglang:inter_token_latency_seconds_bucket{le="0.002",model_name="m"} 120.0
sglang:inter_token_latency_seconds_bucket{le="+Inf",model_name="m"} 127.0
sglang:inter_token_latency_seconds_sum{model_name="m"} 0.1524
sglang:inter_token_latency_seconds_count{model_name="m"} 127.0
sglang:time_to_first_token_seconds_sum{model_name="m"} 9.0
sglang:time_to_first_token_seconds_count{model_name="m"} 3.0
"""


def test_scrape_and_histogram_mean_over_a_window() -> None:
    before = an.scrape_sum_count(SCRAPE, "sglang:inter_token_latency_seconds")
    assert before == (pytest.approx(0.1524), 127.0)
    after_text = SCRAPE.replace("0.1524", "0.3048").replace("_count{model_name=\"m\"} 127.0",
                                                             "_count{model_name=\"m\"} 254.0")  # fmt: skip
    after = an.scrape_sum_count(after_text, "sglang:inter_token_latency_seconds")
    assert an.histogram_mean(before, after) == pytest.approx(0.0012)
    assert an.histogram_mean(before, before) is None  # nothing happened in the window
    with pytest.raises(ValueError):
        an.scrape_sum_count(SCRAPE, "sglang:no_such_metric")


def _results(tpot_b: float, ids_b: list[list[int]]) -> dict[str, dict]:
    return {
        "a8": {"tpot_1": 7.5e-3, "tpot_8": 8.0e-3, "greedy_ids": [[1, 2], [3, 4]]},
        "b8": {"tpot_1": tpot_b, "tpot_8": 1.3e-3, "greedy_ids": ids_b,
               "tpot_1_mean": 1.0e-3, "canary_tpot": 1.03e-3, "server_itl_mean": 0.98e-3},
        "c8": {"tpot_1": 1.0e-3, "tpot_8": 1.25e-3, "greedy_ids": [[1, 2], [3, 9]]},
    }  # fmt: skip


def test_bars_pass_and_fail_on_the_numbers() -> None:
    specs = [s for s in an.plan_servers(1) if s.group == "tp1-8L"]
    bars = {b.name: b for b in an.evaluate_group(_results(1.02e-3, [[1, 2], [3, 4]]), specs)}
    assert bars["patched/BF16 TPOT, 1 stream"].passed is True
    assert bars["patched/BF16 TPOT, 8 streams"].value == pytest.approx(1.04)
    assert bars["patched/unpatched TPOT, 1 stream"].passed is True
    assert bars["(a) == (b) greedy tokens"].passed is True
    assert bars["b8: canary/client/server TPOT spread"].value == pytest.approx(0.03)

    assert not any(name.startswith("pool") for name in bars)  # no log facts: no pool bar

    bad_res = _results(1.2e-3, [[1, 2], [3, 5]])
    bad_res["c8"]["log"] = {"max_total_num_tokens": 400_000}
    bad_res["b8"]["log"] = {"max_total_num_tokens": an.MAX_TOTAL_TOKENS}
    bad = {b.name: b for b in an.evaluate_group(bad_res, specs)}
    assert bad[f"pool = {an.MAX_TOTAL_TOKENS} on every server"].passed is False
    assert bad[f"pool = {an.MAX_TOTAL_TOKENS} on every server"].value == "c8"
    assert bad["patched/BF16 TPOT, 1 stream"].passed is False
    assert bad["(a) == (b) greedy tokens"].passed is False
    assert bad["(a) == (b) greedy tokens"].value == "1/2 prompts"


def test_missing_server_gives_unmeasured_not_passed() -> None:
    specs = [s for s in an.plan_servers(1) if s.group == "tp1-8L"]
    res = _results(1.0e-3, [[1, 2], [3, 4]])
    res["c8"] = {"error": "did not start"}
    bars = {b.name: b for b in an.evaluate_group(res, specs)}
    assert bars["patched/BF16 TPOT, 1 stream"].passed is None
    res["a8"] = {}
    assert "(a) == (b) greedy tokens" not in {b.name for b in an.evaluate_group(res, specs)}


def test_markdown_report_shows_servers_bars_and_agreement() -> None:
    specs = [s for s in an.plan_servers(1) if s.group == "tp1-8L"]
    res = _results(1.02e-3, [[1, 2], [3, 4]])
    rep = an.Report(meta={"device": "1x NVIDIA H200", "date": "2026-11-29"}, servers=res)
    rep.groups = {"tp1-8L": [b.as_dict() for b in an.evaluate_group(res, specs)]}
    rep.agreement = {
        "x": an.compare_tokens(res["b8"]["greedy_ids"], res["c8"]["greedy_ids"]).as_dict()
    }
    md = an.render_markdown(rep, specs)
    assert "| b8 | (b) FP8 KV, patched | 8 |" in md
    assert "| 1.020 |" in md  # patched/BF16 single stream
    assert "| x | 1/2 | 0.750 | =, 1 |" in md


LOG = """\
glmserve.launch: self-test passed: 7 cases bit-identical to the full cast
[2026-11-29 18:40:01] max_total_num_tokens=495552, chunked_prefill_size=8192, max_prefill_tokens=16384
[2026-11-29 18:40:09] Capture cuda graph bs [1, 2, 4, 8]
[2026-11-29 18:41:00] Decode batch, #running-req: 1, #token: 150, token usage: 0.00, cuda graph: True, gen throughput (token/s): 812.33, #queue-req: 0
[2026-11-29 18:41:01] Decode batch, #running-req: 9, #token: 900, token usage: 0.00, cuda graph: False, gen throughput (token/s): 99.00, #queue-req: 0
[2026-11-29 18:41:02] Decode batch, #running-req: 8, #token: 800, token usage: 0.00, cuda graph: True, gen throughput (token/s): 5000.00, #queue-req: 0
"""


def test_log_facts_reads_pool_graphs_and_selftest() -> None:
    facts = an.log_facts(LOG)
    assert facts["max_total_num_tokens"] == 495552
    assert facts["capture_bs"] == [1, 2, 4, 8]
    assert (facts["decode_lines_graph"], facts["decode_lines_eager"]) == (2, 1)
    assert facts["selftest"].startswith("self-test passed")
    empty = an.log_facts("nothing here")
    assert empty["max_total_num_tokens"] is None and empty["selftest"] is None
