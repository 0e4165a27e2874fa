"""A strict unified-diff parser and applier (stdlib only).

Why not `git apply` or `patch`: the tool must behave identically in the CUDA base image, a minimal
Debian CI image and a laptop, and neither binary is guaranteed in all three. Why not fuzz or offset
search: a hunk that does not match byte-for-byte at the line its header names means the target is
not the file the series was generated against, and patching it anyway is how silent breakage ships.

Everything works on bytes, so line endings and encodings pass through untouched.
"""

from __future__ import annotations

import re
from dataclasses import dataclass, field
from pathlib import PurePosixPath

from glmserve.series.errors import PatchError

# Matches only the hunk *header* line of a diff (never applied to source code).
_HUNK_HEADER = re.compile(rb"^@@ -(\d+)(?:,(\d+))? \+(\d+)(?:,(\d+))? @@")
_NO_NEWLINE = b"\\ No newline at end of file"
# git extended header lines that carry no content change we need to act on.
_GIT_HEADERS_OK = (b"index ", b"new file mode ", b"deleted file mode ")
_GIT_HEADERS_REFUSED = (
    b"old mode ",
    b"new mode ",
    b"similarity index ",
    b"dissimilarity index ",
    b"rename from ",
    b"rename to ",
    b"copy from ",
    b"copy to ",
    b"Binary files ",
    b"GIT binary patch",
)


@dataclass(frozen=True)
class Hunk:
    old_start: int
    old_len: int
    new_start: int
    new_len: int
    # Full lines including their line ending (the last line of a file may lack one).
    old_lines: tuple[bytes, ...]
    new_lines: tuple[bytes, ...]

    def reversed(self) -> Hunk:
        return Hunk(
            self.new_start,
            self.new_len,
            self.old_start,
            self.old_len,
            self.new_lines,
            self.old_lines,
        )


@dataclass(frozen=True)
class FilePatch:
    """The changes to one file. A path of None means /dev/null (file created or deleted)."""

    old_path: str | None
    new_path: str | None
    hunks: tuple[Hunk, ...] = field(default_factory=tuple)

    @property
    def path(self) -> str:
        path = self.new_path if self.new_path is not None else self.old_path
        assert path is not None  # the parser rejects /dev/null on both sides
        return path

    def reversed(self) -> FilePatch:
        return FilePatch(
            self.new_path,
            self.old_path,
            tuple(h.reversed() for h in self.hunks),
        )


def _split_lines(data: bytes) -> list[bytes]:
    """Split on b"\\n" only, keeping it; bytes.splitlines() would also split on a bare \\r."""
    parts = data.split(b"\n")
    lines = [p + b"\n" for p in parts[:-1]]
    if parts[-1]:
        lines.append(parts[-1])
    return lines


def _parse_path(raw: bytes, prefix: str, where: str) -> str | None:
    path_part, _, stamp = raw.rstrip(b"\n").partition(b"\t")
    text = path_part.decode("utf-8", errors="strict")
    # `diff -N` marks a created/deleted file with the epoch timestamp instead of /dev/null.
    if text == "/dev/null" or stamp.startswith(b"1970-01-01 00:00:00"):
        return None
    if text.startswith('"'):
        raise PatchError(f"{where}: quoted path {text} is not supported")
    if not text.startswith(prefix):
        raise PatchError(f"{where}: path {text!r} must start with {prefix!r}")
    rel = text[len(prefix) :]
    pure = PurePosixPath(rel)
    if pure.is_absolute() or ".." in pure.parts or not rel or rel != str(pure):
        raise PatchError(f"{where}: unsafe or non-normalised path {text!r}")
    if pure.parts[0] != "sglang":
        raise PatchError(f"{where}: path {text!r} is outside the sglang/ package")
    return rel


def parse_patch(data: bytes, name: str = "<patch>") -> tuple[FilePatch, ...]:
    """Parse a unified diff (plain `diff -u` or `git diff`/`format-patch` output).

    Text before the first file header (a commit message) and a trailing `-- ` signature are
    ignored; anything else that is not part of a file section is an error.
    """
    lines = _split_lines(data)
    files: list[FilePatch] = []
    i = 0
    n = len(lines)
    seen_header = False
    while i < n:
        line = lines[i]
        where = f"{name}:{i + 1}"
        if line.startswith(b"--- ") and i + 1 < n and lines[i + 1].startswith(b"+++ "):
            seen_header = True
            old_path = _parse_path(line[4:], "a/", where)
            new_path = _parse_path(lines[i + 1][4:], "b/", f"{name}:{i + 2}")
            if old_path is None and new_path is None:
                raise PatchError(f"{where}: both sides are /dev/null")
            if old_path is not None and new_path is not None and old_path != new_path:
                raise PatchError(f"{where}: renames are not supported ({old_path} -> {new_path})")
            i += 2
            hunks: list[Hunk] = []
            while i < n and lines[i].startswith(b"@@"):
                hunk, i = _parse_hunk(lines, i, name)
                hunks.append(hunk)
            if not hunks:
                raise PatchError(f"{where}: file header without any hunk")
            _check_hunk_order(hunks, old_path or new_path or "", name)
            files.append(FilePatch(old_path, new_path, tuple(hunks)))
            continue
        if line.startswith(b"diff "):  # `diff --git` or a `diff -ruN` command line
            seen_header = True
            i += 1
            continue
        if seen_header:
            if line.startswith(_GIT_HEADERS_OK):
                i += 1
                continue
            if line.startswith(_GIT_HEADERS_REFUSED):
                raise PatchError(f"{where}: unsupported git header {line.strip()[:40]!r}")
            if line == b"-- \n":
                break  # git format-patch signature: the rest is the git version
            raise PatchError(f"{where}: unexpected line outside a hunk: {line[:60]!r}")
        i += 1  # preamble (commit message) before the first file header
    if not files:
        raise PatchError(f"{name}: no file changes found")
    paths = [f.path for f in files]
    dupes = sorted({p for p in paths if paths.count(p) > 1})
    if dupes:
        raise PatchError(f"{name}: file {dupes[0]} appears twice in one patch")
    return tuple(files)


def _parse_hunk(lines: list[bytes], i: int, name: str) -> tuple[Hunk, int]:
    header = lines[i]
    m = _HUNK_HEADER.match(header)
    if not m:
        raise PatchError(f"{name}:{i + 1}: malformed hunk header {header[:60]!r}")
    old_start = int(m.group(1))
    old_len = int(m.group(2)) if m.group(2) is not None else 1
    new_start = int(m.group(3))
    new_len = int(m.group(4)) if m.group(4) is not None else 1
    old: list[bytes] = []
    new: list[bytes] = []
    # Which side(s) the previous line went to, so a "\ No newline" marker can strip its "\n".
    last_sides: tuple[list[bytes], ...] = ()
    i += 1
    while (
        len(old) < old_len or len(new) < new_len or (i < len(lines) and lines[i].startswith(b"\\"))
    ):
        if i >= len(lines):
            raise PatchError(f"{name}: hunk at line {header.strip()!r} is truncated")
        line = lines[i]
        tag, body = line[:1], line[1:]
        if tag == b"\\":
            if line.rstrip(b"\r\n") != _NO_NEWLINE or not last_sides:
                raise PatchError(f"{name}:{i + 1}: unexpected marker {line[:60]!r}")
            for side in last_sides:
                if not side[-1].endswith(b"\n"):
                    raise PatchError(f"{name}:{i + 1}: duplicate no-newline marker")
                side[-1] = side[-1][:-1]
            last_sides = ()
        elif tag not in (b" ", b"-", b"+"):
            # Includes an empty line: some editors strip the single space of an empty context
            # line, and accepting that would be fuzz by another name.
            raise PatchError(f"{name}:{i + 1}: invalid hunk line {line[:60]!r}")
        elif not body.endswith(b"\n"):
            raise PatchError(f"{name}:{i + 1}: hunk line lacks a line ending")
        elif tag == b" ":
            old.append(body)
            new.append(body)
            last_sides = (old, new)
        elif tag == b"-":
            old.append(body)
            last_sides = (old,)
        else:
            new.append(body)
            last_sides = (new,)
        if len(old) > old_len or len(new) > new_len:
            raise PatchError(f"{name}:{i + 1}: hunk is longer than its header says")
        i += 1
    hunk = Hunk(old_start, old_len, new_start, new_len, tuple(old), tuple(new))
    return hunk, i


def _check_hunk_order(hunks: list[Hunk], path: str, name: str) -> None:
    end = 0
    for h in hunks:
        start = h.old_start if h.old_len else h.old_start + 1
        if start <= end:
            raise PatchError(f"{name}: hunks for {path} overlap or are out of order")
        end = h.old_start + max(h.old_len, 1) - 1


def apply_file_patch(content: bytes | None, fp: FilePatch, name: str = "<patch>") -> bytes | None:
    """Apply one file's hunks to `content` (None = file absent). Returns None if deleted.

    Every hunk must match exactly at the line its header states; there is no offset search.
    """
    if fp.old_path is None:
        if content is not None:
            raise PatchError(f"{fp.path}: {name} creates it but it already exists")
        source: list[bytes] = []
    else:
        if content is None:
            raise PatchError(f"{fp.path}: {name} changes it but it does not exist")
        source = _split_lines(content)
    out: list[bytes] = []
    cursor = 0
    for number, h in enumerate(fp.hunks, start=1):
        # A zero-length old side means "insert after line old_start".
        pos = h.old_start if h.old_len == 0 else h.old_start - 1
        if pos < cursor or pos + h.old_len > len(source):
            raise PatchError(
                f"{fp.path}: {name} hunk #{number} (line {h.old_start}) is outside the file"
            )
        if tuple(source[pos : pos + h.old_len]) != h.old_lines:
            raise PatchError(
                f"{fp.path}: {name} hunk #{number} does not match the file at line {h.old_start}"
            )
        out.extend(source[cursor:pos])
        expected_new = len(out) if h.new_len == 0 else len(out) + 1
        if h.new_start != expected_new:
            raise PatchError(
                f"{fp.path}: {name} hunk #{number} header says +{h.new_start}, "
                f"but the result puts it at line {expected_new}"
            )
        out.extend(h.new_lines)
        cursor = pos + h.old_len
    out.extend(source[cursor:])
    if fp.new_path is None:
        if out:
            raise PatchError(f"{fp.path}: {name} deletes it but its content does not match")
        return None
    return b"".join(out)
