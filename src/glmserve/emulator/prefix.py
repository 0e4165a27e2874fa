"""A model of SGLang's radix (prefix) cache: how many prompt tokens a request finds cached.

The real server reports `meta_info.cached_tokens` on /generate: the length of the longest prefix
of this prompt that an earlier request left in the radix tree. The emulator has no tokens, only
the prompt key (the text, or the id list as a string), so it matches keys in fixed character
pages and converts the matched share of the key into tokens. Only the count is modelled; timing
is unchanged (TTFT does not shrink on a hit), and nothing is ever evicted but the oldest pages
once the table is full.
"""

from __future__ import annotations

from collections import OrderedDict

PAGE_CHARS = 64  # ~16 tokens of text at the emulator's 4 bytes per token
MAX_PAGES = 200_000  # bounded memory: the oldest prefixes go first


class PrefixCache:
    def __init__(self, page_chars: int = PAGE_CHARS, max_pages: int = MAX_PAGES) -> None:
        self.page_chars = page_chars
        self.max_pages = max_pages
        # Every page-aligned prefix ever seen, as a hash: a prefix of k pages is present only if
        # all shorter ones are, so the longest match is found by binary search.
        self._pages: OrderedDict[int, None] = OrderedDict()

    def _has(self, key: str, pages: int) -> bool:
        return hash(key[: pages * self.page_chars]) in self._pages

    def lookup_and_insert(self, key: str, prompt_tokens: int) -> int:
        """Cached tokens for this prompt (what the server would report), then remember it."""
        n = len(key) // self.page_chars
        lo, hi = 0, n  # invariant: lo pages match; more than hi do not
        while lo < hi:
            mid = (lo + hi + 1) // 2
            if self._has(key, mid):
                lo = mid
            else:
                hi = mid - 1
        for pages in range(1, n + 1):
            h = hash(key[: pages * self.page_chars])
            self._pages[h] = None
            self._pages.move_to_end(h)
        while len(self._pages) > self.max_pages:
            self._pages.popitem(last=False)
        if not key or lo == 0:
            return 0
        matched = lo * self.page_chars
        # The real scheduler always recomputes the last prompt token, so a full hit is N - 1.
        return min(prompt_tokens - 1, prompt_tokens * matched // len(key))
