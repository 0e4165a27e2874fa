"""The launcher end to end with an injected host: what it execs, and every input it refuses.

Rule under test throughout: a refusal is exactly one line on stderr, a non-zero exit, no
self-test run, no build-info file and no exec.
"""

from __future__ import annotations

import json
import sys
from pathlib import Path

import pytest
from support.launch import (
    B200,
    GLM_FIXTURE,
    H200,
    PINNED,
    PROFILE_NAMES,
    PROFILES_DIR,
    RTX,
    TINY_MODEL,
    gpus_like,
    model_fixture,
    pinned_sglang_parser,
)

from glmserve import buildinfo
from glmserve.launch import load_profile
from glmserve.launch.inventory import Gpu
from glmserve.launch.profiles import sglang_versions

RTX_PROFILE = "glm5-nvfp4-rtxpro6000-tp8"
B200_PROFILE = "glm5-nvfp4-b200-tp8"
B200_DENSE = "glm5-nvfp4-b200-tp8-dense"
GLM_ARGS = ["--model-path", str(GLM_FIXTURE)]


def assert_refused(outcome, *fragments: str) -> None:
    lines = outcome.err.splitlines()
    assert outcome.code == 2, outcome.err
    assert len(lines) == 1, f"expected one error line, got: {outcome.err!r}"
    assert lines[0].startswith("glmserve.launch: error: ")
    for fragment in fragments:
        assert fragment in lines[0], lines[0]
    assert outcome.rec.execs == [] and outcome.rec.selftests == 0


def dry(launch, argv, **kw):
    outcome = launch(["--dry-run", *argv], **kw)
    assert outcome.code == 0, outcome.err
    return json.loads(outcome.out)


# ---------------------------------------------------------------- dry-run: the argv per profile


def test_dry_run_rtx_profile_argv_is_exactly_launcher_inputs_then_profile_flags(launch):
    report = dry(launch, ["--profile", RTX_PROFILE, *GLM_ARGS])
    assert report["argv"] == [
        sys.executable,
        "-m",
        "sglang.launch_server",
        "--model-path",
        str(GLM_FIXTURE),
        "--tp-size",
        "8",
        "--host",
        "127.0.0.1",
        "--port",
        "30000",
        "--quantization",
        "modelopt_fp4",
        "--kv-cache-dtype",
        "fp8_e4m3",
        "--attention-backend",
        "flashinfer",
        "--disable-shared-experts-fusion",
        "--disable-custom-all-reduce",
        "--cuda-graph-max-bs",
        "64",
        "--max-running-requests",
        "64",
        "--mem-fraction-static",
        "0.85",
        "--reasoning-parser",
        "glm45",
        "--tool-call-parser",
        "glm47",
        "--enable-metrics",
    ]
    assert report["env"]["FLASHINFER_CUDA_ARCH_LIST"] == "12.0f"
    assert report["env_sources"]["FLASHINFER_CUDA_ARCH_LIST"] == "profile"
    assert report["sglang"]["version"] == PINNED and report["sglang"]["fp8_gather"] == "on"
    assert report["sglang"]["patch_in_use"] is True
    assert report["warnings"] == []  # running requests capped at the captured graph size
    assert "not probed" in report["gpus"]


def test_dry_run_b200_default_is_dsa_and_does_not_claim_the_patch(launch):
    report = dry(launch, ["--profile", B200_PROFILE, *GLM_ARGS])
    argv = report["argv"]
    assert "--disable-custom-all-reduce" not in argv  # NVLink: custom all-reduce is the fast path
    assert argv[argv.index("--quantization") + 1] == "modelopt_fp4"
    assert argv[argv.index("--kv-cache-dtype") + 1] == "fp8_e4m3"
    assert argv[argv.index("--attention-backend") + 1] == "nsa"
    assert argv[argv.index("--nsa-prefill-backend") + 1] == "trtllm"
    assert argv[argv.index("--nsa-decode-backend") + 1] == "trtllm"
    assert argv[argv.index("--moe-runner-backend") + 1] == "flashinfer_trtllm"
    assert "--enable-metrics" in argv
    assert report["env"]["FLASHINFER_CUDA_ARCH_LIST"] == "10.0a"
    assert report["sglang"]["patch_in_use"] is False
    assert report["sglang"]["attention_backend"] == "nsa"
    assert report["sglang"]["fp8_gather"] == "n/a"


def test_dry_run_b200_dense_ab_profile_runs_the_patched_path(launch):
    report = dry(launch, ["--profile", B200_DENSE, *GLM_ARGS])
    argv = report["argv"]
    assert argv[argv.index("--attention-backend") + 1] == "flashinfer"
    assert "--nsa-decode-backend" not in argv
    assert report["sglang"]["patch_in_use"] is True and report["sglang"]["fp8_gather"] == "on"


@pytest.mark.parametrize("marker", [None, {"series": "0.5.12", "sglang_version": "0.5.12"}])
def test_dsa_profile_serves_without_the_patch_and_records_that(launch, base_env, marker):
    """DSA reads FP8 natively: no marker, preflight or self-test is needed, and the build info
    must not claim a patched path (no fp8_gather, attention backend nsa)."""
    outcome = launch(
        ["--profile", B200_PROFILE, *GLM_ARGS],
        gpus=gpus_like(B200, 8),
        marker=marker,
        preflight=["would fail if it ran"],
        selftest=("failed", "would fail if it ran"),
    )
    assert outcome.code == 0, outcome.err
    assert outcome.rec.selftests == 0 and len(outcome.rec.execs) == 1
    assert "self-test not run: attention backend nsa" in outcome.err
    info = buildinfo.read_build_info(base_env["GLMSERVE_BUILD_INFO"])
    assert info["fp8_gather"] == "" and info["attention_backend"] == "nsa"
    assert info["patch_series"] == ("" if marker is None else "0.5.12")


def test_extra_args_moving_a_patched_profile_off_flashinfer_drop_the_patch_checks(launch):
    report = dry(
        launch, ["--profile", "tiny-mla", "--", "--attention-backend", "triton"], marker=None
    )
    assert report["sglang"]["patch_in_use"] is False
    assert report["sglang"]["attention_backend"] == "triton"


@pytest.mark.parametrize("profile", ["tiny-mla", "tiny-mla-78l"])
def test_dry_run_tiny_profiles_default_to_the_shipped_model(launch, profile):
    report = dry(launch, ["--profile", profile])
    argv = report["argv"]
    assert report["model_path"] == str(TINY_MODEL)
    assert argv[argv.index("--load-format") + 1] == "dummy"
    assert argv[argv.index("--tp-size") + 1] == "1"
    if profile == "tiny-mla-78l":
        override = json.loads(argv[argv.index("--json-model-override-args") + 1])
        assert override == {"num_hidden_layers": 78}
    else:
        assert "--json-model-override-args" not in argv


@pytest.mark.parametrize("profile", PROFILE_NAMES)
def test_every_profile_dry_runs_against_its_model(launch, profile):
    """The image check runs exactly this for every profile; it must pass for all of them."""
    model = [] if profile.startswith("tiny") else ["--model-path", str(model_fixture(profile))]
    if load_profile(PROFILES_DIR, profile).nodes > 1:  # refuses to plan without its rank
        model = [*model, "--node-rank", "0", "--dist-init-addr", "10.0.0.1:5000"]
    (version,) = sglang_versions(load_profile(PROFILES_DIR, profile))  # the image of its line
    report = dry(launch, ["--profile", profile, *model], version=version)
    assert report["profile"] == profile
    assert report["argv"][1:3] == ["-m", "sglang.launch_server"]
    assert report["sglang"]["version"] == version


def test_inputs_come_from_env_and_cli_wins(launch):
    env = {
        "GLMSERVE_PROFILE": RTX_PROFILE,
        "GLMSERVE_MODEL_PATH": str(GLM_FIXTURE),
        "GLMSERVE_TP": "16",
        "GLMSERVE_HOST": "0.0.0.0",
        "GLMSERVE_PORT": "31000",
    }
    report = dry(launch, ["--port", "32000"], env=env)
    argv = report["argv"]
    assert argv[argv.index("--tp-size") + 1] == "16"
    assert argv[argv.index("--host") + 1] == "0.0.0.0"
    assert argv[argv.index("--port") + 1] == "32000"


def test_environment_overrides_profile_env_and_says_so(launch):
    report = dry(
        launch,
        ["--profile", RTX_PROFILE, *GLM_ARGS],
        env={"FLASHINFER_CUDA_ARCH_LIST": "12.0f 10.0a", "GLMSERVE_FP8_GATHER": "0"},
    )
    assert report["env"]["FLASHINFER_CUDA_ARCH_LIST"] == "12.0f 10.0a"
    assert report["env_sources"]["FLASHINFER_CUDA_ARCH_LIST"] == "environment"
    assert report["sglang"]["fp8_gather"] == "off"


def test_dry_run_does_not_echo_unrelated_environment(launch):
    report = dry(launch, ["--profile", "tiny-mla"], env={"HF_TOKEN": "hf_secret"})
    assert "hf_secret" not in json.dumps(report)


# ---------------------------------------------------------------- extra args: a list, intact

JSON_ARG = '{"num_hidden_layers": 78, "note": "a b  c", "nested": {"k": [1, 2]}}'


def test_json_extra_arg_after_double_dash_survives_intact(launch):
    report = dry(
        launch,
        [
            "--profile",
            "tiny-mla",
            "--",
            "--json-model-override-args",
            JSON_ARG,
            "--log-level",
            "debug",
        ],
    )
    argv = report["argv"]
    assert argv[-4:] == ["--json-model-override-args", JSON_ARG, "--log-level", "debug"]
    assert json.loads(argv[-3]) == json.loads(JSON_ARG)


def test_json_extra_arg_from_env_array_survives_intact_and_precedes_cli(launch):
    env = {"GLMSERVE_EXTRA_ARGS": json.dumps(["--json-model-override-args", JSON_ARG])}
    report = dry(launch, ["--profile", "tiny-mla", "--", "--cuda-graph-max-bs", "1"], env=env)
    argv = report["argv"]
    assert argv[-4:] == ["--json-model-override-args", JSON_ARG, "--cuda-graph-max-bs", "1"]
    # Extra args come after the profile's, so SGLang's argparse keeps the user's value.
    assert argv.index("--cuda-graph-max-bs") < len(argv) - 2
    assert argv[-1] == "1"


@pytest.mark.parametrize(
    "raw, fragment",
    [
        ("--mem-fraction-static 0.8", "must be a JSON array"),
        ('{"a": 1}', "not dict"),
        ('["--x", 3]', "entry 1 is 3, not a string"),
    ],
)
def test_bad_extra_args_env_is_refused(launch, raw, fragment):
    outcome = launch(["--profile", "tiny-mla"], env={"GLMSERVE_EXTRA_ARGS": raw})
    assert_refused(outcome, "GLMSERVE_EXTRA_ARGS", fragment)


@pytest.mark.parametrize(
    "flag",
    ["--tp-size", "--port", "--model-path", "--host=0.0.0.0", "--tp-s", "--model-pa", "--hos=::"],
)
def test_extra_args_may_not_set_launcher_owned_flags(launch, flag):
    outcome = launch(["--profile", "tiny-mla", "--", flag, "4"])
    assert_refused(outcome, flag.split("=")[0], "set by the launcher")


# ---------------------------------------------------------------- refusals from the issue


def test_wrong_tp_for_gpu_count(launch):
    outcome = launch(["--profile", RTX_PROFILE, *GLM_ARGS], gpus=gpus_like(RTX, 4))
    assert_refused(outcome, "TP 8 needs 8 visible GPUs but 4 are visible")


def test_tp_override_is_checked_against_gpus(launch):
    outcome = launch(["--profile", "tiny-mla", "--tp", "2"], gpus=gpus_like(H200, 1))
    assert_refused(outcome, "TP 2 needs 2 visible GPUs but 1 are visible")


@pytest.mark.parametrize("bad", ["0", "eight", "-1"])
def test_bad_tp_value(launch, bad):
    outcome = launch(["--profile", "tiny-mla", "--tp", bad])
    assert_refused(outcome, "TP must be")


def test_non_blackwell_arch_is_refused_without_override(launch):
    outcome = launch(["--profile", RTX_PROFILE, *GLM_ARGS], gpus=gpus_like(H200, 8))
    assert_refused(outcome, "compute capability 9.0", "12.x", "--allow-any-arch")


def test_sm100_gpus_do_not_satisfy_the_sm120_profile(launch):
    outcome = launch(["--profile", RTX_PROFILE, *GLM_ARGS], gpus=gpus_like(B200, 8))
    assert_refused(outcome, "compute capability 10.0")


@pytest.mark.parametrize("how", ["cli", "env"])
def test_arch_override_lets_it_start(launch, how):
    argv = ["--profile", RTX_PROFILE, *GLM_ARGS]
    env = {}
    if how == "cli":
        argv.append("--allow-any-arch")
    else:
        env["GLMSERVE_ALLOW_ANY_ARCH"] = "1"
    outcome = launch(argv, gpus=gpus_like(H200, 8), env=env)
    assert outcome.code == 0, outcome.err
    assert len(outcome.rec.execs) == 1


def test_missing_model_dir(launch, tmp_path):
    outcome = launch(["--profile", RTX_PROFILE, "--model-path", str(tmp_path / "nope")])
    assert_refused(outcome, "does not exist")


def test_model_dir_without_config_json(launch, tmp_path):
    outcome = launch(["--profile", RTX_PROFILE, "--model-path", str(tmp_path)])
    assert_refused(outcome, "has no config.json")


def test_glm_profile_needs_a_model_path(launch):
    outcome = launch(["--profile", RTX_PROFILE])
    assert_refused(outcome, "no default model", "--model-path")


def test_architecture_mismatch(launch):
    # The tiny DeepseekV3 model handed to a GLM-5 profile.
    outcome = launch(["--profile", RTX_PROFILE, "--model-path", str(TINY_MODEL)])
    assert_refused(outcome, "DeepseekV3ForCausalLM", "GlmMoeDsaForCausalLM")


def _copy_glm(tmp_path: Path, **changes) -> Path:
    model = tmp_path / "model"
    model.mkdir()
    config = json.loads((GLM_FIXTURE / "config.json").read_text())
    for key, value in changes.items():
        if value is None:
            config.pop(key, None)
        else:
            config[key] = value
    (model / "config.json").write_text(json.dumps(config))
    return model


def test_unquantized_glm_model_is_refused_by_the_nvfp4_profile(launch, tmp_path):
    model = _copy_glm(tmp_path, quantization_config=None)
    outcome = launch(["--profile", RTX_PROFILE, "--model-path", str(model)])
    assert_refused(outcome, "quant_algo none", "needs NVFP4")


def test_fp8_glm_model_is_refused_by_the_nvfp4_profile(launch, tmp_path):
    model = _copy_glm(tmp_path, quantization_config={"quant_method": "fp8"})
    outcome = launch(["--profile", RTX_PROFILE, "--model-path", str(model)])
    assert_refused(outcome, "quant_algo fp8", "needs NVFP4")


def test_nvfp4_found_in_hf_quant_config_json_alone(launch, tmp_path):
    """SGLang falls back to hf_quant_config.json when config.json has no quantization_config."""
    model = _copy_glm(tmp_path, quantization_config=None)
    (model / "hf_quant_config.json").write_text(
        json.dumps({"quantization": {"quant_algo": "NVFP4"}})
    )
    dry(launch, ["--profile", RTX_PROFILE, "--model-path", str(model)])


def test_mla_geometry_mismatch(launch, tmp_path):
    model = _copy_glm(tmp_path, kv_lora_rank=256)
    outcome = launch(["--profile", RTX_PROFILE, "--model-path", str(model)])
    assert_refused(outcome, "kv_lora_rank=256", "kv_lora_rank=512")


def test_sglang_not_installed(launch):
    outcome = launch(["--profile", "tiny-mla"], site=None)
    assert_refused(outcome, "SGLang is not installed")


def test_wrong_sglang_version(launch):
    outcome = launch(["--profile", "tiny-mla"], version="0.5.23")
    assert_refused(outcome, "installed SGLang is 0.5.23", PINNED)


def test_unpatched_sglang(launch):
    outcome = launch(["--profile", "tiny-mla"], marker=None)
    assert_refused(outcome, "is not patched", "patches/apply.py --target")


def test_marker_from_another_sglang_version(launch):
    outcome = launch(
        ["--profile", "tiny-mla"], marker={"series": "0.5.12", "sglang_version": "0.5.12"}
    )
    assert_refused(outcome, "written for SGLang 0.5.12", "re-apply")


def test_failed_preflight_is_refused(launch):
    problems = ["decode path still casts the full pool", "gather module missing"]
    outcome = launch(["--profile", "tiny-mla"], preflight=problems)
    assert_refused(outcome, "fails the preflight: decode path still casts the full pool", "1 more")


def test_unwritable_jit_cache_dir(launch, tmp_path):
    blocker = tmp_path / "file-not-dir"
    blocker.write_text("")
    outcome = launch(["--profile", "tiny-mla"], env={"FLASHINFER_WORKSPACE_BASE": str(blocker)})
    assert_refused(outcome, "FlashInfer JIT cache dir", "not writable")


def test_bad_fp8_gather_switch(launch):
    outcome = launch(["--profile", "tiny-mla"], env={"GLMSERVE_FP8_GATHER": "yes"})
    assert_refused(outcome, "GLMSERVE_FP8_GATHER")


def test_unknown_profile_lists_the_available_ones(launch):
    outcome = launch(["--profile", "glm5-h100"])
    assert_refused(outcome, "unknown profile 'glm5-h100'", *PROFILE_NAMES)


def test_no_profile_lists_the_available_ones(launch):
    outcome = launch(["--dry-run"])
    assert_refused(outcome, "no profile given", "tiny-mla")


def test_unknown_launcher_option_is_one_line(launch):
    outcome = launch(["--profile", "tiny-mla", "--tp-size", "8"])
    assert_refused(outcome, "unrecognized arguments: --tp-size 8")


def test_malformed_profile_file(launch, tmp_path):
    (tmp_path / "broken.json").write_text('{"schema": 1, "name": "broken",')
    outcome = launch(["--profile", "broken", "--profiles-dir", str(tmp_path)])
    assert_refused(outcome, "not valid JSON", "broken.json")


# ---------------------------------------------------------------- the start sequence


def test_start_runs_selftest_writes_build_info_then_execs(launch, base_env):
    outcome = launch(["--profile", RTX_PROFILE, *GLM_ARGS])
    assert outcome.code == 0, outcome.err
    assert outcome.rec.selftests == 1
    [(file, argv, env)] = outcome.rec.execs
    # The self-test sees the environment the server gets (it reads GLMSERVE_FP8_GATHER).
    assert outcome.rec.selftest_env == env
    assert file == sys.executable and argv[0] == sys.executable
    assert argv[1:3] == ["-m", "sglang.launch_server"]
    assert env["FLASHINFER_CUDA_ARCH_LIST"] == "12.0f" and env["HOME"] == base_env["HOME"]
    info = buildinfo.read_build_info(base_env["GLMSERVE_BUILD_INFO"])
    assert info == {
        "sglang_version": PINNED,
        "patch_series": PINNED,
        "patch_lock_sha256": "ab" * 32,
        "fp8_gather": "on",
        "fp8_attention": "native",
        "fp8_attention_requested": "auto",
        "fp8_attention_why": "default (not timed)",
        "fp8_attention_timing": "",
        "attention_backend": "flashinfer",
        "patch_in_use": "yes",
        "speculative_algorithm": "",
        "speculative_num_draft_tokens": "",
        "source": "launcher",
    }


def test_native_decode_failing_its_self_test_serves_on_the_proven_gather_path(launch, base_env):
    """The gather checks passed, the native kernel's did not: serve with
    GLMSERVE_FP8_ATTENTION=gather (not refuse), say so, and record it."""
    outcome = launch(
        ["--profile", RTX_PROFILE, *GLM_ARGS],
        selftest=("passed", "bit-identical", "failed: native FP8 decode is WRONG: row error"),
    )
    assert outcome.code == 0, outcome.err
    [(_file, _argv, env)] = outcome.rec.execs
    assert env["GLMSERVE_FP8_ATTENTION"] == "gather"
    assert "native FP8 decode self-test failed: native FP8 decode is WRONG" in outcome.err
    assert "serving with GLMSERVE_FP8_ATTENTION=gather instead" in outcome.err
    info = buildinfo.read_build_info(base_env["GLMSERVE_BUILD_INFO"])
    assert info["fp8_attention"] == "gather"


def test_native_decode_passing_its_self_test_keeps_the_chosen_mode(launch):
    outcome = launch(
        ["--profile", RTX_PROFILE, *GLM_ARGS], selftest=("passed", "ok", "passed: 4 cases")
    )
    [(_file, _argv, env)] = outcome.rec.execs
    assert "GLMSERVE_FP8_ATTENTION" not in env or env["GLMSERVE_FP8_ATTENTION"] == "native"
    assert "native FP8 decode self-test passed: 4 cases" in outcome.err


TIMED = {"heads": 8, "context": 2048, "batches": [1, 64], "native_us": [10.0, 66.0],
         "gather_us": [17.0, 155.0], "faster": "native"}  # fmt: skip


@pytest.mark.parametrize(
    ("request_env", "timing", "native", "chosen", "why"),
    [
        # auto (unset): the self-test's faster path serves, with the µs in the why
        ({}, TIMED, "passed: ok", "native", "faster on this GPU: native 76.0 µs vs gather 172.0"),
        ({}, {**TIMED, "faster": "gather"}, "passed: ok", "gather", "faster on this GPU"),
        ({"GLMSERVE_FP8_ATTENTION": ""}, {**TIMED, "faster": "gather"}, "passed: ok", "gather",
         "faster on this GPU"),
        # pinned: honoured whatever the timing says
        ({"GLMSERVE_FP8_ATTENTION": "native"}, {**TIMED, "faster": "gather"}, "passed: ok",
         "native", "pinned by GLMSERVE_FP8_ATTENTION=native"),
        ({"GLMSERVE_FP8_ATTENTION": "gather"}, TIMED, "passed: ok", "gather",
         "pinned by GLMSERVE_FP8_ATTENTION=gather"),
        # a failed native check beats a pin to native
        ({"GLMSERVE_FP8_ATTENTION": "native"}, {}, "failed: WRONG", "gather",
         "native FP8 decode failed its self-test"),
        # timing that failed leaves native (the default) serving, and says why
        ({}, {"error": "OutOfMemoryError: x"}, "passed: ok", "native",
         "default (the paths could not be timed: OutOfMemoryError: x)"),
    ],
)  # fmt: skip
def test_the_box_serves_the_faster_fp8_decode_path_unless_pinned(
    launch, base_env, request_env, timing, native, chosen, why
):
    outcome = launch(
        ["--profile", RTX_PROFILE, *GLM_ARGS], env=request_env,
        selftest=("passed", "ok", native, timing),
    )  # fmt: skip
    assert outcome.code == 0, outcome.err
    [(_file, _argv, env)] = outcome.rec.execs
    assert env["GLMSERVE_FP8_ATTENTION"] == chosen
    info = buildinfo.read_build_info(base_env["GLMSERVE_BUILD_INFO"])
    assert info["fp8_attention"] == chosen
    assert why in info["fp8_attention_why"], info["fp8_attention_why"]
    raw = request_env.get("GLMSERVE_FP8_ATTENTION", "")
    assert info["fp8_attention_requested"] == (raw or "auto")
    assert json.loads(info["fp8_attention_timing"] or "{}") == timing
    # What the self-test timed: GLM-5's 64 heads over TP8, and the server's decode batches.
    assert outcome.rec.selftest_env["GLMSERVE_SELFTEST_HEADS"] == "8"
    assert outcome.rec.selftest_env["GLMSERVE_SELFTEST_DECODE_BATCHES"].startswith("1,")


def test_unknown_fp8_attention_mode_is_refused_before_anything_starts(launch):
    outcome = launch(["--profile", RTX_PROFILE, *GLM_ARGS], env={"GLMSERVE_FP8_ATTENTION": "fast"})
    assert_refused(outcome, "GLMSERVE_FP8_ATTENTION='fast' must be native")
    assert outcome.rec.selftests == 0 and outcome.rec.execs == []


def test_build_info_records_the_upstream_path_when_gather_is_off(launch, base_env):
    outcome = launch(["--profile", "tiny-mla"], env={"GLMSERVE_FP8_GATHER": "0"}, gpus=[H200])
    assert outcome.code == 0, outcome.err
    assert buildinfo.read_build_info(base_env["GLMSERVE_BUILD_INFO"])["fp8_gather"] == "off"


def test_a_gpu_without_hardware_e4m3_serves_the_upstream_cast_and_says_so(launch, base_env):
    """The patched SGLang turns the gather off by itself below compute capability 8.9; the
    launcher says so in one line and records what runs, and the self-test (which skips there)
    does not stop the start."""
    a100 = Gpu(index=0, name="NVIDIA A100-SXM4-80GB", capability=(8, 0))
    outcome = launch(
        ["--profile", "tiny-mla", "--allow-any-arch"],
        gpus=[a100],
        selftest=("skipped", "compute capability 8.0 has no hardware FP8 e4m3 convert"),
    )
    assert outcome.code == 0, outcome.err
    [line] = [x for x in outcome.err.splitlines() if "FP8 KV gather off" in x]
    assert line == (
        "glmserve.launch: FP8 KV gather off on GPU 0 (NVIDIA A100-SXM4-80GB): compute capability "
        "8.0 has no hardware FP8 e4m3 convert (needs 8.9): the patched SGLang turns the gather "
        "off and runs the upstream full-pool cast"
    )
    assert buildinfo.read_build_info(base_env["GLMSERVE_BUILD_INFO"])["fp8_gather"] == "off"
    assert len(outcome.rec.execs) == 1
    ada = Gpu(index=0, name="NVIDIA L40S", capability=(8, 9))
    outcome = launch(["--profile", "tiny-mla", "--allow-any-arch"], gpus=[ada])
    assert "FP8 KV gather off" not in outcome.err
    assert buildinfo.read_build_info(base_env["GLMSERVE_BUILD_INFO"])["fp8_gather"] == "on"


def test_failed_selftest_refuses_to_serve(launch, base_env):
    outcome = launch(
        ["--profile", RTX_PROFILE, *GLM_ARGS], selftest=("failed", "row 17 differs from .to()")
    )
    assert outcome.code == 2
    assert outcome.err.splitlines()[-1].startswith(
        "glmserve.launch: error: kernel self-test failed"
    )
    assert "row 17 differs" in outcome.err and "--skip-selftest" in outcome.err
    assert outcome.rec.execs == []
    assert not Path(base_env["GLMSERVE_BUILD_INFO"]).exists()


@pytest.mark.parametrize("how", ["cli", "env"])
def test_selftest_override_serves_without_running_it(launch, how):
    argv = ["--profile", RTX_PROFILE, *GLM_ARGS]
    env = {}
    if how == "cli":
        argv.append("--skip-selftest")
    else:
        env["GLMSERVE_SKIP_SELFTEST"] = "1"
    outcome = launch(argv, env=env, selftest=("failed", "would fail"))
    assert outcome.code == 0, outcome.err
    assert outcome.rec.selftests == 0 and len(outcome.rec.execs) == 1
    assert "skipped by override" in outcome.err


def test_skipped_selftest_is_not_a_failure(launch):
    outcome = launch(["--profile", RTX_PROFILE, *GLM_ARGS], selftest=("skipped", "no CUDA"))
    assert outcome.code == 0 and len(outcome.rec.execs) == 1


def test_check_mode_probes_gpus_but_starts_nothing(launch):
    ok = launch(["--check", "--profile", "tiny-mla"], gpus=[H200])
    assert ok.code == 0, ok.err
    assert "NVIDIA H200" in json.loads(ok.out)["gpus"]
    assert ok.rec.execs == [] and ok.rec.selftests == 0
    bad = launch(["--check", "--profile", "tiny-mla"], gpus=[])
    assert_refused(bad, "TP 1 needs 1 visible GPUs but 0 are visible")


def test_unwritable_build_info_is_refused_before_the_selftest(launch, tmp_path):
    blocker = tmp_path / "blocker"
    blocker.write_text("")
    env = {"GLMSERVE_BUILD_INFO": str(blocker / "build-info.json")}
    outcome = launch(["--profile", RTX_PROFILE, *GLM_ARGS], env=env)
    assert_refused(outcome, "build-info directory")


def test_list_profiles(launch):
    outcome = launch(["--list-profiles"])
    assert outcome.code == 0
    assert [line.split("\t")[0] for line in outcome.out.splitlines()] == PROFILE_NAMES


# ---------------------------------------------------------------- host driver (cu130 image)


@pytest.mark.parametrize("mode", [["--check"], []])
def test_a_driver_too_old_for_the_cuda_runtime_is_refused_before_counting_gpus(launch, mode):
    outcome = launch([*mode, "--profile", RTX_PROFILE, *GLM_ARGS], driver="570.172.08", gpus=[])
    assert_refused(outcome, "driver 570.172.08 is too old", "CUDA 13.0", "580.65.06", "R580+")


@pytest.mark.parametrize("driver", ["580.65.06", "580.95.05", "590.48.01"])
def test_an_r580_driver_passes(launch, driver):
    outcome = launch(["--check", "--profile", RTX_PROFILE, *GLM_ARGS], driver=driver)
    assert outcome.code == 0, outcome.err


def test_unknown_driver_or_cuda_is_not_guessed(launch):
    for kw in ({"driver": None}, {"cuda": None}):
        outcome = launch(["--check", "--profile", RTX_PROFILE, *GLM_ARGS], **kw)
        assert outcome.code == 0, outcome.err


# ---------------------------------------------------------------- CUDA graphs vs running batch


def test_a_batch_that_can_outgrow_the_cuda_graphs_is_warned_about(launch):
    """The H200 run: --cuda-graph-max-bs 16 with SGLang's pool-sized running limit let 16 load
    streams + the canary decode eagerly. The dry run and the start both say so."""
    argv = ["--profile", RTX_PROFILE, *GLM_ARGS, "--", "--cuda-graph-max-bs", "16"]
    report = dry(launch, argv)
    [warning] = report["warnings"]
    assert "captured up to batch 16" in warning and "--max-running-requests 64" in warning
    assert "canary" in warning
    started = launch(argv)
    assert started.code == 0
    assert "glmserve.launch: warning: decode CUDA graphs are captured up to batch 16" in started.err


@pytest.mark.parametrize(
    "extra, warned",
    [
        ([], False),  # the profile's own 64/64
        (["--max-running-requests", "32"], False),
        (["--max-running-requests", "65"], True),
        (["--disable-cuda-graph"], False),
    ],
)
def test_cuda_graph_warning_follows_the_final_argv(launch, extra, warned):
    report = dry(launch, ["--profile", RTX_PROFILE, *GLM_ARGS, "--", *extra])
    assert bool(report["warnings"]) is warned, report["warnings"]


# ---------------------------------------------------------------- refusals under compose (hold)


def _host_for_main(base_env, extra_env, waits):
    from glmserve.launch import Host

    return Host(
        environ={**base_env, **extra_env},
        sglang_site=lambda: Path("/fake/site-packages"),
        detect_version=lambda _site: PINNED,
        read_marker=lambda _site: {
            "series": PINNED,
            "sglang_version": PINNED,
            "lock_sha256": "ab" * 32,
        },
        preflight=lambda _site: [],
        sglang_parser=pinned_sglang_parser,
        gpus=lambda _env: gpus_like(RTX, 8),
        driver_version=lambda: "580.95.05",
        cuda_version=lambda _env: "13.0",
        run_selftest=lambda _env: ("passed", "ok", "", {}),
        execvpe=lambda *_a: None,
        wait_for_stop=lambda: waits.append(1),
        clock=lambda: 1700000000.0,
    )


def test_under_compose_a_refusal_is_recorded_and_waits_instead_of_restarting(base_env, capsys):
    """GLMSERVE_HOLD_ON_ERROR=1 (compose): the one line, a record the exporter shows, and a wait
    for docker stop; without it, the plain exit."""
    from glmserve.launch import main

    waits: list[int] = []
    host = _host_for_main(base_env, {"GLMSERVE_HOLD_ON_ERROR": "1"}, waits)
    assert main(["--profile", "glm5-h100"], host) == 2
    err = capsys.readouterr().err.splitlines()
    assert err[0].startswith("glmserve.launch: error: unknown profile 'glm5-h100'")
    assert "waiting, not restarting" in err[1] and waits == [1]
    record = buildinfo.read_launch_error(base_env["GLMSERVE_BUILD_INFO"])
    assert record == {
        "error": err[0].removeprefix("glmserve.launch: error: "),
        "time": "1700000000",
    }
    # A start that passes its checks clears it.
    assert main(["--profile", RTX_PROFILE, *GLM_ARGS], host) == 0
    assert buildinfo.read_launch_error(base_env["GLMSERVE_BUILD_INFO"]) is None
    # Without the switch (a plain `docker run`, the smoke test): exit, no record, no wait.
    waits.clear()
    assert main(["--profile", "glm5-h100"], _host_for_main(base_env, {}, waits)) == 2
    assert waits == [] and buildinfo.read_launch_error(base_env["GLMSERVE_BUILD_INFO"]) is None
    # One-off commands answer and exit even with it (`docker compose run --rm sglang --check`).
    assert main(["--check", "--profile", "glm5-h100"], host) == 2
    assert waits == [] and buildinfo.read_launch_error(base_env["GLMSERVE_BUILD_INFO"]) is None


@pytest.mark.parametrize(
    ("profile", "version"),
    [("glm5-nvfp4-rtxpro6000-tp8-dsa", PINNED), (RTX_PROFILE, "0.5.17")],
)
def test_a_profile_of_another_line_is_refused_in_one_line(launch, profile, version):
    """The 0.5.17 DSA profiles need the 0.5.17 image and the patched dense ones 0.5.12.post1's."""
    outcome = launch(["--dry-run", "--profile", profile, *GLM_ARGS], version=version)
    assert_refused(outcome, f"installed SGLang is {version}", f"profile '{profile}'")


def test_the_current_line_s_dsa_profiles_do_not_use_the_patch(launch):
    for profile in ("glm5-nvfp4-rtxpro6000-tp8-dsa", "glm5-nvfp4-b200-tp8-dsa"):
        report = dry(launch, ["--profile", profile, *GLM_ARGS], version="0.5.17", marker=None)
        assert report["sglang"]["patch_in_use"] is False
        assert report["sglang"]["attention_backend"] == "dsa"


def test_fa3_is_a_patched_path_from_0_5_17_on(launch):
    """0.5.17's series also patches FlashAttention's MLA path (SGLang's SM90 default): a tiny
    MLA run moved onto fa3 keeps the patch checks there, and drops them on 0.5.12.post1."""
    for profile, version, patched in (
        ("tiny-mla-78l-sglang0.5.17", "0.5.17", True),
        ("tiny-mla-78l", PINNED, False),
    ):
        argv = ["--profile", profile, "--", "--attention-backend", "fa3"]
        report = dry(launch, argv, version=version, marker="good" if patched else None)
        assert report["sglang"]["patch_in_use"] is patched, version
        assert report["sglang"]["attention_backend"] == "fa3"


def test_a_fa3_start_on_0_5_17_records_the_gather_path_and_the_patch_in_use(launch, base_env):
    """fa3's MLA path always gathers through its page table; build info says which line, which
    backend, that the patch is in use, and that decode gathers (whatever native mode was asked)."""
    argv = ["--profile", "tiny-mla-78l-sglang0.5.17", "--", "--attention-backend", "fa3"]
    outcome = launch(argv, version="0.5.17", gpus=gpus_like(H200, 1))
    assert outcome.code == 0, outcome.err
    info = buildinfo.read_build_info(base_env["GLMSERVE_BUILD_INFO"])
    assert info["sglang_version"] == info["patch_series"] == "0.5.17"
    assert (info["attention_backend"], info["patch_in_use"]) == ("fa3", "yes")
    assert (info["fp8_gather"], info["fp8_attention"]) == ("on", "gather")
    assert info["fp8_attention_why"].startswith("fa3 MLA path")


def test_a_dsa_start_on_0_5_17_records_the_patch_not_in_use(launch, base_env):
    outcome = launch(
        ["--profile", "glm5-nvfp4-rtxpro6000-tp8-dsa", *GLM_ARGS], version="0.5.17", marker=None
    )
    assert outcome.code == 0, outcome.err
    assert outcome.rec.selftests == 0
    info = buildinfo.read_build_info(base_env["GLMSERVE_BUILD_INFO"])
    assert (info["attention_backend"], info["patch_in_use"], info["fp8_gather"]) == (
        "dsa",
        "no",
        "",
    )
