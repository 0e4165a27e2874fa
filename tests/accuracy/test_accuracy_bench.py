"""The accuracy bench without a GPU: its requests, bars and report, the miswired tree it builds
from the real patched SGLang, and its whole client flow against emulators."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import accuracy_bench as ab  # bench/accuracy (pytest's pythonpath)
import pytest
import recall_task as task

from glmserve.preflight.verify import preflight
from glmserve.series.detect import detect_version
from glmserve.series.errors import PatchError
from glmserve.series.lock import load_lock

REPO = Path(__file__).resolve().parents[2]
PINNED = "0.5.12.post1"


def test_request_body_is_sglangs_generate_with_greedy_top_k_logprobs() -> None:
    body = json.loads(ab.request_body("1,500,600", 77, logprobs=True))
    assert body["input_ids"] == [1, 500, 600, task.QUERY_ID, 77]
    assert body["sampling_params"] == {"temperature": 0.0, "max_new_tokens": 8, "ignore_eos": True}
    assert body["return_logprob"] is True and body["top_logprobs_num"] == ab.TOP_K
    assert "return_logprob" not in json.loads(ab.request_body("1", 77, logprobs=False))


def test_server_arguments_per_variant() -> None:
    args = ab.sglang_args(ab.VARIANTS["native-mtp"])
    assert args[:2] == ["--load-format", "auto"]  # after the profile's dummy: the last one wins
    assert args[args.index("--kv-cache-dtype") + 1] == "fp8_e4m3"
    assert args[args.index("--chunked-prefill-size") + 1] == str(ab.CHUNK)
    assert args[-8:] == ab.MTP_ARGS
    tri = ab.sglang_args(ab.VARIANTS["triton"])
    assert (
        tri[tri.index("--attention-backend") + 1] == "triton"
        and "--speculative-algorithm" not in tri
    )
    env = ab.server_env(ab.VARIANTS["upstream"], Path("/x.json"), None)
    assert (env["GLMSERVE_FP8_GATHER"], env["GLMSERVE_SKIP_SELFTEST"]) == ("0", "1")
    env = ab.server_env(ab.VARIANTS["miswired"], Path("/x.json"), Path("/mis"))
    assert env["PYTHONPATH"].split(":")[0] == "/mis"
    assert {v.heads for v in ab.VARIANTS.values()} == {8, 16}


def _res(acc: float, kl: float | None = None, accept: float | None = None, errors: int = 0) -> dict:
    r = {"queries": 100, "accuracy": acc, "errors": errors}
    if kl is not None:
        r["vs_reference"] = {"kl_mean": kl}
    if accept is not None:
        r["accept_length"] = accept
    return r


def test_bars() -> None:
    ctx = [2048, 8192]
    res = {
        "bf16": {"2048": _res(1.0), "8192": _res(0.97)},
        "upstream": {"2048": _res(0.99, 1e-3), "8192": _res(0.96, 2e-3)},
        "gather": {"2048": _res(0.99, 1e-3), "8192": _res(0.96, 2e-3)},
        "native": {"2048": _res(0.985, 1.2e-3), "8192": _res(0.97, 1e-3)},
        # the 8-head paths against the 8-head cast (larger KL than the 16-head one's)
        "upstream-8h": {"2048": _res(1.0, 5e-3)},
        "gather-8h": {"2048": _res(1.0, 5e-3)},
        "native-8h": {"2048": _res(1.0, 6e-3)},
        "bf16-mtp": {"2048": _res(1.0, accept=3.1), "8192": _res(0.97, accept=2.4)},
        "miswired": {"2048": _res(0.02), "8192": _res(0.6, errors=3)},
    }
    got = {b["bar"]: b["pass"] for b in ab.bars(res, ctx)}
    assert got["BF16 KV accuracy >= 0.95 at 8k"]
    assert got["gather accuracy within 1 point of BF16 KV at 2048"]
    assert not got["native accuracy within 1 point of BF16 KV at 2048"]  # 1.5 points down
    assert got["gather KL vs BF16 <= upstream's (+5 %) at 8192"]
    assert not got["native KL vs BF16 <= upstream's (+5 %) at 2048"]
    assert got["gather-8h KL vs BF16 <= upstream-8h's (+5 %) at 2048"]
    assert not got["native-8h KL vs BF16 <= upstream-8h's (+5 %) at 2048"]
    assert not got["MTP acceptance length >= 2.5 with BF16 KV (every context)"]
    assert got["miswired accuracy < 0.5 at 2048 (the check can fail)"]
    # a context with failed requests is not scored at all
    assert "miswired accuracy < 0.5 at 8192 (the check can fail)" not in got


NATIVE = "sglang/srt/layers/attention/fp8_mla_decode.py"


def test_the_miswired_tree_is_the_patched_one_plus_the_diff(patched_tree, tmp_path) -> None:
    site = patched_tree(PINNED)
    dest = ab.prepare_miswired_site(site, tmp_path / "mis")
    before = (site / NATIVE).read_text()
    after = (dest / NATIVE).read_text()
    slip = "k0 = _e4m3_to_f16(tl.load(row + D_BLK + cols, mask=mask"
    assert slip in after and slip not in before
    assert sum(a != b for a, b in zip(before.splitlines(), after.splitlines(), strict=True)) == 1
    assert detect_version(dest) == PINNED  # the launcher finds the same SGLang there
    # the copy's marker records the miswired bytes, as for a bug shipped in the series: the
    # launcher's preflight passes the tree, so only the answers can tell
    assert preflight(dest, import_gather=False) == []
    # every other file of the series is the patched tree's
    lock, _ = load_lock(REPO / "patches")
    for rel in lock["series"][PINNED]["files"]:
        if rel != NATIVE:
            assert (dest / rel).read_bytes() == (site / rel).read_bytes()
    # a diff that no longer fits the tree is refused, not fuzzed in
    stale = tmp_path / "stale.diff"
    stale.write_text(ab.MISWIRE_DIFF.read_text().replace("mask = (live & valid)", "mask = live", 1))
    with pytest.raises(PatchError):
        ab.prepare_miswired_site(site, tmp_path / "mis2", stale)


def test_the_preflight_already_refuses_a_native_decode_on_another_layers_pool(
    patched_tree, tmp_path
) -> None:
    """The first miswiring the bench tried: the launcher refused to start it (its wiring rule
    compares the pool the native kernel reads with the one upstream casts)."""
    site = patched_tree(PINNED)
    dest = ab.prepare_miswired_site(
        site, tmp_path / "mis", ab.HERE / "miswire-native-previous-layer.diff"
    )
    problems = preflight(dest, import_gather=False)
    assert len(problems) == 1 and "[native-decode]" in problems[0], problems
    assert "get_key_buffer(layer.layer_id - 1)" in problems[0]


@pytest.mark.slow
def test_the_whole_client_flow_against_emulators(tmp_path) -> None:
    pytest.importorskip("torch")
    import recall_model as rm

    model = tmp_path / "model"
    rm.write_checkpoint(rm.RecallModel(rm.Shape()), model)
    out = tmp_path / "out"
    proc = subprocess.run(
        [sys.executable, str(REPO / "bench" / "accuracy" / "accuracy_bench.py"), "--out", str(out),
         "--model", str(model), "--emulator", "--work", str(tmp_path / "work"),
         "--only", "bf16,native,native-8h,bf16-mtp", "--contexts", "2048,8192",
         "--haystacks", "1", "--queries", "5", "--ready-budget-s", "60"],
        capture_output=True, text=True, timeout=600,
    )  # fmt: skip
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-3000:]
    doc = json.loads((out / "accuracy.json").read_text())
    assert set(doc["results"]) == {"bf16", "native", "native-8h", "bf16-mtp"}
    for name, per in doc["results"].items():
        for ctx in ("2048", "8192"):
            r = per[ctx]
            assert r["queries"] == 5 and r["errors"] == 0, (name, ctx, r)
            # the first query prefills the haystack, the other four hit the radix cache
            assert 0.7 < r["cached_fraction"] < 0.85, r
    assert all("ready_s" in s for s in doc["servers"].values())
    # the 16-head servers ran the widened copy
    wide = json.loads((tmp_path / "work" / "recall-mla-16h" / "config.json").read_text())
    assert wide["num_attention_heads"] == 16
    assert "| native |" in (out / "accuracy.md").read_text()
