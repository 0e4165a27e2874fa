"""Prompts: synthetic text of a controlled length, or lines of a JSONL file.

Synthetic prompts are short common words, each about one token in BPE vocabularies, so
`--input-tokens` is close to the prompt length the server reports (`prompt_tokens` in the
report is the server's count, which is the one to trust). Each prompt starts with a fresh
random tag so that the radix cache cannot turn prefill into a cache hit.
"""

from __future__ import annotations

import json
import random
from pathlib import Path

from glmserve.loadtest.options import OptionsError

_TEXT = (
    "the of and to in is was for on are with as by at from this that be have not or one all "
    "they which we an there been has more when who will no if out so up said what its about "
    "into than them can only other new some could time these two may then do first any my now "
    "such like our over man me even most made after also did many before must through back "
    "years where much your way well down should because each just those people how too little "
    "state good very make world still own see men work long get here between both life being "
    "under never day same another know while last might us great old year off come since"
)
_WORDS = tuple(_TEXT.split())


def load_prompt_file(path: str) -> list[str]:
    """Every line is a JSON object with a "prompt" (or "text") string; blank lines are skipped."""
    try:
        lines = Path(path).read_text(encoding="utf-8").splitlines()
    except OSError as exc:
        raise OptionsError(f"--prompt-file {path}: {exc.strerror or exc}") from exc
    prompts = []
    for n, line in enumerate(lines, 1):
        if not line.strip():
            continue
        try:
            obj = json.loads(line)
        except ValueError as exc:
            raise OptionsError(f"--prompt-file {path}:{n}: not JSON ({exc.msg})") from exc
        text = obj.get("prompt", obj.get("text")) if isinstance(obj, dict) else None
        if not isinstance(text, str) or not text:
            raise OptionsError(f'--prompt-file {path}:{n}: needs a non-empty "prompt" string')
        prompts.append(text)
    if not prompts:
        raise OptionsError(f"--prompt-file {path}: no prompts")
    return prompts


def user_rng(seed: int | None, stream_id: int) -> random.Random:
    """The random stream of one Locust user: reproducible per (seed, user) when seeded."""
    return random.Random(None if seed is None else f"{seed}:{stream_id}")


def synthetic_text(rng: random.Random, words: int) -> str:
    """`words` common words (about a token each) after a random tag that makes it unique."""
    tag = f"[{rng.getrandbits(48):012x}]"
    return " ".join([tag, *rng.choices(_WORDS, k=max(words - 1, 0))])
