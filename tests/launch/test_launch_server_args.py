"""Every flag a profile passes exists in its SGLang line's server_args.py, with a legal value;
the stored copies of each line's options (glmserve.launch.argspec, read by the dry run without
SGLang) are exactly what the real wheels give; and the launcher reads the options as SGLang's
own parser does.

The source is read from the real sglang wheels (downloaded once into .cache/wheels, as the patch
tests do) and parsed with ast: SGLang itself is never imported (it needs torch and CUDA), yet a
typo, a renamed flag or an invalid choice in a profile fails here instead of on a GPU host 7
minutes into model loading. Some choices are registries elsewhere in the wheel
(`["auto"] + list(ReasoningParser.DetectorMap.keys())`): those are followed through the
imports, so `--reasoning-parser glm45` is checked too.
"""

from __future__ import annotations

import argparse
from collections.abc import Callable

import pytest
from support.launch import PINNED, PROFILE_NAMES, PROFILES_DIR, pinned_sglang_parser

from glmserve import sglang_lines
from glmserve.launch import argspec
from glmserve.launch.argspec import OptionSpec
from glmserve.launch.errors import LaunchError
from glmserve.launch.profiles import LAUNCHER_OWNED_FLAGS, parse_profile_file, sglang_versions
from glmserve.launch.sglang_argv import check_args, resolve
from glmserve.series.errors import PatchError
from glmserve.series.wheels import default_cache_dir, fetch_wheel


def _wheel_specs(version: str, require) -> list[OptionSpec]:
    try:
        wheel = fetch_wheel(version, default_cache_dir())
    except PatchError as exc:
        require(False, f"cannot get the sglang {version} wheel: {exc}")
        raise
    return argspec.from_wheel(wheel)


@pytest.fixture(scope="module")
def line_specs(require) -> Callable[[str], dict[str, OptionSpec]]:
    """version -> that SGLang line's options by option string, read from its wheel."""
    cache: dict[str, dict[str, OptionSpec]] = {}

    def get(version: str) -> dict[str, OptionSpec]:
        if version not in cache:
            cache[version] = {o: s for s in _wheel_specs(version, require) for o in s.options}
        return cache[version]

    return get


@pytest.fixture(scope="module")
def specs(line_specs) -> dict[str, OptionSpec]:
    return line_specs(PINNED)


def wheel_parser(version: str, require) -> argparse.ArgumentParser:
    return argspec.parser(tuple(_wheel_specs(version, require)))


def refusal(parser: argparse.ArgumentParser, argv: list[str]) -> str | None:
    try:
        check_args(parser, argv, "args", "test")
    except LaunchError as exc:
        return str(exc)
    return None


def test_the_parse_sees_the_real_parser(specs):
    """Guards the guard: an AST walk that found nothing would make every check below vacuous."""
    assert len(specs) > 300
    assert "flashinfer" in specs["--attention-backend"].choices
    assert "modelopt_fp4" in specs["--quantization"].choices
    assert specs["--enable-metrics"].action == "store_true"
    assert specs["--port"].type == "int"
    assert specs["--mem-fraction-static"].type == "float"
    assert specs["--context-length"].type == "human_readable_int"
    # Followed through the imports to the parser registries (not literals in server_args.py).
    assert {"auto", "glm45", "deepseek-r1"} <= set(specs["--reasoning-parser"].choices)
    assert {"auto", "glm47", "glm45"} <= set(specs["--tool-call-parser"].choices)
    assert {"trtllm", "flashmla_kv"} <= set(specs["--nsa-decode-backend"].choices)
    assert "flashinfer_trtllm" in specs["--moe-runner-backend"].choices


@pytest.mark.parametrize("version", sorted(sglang_lines.LINES))
def test_the_stored_options_are_the_wheels(version, require):
    """sglang_args/<line>.json, what the dry run checks without SGLang, is exactly what the
    line's wheel gives (regenerate: python -m glmserve.launch.argstore --write)."""
    stored = (argspec.SHIPPED_DIR / f"{version}.json").read_text(encoding="utf-8")
    assert stored == argspec.dumps(_wheel_specs(version, require), version)
    assert argspec.shipped(version) == tuple(_wheel_specs(version, require))


@pytest.mark.parametrize("name", PROFILE_NAMES)
def test_every_profile_flag_exists_with_a_legal_value(name, require):
    """Against the parser of the line the profile names (0.5.12.post1 or 0.5.17), with its
    types, choices and the launcher's ranges (glmserve.launch.sglang_argv.check_args)."""
    profile = parse_profile_file(PROFILES_DIR / f"{name}.json")
    (version,) = sglang_versions(profile)  # the line that lists it
    assert refusal(wheel_parser(version, require), list(profile.args)) is None


def test_the_parse_sees_the_annotated_parser_of_the_current_line(line_specs, require):
    """0.5.17 declares most options as annotated ServerArgs fields, not add_argument calls: the
    parse must see them with their choices, or the current line's profiles check nothing."""
    specs = line_specs("0.5.17")
    assert len(specs) > 400
    assert {"dsa", "flashinfer", "fa3", "trtllm_mla"} <= set(specs["--attention-backend"].choices)
    assert "flashinfer_sparse_mla" in specs["--dsa-decode-backend"].choices
    assert specs["--enable-metrics"].action == "store_true"
    assert specs["--tp-size"].type == "int" and "--tensor-parallel-size" in specs
    parser = wheel_parser("0.5.17", require)
    said = refusal(parser, ["--attention-backend", "dsaa"])
    assert said is not None and "argument --attention-backend: invalid choice: 'dsaa'" in said
    said = refusal(parser, ["--dsa-decode-backend", "x"])
    assert said is not None and "argument --dsa-decode-backend: invalid choice: 'x'" in said


@pytest.mark.parametrize("version", ["0.5.17", "0.5.23"])
def test_the_launchers_parser_reads_the_newer_lines(version, require):
    """The launcher rebuilds SGLang's parser at start to keep its own flags its own: on the newer
    lines (annotated fields; 0.5.23's moved into arg_groups/fields/) it must still find them."""
    from glmserve.launch.sglang_argv import owned_dests

    parser = wheel_parser(version, require)
    dests = owned_dests(parser, LAUNCHER_OWNED_FLAGS)
    assert {"model_path", "tp_size", "host", "port", "nnodes", "node_rank"} <= set(dests)
    assert resolve(parser, "--tensor-parallel") == resolve(parser, "--tp") == "tp_size"
    assert resolve(parser, "--dsa-decode-backend") == "dsa_decode_backend"
    # Choices that 0.5.23 imports from arg_groups/choices.py are followed there.
    assert refusal(parser, ["--attention-backend", "flashinfer"]) is None
    assert "invalid choice" in (refusal(parser, ["--attention-backend", "nope"]) or "")


def test_the_flags_the_launcher_adds_exist(require):
    argv = ["--model-path", "/m", "--tp-size", "8", "--host", "127.0.0.1", "--port", "30000"]
    assert refusal(wheel_parser(PINNED, require), argv) is None


def test_the_multi_node_flags_the_launcher_adds_exist_with_their_types(specs, require):
    """SGLang's own multi-node TP: --nnodes / --node-rank are ints, --dist-init-addr a string."""
    parser = wheel_parser(PINNED, require)
    argv = ["--nnodes", "2", "--node-rank", "1", "--dist-init-addr", "10.0.0.1:5000"]
    assert refusal(parser, argv) is None
    assert specs["--nnodes"].type == "int" and specs["--node-rank"].type == "int"
    assert refusal(parser, ["--nnodes", "two"]) == (
        "args: argument --nnodes: invalid int value: 'two' (test)"
    )


def test_every_alias_of_a_launcher_owned_flag_is_blocked(specs):
    """If SGLang accepted --tp as well as --tp-size, an extra arg could bypass the TP check."""
    for flag in ("--model-path", "--tp-size", "--host", "--port", "--nnodes", "--node-rank",
                 "--dist-init-addr"):  # fmt: skip
        assert set(specs[flag].options) <= set(LAUNCHER_OWNED_FLAGS), specs[flag].options


@pytest.mark.parametrize(
    ("argv", "said"),
    [
        (["--attention-backend", "flashinfr"], "argument --attention-backend: invalid choice"),
        (["--no-such-flag"], "unrecognized arguments: --no-such-flag"),
        (["--enable-metrics=1"], "argument --enable-metrics: ignored explicit argument '1'"),
        (["--port", "x"], "argument --port: invalid int value: 'x'"),
        (["--reasoning-parser", "glm5"], "argument --reasoning-parser: invalid choice: 'glm5'"),
        (["--tool-call-parser", "glm48"], "argument --tool-call-parser: invalid choice"),
        (["--mem-fraction-static", "abc"], "invalid float value: 'abc'"),
        (["--context-length", "abc"], "argument --context-length: Invalid integer value: 'abc'"),
        (["--disable-cuda"], "ambiguous option: --disable-cuda could match"),
        (["--mem-fraction-static", "1.5"], "--mem-fraction-static 1.5 is not a fraction"),
        (["--json-model-override-args", "{x"], "is not a JSON object"),
    ],
)
def test_the_checker_refuses_what_sglang_would(argv, said, require):
    assert said in (refusal(wheel_parser(PINNED, require), argv) or "(accepted)")


def test_values_sglang_takes_pass(require):
    """Its own spellings: SI/IEC suffixes, the `=` form, an abbreviation, a JSON object."""
    argv = ["--context-length=32k", "--mem-fraction-static", "0.88", "--kv-cache-d", "fp8_e4m3",
            "--json-model-override-args", '{"x": 1}', "--cuda-graph-bs", "1", "2", "4"]  # fmt: skip
    assert refusal(wheel_parser(PINNED, require), argv) is None


def test_the_launchers_view_of_the_parser_knows_every_sglang_option(specs):
    """glmserve.launch.sglang_argv rebuilds SGLang's parser: each option (and alias) resolves to
    a dest there, so an abbreviation of any of them is resolved as SGLang resolves it."""
    parser = pinned_sglang_parser()
    unresolved = [option for option in specs if resolve(parser, option) is None]
    assert not unresolved and len(specs) > 300
    assert resolve(parser, "--tp") == resolve(parser, "--tp-s") == resolve(parser, "--tp-size")
    assert resolve(parser, "--no-such-flag") is None


def test_the_prefix_fallback_refuses_no_option_sglang_would_accept(specs):
    """Without a parser (a profile pinned to a line with none stored, and no SGLang here), every
    prefix of a launcher-owned flag is refused. That must never hit an option of SGLang's own:
    none is a prefix of an owned flag or of --config (argparse takes an exact option over an
    abbreviation, so such an option would be legal)."""
    from glmserve.launch.sglang_argv import CONFIG_FLAG

    owned = (*LAUNCHER_OWNED_FLAGS, CONFIG_FLAG)
    for option in specs:
        if option in owned or not option.startswith("--") or len(option) < 4:
            continue
        assert not [f for f in owned if f.startswith(option)], option
