"""The fixed prompts every variant answers, and how one is sent (glmserve.streaming, /generate).

All greedy (temperature 0) so that two servers with the same numerics give the same tokens, and
sent one at a time so every variant runs them at the same batch size. /generate because it
returns the token ids (exact comparison, first divergent position) and meta_info.cached_tokens
(the prefix-cache check) without a chat template in the way.

- short: one-line questions with a checkable answer;
- prefix: a ~2,000-token shared context of numbered records, then two different questions
  (the second must be served from the prefix cache: on the patched path that is the paged
  extend, whose full-pool cast the series also removes), then the first question again;
- long: a needle in a haystack of `long_tokens` (default 12,000: past the 8,192-token chunked
  prefill of 96 GB cards and far past DSA's 2,048-token index_topk).

Expected answers are substrings (case-insensitive); a tiny random-weights model answers none,
which is fine: answer checks only count where the BF16 reference answers (verdict.py).
"""

from __future__ import annotations

import random
from dataclasses import asdict, dataclass
from typing import Any

from glmserve.streaming import StreamError, StreamRequest, time_stream

# Haystack sizing: the tiny model's whitespace WordLevel tokenizer is the least dense one here
# (~5 characters per token on these records); GLM-5's BPE and the emulator (4 bytes per token)
# count more tokens for the same text, so the prompt is at least `long_tokens` long everywhere.
CHARS_PER_TOKEN = 5


@dataclass(frozen=True)
class Probe:
    id: str
    group: str  # short | prefix | long
    prompt: str
    max_new_tokens: int = 32
    expect_all: tuple[str, ...] = ()  # every one must appear in the output (case-insensitive)
    expect_cached: bool = False  # the prefix cache must serve part of this prompt
    min_prompt_tokens: int = 0  # the server must count at least this many prompt tokens

    def answered(self, text: str) -> bool | None:
        """None when there is nothing to check."""
        if not self.expect_all:
            return None
        low = text.lower()
        return all(e.lower() in low for e in self.expect_all)


SHORT = (
    Probe("capital", "short", "Question: What is the capital of France?\nAnswer:", expect_all=("Paris",)),
    Probe("sum", "short", "Question: What is 17 + 25? Answer with the number.\nAnswer:", expect_all=("42",)),
    Probe("gold", "short", "Question: What is the chemical symbol of gold?\nAnswer:", expect_all=("Au",)),
    Probe(
        "primes",
        "short",
        "The first five prime numbers, separated by commas: 2, 3,",
        expect_all=("5", "7", "11"),
    ),
    Probe("french", "short", "English: Thank you very much.\nFrench:", expect_all=("merci",)),
    Probe(
        "code",
        "short",
        'def add(a, b):\n    """Return the sum of a and b."""\n',
        expect_all=("return",),
    ),
)  # fmt: skip

_CITIES = ("Lisbon", "Oslo", "Kyoto", "Quito", "Dakar", "Perth", "Tunis", "Lima", "Riga", "Hanoi")
_THINGS = ("copper pipe", "glass jar", "oak chest", "brass lamp", "clay pot", "steel box")
_COLOURS = ("red", "blue", "green", "amber", "violet", "white", "black", "grey")


def records(count: int, seed: int) -> list[str]:
    """Numbered, varied, checkable lines: record i has one number only it holds."""
    rng = random.Random(seed)
    lines = []
    for i in range(1, count + 1):
        lines.append(
            f"Record {i}: the {rng.choice(_COLOURS)} {rng.choice(_THINGS)} stored in "
            f"{rng.choice(_CITIES)} has inventory number {rng.randrange(10_000, 99_999)}."
        )
    return lines


def _number(line: str) -> str:
    return line.rsplit(" ", 1)[1].rstrip(".")


def prefix_probes() -> tuple[Probe, ...]:
    lines = records(120, seed=5)  # ~2,000 tokens
    context = "Inventory ledger.\n" + "\n".join(lines) + "\n\n"
    ask = "Question: What is the inventory number of record {k}? Answer with the number.\nAnswer:"
    a, b = 17, 93
    return (
        Probe("prefix-a", "prefix", context + ask.format(k=a), expect_all=(_number(lines[a - 1]),)),
        Probe(
            "prefix-b",
            "prefix",
            context + ask.format(k=b),
            expect_all=(_number(lines[b - 1]),),
            expect_cached=True,
        ),
        Probe(
            "prefix-a-again",
            "prefix",
            context + ask.format(k=a),
            expect_all=(_number(lines[a - 1]),),
            expect_cached=True,
        ),
    )


def long_probe(long_tokens: int) -> Probe:
    """A haystack of about `long_tokens` tokens with one passphrase in its middle."""
    # ~17 tokens per record line; the ledger is then cut to size by characters.
    lines = records(max(4, long_tokens // 10), seed=11)
    budget = long_tokens * CHARS_PER_TOKEN
    kept: list[str] = []
    size = 0
    for line in lines:
        if size + len(line) + 1 > budget:
            break
        kept.append(line)
        size += len(line) + 1
    needle = "Note: the vault passphrase is amber-falcon-6182."
    kept.insert(len(kept) // 2, needle)
    prompt = (
        "Inventory ledger.\n"
        + "\n".join(kept)
        + "\n\nQuestion: What is the vault passphrase given in the note? Answer with the "
        "passphrase.\nAnswer:"
    )
    return Probe(
        "long",
        "long",
        prompt,
        expect_all=("amber", "falcon", "6182"),
        # The server's own count must show the prompt really was long (80%: tokenizers differ).
        min_prompt_tokens=int(long_tokens * 0.8),
    )


def build(long_tokens: int) -> tuple[Probe, ...]:
    return (*SHORT, *prefix_probes(), long_probe(long_tokens))


def run(url: str, probe: Probe, client: Any, timeout_s: float) -> dict[str, Any]:
    """Send one probe; the result is plain data (JSON-able) for the report."""
    req = StreamRequest(
        route="generate",
        prompt=probe.prompt,
        max_tokens=probe.max_new_tokens,
        ignore_eos=False,  # natural answers: the expected strings come early
        temperature=0.0,
    )
    out: dict[str, Any] = {"probe": probe.id, "group": probe.group}
    try:
        t = time_stream(url, req, client=client, timeout_s=timeout_s, keep_content=True)
    except StreamError as exc:
        out["error"] = str(exc)[:300]
        return out
    out.update(
        text=t.text,
        output_ids=list(t.output_ids),
        prompt_tokens=t.prompt_tokens,
        cached_tokens=t.cached_tokens,
        output_tokens=t.output_tokens,
        ttft_s=t.ttft_s,
        tpot_s=t.tpot_s,
        answered=probe.answered(t.text),
    )
    return out


def describe(probes: tuple[Probe, ...]) -> list[dict[str, Any]]:
    """The probe set for the report, prompts shortened."""
    rows = []
    for p in probes:
        row = asdict(p)
        row["prompt_chars"] = len(p.prompt)
        row["prompt"] = (
            p.prompt if len(p.prompt) <= 200 else p.prompt[:80] + " ... " + p.prompt[-100:]
        )
        rows.append(row)
    return rows
