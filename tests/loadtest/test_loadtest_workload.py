"""Workloads: length distributions, JSONL datasets, multi-turn conversations."""

from __future__ import annotations

import random
import statistics
from pathlib import Path

import pytest

from glmserve.loadtest.options import LoadTestOptions, OptionsError
from glmserve.loadtest.workload import LengthDist, Workload, load_dataset
from glmserve.streaming import StreamRequest


@pytest.mark.parametrize(
    ("spec", "mean", "lo", "hi"),
    [("fixed:64", 64, 64, 64), ("uniform:10:30", 20, 10, 30), ("normal:200:20", 200, 100, 300),
     ("lognormal:100:0.5", 113, 1, 800)],
)  # fmt: skip
def test_lengths_follow_their_distribution_within_bounds(spec, mean, lo, hi) -> None:
    dist = LengthDist.parse(spec, "--input-dist")
    sample = [dist.sample(random.Random(i)) for i in range(3000)]
    assert lo <= min(sample) and max(sample) <= hi
    assert statistics.fmean(sample) == pytest.approx(mean, rel=0.05)
    assert all(isinstance(v, int) and v >= 1 for v in sample)


@pytest.mark.parametrize("spec", ["normal:100", "gauss:1:2", "uniform:9:3", "fixed:0", "fixed:x"])
def test_bad_length_spec_is_one_line_naming_the_flag(spec) -> None:
    with pytest.raises(OptionsError, match=f"--output-dist '{spec}'"):
        LengthDist.parse(spec, "--output-dist")


def test_dataset_lines_give_texts_or_lengths_and_output_lengths(tmp_path: Path) -> None:
    f = tmp_path / "d.jsonl"
    f.write_text('{"prompt": "hello there", "output_tokens": 7}\n\n{"input_tokens": 12}\n')
    entries = load_dataset(str(f))
    workload = Workload(LoadTestOptions(dataset=str(f), max_tokens=33), dataset=entries)
    seen = {}
    for i in range(40):
        req = workload.next_request(random.Random(i))
        seen[req.max_tokens] = req.text
    assert seen[7] == "hello there"
    assert len(seen[33].split()) == 12


@pytest.mark.parametrize(
    ("line", "message"),
    [("[1]", "must be a JSON object"), ('{"prompt": "a", "input_tokens": 3}', "exactly one"),
     ('{"input_tokens": 0}', "integer >= 1"), ('{"prompt": "a", "output_tokens": "9"}',
     '"output_tokens" must be'), ("{x", "not JSON")],
)  # fmt: skip
def test_bad_dataset_line_names_file_and_line(tmp_path: Path, line, message) -> None:
    f = tmp_path / "d.jsonl"
    f.write_text('{"prompt": "ok"}\n' + line + "\n")
    with pytest.raises(OptionsError, match=f"d.jsonl:2: .*{message}"):
        load_dataset(str(f))


def test_conversations_grow_turn_by_turn_and_end_after_the_last() -> None:
    w = Workload(LoadTestOptions(turns=3, input_dist="fixed:4", output_dist="fixed:5"))
    rng = random.Random(1)
    first = w.next_request(rng)
    assert first.turn == 1 and len(first.messages) == 1 and first.max_tokens == 5
    other = w.next_request(rng)  # the first is in flight: a new conversation starts
    assert other.conversation is not first.conversation
    w.finished(first, "answer one")
    second = w.next_request(rng)  # the conversation that waited longest goes on
    assert second.conversation is first.conversation and second.turn == 2
    assert [role for role, _ in second.messages] == ["user", "assistant", "user"]
    assert second.text.startswith(first.text + "\nanswer one\n")
    w.finished(second, "answer two")
    third = w.next_request(rng)
    assert third.turn == 3
    w.finished(third, "answer three")  # the last turn: the conversation ends
    fresh = w.next_request(rng)  # `other` is still in flight: nothing waits, a new one starts
    assert fresh.turn == 1 and fresh.conversation not in (first.conversation, other.conversation)
    w.finished(other, "answer")
    again = w.next_request(rng)
    assert again.conversation is other.conversation and again.turn == 2
    w.finished(again, None)  # a failed turn ends its conversation
    w.finished(fresh, None)
    assert w.next_request(rng).turn == 1


def test_chat_turns_go_out_as_messages() -> None:
    req = StreamRequest(messages=(("user", "a"), ("assistant", "b"), ("user", "c")))
    assert req.payload()["messages"] == [
        {"role": "user", "content": "a"}, {"role": "assistant", "content": "b"},
        {"role": "user", "content": "c"},
    ]  # fmt: skip
    with pytest.raises(ValueError, match="chat route"):
        StreamRequest(route="generate", messages=(("user", "a"),)).payload()
