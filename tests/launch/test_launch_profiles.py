"""Profiles are data with a schema: the shipped ones parse, and a malformed one is refused with a
single line naming the file and the problem."""

from __future__ import annotations

import copy
import json
from pathlib import Path

import pytest
from support.launch import PINNED, PROFILE_NAMES, PROFILES_DIR, TINY_MODEL

from glmserve.launch import LaunchError, load_profile, parse_profile_file
from glmserve.launch.profiles import LAUNCHER_OWNED_FLAGS, find_profiles_dir, sglang_versions
from glmserve.sglang_lines import CURRENT_LINE

REQUIRED = {
    "glm5-nvfp4-rtxpro6000-tp8",
    "glm5-nvfp4-b200-tp8",
    "glm5-nvfp4-b200-tp8-dense",
    "tiny-mla",
}


def test_the_required_profiles_ship():
    assert set(PROFILE_NAMES) >= REQUIRED


@pytest.mark.parametrize("name", PROFILE_NAMES)
def test_shipped_profile_parses_and_documents_every_flag(name):
    profile = load_profile(PROFILES_DIR, name)
    # Shipped profiles name no SGLang: their line lists them (glmserve.sglang_lines), the default
    # or the current one, each built by the one Dockerfile.
    assert profile.sglang_version is None and sglang_versions(profile) in (
        (PINNED,),
        (CURRENT_LINE,),
    )
    flags = [a for a in profile.args if a.startswith("--")]
    assert flags and all(profile.notes[f].strip() for f in flags)
    assert all(profile.notes[k].strip() for k in profile.env)
    assert not {a.split("=")[0] for a in profile.args} & set(LAUNCHER_OWNED_FLAGS)


def _pairs(args) -> dict[str, str]:
    """flag -> value ("" for a valueless flag)."""
    out = {}
    for i, token in enumerate(args):
        if token.startswith("--"):
            nxt = args[i + 1] if i + 1 < len(args) else "--"
            out[token] = "" if nxt.startswith("--") else nxt
    return out


GLM_PROFILES = (
    "glm5-nvfp4-rtxpro6000-tp8",
    "glm5-nvfp4-b200-tp8",
    "glm5-nvfp4-b200-tp8-dense",
    "glm5-nvfp4-rtxpro6000-tp8-dsa",
    "glm5-nvfp4-b200-tp8-dsa",
)


@pytest.mark.parametrize("name", GLM_PROFILES)
def test_glm_profiles_carry_the_recipe_flags(name):
    p = load_profile(PROFILES_DIR, name)
    pairs = _pairs(p.args)
    assert pairs["--quantization"] == "modelopt_fp4"
    assert pairs["--kv-cache-dtype"] == "fp8_e4m3"
    # BF16 shared expert beside NVFP4 routed experts (sglang issue 29562).
    assert "--disable-shared-experts-fusion" in p.args
    assert pairs["--reasoning-parser"] == "glm45" and pairs["--tool-call-parser"] == "glm47"
    # Explicit memory split, and a running batch that never outgrows the captured graphs.
    assert 0.8 <= float(pairs["--mem-fraction-static"]) <= 0.9
    assert int(pairs["--max-running-requests"]) == int(pairs["--cuda-graph-max-bs"]) <= 256
    assert "--enable-metrics" in p.args
    assert p.tp == 8 and p.model.quant_algo == "NVFP4"


def test_rtx_profile_is_the_patched_dense_path_for_pcie_boxes():
    rtx = load_profile(PROFILES_DIR, "glm5-nvfp4-rtxpro6000-tp8")
    pairs = _pairs(rtx.args)
    assert pairs["--attention-backend"] == "flashinfer" and rtx.capability_majors == (12,)
    assert "--disable-custom-all-reduce" in rtx.args
    assert int(pairs["--cuda-graph-max-bs"]) <= 64  # 96 GB cards: recipes use 32-64
    assert rtx.env["NCCL_IB_DISABLE"] == "1"
    # Only safe with IOMMU passthrough: documented, never a profile default.
    assert "NCCL_P2P_LEVEL" not in rtx.env


def test_b200_default_is_dsa_and_the_dense_patched_path_is_the_named_ab():
    dsa = load_profile(PROFILES_DIR, "glm5-nvfp4-b200-tp8")
    dense = load_profile(PROFILES_DIR, "glm5-nvfp4-b200-tp8-dense")
    d = _pairs(dsa.args)
    assert d["--attention-backend"] == "nsa"
    assert d["--nsa-prefill-backend"] == d["--nsa-decode-backend"] == "trtllm"
    assert d["--moe-runner-backend"] == "flashinfer_trtllm"
    assert "GLMSERVE_FP8_GATHER" not in dsa.env  # no patched code on this path
    assert _pairs(dense.args)["--attention-backend"] == "flashinfer"
    assert dense.env["GLMSERVE_FP8_GATHER"] == "1"
    assert dsa.capability_majors == dense.capability_majors == (10,)
    # The A/B differs only in attention: same memory, graphs, MoE and parsers.
    attention = {"--attention-backend", "--nsa-prefill-backend", "--nsa-decode-backend"}
    strip = lambda ps: {k: v for k, v in ps.items() if k not in attention}  # noqa: E731
    assert strip(d) == strip(_pairs(dense.args))


def test_tiny_profiles_point_at_the_shipped_model():
    for name in ("tiny-mla", "tiny-mla-78l", "tiny-mla-78l-sglang0.5.17"):
        assert load_profile(PROFILES_DIR, name).model.default_path == TINY_MODEL


def test_the_deep_tiny_profile_differs_only_by_the_layer_override():
    base = load_profile(PROFILES_DIR, "tiny-mla")
    deep = load_profile(PROFILES_DIR, "tiny-mla-78l")
    assert list(deep.args[: len(base.args)]) == list(base.args)
    assert list(deep.args[len(base.args) :]) == [
        "--json-model-override-args",
        '{"num_hidden_layers": 78}',
    ]
    assert deep.env == base.env and deep.model == base.model


GOOD = json.loads((PROFILES_DIR / "tiny-mla.json").read_text())


def _mutate(path: str, value) -> dict:
    raw = copy.deepcopy(GOOD)
    node = raw
    keys = path.split(".")
    for key in keys[:-1]:
        node = node[key]
    if value is KeyError:
        del node[keys[-1]]
    else:
        node[keys[-1]] = value
    return raw


@pytest.mark.parametrize(
    "raw, fragment",
    [
        ([1, 2], "top level must be a JSON object"),
        (_mutate("tp", "1"), "'tp' must be a positive integer"),
        (_mutate("tp", 0), "'tp' must be a positive integer"),
        (_mutate("args", "--load-format dummy"), "'args' must be a list of strings"),
        (_mutate("args", ["--port", "1"]), "which the launcher owns"),
        (_mutate("args", [*GOOD["args"], "--new-flag"]), "no entry in 'notes' for ['--new-flag']"),
        (_mutate("env", {"X": 1}), "'env' must be an object of string to string"),
        (_mutate("schema", 2), "'schema' must be 1"),
        (_mutate("name", "other"), "but the file is named"),
        (_mutate("flags", []), "unknown keys ['flags']"),
        (_mutate("model", KeyError), "missing keys ['model']"),
        (_mutate("model.architectures", []), "'model.architectures' must be a non-empty list"),
        (_mutate("model.quant_algo", 4), "'model.quant_algo' must be a string or null"),
        (_mutate("compute_capability_majors", [12.0]), "'compute_capability_majors'"),
        (_mutate("sglang_version", ""), "'sglang_version' must be a non-empty string"),
    ],
)
def test_malformed_profile_is_one_clear_line(tmp_path: Path, raw, fragment):
    path = tmp_path / "tiny-mla.json"
    path.write_text(json.dumps(raw))
    with pytest.raises(LaunchError) as info:
        parse_profile_file(path)
    message = str(info.value)
    assert "\n" not in message
    assert fragment in message and str(path) in message


def test_a_profile_of_ones_own_may_pin_its_sglang(tmp_path: Path):
    """Shipped profiles are listed by their SGLang line; one written elsewhere (no line lists
    it) names its version itself, or is written for none."""
    for name, pin, versions in (("mine", "0.5.12", ("0.5.12",)), ("orphan", None, ())):
        raw = {**GOOD, "name": name}
        if pin:
            raw["sglang_version"] = pin
        (tmp_path / f"{name}.json").write_text(json.dumps(raw))
        assert sglang_versions(parse_profile_file(tmp_path / f"{name}.json")) == versions


def test_invalid_json_names_the_position(tmp_path: Path):
    path = tmp_path / "x.json"
    path.write_text('{\n  "schema": 1,\n  "name": "x"\n  "tp": 1\n}')
    with pytest.raises(LaunchError, match=r"not valid JSON: line 4 column 3"):
        parse_profile_file(path)


def test_profiles_dir_env_and_explicit_beat_the_checkout(tmp_path: Path):
    assert find_profiles_dir({}, None) == PROFILES_DIR
    assert find_profiles_dir({"GLMSERVE_PROFILES_DIR": str(tmp_path)}, None) == tmp_path
    with pytest.raises(LaunchError, match="no profiles directory"):
        find_profiles_dir({}, str(tmp_path / "missing"))


@pytest.mark.parametrize("gpu", ["rtxpro6000", "b200"])
def test_the_current_line_runs_glm5_on_dsa_and_the_dense_patched_line_is_the_speed_ab(gpu):
    """0.5.17: DSA with native FP8 KV, SGLang's own default for GLM-5 there; the 0.5.12.post1
    dense patched profile of the same box is kept as the named speed A/B, same memory/graphs."""
    dsa = load_profile(PROFILES_DIR, f"glm5-nvfp4-{gpu}-tp8-dsa")
    dense = load_profile(
        PROFILES_DIR, f"glm5-nvfp4-{gpu}-tp8" + ("-dense" if gpu == "b200" else "")
    )
    d, ab = _pairs(dsa.args), _pairs(dense.args)
    assert sglang_versions(dsa) == (CURRENT_LINE,) and sglang_versions(dense) == (PINNED,)
    assert d["--attention-backend"] == "dsa" and ab["--attention-backend"] == "flashinfer"
    want = "flashinfer_sparse_mla" if gpu == "rtxpro6000" else "trtllm"
    assert d["--dsa-prefill-backend"] == d["--dsa-decode-backend"] == want
    assert "GLMSERVE_FP8_GATHER" not in dsa.env and dense.env["GLMSERVE_FP8_GATHER"] == "1"
    assert dsa.capability_majors == dense.capability_majors
    attention = {"--attention-backend", "--dsa-prefill-backend", "--dsa-decode-backend"}
    strip = lambda ps: {k: v for k, v in ps.items() if k not in attention}  # noqa: E731
    assert strip(d) == strip(ab)


def test_the_current_line_s_deep_tiny_profile_is_the_pinned_one_on_0_5_17():
    pinned = load_profile(PROFILES_DIR, "tiny-mla-78l")
    current = load_profile(PROFILES_DIR, f"tiny-mla-78l-sglang{CURRENT_LINE}")
    assert sglang_versions(current) == (CURRENT_LINE,)
    assert current.args == pinned.args and current.env == pinned.env
    assert current.model == pinned.model


def test_the_patched_path_is_the_lines_patched_backends():
    """flashinfer is patched on every line; fa3 only on the lines whose series patches it, so a
    tiny fa3 run counts as patched on the current line and not on the default one."""
    from glmserve.launch.profiles import uses_patched_path
    from glmserve.launch.sglang_argv import server_args

    def patched(argv: list[str], versions: tuple[str, ...] = ()) -> bool:
        return uses_patched_path(server_args(argv, versions), versions)

    fa3 = ["--attention-backend", "fa3"]
    flashinfer = ["--attention-backend", "flashinfer"]
    assert patched(flashinfer, (PINNED,)) and patched(flashinfer)
    assert patched(fa3, (CURRENT_LINE,)) and not patched(fa3, (PINNED,))
    assert not patched(["--attention-backend", "dsa"], (CURRENT_LINE,))
    tiny = load_profile(PROFILES_DIR, f"tiny-mla-78l-sglang{CURRENT_LINE}")
    assert patched([*tiny.args, *fa3], sglang_versions(tiny))


@pytest.mark.parametrize("line", [PINNED, CURRENT_LINE])
def test_the_patch_question_reads_the_argv_as_sglang_does(line):
    """argparse takes any unique prefix and keeps the last occurrence: after
    `--attention-backend flashinfer`, `--attention-back fa3` (or `--decode-attention-b`) is what
    SGLang runs, so the patch and preflight question is decided on that, not on the exact name
    an exact-match reader would find."""
    from glmserve.launch.profiles import decode_attention_backend
    from glmserve.launch.sglang_argv import server_args

    argv = ["--attention-backend", "flashinfer", "--attention-back", "fa3", "--kv-cache-d", "bf16"]
    args = server_args(argv, (line,))
    assert decode_attention_backend(args) == "fa3"
    assert args.get("--kv-cache-dtype") == "bf16"
    args = server_args(["--attention-backend", "fa3", "--decode-attention-b=flashinfer"], (line,))
    assert decode_attention_backend(args) == "flashinfer"
