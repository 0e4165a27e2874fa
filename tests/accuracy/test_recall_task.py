"""The recall task's pure logic: vocabulary and tokenizer, prompts, the scorer, top-k KL."""

from __future__ import annotations

import hashlib
import math
import random

import pytest
import recall_task as task  # bench/accuracy (pytest's pythonpath)


def test_vocabulary_ids_and_the_tokenizer_agree() -> None:
    vocab = task.tokens()
    assert len(vocab) == len(set(vocab)) == task.VOCAB_SIZE == 5190
    assert vocab[task.QUERY_ID] == "Q" and vocab[task.END_ID] == ";"
    assert vocab[task.KEY0] == "k0" and vocab[task.VALUE0] == "a0" and vocab[task.FILLER0] == "z0"
    assert vocab[task.value_id(7, 511)] == "h511"
    tj = task.tokenizer_json()
    assert tj["model"]["type"] == "WordLevel"
    assert tj["model"]["vocab"] == {tok: i for i, tok in enumerate(vocab)}
    assert [t["content"] for t in tj["added_tokens"]] == list(task.SPECIAL)
    assert task.slot_of(task.value_id(3, 5)) == 3
    assert task.slot_of(task.KEY0) is None and task.slot_of(task.FILLER0) is None


def test_a_prompt_round_trips_through_the_words() -> None:
    stack = task.haystack(random.Random(3), 200, 10)
    ids = stack.prompt(next(iter(stack.values)))
    assert task.encode(task.decode(ids)) == ids


def test_haystack_layout() -> None:
    stack = task.haystack(random.Random(5), 1000, 60)
    ids = stack.ids
    assert len(ids) == 1000 and ids[0] == task.BOS
    assert len(stack.values) == 60  # unique keys
    for i, tok in enumerate(ids):
        if tok in stack.values:
            assert tuple(ids[i + 1 : i + 1 + task.VALUE_LEN]) == stack.values[tok]
            slots = [task.slot_of(t) for t in stack.values[tok]]
            assert slots == list(range(task.VALUE_LEN))
    fillers = sum(task.FILLER0 <= t < task.VOCAB_SIZE for t in ids)
    assert fillers == 999 - 60 * (task.VALUE_LEN + 1)
    # every key and value token once: what follows an answer token's one occurrence is the next
    not_filler = [t for t in ids[1:] if t < task.FILLER0]
    assert len(not_filler) == len(set(not_filler)) == 60 * (task.VALUE_LEN + 1)
    with pytest.raises(ValueError, match="do not fit"):
        task.haystack(random.Random(0), 100_000, task.SYMBOLS + 1)  # a slot's symbols run out
    with pytest.raises(ValueError, match="do not fit"):
        task.haystack(random.Random(0), 100, 20)


def test_bench_sets_are_deterministic_and_pinned() -> None:
    a = task.bench_set(1, 2048, 2, 8)
    b = task.bench_set(1, 2048, 2, 8)
    assert a == b
    stacks, queries = a
    assert all(len(s.ids) == 2046 for s in stacks)  # + Q + key = 2,048
    assert len(queries) == 16 and len({(q.haystack, q.key) for q in queries}) == 16
    for q in queries:
        assert stacks[q.haystack].values[q.key] == q.answer
    assert task.records_for(2048) == 159 and task.records_for(32768) == task.MAX_RECORDS == 500
    # Results of different runs compare only if the prompts stay the same.
    digest = hashlib.sha256(repr(a).encode()).hexdigest()[:16]
    assert digest == PINNED_DIGEST, digest
    assert task.bench_set(2, 2048, 2, 8) != a


PINNED_DIGEST = "0f169f808712595b"


def test_score_is_exact_match_on_the_first_value_tokens() -> None:
    want = [(1, 2, 3), (4, 5, 6), (7, 8, 9)]
    s = task.score([[1, 2, 3, 99], [4, 0, 6], [7]], want)
    assert (s.queries, s.exact) == (3, 1)
    assert s.accuracy == pytest.approx(1 / 3)
    assert s.token_accuracy == pytest.approx((3 + 2 + 1) / 9)
    with pytest.raises(ValueError):
        task.score([[1]], want)


def _top(logps: list[float], k: int) -> list[tuple[float, int]]:
    order = sorted(range(len(logps)), key=lambda i: -logps[i])[:k]
    return [(logps[i], i) for i in order]


def _logsoftmax(x: list[float]) -> list[float]:
    m = max(x)
    z = m + math.log(sum(math.exp(v - m) for v in x))
    return [v - z for v in x]


def test_topk_kl_is_zero_for_equal_lists_and_a_lower_bound_of_the_full_kl() -> None:
    rng = random.Random(0)
    for _ in range(50):
        p = _logsoftmax([rng.gauss(0, 3) for _ in range(40)])
        q = _logsoftmax([v + rng.gauss(0, 0.5) for v in p])
        full = sum(math.exp(a) * (a - b) for a, b in zip(p, q, strict=True))
        kl = task.topk_kl(_top(p, 5), _top(q, 5))
        assert 0.0 <= kl <= full + 1e-9
        assert task.topk_kl(_top(p, 5), _top(p, 5)) == pytest.approx(0.0, abs=1e-12)
    # A confident disagreement is large.
    assert task.topk_kl([(-0.01, 1), (-5.0, 2)], [(-0.01, 2), (-5.0, 1)]) > 3.0


def test_agreement_stops_at_the_first_divergence() -> None:
    top = [[(-0.1, 5), (-3.0, 6)]] * 4
    ag = task.Agreement()
    chosen = [(-0.1, 5)] * 4
    ag.add([5, 5, 5, 5], [5, 6, 5, 5], top, top, chosen, chosen)
    assert (ag.outputs, ag.divergent, ag.positions) == (1, 1, 2)
    ag.add([5, 5], [5, 5], top, top, chosen, chosen)
    d = ag.as_dict()
    assert d["outputs"] == 2 and d["divergent_outputs"] == 1 and d["positions"] == 4
    assert d["kl_mean"] == pytest.approx(0.0) and d["abs_dlogprob_max"] == pytest.approx(0.0)


def test_sglang_logprob_fields_are_parsed() -> None:
    meta = {
        "output_token_logprobs": [[-0.5, 17, None], [-0.25, 18, None]],
        "output_top_logprobs": [[[-0.5, 17, None], [-1.5, 3, None]], None],
    }
    assert task.parse_token_logprobs(meta) == [(-0.5, 17), (-0.25, 18)]
    assert task.parse_top_logprobs(meta) == [[(-0.5, 17), (-1.5, 3)], []]
    assert task.parse_top_logprobs({}) == []
