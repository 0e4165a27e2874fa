"""GLM-5.1 and GLM-5.2 checkpoints: which profile serves which, each refusal in one line, and
the patched path held to the MLA geometry its kernels are built for (512 + 64).

The GLM-5.2 fixture (tests/fixtures/glm52-nvfp4) is nvidia/GLM-5.2-NVFP4's config as public
sources give it (its README cites each field); GLM-5.1's config equals GLM-5's but for the
transformers version it records, so the GLM-5 fixture stands for it."""

from __future__ import annotations

import json
import shutil
from pathlib import Path

import pytest
from support.launch import B200, GLM52_FIXTURE, GLM_FIXTURE, PROFILES_DIR, RTX, gpus_like

from glmserve.launch import load_profile
from glmserve.launch.profiles import sglang_versions

GLM52_RTX = "glm52-nvfp4-rtxpro6000-tp8"
GLM52_B200 = "glm52-nvfp4-b200-tp8-dsa"


def dry(launch, argv, **kw):
    outcome = launch(["--dry-run", *argv], **kw)
    return outcome, (json.loads(outcome.out) if outcome.code == 0 else None)


def one_line_refusal(outcome) -> str:
    lines = outcome.err.splitlines()
    assert outcome.code == 2 and len(lines) == 1, outcome.err
    assert outcome.rec.execs == [] and outcome.rec.selftests == 0
    return lines[0]


def version_of(profile: str) -> str:
    (version,) = sglang_versions(load_profile(PROFILES_DIR, profile))
    return version


def test_glm52_fixture_is_the_indexshare_checkpoint() -> None:
    config = json.loads((GLM52_FIXTURE / "config.json").read_text())
    types = config["indexer_types"]
    assert len(types) == config["num_hidden_layers"] == 78
    assert types.count("full") == 21 and types[:7] == ["full"] * 3 + ["shared"] * 3 + ["full"]
    assert (config["kv_lora_rank"], config["qk_rope_head_dim"]) == (512, 64)
    assert config["quantization_config"]["quant_algo"] == "NVFP4"


@pytest.mark.parametrize(
    ("profile", "gpu", "patched"), [(GLM52_RTX, RTX, True), (GLM52_B200, B200, False)]
)
def test_dry_run_accepts_glm52_with_its_profiles(launch, profile, gpu, patched) -> None:
    """The bar: the launcher's dry run accepts the GLM-5.2-NVFP4 config with the new profiles,
    on the SGLang line each is written for, and says whether the patch runs."""
    outcome, report = dry(
        launch, ["--profile", profile, "--model-path", str(GLM52_FIXTURE)],
        version=version_of(profile), gpus=gpus_like(gpu, 8),
    )  # fmt: skip
    assert outcome.code == 0, outcome.err
    assert report["sglang"]["patch_in_use"] is patched
    assert report["fit"]["fits"], report["fit"]
    argv = report["argv"]
    assert argv[argv.index("--model-path") + 1] == str(GLM52_FIXTURE)


def test_glm52_profile_refuses_a_glm5_checkpoint_and_names_the_one_to_use(launch) -> None:
    line = one_line_refusal(
        launch(["--dry-run", "--profile", GLM52_RTX, "--model-path", str(GLM_FIXTURE)])
    )
    assert "index_topk_freq=None" in line and "needs index_topk_freq=4" in line
    assert "glm5-nvfp4-rtxpro6000-tp8" in line


def test_glm5_dsa_profile_of_the_old_line_refuses_glm52(launch) -> None:
    """0.5.12.post1's DSA does not read index_skip_topk_offset: GLM-5.2 there would share top-k
    over the wrong layers, so its GLM-5 DSA profiles refuse the checkpoint."""
    for profile in ("glm5-nvfp4-b200-tp8", "glm5-nvfp4-b200-tp4", "glm5-nvfp4-b200-tp8-mtp"):
        argv = ["--dry-run", "--profile", profile, "--model-path", str(GLM52_FIXTURE)]
        line = one_line_refusal(launch(argv, gpus=gpus_like(B200, 8)))
        assert "index_skip_topk_offset=3" in line and "glm52-nvfp4-b200-tp8-dsa" in line


def test_glm51_is_served_by_the_glm5_profiles(launch, tmp_path: Path) -> None:
    """GLM-5.1's config is GLM-5's (78 layers, 256 experts, MLA 512 + 64, DSA top-2048, no
    IndexShare): every GLM-5 profile takes it."""
    glm51 = tmp_path / "glm51"
    shutil.copytree(GLM_FIXTURE, glm51)
    config = json.loads((glm51 / "config.json").read_text())
    config["transformers_version"] = "5.4.0"
    (glm51 / "config.json").write_text(json.dumps(config))
    for profile in ("glm5-nvfp4-rtxpro6000-tp8", "glm5-nvfp4-b200-tp8", "glm5-nvfp4-b200-tp8-dsa"):
        outcome, _ = dry(launch, ["--profile", profile, "--model-path", str(glm51)],
                         version=version_of(profile))  # fmt: skip
        assert outcome.code == 0, (profile, outcome.err)


@pytest.mark.parametrize(
    ("field", "value", "fragment"),
    [
        ("kv_lora_rank", 256, "kv_lora_rank=256"),
        ("architectures", ["DeepseekV3ForCausalLM"], "is DeepseekV3ForCausalLM"),
        ("quantization_config", {"quant_method": "fp8"}, "has quant_algo fp8"),
    ],
)
def test_mismatched_checkpoint_is_refused_in_one_line(launch, tmp_path, field, value, fragment):
    bad = tmp_path / "model"
    shutil.copytree(GLM52_FIXTURE, bad)
    config = json.loads((bad / "config.json").read_text())
    config[field] = value
    (bad / "config.json").write_text(json.dumps(config))
    line = one_line_refusal(launch(["--dry-run", "--profile", GLM52_RTX, "--model-path", str(bad)]))
    assert fragment in line, line


def test_patched_path_refuses_an_mla_width_its_kernels_were_not_built_for(launch, tmp_path):
    """Whatever the profile expects, the patched backend only runs 512 + 64 latent rows: a
    profile of one's own without that check is refused too, and the same model on an
    untouched backend is not."""
    own = tmp_path / "profiles"
    shutil.copytree(PROFILES_DIR, own)
    raw = json.loads((own / f"{GLM52_RTX}.json").read_text())
    raw["model"]["expect"] = {}
    (own / f"{GLM52_RTX}.json").write_text(json.dumps(raw))
    model = tmp_path / "model"
    shutil.copytree(GLM52_FIXTURE, model)
    config = json.loads((model / "config.json").read_text())
    config["qk_rope_head_dim"] = 128
    (model / "config.json").write_text(json.dumps(config))
    argv = ["--dry-run", "--profile", GLM52_RTX, "--model-path", str(model)]
    env = {"GLMSERVE_PROFILES_DIR": str(own)}
    line = one_line_refusal(launch(argv, env=env))
    assert "kv_lora_rank 512 + qk_rope_head_dim 64" in line and "512 + 128" in line
    outcome = launch([*argv, "--", "--attention-backend", "triton"], env=env, marker=None)
    assert outcome.code == 0, outcome.err
