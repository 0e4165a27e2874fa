"""The emulator's prefix-cache model: cached_tokens as SGLang's radix cache would report it."""

from __future__ import annotations

from glmserve.emulator.prefix import PrefixCache


def test_a_new_prompt_finds_nothing_and_a_repeat_finds_all_but_the_last_token():
    cache = PrefixCache(page_chars=8)
    text = "x" * 400
    assert cache.lookup_and_insert(text, 100) == 0
    assert cache.lookup_and_insert(text, 100) == 99


def test_a_shared_prefix_is_found_in_whole_pages_only():
    cache = PrefixCache(page_chars=8)
    context = "".join(chr(ord("a") + i % 26) for i in range(200))
    cache.lookup_and_insert(context + " first question?", 54)
    second = context + " another question!"
    cached = cache.lookup_and_insert(second, 55)
    # 200 shared chars = 25 whole pages of 8; the key is 218 chars, 55 tokens.
    assert cached == 55 * 200 // 218
    assert 0 < cached < 55


def test_unrelated_prompts_do_not_hit():
    cache = PrefixCache(page_chars=8)
    cache.lookup_and_insert("a" * 100, 25)
    assert cache.lookup_and_insert("b" * 100, 25) == 0


def test_the_table_is_bounded_and_forgets_the_oldest():
    cache = PrefixCache(page_chars=4, max_pages=10)
    cache.lookup_and_insert("a" * 40, 10)  # 10 pages
    cache.lookup_and_insert("b" * 40, 10)  # pushes every "a" page out
    assert cache.lookup_and_insert("a" * 40, 10) == 0
