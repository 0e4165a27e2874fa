"""glmserve.envfile: the one reader of env files (the doctor's and the fleet's), reading what
docker compose reads, as compose reads it."""

from __future__ import annotations

from pathlib import Path

import pytest

from glmserve.envfile import EnvFileError, chosen_files, read_entries, read_values


def write(tmp_path: Path, text: str, name: str = ".env") -> Path:
    path = tmp_path / name
    path.write_text(text)
    return path


def test_compose_syntax_quotes_comments_export_and_several_lines(tmp_path):
    """The cases hand-written readers got wrong: quotes kept before an inline comment, a
    multi-line quoted value called bad syntax, `1 # on` read as the value, and `export NAME`
    read as a name with a space in it."""
    path = write(
        tmp_path,
        "# comment\n\n"
        'A="abc" # c\n'
        "FLEET_EMULATED=1 # on\n"
        "export FLEET_ROUTER_PORT=29001\n"
        "B='single # kept'\n"
        'C="two\nlines"\n'
        'D="double \\"quoted\\""\n'
        "E=\n"
        "F=x=y\n",
    )
    entries, problems = read_entries(path)
    assert problems == []
    assert [(e.line, e.name, e.value) for e in entries] == [
        (3, "A", "abc"),
        (4, "FLEET_EMULATED", "1"),
        (5, "FLEET_ROUTER_PORT", "29001"),
        (6, "B", "single # kept"),
        (7, "C", "two\nlines"),
        (9, "D", 'double "quoted"'),
        (10, "E", ""),
        (11, "F", "x=y"),
    ]
    assert entries[0].where == ".env:3"


def test_lines_that_are_not_assignments_are_named_with_their_line(tmp_path):
    path = write(tmp_path, 'A=1\nthis line is not an assignment\nNAME\n9BAD=1\nB="open\n')
    entries, problems = read_entries(path)
    assert [e.name for e in entries] == ["A"]
    assert problems == [
        ".env:2: not NAME=VALUE: 'this line is not an assignment'",
        ".env:3: not NAME=VALUE: 'NAME'",
        ".env:4: not NAME=VALUE: '9BAD=1'",
        ".env:5: not NAME=VALUE: 'B=\"open'",
    ]
    with pytest.raises(EnvFileError, match=r"^\.env:2: not NAME=VALUE.*\(and 3 more\)$"):
        read_values(path)


def test_later_lines_win_and_unreadable_files_are_one_line(tmp_path):
    assert read_values(write(tmp_path, "A=1\nA=2\n")) == {"A": "2"}
    with pytest.raises(EnvFileError, match="cannot read"):
        read_entries(tmp_path / "missing.env")
    binary = tmp_path / "binary.env"
    binary.write_bytes(b"A=\xff\xfe\n")
    with pytest.raises(EnvFileError, match="is not UTF-8 text"):
        read_entries(binary)


def test_which_files_as_compose_chooses_them(tmp_path):
    """--env-file, else COMPOSE_ENV_FILES, else the project's .env when there is one."""
    project = tmp_path / "project"
    project.mkdir()
    assert chosen_files(None, {}, project) == []
    (project / ".env").write_text("")
    assert chosen_files(None, {}, project) == [project / ".env"]
    assert chosen_files(None, {"COMPOSE_ENV_FILES": "a.env, b.env"}, project) == [
        Path("a.env"),
        Path("b.env"),
    ]
    explicit = [tmp_path / "x.env"]
    assert chosen_files(explicit, {"COMPOSE_ENV_FILES": "a.env"}, project) == explicit
