"""The built recall model on the CPU: the same bytes on every build, the margins its circuit
promises, and the torch reference's verdict on the weights SGLang loads (bf16, as written):
the task solved, every draft depth right, FP8-rounded rows harmless, a miswired attention lost."""

from __future__ import annotations

import pytest

torch = pytest.importorskip("torch")

import recall_build as rb  # noqa: E402  (bench/accuracy)
import recall_eval  # noqa: E402
import recall_model as rm  # noqa: E402
import recall_task as task  # noqa: E402


@pytest.fixture(scope="module")
def served(tmp_path_factory) -> rm.RecallModel:
    out = tmp_path_factory.mktemp("recall")
    rm.write_checkpoint(rb.build(31), out)
    return rm.read_checkpoint(out).eval()


def test_two_builds_write_the_same_bytes(tmp_path) -> None:
    a, b = tmp_path / "a.safetensors", tmp_path / "b.safetensors"
    rm.save_safetensors(a, rb.build(31).state())
    rm.save_safetensors(b, rb.build(31).state())
    assert a.read_bytes() == b.read_bytes()
    rm.save_safetensors(b, rb.build(32).state())
    assert a.read_bytes() != b.read_bytes()


def test_the_circuit_keeps_its_margins() -> None:
    m = rb.margins(31)
    # softmax logits between the wanted row and the best other one, at every distance to 64k
    assert m["previous_token_gap_logits"] >= 10, m
    assert m["induction_gap_logits"] >= 10 and m["readout_gap_logits"] >= 5, m
    assert rb.HIDDEN >= 1 + 3 * rb.CODE


def test_the_served_weights_solve_the_task_and_the_draft_head_predicts_it(served) -> None:
    r = recall_eval.evaluate(served, [1024], seed=5, haystacks=1, queries=16, device="cpu")["1024"]
    assert r["accuracy"] == 1.0 and r["draft1_token_accuracy"] == 1.0, r


def test_every_chained_draft_depth_predicts_the_next_answer_token(served) -> None:
    stacks, qs = task.bench_set(7, 512, 1, 4)
    ids = torch.tensor([stacks[0].prompt(q.key) + list(q.answer) for q in qs])
    n = len(stacks[0].ids) + 2
    with torch.no_grad():
        _, drafts = served(ids, chain=3, region=n)
    for depth, (logits, pos) in enumerate(drafts, start=1):
        # logits at j predict ids[j + 2]; answer tokens 2..8 (a chain of d steps starts d - 1
        # tokens into the answer, as EAGLE's does)
        j = torch.arange(max(n - 1, int(pos[0])), n + task.VALUE_LEN - 2)
        pred = logits[:, j - pos[0]].argmax(-1)
        assert len(j) >= task.VALUE_LEN - 2 and torch.equal(pred, ids[:, j + 2]), depth


def test_fp8_rounded_rows_give_the_same_answers(served) -> None:
    stacks, qs = task.bench_set(9, 1024, 1, 8)
    ids = torch.tensor([stacks[0].prompt(q.key) + list(q.answer) for q in qs])
    n = len(stacks[0].ids) + 2
    with torch.no_grad():
        bf16, _, _ = served.target(ids, fp8=False, logits_from=n - 1)
        fp8, _, _ = served.target(ids, fp8=True, logits_from=n - 1)
    want = torch.tensor([q.answer for q in qs])
    assert torch.equal(bf16[:, : task.VALUE_LEN].argmax(-1), want)
    assert torch.equal(fp8[:, : task.VALUE_LEN].argmax(-1), want)


@pytest.mark.parametrize("mode", ["previous_layer", "shifted_rows"])
def test_a_miswired_attention_loses(served, mode: str) -> None:
    r = recall_eval.evaluate(served, [1024], 5, 1, 16, "cpu", miswire=mode)["1024"]
    assert r["accuracy"] < 0.5, r
