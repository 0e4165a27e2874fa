"""SGLang's own command-line parser, as the launcher needs it: to see what an argv *means*.

SGLang parses `sglang.launch_server`'s argv with a plain argparse parser. argparse accepts any
unique prefix of a long option and the `--flag=value` form, so `--hos 0.0.0.0` *is* `--host`
and `--attention-back fa3` *is* `--attention-backend fa3`: reading or checking an argv by exact
flag names would let it say one thing to the launcher and another to SGLang. So everything here
asks the parser itself (rebuilt from SGLang's source, glmserve.launch.argspec): which option an
argument resolves to, which values SGLang's types and choices refuse, and what value each option
ends up with (ServerArgs). With SGLang installed, its own server_args.py; without (the tools
image's dry run, the doctor), the stored copy of the profile's line.
"""

from __future__ import annotations

import argparse
import json
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from glmserve.launch.argspec import (
    FIELDS_DIR,
    SERVER_ARGS_FILE,
    ParseError,
    annotated_fields,
    parser,
    parser_from_source,
    read_site,
    shipped,
)
from glmserve.launch.errors import LaunchError

__all__ = ["FIELDS_DIR", "SERVER_ARGS_FILE", "annotated_fields", "parser_from_source"]

# `--config FILE` merges a YAML file into the argv (server_args_config_parser): its keys could set
# anything, unseen by this check, so it is refused like a launcher-owned flag.
CONFIG_DEST = "config"

# Values never printed: the plan and the exec log line show REDACTED instead.
SECRET_DESTS = ("api_key", "admin_api_key", "ssl_keyfile_password")
REDACTED = "<redacted>"


def load_parser(site: Path) -> argparse.ArgumentParser:
    """SGLang's parser for the installation in `site` (its server_args.py, never imported)."""
    return parser(tuple(read_site(site)))


def line_parser(versions: Sequence[str]) -> tuple[str, argparse.ArgumentParser] | None:
    """(version, parser) of the first of these SGLang lines whose options are stored here."""
    for version in versions:
        specs = shipped(version)
        if specs is not None:
            return version, parser(specs)
    return None


def _option_like(arg: str) -> bool:
    # What argparse would try to match as an option: a leading '-' that is not a lone '-' or a
    # negative number (SGLang defines no option that looks like one).
    if not arg.startswith("-") or arg == "-":
        return False
    try:
        float(arg)
    except ValueError:
        return True
    return False


def resolve(parser: argparse.ArgumentParser, arg: str) -> str | None:
    """The dest SGLang's parser gives an option-like argument (prefix and `=` forms included),
    None when it matches no option. An ambiguous prefix raises LaunchError with argparse's words."""
    if not _option_like(arg):
        return None
    try:
        # A dummy value, so an option that takes one resolves without "expected one argument";
        # the untyped twin, so that no type or choice refuses the dummy.
        ns, _ = getattr(parser, "untyped", parser).parse_known_args([arg, "VALUE"])
    except ParseError as exc:
        raise LaunchError(f"SGLang's parser refuses the argument {arg}: {exc}") from None
    dests = list(vars(ns))
    return dests[0] if dests else None


def owned_dests(parser: argparse.ArgumentParser, flags: Iterable[str]) -> dict[str, str]:
    """dest -> the launcher's flag for it, for each of the launcher's own flags."""
    dests: dict[str, str] = {}
    for flag in flags:
        dest = resolve(parser, flag)
        if dest is None:
            raise LaunchError(f"SGLang's parser has no {flag}, which the launcher sets")
        dests.setdefault(dest, flag)
    return dests


# Without SGLang's parser (the tools image has no SGLang): what a prefix may stand for.
SECRET_FLAGS = ("--api-key", "--admin-api-key", "--ssl-keyfile-password")
CONFIG_FLAG = "--config"


def _prefix_dest(arg: str, flags: Iterable[str]) -> str | None:
    """The flag `arg` could abbreviate (or name exactly, or in its `=` form): the first of
    `flags` it is a prefix of. A superset of argparse's answer, which also needs the prefix to
    be unique among all of SGLang's options; a bare `--` or `-x` is too short to be one."""
    if not _option_like(arg):
        return None
    name = arg.split("=", 1)[0]
    if not name.startswith("--") or len(name) < 4:
        return None
    return next((f for f in flags if f.startswith(name)), None)


def check_not_owned(
    parser: argparse.ArgumentParser | None,
    args: Sequence[str],
    owned: Iterable[str],
    where: str,
) -> None:
    """Refuse the first argument SGLang would read as one of the launcher's own flags. With no
    parser (SGLang not installed here), refuse every prefix of one, which covers them all."""
    owned = tuple(owned)
    if parser is None:
        taken = {flag.lstrip("-").replace("-", "_"): flag for flag in owned}
    else:
        taken = owned_dests(parser, owned)
    for arg in args:
        if parser is None:
            hit = _prefix_dest(arg, (*owned, CONFIG_FLAG))
            dest = None if hit is None else hit.lstrip("-").replace("-", "_")
        else:
            dest = resolve(parser, arg)
        if dest is None:
            continue
        flag = arg.split("=", 1)[0]
        if dest in taken:
            reads = f" (SGLang reads it as {taken[dest]})" if flag != taken[dest] else ""
            raise LaunchError(
                f"{where} {flag} is set by the launcher itself{reads}; use its own input "
                "(--model-path, --tp, --host, --port, --nnodes, --node-rank, --dist-init-addr "
                "or their GLMSERVE_* variables)"
            )
        if dest == CONFIG_DEST:
            raise LaunchError(
                f"{where} {flag} reads more SGLang options from a file, which the launcher cannot "
                "check against the flags it owns; pass those options after -- instead"
            )


def redact(parser: argparse.ArgumentParser | None, argv: Sequence[str]) -> list[str]:
    """argv with the values of secret options replaced (`--api-key X`, `--api-k=X`, ...); with
    no parser, the values of every prefix of one."""
    out: list[str] = []
    hide_next = False
    for arg in argv:
        if hide_next:
            out.append(REDACTED)
            hide_next = False
            continue
        if parser is None:
            hit = _prefix_dest(arg, SECRET_FLAGS)
            dest = None if hit is None else hit.lstrip("-").replace("-", "_")
        else:
            try:
                dest = resolve(parser, arg)
            except LaunchError:
                dest = None
        if dest in SECRET_DESTS:
            if "=" in arg:
                out.append(arg.split("=", 1)[0] + "=" + REDACTED)
            else:
                out.append(arg)
                hide_next = True
            continue
        out.append(arg)
    return out


# Values SGLang's parser takes but its server cannot run with, found by SGLang only minutes
# into start-up (or never: a fraction over 1 asks for more memory than the GPU has). By option
# string, so each line's own dest for it is used; an option a line lacks is skipped.
RANGES: dict[str, tuple[float, float, str]] = {
    "--mem-fraction-static": (0.0, 1.0, "a fraction of GPU memory, in (0, 1]"),
    "--context-length": (0, float("inf"), "a number of tokens, > 0"),
    "--cuda-graph-max-bs": (0, float("inf"), "a batch size, > 0"),
    "--max-running-requests": (0, float("inf"), "a number of requests, > 0"),
    "--max-total-tokens": (0, float("inf"), "a number of tokens, > 0"),
    "--page-size": (0, float("inf"), "a number of tokens, > 0"),
}
# String options SGLang json.loads at start (a typo there is a traceback after the weights load).
JSON_OBJECT_OPTIONS = ("--json-model-override-args",)


@dataclass(frozen=True)
class ServerArgs:
    """What an SGLang argv sets, as SGLang's own parser reads it: abbreviations and `=` forms
    resolved, the last occurrence kept, values converted by SGLang's types. Read by option
    string (`args.get("--cuda-graph-max-bs")`), whatever dest the line gives that option."""

    parser: argparse.ArgumentParser
    values: Mapping[str, Any]

    @classmethod
    def parse(cls, parser: argparse.ArgumentParser, argv: Sequence[str]) -> ServerArgs:
        try:
            ns, _ = parser.parse_known_args(list(argv))
        except ParseError as exc:
            raise LaunchError(f"SGLang's parser refuses the arguments: {exc}") from None
        return cls(parser, dict(vars(ns)))

    def get(self, option: str, default: Any = None) -> Any:
        dest = self.dest(option)
        return self.values.get(dest, default) if dest is not None else default

    def dest(self, option: str) -> str | None:
        try:
            return resolve(self.parser, option)
        except LaunchError:
            return None

    def given(self, option: str) -> bool:
        dest = self.dest(option)
        return dest is not None and dest in self.values


def server_args(argv: Sequence[str], versions: Sequence[str] = ()) -> ServerArgs:
    """`argv` read by the stored parser of these lines (the default line's when none is stored:
    a profile of one's own pinned elsewhere), for callers without SGLang installed."""
    from glmserve.sglang_lines import DEFAULT_LINE

    found = line_parser([*versions, DEFAULT_LINE])
    assert found is not None, f"no stored SGLang options for the default line {DEFAULT_LINE}"
    return ServerArgs.parse(found[1], argv)


def check_args(
    parser: argparse.ArgumentParser, args: Sequence[str], where: str, whose: str
) -> None:
    """Refuse in one line what SGLang would refuse of `args`, or fail on later: an unknown or
    ambiguous flag, a value of the wrong type or outside the choices (SGLang's own parser,
    `whose` naming it), a value out of RANGES, a JSON option that is not a JSON object."""
    try:
        ns = parser.parse_args(list(args))
    except ParseError as exc:
        raise LaunchError(f"{where}: {exc} ({whose})") from None
    values = ServerArgs(parser, dict(vars(ns)))
    for option, (low, high, what) in RANGES.items():
        value = values.get(option)
        number = isinstance(value, (int, float)) and not isinstance(value, bool)
        if number and not low < value <= high:
            raise LaunchError(f"{where}: {option} {value:g} is not {what}")
    for option in JSON_OBJECT_OPTIONS:
        value = values.get(option)
        if value is None:
            continue
        try:
            ok = isinstance(json.loads(value), dict)
        except ValueError:
            ok = False
        if not ok:
            raise LaunchError(f"{where}: {option} {value!r} is not a JSON object")
