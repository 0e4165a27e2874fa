"""MTP (speculative decoding from the model's own NextN layer) in the launcher: the MTP profiles
are their base profiles plus the public recipe's four flags; a model dir without the NextN
layer (not declared, or declared without weights) is refused in one line before anything
starts, in the dry run too, and the doctor says the same before `up`; the fit check counts the
draft's weights and KV; the CUDA-graph warning knows SGLang's speculative cap of 48."""

from __future__ import annotations

import json
import shutil
import struct
from pathlib import Path

import pytest
from support.launch import GLM_FIXTURE, PROFILES_DIR, TINY_MODEL
from test_launch_cli import assert_refused, dry

from glmserve.launch import checks, fit, load_profile, speculative
from glmserve.launch.profiles import sglang_versions
from glmserve.launch.sglang_argv import server_args

CONFIG = json.loads((GLM_FIXTURE / "config.json").read_text())
SPEC_FLAGS = {
    "--speculative-algorithm": "EAGLE",
    "--speculative-num-steps": "3",
    "--speculative-eagle-topk": "1",
    "--speculative-num-draft-tokens": "4",
}
SPEC_ARGV = [token for pair in SPEC_FLAGS.items() for token in pair]
DENSE_FP8 = ["--kv-cache-dtype", "fp8_e4m3", "--attention-backend", "flashinfer"]
# MTP profile -> the profile it adds MTP to (same line, same box, same attention).
MTP_PROFILES = {
    "glm5-nvfp4-rtxpro6000-tp8-mtp": "glm5-nvfp4-rtxpro6000-tp8",
    "glm5-nvfp4-b200-tp8-dense-mtp": "glm5-nvfp4-b200-tp8-dense",
    "glm5-nvfp4-b200-tp8-mtp": "glm5-nvfp4-b200-tp8",
    "glm5-nvfp4-rtxpro6000-tp8-dsa-mtp": "glm5-nvfp4-rtxpro6000-tp8-dsa",
    "glm5-nvfp4-b200-tp8-dsa-mtp": "glm5-nvfp4-b200-tp8-dsa",
}
RTX_MTP = "glm5-nvfp4-rtxpro6000-tp8-mtp"
NOT_DECLARED = "the model has no NextN layer"
NO_WEIGHTS = "exported without its MTP layer"


def _pairs(args) -> dict[str, str]:
    out = {}
    for i, token in enumerate(args):
        if token.startswith("--"):
            nxt = args[i + 1] if i + 1 < len(args) else "--"
            out[token] = "" if nxt.startswith("--") else nxt
    return out


def model_dir(tmp_path: Path, drop: bool = False, **config) -> Path:
    """A copy of the GLM-5-NVFP4 fixture with config.json changed (None deletes a key)."""
    target = tmp_path / "model"
    shutil.copytree(GLM_FIXTURE, target)
    raw = {**CONFIG, **config}
    raw = {k: v for k, v in raw.items() if v is not None}
    (target / "config.json").write_text(json.dumps(raw))
    return target


def with_index(directory: Path, layers: range) -> Path:
    """A shard index naming one weight of each layer in `layers` (no shards needed: the
    launcher reads the names only)."""
    weight_map = {f"model.layers.{i}.self_attn.kv_a_proj_with_mqa.weight": "s.safetensors"
                  for i in layers}  # fmt: skip
    weight_map["model.embed_tokens.weight"] = "s.safetensors"
    (directory / speculative.INDEX_FILE).write_text(json.dumps({"weight_map": weight_map}))
    return directory


def with_single_file(directory: Path, names: list[str]) -> Path:
    header = json.dumps({n: {"dtype": "BF16", "shape": [1], "data_offsets": [0, 2]}
                         for n in names}).encode()  # fmt: skip
    (directory / speculative.SINGLE_FILE).write_bytes(struct.pack("<Q", len(header)) + header)
    return directory


# ---------------------------------------------------------------- the profiles


@pytest.mark.parametrize(("mtp", "base"), MTP_PROFILES.items())
def test_an_mtp_profile_is_its_base_plus_the_recipe_flags(mtp, base):
    """Same line, model, box and attention as the profile it adds MTP to; only the four
    speculative flags, and (documented per profile) the memory split and graph size, differ."""
    p, b = load_profile(PROFILES_DIR, mtp), load_profile(PROFILES_DIR, base)
    assert sglang_versions(p) == sglang_versions(b)
    assert (p.tp, p.model, p.env, p.capability_majors) == (
        b.tp,
        b.model,
        b.env,
        b.capability_majors,
    )
    pairs, base_pairs = _pairs(p.args), _pairs(b.args)
    assert {k: pairs[k] for k in SPEC_FLAGS} == SPEC_FLAGS
    tuned = {"--mem-fraction-static", "--cuda-graph-max-bs", "--max-running-requests"}
    same = {k: v for k, v in pairs.items() if k not in {*SPEC_FLAGS, *tuned}}
    assert same == {k: v for k, v in base_pairs.items() if k not in tuned}
    # The batch never outgrows the graphs, and is set (SGLang would cap MTP at 48 otherwise).
    assert pairs["--max-running-requests"] == pairs["--cuda-graph-max-bs"] == "64"
    assert (
        0.8 <= float(pairs["--mem-fraction-static"]) <= float(base_pairs["--mem-fraction-static"])
    )
    spec = speculative.from_args(server_args(p.args, sglang_versions(p)))
    assert spec is not None and spec.uses_nextn_layer and spec.tokens_per_verify == 4


def test_the_speculative_flags_are_read_as_sglangs_parser_reads_them():
    """Prefixes, `=` forms, the draft path's alias and the last occurrence, as argparse
    resolves them for SGLang: what the launcher checks and sizes is what SGLang runs."""
    spec = speculative.from_args(server_args(["--speculative-algo=nextn", "--speculative-num-st",
                                              "3", "--speculative-eagle-topk", "1",
                                              "--speculative-num-steps=5"]))  # fmt: skip
    assert spec is not None and spec.algorithm == "NEXTN" and spec.tokens_per_verify == 6
    draft = server_args([*SPEC_ARGV, "--speculative-draft-model", "/drafts/eagle3"])
    assert not speculative.from_args(draft).uses_nextn_layer
    assert speculative.from_args(server_args(["--speculative-num-steps", "3"])) is None
    assert speculative.max_running_requests(server_args(SPEC_ARGV)) == 48
    assert speculative.max_running_requests(server_args([*SPEC_ARGV, "--max-running-r=8"])) == 8
    override = server_args(["--json-model-override=" + json.dumps({"num_nextn_predict_layers": 1})])
    assert speculative.effective_config({"num_nextn_predict_layers": 0}, override) == {
        "num_nextn_predict_layers": 1
    }


def test_the_notes_name_the_public_sources_of_the_speculative_flags():
    for name in MTP_PROFILES:
        notes = load_profile(PROFILES_DIR, name).notes
        assert "InferenceX" in notes["--speculative-algorithm"]
        assert "rtx6kpro" in notes["--speculative-algorithm"]
        assert "48" in notes["--max-running-requests"]
    dense = load_profile(PROFILES_DIR, RTX_MTP).notes["--speculative-eagle-topk"]
    assert "only supports topk=1" in dense  # SGLang's flashinfer MLA backend, quoted


# ---------------------------------------------------------------- the NextN layer


@pytest.mark.parametrize(
    ("config", "fragment"),
    [
        ({"num_nextn_predict_layers": None}, "num_nextn_predict_layers is missing"),
        ({"num_nextn_predict_layers": 0}, "num_nextn_predict_layers is 0"),
    ],
)
def test_a_model_without_a_nextn_layer_is_refused_by_the_dry_run(launch, tmp_path, config,
                                                                 fragment):  # fmt: skip
    model = model_dir(tmp_path, **config)
    outcome = launch(["--dry-run", "--profile", RTX_MTP, "--model-path", str(model)])
    assert_refused(outcome, f"profile '{RTX_MTP}' asks for MTP", fragment, NOT_DECLARED,
                   "docs/deploy.md")  # fmt: skip
    assert "Traceback" not in outcome.err


def test_the_same_model_serves_the_profile_without_mtp(launch, tmp_path):
    model = model_dir(tmp_path, num_nextn_predict_layers=None)
    report = dry(launch, ["--profile", "glm5-nvfp4-rtxpro6000-tp8", "--model-path", str(model)])
    assert report["profile"] == "glm5-nvfp4-rtxpro6000-tp8"


def test_a_declared_layer_without_weights_is_refused(launch, tmp_path):
    """lukealonso/GLM-5-NVFP4 and Mapika/GLM-5.2-NVFP4 declare the layer but ship no layer-78
    weights: SGLang would draft from random weights without a word."""
    model = with_index(model_dir(tmp_path), range(78))
    outcome = launch(["--dry-run", "--profile", RTX_MTP, "--model-path", str(model)])
    assert_refused(outcome, NO_WEIGHTS, "model.safetensors.index.json", "layer 78",
                   "model.layers.78.*")  # fmt: skip


def test_a_checkpoint_that_carries_layer_78_passes(launch, tmp_path):
    model = with_index(model_dir(tmp_path), range(79))
    report = dry(launch, ["--profile", RTX_MTP, "--model-path", str(model)])
    assert report["argv"][report["argv"].index("--speculative-algorithm") + 1] == "EAGLE"


def test_a_single_file_checkpoint_is_read_from_its_header(tmp_path):
    profile = load_profile(PROFILES_DIR, RTX_MTP)
    without = with_single_file(model_dir(tmp_path), ["model.layers.77.mlp.gate.weight"])
    with pytest.raises(checks.LaunchError, match=r"model\.safetensors holds no weight of layer 78"):
        checks.check_model(profile, without)
    with_single_file(without, ["model.layers.78.eh_proj.weight"])
    assert checks.check_model(profile, without)["num_nextn_predict_layers"] == 1


def test_mtp_asked_in_the_extra_args_is_checked_too(launch, tmp_path):
    model = model_dir(tmp_path, num_nextn_predict_layers=None)
    extra = ["--speculative-algorithm", "NEXTN", "--speculative-num-steps", "3"]
    outcome = launch(["--dry-run", "--profile", "glm5-nvfp4-rtxpro6000-tp8",
                      "--model-path", str(model), "--", *extra])  # fmt: skip
    assert_refused(outcome, "--speculative-algorithm NEXTN", NOT_DECLARED)
    env = {"GLMSERVE_EXTRA_ARGS": json.dumps(extra)}
    outcome = launch(["--dry-run", "--profile", "glm5-nvfp4-rtxpro6000-tp8",
                      "--model-path", str(model)], env=env)  # fmt: skip
    assert_refused(outcome, NOT_DECLARED)


def test_a_separate_draft_model_is_not_the_nextn_layer(launch, tmp_path):
    model = model_dir(tmp_path, num_nextn_predict_layers=None)
    extra = ["--speculative-draft-model-path", "/drafts/glm5-eagle3"]
    report = dry(launch, ["--profile", RTX_MTP, "--model-path", str(model), "--", *extra])
    assert report["profile"] == RTX_MTP


def test_the_override_args_give_the_tiny_model_its_layer_and_dummy_weights_need_none(launch):
    """The bench's tiny model gets num_nextn_predict_layers from --json-model-override-args
    (as SGLang applies it) and has no weights to look in (--load-format dummy)."""
    outcome = launch(["--dry-run", "--profile", "tiny-mla-78l", "--", *SPEC_ARGV])
    assert_refused(outcome, NOT_DECLARED, str(TINY_MODEL))
    override = ["--json-model-override-args",
                '{"num_hidden_layers": 78, "num_nextn_predict_layers": 1}']  # fmt: skip
    report = dry(launch, ["--profile", "tiny-mla-78l", "--", *SPEC_ARGV, *override])
    assert report["profile"] == "tiny-mla-78l"


def test_the_doctor_names_it_before_up(capsys, tmp_path):
    from glmserve.doctor.__main__ import main

    model = with_index(model_dir(tmp_path), range(78))
    environ = {"MODEL_DIR": str(model), "GLMSERVE_PROFILE": RTX_MTP,
               "GRAFANA_ADMIN_PASSWORD": "x", "COMPOSE_PROFILES": "gpu"}  # fmt: skip
    repo = Path(__file__).resolve().parents[2]
    rc = main(["--project-dir", str(repo)], environ, lambda _gpu: ([], []))
    (line,) = capsys.readouterr().err.splitlines()
    assert rc == 1
    assert line.startswith("glmserve.doctor: MODEL_DIR: glmserve.launch: error: profile ")
    assert NO_WEIGHTS in line


# ---------------------------------------------------------------- memory and batch


def test_the_draft_is_one_bf16_moe_layer_and_one_layer_of_kv():
    """GLM-5's NextN layer: 256 experts x 3 x 6144 x 2048 in BF16 is 19.3 GB (the MTP shard
    the community restored is about 19 GB), 2.4 GB per GPU at TP8, plus attention and eh_proj;
    its KV is one 576-wide FP8 row per pool token."""
    argv = [*DENSE_FP8, *SPEC_ARGV]
    weights, kv = fit.draft_bytes(CONFIG, server_args(argv), tp=8, kv_pool_tokens=500_000)
    assert 2.4e9 < weights < 2.7e9, weights / 1e9
    assert kv == 500_000 * 576
    dsa = server_args([*argv, "--attention-backend", "dsa"], ("0.5.17",))
    assert fit.draft_bytes(CONFIG, dsa, tp=8, kv_pool_tokens=1)[1] == 656 + 132
    no_mtp = server_args(DENSE_FP8)
    assert fit.draft_bytes(CONFIG, no_mtp, tp=8, kv_pool_tokens=1) == (0, 0)


def test_the_dsa_row_is_counted_under_its_new_name_too():
    assert fit.kv_bytes_per_token(CONFIG, "fp8_e4m3", "dsa") == 78 * (656 + 132)


def test_sglangs_default_fraction_reserves_4_gb_for_an_eagle_draft():
    memory = 183_359 * fit.MIB
    plain = fit.default_mem_fraction(memory, 8, server_args([]))
    mtp = fit.default_mem_fraction(memory, 8, server_args(["--speculative-algorithm", "EAGLE"]))
    assert mtp == round(plain - 4096 / 183_359, 3)


@pytest.mark.parametrize("name", MTP_PROFILES)
def test_every_mtp_profile_fits_its_box_with_the_draft(launch, name):
    (version,) = sglang_versions(load_profile(PROFILES_DIR, name))
    report = dry(launch, ["--profile", name, "--model-path", str(GLM_FIXTURE)], version=version)
    f = report["fit"]
    assert f["fits"] and 2.3 < f["draft_weights_per_gpu_gib"] < 2.6
    assert f["draft_weights_per_gpu_gib"] + f["draft_kv_gib"] < f["headroom_gib"]


def test_a_draft_that_does_not_fit_the_headroom_is_refused(launch):
    outcome = launch(["--dry-run", "--profile", RTX_MTP, "--model-path", str(GLM_FIXTURE),
                      "--", "--mem-fraction-static", "0.975"])  # fmt: skip
    assert_refused(outcome, "the MTP draft needs", "outside --mem-fraction-static 0.975",
                   "lower the fraction or turn MTP off")  # fmt: skip


def test_the_profiles_without_mtp_report_their_fit_as_before(launch):
    report = dry(launch, ["--profile", "glm5-nvfp4-rtxpro6000-tp8", "--model-path",
                          str(GLM_FIXTURE)])  # fmt: skip
    assert "draft_weights_per_gpu_gib" not in report["fit"]


def test_the_graph_warning_knows_sglangs_speculative_cap():
    spec = ["--speculative-algorithm", "EAGLE"]
    warning = checks.cuda_graph_warning(server_args([*spec, "--cuda-graph-max-bs", "32"]))
    assert warning is not None and "lets SGLang run 48 requests" in warning
    assert checks.cuda_graph_warning(server_args([*spec, "--cuda-graph-max-bs", "48"])) is None
    # A --max-running-requests given (abbreviated too) is the argv's, not SGLang's default.
    given = server_args([*spec, "--cuda-graph-max-bs", "32", "--max-running-req", "40"])
    assert "--max-running-requests 40 allows more" in checks.cuda_graph_warning(given)
    # Without MTP an unset --max-running-requests is sized from the pool, as before.
    plain = server_args(["--cuda-graph-max-bs", "32"])
    assert "sizes it from the KV pool" in checks.cuda_graph_warning(plain)


def test_the_self_test_times_the_verify_pass_under_mtp_only():
    """Under MTP the native kernel serves target verify too: the self-test times both paths on
    the verify pass's query tokens (num_steps + 1 at topk 1); without MTP it times none."""
    config = {"num_attention_heads": 64}
    mtp = load_profile(PROFILES_DIR, RTX_MTP)
    env = checks.decode_timing_env(server_args(mtp.args, sglang_versions(mtp)), config, 8)
    assert env["GLMSERVE_SELFTEST_VERIFY_TOKENS"] == "4"
    assert env["GLMSERVE_SELFTEST_HEADS"] == "8"
    plain = load_profile(PROFILES_DIR, MTP_PROFILES[RTX_MTP])
    plain_env = checks.decode_timing_env(server_args(plain.args, sglang_versions(plain)), config, 8)
    assert "GLMSERVE_SELFTEST_VERIFY_TOKENS" not in plain_env
