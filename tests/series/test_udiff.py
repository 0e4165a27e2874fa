"""The strict unified-diff applier: exact matches only, no fuzz, no offsets, bytes preserved."""

from __future__ import annotations

import pytest

from glmserve.series.errors import PatchError
from glmserve.series.udiff import apply_file_patch, parse_patch

P = "sglang/m.py"
SOURCE = b"".join(b"line %d\n" % i for i in range(1, 11))


def diff(body: str, old: str = f"a/{P}", new: str = f"b/{P}") -> bytes:
    return f"--- {old}\n+++ {new}\n{body}".encode()


def one(patch: bytes):
    (fp,) = parse_patch(patch)
    return fp


CHANGE_3 = diff("@@ -2,3 +2,3 @@\n line 2\n-line 3\n+LINE 3\n line 4\n")


def test_exact_hunk_applies_and_reverses():
    out = apply_file_patch(SOURCE, one(CHANGE_3))
    assert out == SOURCE.replace(b"line 3\n", b"LINE 3\n")
    assert apply_file_patch(out, one(CHANGE_3).reversed()) == SOURCE


def test_hunk_is_not_searched_for_at_another_offset():
    """The same context one line lower must be refused, not found by searching (no fuzz)."""
    shifted = b"extra\n" + SOURCE
    with pytest.raises(PatchError, match=r"hunk #1 does not match the file at line 2"):
        apply_file_patch(shifted, one(CHANGE_3))


def test_changed_context_line_is_refused():
    with pytest.raises(PatchError, match="does not match"):
        apply_file_patch(SOURCE.replace(b"line 4\n", b"line 4 \n"), one(CHANGE_3))


def test_crlf_target_does_not_match_lf_patch():
    with pytest.raises(PatchError, match="does not match"):
        apply_file_patch(SOURCE.replace(b"\n", b"\r\n"), one(CHANGE_3))


def test_two_hunks_with_line_count_changes():
    patch = diff(
        "@@ -1,2 +1,3 @@\n line 1\n+inserted\n line 2\n"
        "@@ -8,3 +9,2 @@\n line 8\n-line 9\n line 10\n"
    )
    out = apply_file_patch(SOURCE, one(patch))
    assert out.split(b"\n")[:3] == [b"line 1", b"inserted", b"line 2"]
    assert b"line 9\n" not in out and out.endswith(b"line 8\nline 10\n")
    assert apply_file_patch(out, one(patch).reversed()) == SOURCE


def test_wrong_new_start_in_header_is_refused():
    patch = diff(
        "@@ -1,2 +1,3 @@\n line 1\n+x\n line 2\n@@ -8,3 +8,2 @@\n line 8\n-line 9\n line 10\n"
    )
    with pytest.raises(PatchError, match=r"header says \+8"):
        apply_file_patch(SOURCE, one(patch))


def test_no_newline_at_end_of_file_both_ways():
    src = b"a\nb"
    patch = diff("@@ -1,2 +1,2 @@\n a\n-b\n\\ No newline at end of file\n+b\n")
    assert apply_file_patch(src, one(patch)) == b"a\nb\n"
    assert apply_file_patch(b"a\nb\n", one(patch).reversed()) == src
    with pytest.raises(PatchError, match="does not match"):
        apply_file_patch(b"a\nb\n", one(patch))


def test_new_file_git_and_diff_n_styles():
    git = diff("@@ -0,0 +1,2 @@\n+x = 1\n+y = 2\n", old="/dev/null")
    plain = diff(
        "@@ -0,0 +1,2 @@\n+x = 1\n+y = 2\n",
        old=f"a/{P}\t1970-01-01 00:00:00.000000000 +0000",
        new=f"b/{P}\t2026-11-29 16:42:58.037981827 +0000",
    )
    for patch in (git, plain):
        fp = one(patch)
        assert fp.old_path is None and fp.new_path == P
        assert apply_file_patch(None, fp) == b"x = 1\ny = 2\n"
        assert apply_file_patch(b"x = 1\ny = 2\n", fp.reversed()) is None
        with pytest.raises(PatchError, match="already exists"):
            apply_file_patch(b"", fp)
    with pytest.raises(PatchError, match="does not match"):
        apply_file_patch(b"x = 1\ny = 3\n", one(git).reversed())


def test_missing_target_is_refused():
    with pytest.raises(PatchError, match="does not exist"):
        apply_file_patch(None, one(CHANGE_3))


def test_git_headers_preamble_and_signature_are_accepted():
    patch = (
        b"Subject: a commit message\n\nwith --- dashes -- and text\n\n"
        b"diff --git a/sglang/m.py b/sglang/m.py\nindex 1234567..89abcde 100644\n"
        + CHANGE_3
        + b"-- \n2.43.0\n"
    )
    assert apply_file_patch(SOURCE, one(patch)) == apply_file_patch(SOURCE, one(CHANGE_3))


@pytest.mark.parametrize(
    ("patch", "error"),
    [
        (diff("@@ -2,3 +2,3 @@\n line 2\n-line 3\n+LINE 3\n"), "truncated"),
        (diff("@@ -2,2 +2,2 @@\n line 2\n-line 3\n+LINE 3\n line 4\n"), "unexpected line"),
        (diff("@@ -2,3 +2,3 @@\n line 2\n-line 3\n+LINE 3\n\n"), "invalid hunk line"),
        (diff("@@ -2,3 +2,3 @@\n line 2\n-line 3\n+LINE 3\n line 4"), "lacks a line ending"),
        (diff("@@ -x +2 @@\n"), "malformed hunk header"),
        (diff(""), "without any hunk"),
        (diff("@@ -1 +1 @@\n-a\n+b\n", old="a/setup.py", new="b/setup.py"), "outside the sglang"),
        (diff("@@ -1 +1 @@\n-a\n+b\n", old="a/sglang/../x", new="b/sglang/../x"), "unsafe"),
        (diff("@@ -1 +1 @@\n-a\n+b\n", old="/etc/passwd", new="/etc/passwd"), "must start with"),
        (diff("@@ -1 +1 @@\n-a\n+b\n", new="b/sglang/other.py"), "renames are not supported"),
        (diff("@@ -1 +1 @@\n-a\n+b\n", old="/dev/null", new="/dev/null"), "both sides"),
        (
            b"diff --git a/sglang/x b/sglang/x\nold mode 100644\nnew mode 100755\n",
            "unsupported git",
        ),
        (
            b"diff --git a/sglang/x b/sglang/x\nBinary files a/sglang/x and b/sglang/x differ\n",
            "unsupported",
        ),
        (CHANGE_3 + CHANGE_3, "appears twice"),
        (b"just some text\n", "no file changes"),
        (diff("@@ -5,1 +5,1 @@\n-line 5\n+L5\n@@ -4,1 +4,1 @@\n-line 4\n+L4\n"), "out of order"),
    ],
)
def test_malformed_patches_are_refused(patch, error):
    with pytest.raises(PatchError, match=error):
        parse_patch(patch, "t.patch")


def test_hunk_past_end_of_file_is_refused():
    patch = diff("@@ -10,2 +10,2 @@\n line 10\n-line 11\n+x\n")
    with pytest.raises(PatchError, match="outside the file"):
        apply_file_patch(SOURCE, one(patch))
