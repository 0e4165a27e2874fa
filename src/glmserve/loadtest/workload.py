"""Workloads: prompt and output lengths from a distribution or a JSONL dataset, and multi-turn
conversations whose every turn carries the conversation so far (no Locust).

A conversation is what a chat or an agent does to the server's radix cache: turn k's prompt is
turns 1..k-1 (questions and answers) plus a new question, so all but the new part can be served
from the cache. The report shows how much was (the server's own cached-token counts).
"""

from __future__ import annotations

import collections
import itertools
import json
import math
import random
from dataclasses import dataclass, field
from pathlib import Path

from glmserve.loadtest.options import LoadTestOptions, OptionsError
from glmserve.loadtest.prompts import synthetic_text

DISTRIBUTIONS = ("fixed", "uniform", "normal", "lognormal")
# Lengths are clipped here: a normal or lognormal tail must not ask for a million tokens.
MAX_LENGTH_FACTOR = 8


@dataclass(frozen=True)
class LengthDist:
    """A length distribution, sampled as a whole number >= 1 (and <= 8x its centre).

    fixed:N; uniform:LO:HI (inclusive); normal:MEAN:SD; lognormal:MEDIAN:SIGMA (the median
    length and the sigma of its logarithm: long-tailed like real prompts and answers).
    """

    kind: str
    a: float
    b: float = 0.0

    @classmethod
    def parse(cls, spec: str, flag: str) -> LengthDist:
        kind, _, rest = spec.partition(":")
        params = rest.split(":") if rest else []
        want = {"fixed": 1, "uniform": 2, "normal": 2, "lognormal": 2}.get(kind)
        usage = (
            f"{flag} {spec!r}: use fixed:N, uniform:LO:HI, normal:MEAN:SD or lognormal:MEDIAN:SIGMA"
        )
        if want is None or len(params) != want:
            raise OptionsError(usage)
        try:
            values = [float(p) for p in params]
        except ValueError:
            raise OptionsError(usage) from None
        dist = cls(kind, *values)
        if not all(math.isfinite(v) for v in values) or dist.a < 1 or dist.b < 0:
            raise OptionsError(f"{flag} {spec!r}: lengths must be >= 1 and spreads >= 0")
        if kind == "uniform" and dist.b < dist.a:
            raise OptionsError(f"{flag} {spec!r}: HI must be >= LO")
        return dist

    @property
    def centre(self) -> float:
        return (self.a + self.b) / 2 if self.kind == "uniform" else self.a

    def sample(self, rng: random.Random) -> int:
        if self.kind == "fixed":
            value = self.a
        elif self.kind == "uniform":
            return rng.randint(round(self.a), round(self.b))
        elif self.kind == "normal":
            value = rng.gauss(self.a, self.b)
        else:
            value = rng.lognormvariate(math.log(self.a), self.b)
        return int(min(max(round(value), 1), MAX_LENGTH_FACTOR * self.centre))

    def describe(self) -> str:
        if self.kind == "fixed":
            return f"fixed {self.a:g}"
        return f"{self.kind} {self.a:g}:{self.b:g}"


@dataclass(frozen=True)
class DatasetEntry:
    """One line of a --dataset: a prompt text or a prompt length, and maybe an output length."""

    prompt: str | None = None
    input_tokens: int | None = None
    output_tokens: int | None = None


def load_dataset(path: str) -> list[DatasetEntry]:
    """JSONL: each line {"prompt": TEXT} (or "text") or {"input_tokens": N}, optionally with
    "output_tokens" (or "max_tokens"): M. Blank lines are skipped."""
    try:
        lines = Path(path).read_text(encoding="utf-8").splitlines()
    except OSError as exc:
        raise OptionsError(f"--dataset {path}: {exc.strerror or exc}") from exc
    entries = []
    for n, line in enumerate(lines, 1):
        if not line.strip():
            continue
        where = f"--dataset {path}:{n}"
        try:
            obj = json.loads(line)
        except ValueError as exc:
            raise OptionsError(f"{where}: not JSON ({exc.msg})") from exc
        if not isinstance(obj, dict):
            raise OptionsError(f"{where}: each line must be a JSON object")
        text = obj.get("prompt", obj.get("text"))
        length = obj.get("input_tokens")
        out = obj.get("output_tokens", obj.get("max_tokens"))
        if text is not None and (not isinstance(text, str) or not text):
            raise OptionsError(f'{where}: "prompt" must be a non-empty string')
        if length is not None and not _positive_int(length):
            raise OptionsError(f'{where}: "input_tokens" must be an integer >= 1')
        if (text is None) == (length is None):
            raise OptionsError(f'{where}: needs exactly one of "prompt" and "input_tokens"')
        if out is not None and not _positive_int(out):
            raise OptionsError(f'{where}: "output_tokens" must be an integer >= 1')
        entries.append(DatasetEntry(text, length, out))
    if not entries:
        raise OptionsError(f"--dataset {path}: no entries")
    return entries


def _positive_int(value: object) -> bool:
    return isinstance(value, int) and not isinstance(value, bool) and value >= 1


@dataclass
class Conversation:
    """A multi-turn conversation: the messages so far, oldest first, and its turn count."""

    id: int
    turns: int  # how many turns it will have
    messages: list[tuple[str, str]] = field(default_factory=list)  # (role, text)

    @property
    def turn(self) -> int:
        """The turn about to be sent (1-based)."""
        return sum(1 for role, _ in self.messages if role == "user") + 1


@dataclass(frozen=True)
class Request:
    """What one request sends: the conversation (one user message for a single turn), the
    output length, and for multi-turn runs the conversation it belongs to."""

    messages: tuple[tuple[str, str], ...]
    max_tokens: int
    conversation: Conversation | None = None
    turn: int | None = None  # multi-turn: which turn of its conversation this is (1-based)

    @property
    def text(self) -> str:
        """The conversation as one text (the completions and /generate routes)."""
        return "\n".join(content for _, content in self.messages)


class Workload:
    """Where request contents come from, for every user of a session.

    Each user draws from its own seeded random stream (`source(user)`); conversations are
    shared: a request takes the conversation that has waited longest for its next turn, or
    starts a new one, so open-loop arrivals and closed-loop streams both advance them turn by
    turn, one request of a conversation at a time.
    """

    def __init__(
        self,
        options: LoadTestOptions,
        prompts: list[str] | None = None,
        dataset: list[DatasetEntry] | None = None,
    ) -> None:
        self.options = options
        self.prompts = prompts
        self.dataset = dataset
        self.input_dist = (
            LengthDist.parse(options.input_dist, "--input-dist") if options.input_dist else None
        )
        self.output_dist = (
            LengthDist.parse(options.output_dist, "--output-dist") if options.output_dist else None
        )
        self._idle: collections.deque[Conversation] = collections.deque()
        self._ids = itertools.count(1)

    @classmethod
    def from_options(cls, options: LoadTestOptions, prompts: list[str] | None) -> Workload:
        """Raises OptionsError (one line) for a bad distribution or dataset."""
        dataset = load_dataset(options.dataset) if options.dataset else None
        return cls(options, prompts, dataset)

    def describe(self) -> dict[str, object]:
        o = self.options
        if self.dataset is not None:
            source = f"dataset {o.dataset} ({len(self.dataset)} entries)"
        elif self.prompts:
            source = f"file {o.prompt_file}"
        elif self.input_dist is not None:
            source = f"synthetic, {self.input_dist.describe()} words"
        else:
            source = f"synthetic {o.input_tokens} words"
        out = self.output_dist.describe() if self.output_dist else f"fixed {o.max_tokens}"
        return {"input": source, "output_tokens": out, "turns": o.turns}

    def next_request(self, rng: random.Random) -> Request:
        content, max_tokens = self._draw(rng)
        if self.options.turns == 1:
            return Request((("user", content),), max_tokens)
        conv = (
            self._idle.popleft()
            if self._idle
            else Conversation(next(self._ids), self.options.turns)
        )
        turn = conv.turn
        conv.messages.append(("user", content))
        return Request(tuple(conv.messages), max_tokens, conv, turn)

    def finished(self, request: Request, reply: str | None) -> None:
        """A request ended: its conversation takes the reply and waits for its next turn; a
        failed turn (reply None) or a last turn ends the conversation."""
        conv = request.conversation
        if conv is None or reply is None or request.turn == conv.turns:
            return
        conv.messages.append(("assistant", reply))
        self._idle.append(conv)

    def _draw(self, rng: random.Random) -> tuple[str, int]:
        o = self.options
        max_tokens = self.output_dist.sample(rng) if self.output_dist else o.max_tokens
        if self.dataset is not None:
            entry = rng.choice(self.dataset)
            text = entry.prompt or synthetic_text(rng, entry.input_tokens or o.input_tokens)
            return text, entry.output_tokens or max_tokens
        if self.prompts:
            return rng.choice(self.prompts), max_tokens
        words = self.input_dist.sample(rng) if self.input_dist else o.input_tokens
        return synthetic_text(rng, words), max_tokens
