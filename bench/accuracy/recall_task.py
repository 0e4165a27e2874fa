"""The recall task: a haystack of key -> multi-token value records, then a query; its vocabulary,
its tokenizer, and the scorer. Stdlib only (the bench client and the CI tests import it without
torch).

    <s> ... k417 a3 b30 c7 d12 e0 f21 g9 h5 z17 z2 ... k88 a19 b4 ... Q k417  =>  a3 b30 c7 d12 e0 f21 g9 h5

Every record is one key token (1,024 of them) and VALUE_LEN value tokens, slot s drawn from its
own 512-symbol alphabet (letters a..h); keys and each slot's symbols are unique within a prompt,
so every token of an answer occurs once in the haystack and is found by what follows its
predecessor there. Filler tokens sit between records. The prompt ends with `Q key`; the answer
is that key's value. Every answer token needs the right earlier rows: the first the row after
the key, each later one the row after the previous answer token. A model that reads wrong KV
rows (another layer's pool, shifted offsets, a stale page table) answers with other tokens, so
exact-match accuracy falls; a random guess scores 512**-8. The answer is deterministic, so the
NextN (MTP) draft head can predict it too, which is what gives a meaningful acceptance length.
"""

from __future__ import annotations

import math
import random
from collections.abc import Sequence
from dataclasses import dataclass

SPECIAL = ("<unk>", "<s>", "</s>", "<pad>")  # ids 0..3, as every tokenizer in deploy/models
BOS = 1
QUERY, END = "Q", ";"
N_KEYS = 1024
VALUE_LEN = 8
SYMBOLS = 512
N_FILLERS = 64
SLOT_LETTERS = "abcdefgh"
assert len(SLOT_LETTERS) == VALUE_LEN


def tokens() -> list[str]:
    """The vocabulary in id order."""
    out = [*SPECIAL, QUERY, END]
    out += [f"k{i}" for i in range(N_KEYS)]
    out += [f"{SLOT_LETTERS[s]}{j}" for s in range(VALUE_LEN) for j in range(SYMBOLS)]
    out += [f"z{i}" for i in range(N_FILLERS)]
    return out


VOCAB_SIZE = len(tokens())  # 5,190
QUERY_ID = len(SPECIAL)
END_ID = QUERY_ID + 1
KEY0 = END_ID + 1
VALUE0 = KEY0 + N_KEYS
FILLER0 = VALUE0 + VALUE_LEN * SYMBOLS
assert FILLER0 + N_FILLERS == VOCAB_SIZE


def value_id(slot: int, symbol: int) -> int:
    return VALUE0 + slot * SYMBOLS + symbol


def slot_of(token_id: int) -> int | None:
    """The value slot a token belongs to (None: not a value token)."""
    if VALUE0 <= token_id < FILLER0:
        return (token_id - VALUE0) // SYMBOLS
    return None


def tokenizer_json() -> dict:
    """A Hugging Face `tokenizers` WordLevel model (as deploy/models/tiny-mla/generate.py writes
    one), so SGLang's tokenizer manager loads and detokenizes the model's words."""
    vocab = tokens()
    return {
        "version": "1.0",
        "truncation": None,
        "padding": None,
        "added_tokens": [
            {
                "id": i,
                "content": tok,
                "single_word": False,
                "lstrip": False,
                "rstrip": False,
                "normalized": False,
                "special": True,
            }
            for i, tok in enumerate(SPECIAL)
        ],
        "normalizer": None,
        "pre_tokenizer": {"type": "Whitespace"},
        "post_processor": None,
        "decoder": None,
        "model": {
            "type": "WordLevel",
            "vocab": {tok: i for i, tok in enumerate(vocab)},
            "unk_token": "<unk>",
        },
    }


def tokenizer_config(max_positions: int) -> dict:
    return {
        "tokenizer_class": "PreTrainedTokenizerFast",
        "bos_token": "<s>",
        "eos_token": "</s>",
        "unk_token": "<unk>",
        "pad_token": "<pad>",
        "model_max_length": max_positions,
        "clean_up_tokenization_spaces": False,
    }


def encode(text: str) -> list[int]:
    """The tokenizer's WordLevel model on words separated by spaces (tests compare the two)."""
    index = {tok: i for i, tok in enumerate(tokens())}
    return [index.get(w, 0) for w in text.split()]


def decode(ids: Sequence[int]) -> str:
    vocab = tokens()
    return " ".join(vocab[i] for i in ids)


# ---------------------------------------------------------------- prompts


@dataclass(frozen=True)
class Haystack:
    """One context: its token ids (BOS first) and every record's value, by key id."""

    ids: tuple[int, ...]
    values: dict[int, tuple[int, ...]]

    def prompt(self, key: int) -> list[int]:
        return [*self.ids, QUERY_ID, key]


MAX_RECORDS = 500  # unique symbols per slot (512) bound it


def records_for(context: int) -> int:
    """How many records a bench context of `context` tokens holds: 70 % of it, at most
    MAX_RECORDS (longer contexts get more filler instead)."""
    return max(4, min(MAX_RECORDS, int(0.7 * context) // (VALUE_LEN + 1)))


def haystack(rng: random.Random, length: int, n_records: int) -> Haystack:
    """A context of exactly `length` tokens (BOS included): n_records records in random order,
    the rest filler tokens, spread in random gaps."""
    body = length - 1
    fillers = body - n_records * (VALUE_LEN + 1)
    if n_records < 1 or n_records > min(N_KEYS, SYMBOLS) or fillers < 0:
        raise ValueError(f"{n_records} records do not fit {length} tokens")
    keys = [KEY0 + k for k in rng.sample(range(N_KEYS), n_records)]
    symbols = [rng.sample(range(SYMBOLS), n_records) for _ in range(VALUE_LEN)]  # unique per slot
    values = {
        k: tuple(value_id(s, symbols[s][r]) for s in range(VALUE_LEN)) for r, k in enumerate(keys)
    }
    items: list[int | None] = [*keys, *([None] * fillers)]  # None: one filler token
    rng.shuffle(items)
    ids = [BOS]
    for item in items:
        if item is None:
            ids.append(FILLER0 + rng.randrange(N_FILLERS))
        else:
            ids += [item, *values[item]]
    return Haystack(tuple(ids), values)


@dataclass(frozen=True)
class Query:
    haystack: int  # index of its haystack in the set
    key: int
    answer: tuple[int, ...]


def bench_set(
    seed: int, context: int, n_haystacks: int, queries_per: int
) -> tuple[list[Haystack], list[Query]]:
    """The prompts of one context length: haystacks of `context - 2` tokens (the query adds 2),
    each asked about `queries_per` distinct keys; deterministic in `seed`."""
    rng = random.Random(f"recall-{seed}-{context}")
    stacks, queries = [], []
    for h in range(n_haystacks):
        stack = haystack(rng, context - 2, records_for(context))
        stacks.append(stack)
        for key in rng.sample(sorted(stack.values), min(queries_per, len(stack.values))):
            queries.append(Query(h, key, stack.values[key]))
    return stacks, queries


# ---------------------------------------------------------------- scoring


@dataclass(frozen=True)
class Score:
    queries: int
    exact: int  # answers right in every token
    tokens_right: int
    tokens: int

    @property
    def accuracy(self) -> float:
        return self.exact / self.queries if self.queries else 0.0

    @property
    def token_accuracy(self) -> float:
        return self.tokens_right / self.tokens if self.tokens else 0.0

    def as_dict(self) -> dict:
        return {
            "queries": self.queries,
            "exact": self.exact,
            "accuracy": self.accuracy,
            "token_accuracy": self.token_accuracy,
        }


def score(answers: Sequence[Sequence[int]], expected: Sequence[Sequence[int]]) -> Score:
    """Exact match on the first VALUE_LEN generated tokens (a short output counts as wrong)."""
    if len(answers) != len(expected):
        raise ValueError(f"{len(answers)} answers for {len(expected)} queries")
    exact = right = total = 0
    for got, want in zip(answers, expected, strict=True):
        got = list(got)[: len(want)]
        hits = sum(g == w for g, w in zip(got, want, strict=False))
        right += hits
        total += len(want)
        exact += hits == len(want)
    return Score(len(expected), exact, right, total)


# ---------------------------------------------------------------- logprob agreement


def topk_kl(ref: Sequence[tuple[float, int]], other: Sequence[tuple[float, int]]) -> float:
    """KL(ref || other) over the buckets {ref's top-k tokens} + {everything else}.

    Each server reports only its own top-k: a reference token missing from `other`'s list gets
    the smallest logprob `other` reported (its probability is at most that). Coarse-graining
    never increases KL, so this is a lower bound of the full KL that both tails share fairly."""
    if not ref or not other:
        raise ValueError("empty top-k list")
    floor = min(lp for lp, _ in other)
    theirs = {tok: lp for lp, tok in other}
    kl = 0.0
    p_in = q_in = 0.0
    for lp, tok in ref:
        p = math.exp(lp)
        q_lp = theirs.get(tok, floor)
        kl += p * (lp - q_lp)
        p_in += p
        q_in += math.exp(q_lp)
    p_tail, q_tail = max(1.0 - p_in, 0.0), max(1.0 - q_in, 1e-12)
    if p_tail > 1e-12:
        kl += p_tail * math.log(p_tail / q_tail)
    return max(kl, 0.0)


def parse_top_logprobs(
    meta: dict, key: str = "output_top_logprobs"
) -> list[list[tuple[float, int]]]:
    """SGLang's meta_info[key]: per position a list of [logprob, token id, text]."""
    rows = meta.get(key) or []
    return [[(float(e[0]), int(e[1])) for e in (row or [])] for row in rows]


def parse_token_logprobs(meta: dict) -> list[tuple[float, int]]:
    return [(float(e[0]), int(e[1])) for e in meta.get("output_token_logprobs") or []]


@dataclass
class Agreement:
    """How one server's decode matches the reference server's on the same prompts."""

    positions: int = 0  # compared positions (up to and including the first divergence)
    divergent: int = 0  # outputs whose greedy tokens differ somewhere
    outputs: int = 0
    kl_sum: float = 0.0
    kl_max: float = 0.0
    dlp_sum: float = 0.0  # |d logprob| of the reference's chosen token
    dlp_max: float = 0.0

    def add(
        self,
        ref_ids: Sequence[int],
        ids: Sequence[int],
        ref_top: Sequence[Sequence[tuple[float, int]]],
        top: Sequence[Sequence[tuple[float, int]]],
        ref_chosen: Sequence[tuple[float, int]],
        chosen: Sequence[tuple[float, int]],
    ) -> None:
        """One output pair: positions compared while the histories are the same (the
        divergent position itself conditions on the same prefix, so it counts)."""
        self.outputs += 1
        n = min(len(ref_ids), len(ids), len(ref_top), len(top))
        for i in range(n):
            kl = topk_kl(ref_top[i], top[i])
            self.kl_sum += kl
            self.kl_max = max(self.kl_max, kl)
            if i < len(ref_chosen) and i < len(chosen):
                # The reference's token, as scored by this server (from its top-k if present).
                tok = ref_chosen[i][1]
                mine = dict((t, lp) for lp, t in top[i]).get(tok)
                if mine is not None:
                    d = abs(ref_chosen[i][0] - mine)
                    self.dlp_sum += d
                    self.dlp_max = max(self.dlp_max, d)
            self.positions += 1
            if ref_ids[i] != ids[i]:
                self.divergent += 1
                break

    def as_dict(self) -> dict:
        n = max(self.positions, 1)
        return {
            "outputs": self.outputs,
            "divergent_outputs": self.divergent,
            "positions": self.positions,
            "kl_mean": self.kl_sum / n,
            "kl_max": self.kl_max,
            "abs_dlogprob_mean": self.dlp_sum / n,
            "abs_dlogprob_max": self.dlp_max,
        }
