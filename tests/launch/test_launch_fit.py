"""Fit and multi-node: the launcher sizes GLM-5-NVFP4 from its config.json and refuses a server
that cannot hold its weights plus one full-length request's KV, or a multi-node start that is
missing its rank or address, or whose nodes x GPUs do not make its TP."""

from __future__ import annotations

import json

import pytest
from support.launch import B200, GLM_FIXTURE, RTX, gpus_like
from test_launch_cli import assert_refused, dry

from glmserve.launch import Gpu, fit, parse_profile_file
from glmserve.launch.errors import LaunchError
from glmserve.launch.inventory import parse_nvidia_smi
from glmserve.launch.sglang_argv import server_args

CONFIG = json.loads((GLM_FIXTURE / "config.json").read_text())
GLM_ARGS = ["--model-path", str(GLM_FIXTURE)]
B200_TP4 = "glm5-nvfp4-b200-tp4"
RTX_TP8 = "glm5-nvfp4-rtxpro6000-tp8"
TWO_NODE = "glm5-nvfp4-rtxpro6000-2node-tp8"
NODE0 = ["--node-rank", "0", "--dist-init-addr", "10.0.0.1:5000"]
DENSE_FP8 = ["--kv-cache-dtype", "fp8_e4m3", "--attention-backend", "flashinfer"]


def with_memory(gpus: list[Gpu], mib: int) -> list[Gpu]:
    return [Gpu(g.index, g.name, g.capability, memory_mib=mib) for g in gpus]


# ---------------------------------------------------------------- the arithmetic


def test_the_weight_count_matches_the_published_model_size():
    """744B parameters (model card); the community TP8 recipe saw about 57 GB per GPU."""
    split, repeated = fit.weight_bytes(CONFIG, quantized_experts=True)
    params_split, params_rep = fit.weight_bytes(CONFIG, quantized_experts=False)
    params = (params_split + params_rep) / fit.BF16_BYTES
    assert 735e9 < params < 750e9, params / 1e9
    per_gpu_tp8 = split / 8 + repeated
    assert 55e9 < per_gpu_tp8 < 62e9, per_gpu_tp8 / 1e9


def test_mla_kv_is_one_576_wide_row_per_layer_on_every_rank():
    assert fit.kv_bytes_per_token(CONFIG, "fp8_e4m3", "flashinfer") == 78 * 576
    assert fit.kv_bytes_per_token(CONFIG, "auto", "flashinfer") == 78 * 576 * 2
    assert fit.kv_bytes_per_token(CONFIG, "fp8_e4m3", "nsa") == 78 * (656 + 132)


def test_sglangs_default_mem_fraction_is_reproduced():
    """server_args._handle_gpu_memory_settings on a >160 GB GPU at TP4: 512 + 16384 x 1.5 +
    512 x 2 + 4/8 x 1024 = 26,624 MB reserved."""
    memory = 183_359 * fit.MIB
    none = server_args([])
    assert fit.default_mem_fraction(memory, 4, none) == round((183_359 - 26_624) / 183_359, 3)
    # An explicit chunk / graph size in the argv is what SGLang would use instead.
    smaller = fit.default_mem_fraction(memory, 4, server_args(["--cuda-graph-max-bs", "64"]))
    assert smaller > fit.default_mem_fraction(memory, 4, none)


def test_the_fit_reads_values_as_sglangs_parser_keeps_them():
    """The last occurrence, the `=` form and an abbreviation all count, as argparse counts them
    (an exact-name reader once sized the pool from the first or missed the abbreviated one)."""
    argv = ["--mem-fraction-static", "0.8", "--kv-cache-dtype", "fp8_e4m3",
            "--mem-fraction-stat=0.7", "--kv-cache-d", "bf16", "--context-len", "32k"]  # fmt: skip
    result = fit.compute_fit(CONFIG, quant_algo="NVFP4", tp=8, gpu_memory=179 * fit.GIB,
                             args=server_args(argv))  # fmt: skip
    assert result.mem_fraction_static == 0.7 and result.fraction_source == "argv"
    assert result.kv_bytes_per_token == 78 * 576 * 2  # bf16 won
    assert result.min_kv_tokens == 32_000


@pytest.mark.parametrize("fraction", ["1.5", "0", "-0.2"])
def test_an_impossible_fraction_never_fits(fraction):
    """A fraction over 1 once read as 2,088,905 KV tokens that "fit"."""
    result = fit.compute_fit(CONFIG, quant_algo="NVFP4", tp=8, gpu_memory=179 * fit.GIB,
                             args=server_args(["--mem-fraction-static", fraction]))  # fmt: skip
    with pytest.raises(LaunchError, match=r"is not a fraction of GPU memory, in \(0, 1\]$"):
        fit.check_fit(result, B200_TP4, "here")


def test_two_tp4_replicas_fit_8x_b200_with_room_for_kv():
    result = fit.compute_fit(CONFIG, quant_algo="NVFP4", tp=4, gpu_memory=179 * fit.GIB,
                             args=server_args(DENSE_FP8))  # fmt: skip
    assert result.fits
    assert result.kv_pool_tokens > 5 * result.min_kv_tokens  # > five 202,752-token requests


def test_tp4_does_not_fit_rtx_pro_6000():
    result = fit.compute_fit(CONFIG, quant_algo="NVFP4", tp=4, gpu_memory=95 * fit.GIB,
                             args=server_args(DENSE_FP8))  # fmt: skip
    assert not result.fits and result.kv_pool_tokens == 0


# ---------------------------------------------------------------- through the launcher


def test_the_data_parallel_replica_profile_dry_runs_and_reports_its_fit(launch):
    report = dry(launch, ["--profile", B200_TP4, *GLM_ARGS])
    assert report["tp"] == 4
    assert report["fit"]["fits"] is True
    assert report["fit"]["weights_per_gpu_gib"] == pytest.approx(106, abs=3)


def test_a_tp_that_does_not_fit_is_refused_before_anything_starts(launch):
    outcome = launch(["--dry-run", "--profile", RTX_TP8, *GLM_ARGS, "--tp", "4"])
    assert_refused(outcome, "does not fit", "weights alone need", "GiB per GPU at TP 4")


def test_too_little_kv_headroom_is_refused(launch):
    """The weights fit, but the pool would not hold one request of the model's context."""
    outcome = launch(["--dry-run", "--profile", B200_TP4, *GLM_ARGS, "--",
                      "--mem-fraction-static", "0.62"])  # fmt: skip
    assert_refused(outcome, "KV pool holds", "less than one 202,752-token request",
                   "--mem-fraction-static 0.62")  # fmt: skip


def test_a_shorter_context_makes_the_same_memory_enough(launch):
    argv = ["--dry-run", "--profile", B200_TP4, *GLM_ARGS, "--", "--mem-fraction-static", "0.62"]
    report = dry(launch, [*argv[1:], "--context-length", "32768"])
    assert report["fit"]["fits"] and report["fit"]["min_kv_tokens"] == 32768


def test_probed_gpu_memory_wins_over_the_profiles_nominal(launch):
    """--check uses the GPUs it finds: the same TP8 profile fits 96 GB cards, not 48 GB ones."""
    big = launch(["--check", "--profile", RTX_TP8, *GLM_ARGS],
                 gpus=with_memory(gpus_like(RTX, 8), 97_887))  # fmt: skip
    assert big.code == 0, big.err
    assert json.loads(big.out)["fit"]["gpu_memory_gib"] == pytest.approx(95.6, abs=0.1)
    small = launch(["--check", "--profile", RTX_TP8, *GLM_ARGS],
                   gpus=with_memory(gpus_like(RTX, 8), 49_152))  # fmt: skip
    assert_refused(small, "does not fit the GPUs here (48.0 GiB each)")


def test_profiles_without_a_gpu_memory_skip_the_fit(launch):
    report = dry(launch, ["--profile", "tiny-mla"])
    assert report["fit"] is None


def test_nvidia_smi_memory_is_read_when_present():
    gpus = parse_nvidia_smi("0, GPU-a, NVIDIA B200, 10.0, 183359\n1, GPU-b, NVIDIA B200, 10.0\n")
    assert [g.memory_mib for g in gpus] == [183359, None]
    assert gpus[0].capability == (10, 0)


# ---------------------------------------------------------------- multi-node


def test_two_node_profile_adds_sglangs_multi_node_flags(launch):
    report = dry(launch, ["--profile", TWO_NODE, *GLM_ARGS, "--node-rank", "1",
                          "--dist-init-addr", "10.0.0.1:5000"])  # fmt: skip
    argv = report["argv"]
    assert report["nnodes"] == 2 and report["tp"] == 8
    i = argv.index("--nnodes")
    assert argv[i : i + 6] == ["--nnodes", "2", "--node-rank", "1", "--dist-init-addr",
                               "10.0.0.1:5000"]  # fmt: skip
    assert report["fit"]["fits"]  # TP8 over two 4-GPU boxes: the point of the profile


def test_multi_node_inputs_come_from_the_environment_too(launch):
    env = {"GLMSERVE_NODE_RANK": "0", "GLMSERVE_DIST_INIT_ADDR": "head:25000"}
    report = dry(launch, ["--profile", TWO_NODE, *GLM_ARGS], env=env)
    assert report["argv"][report["argv"].index("--dist-init-addr") + 1] == "head:25000"


@pytest.mark.parametrize(
    ("extra", "fragment"),
    [
        (["--dist-init-addr", "10.0.0.1:5000"], "needs this node's rank: --node-rank"),
        (["--node-rank", "0"], "needs rank 0's address: --dist-init-addr HOST:PORT"),
        (["--node-rank", "2", "--dist-init-addr", "h:1"], "node rank must be between 0 and 1"),
        (["--node-rank", "0", "--dist-init-addr", "10.0.0.1"], "must be HOST:PORT"),
        ([*NODE0, "--tp", "6", "--nnodes", "4"], "TP 6 does not split evenly over 4 nodes"),
    ],
)
def test_multi_node_refusals_are_one_line(launch, extra, fragment):
    assert_refused(launch(["--dry-run", "--profile", TWO_NODE, *GLM_ARGS, *extra]), fragment)


def test_rank_and_address_are_refused_for_a_one_node_profile(launch):
    outcome = launch(["--dry-run", "--profile", RTX_TP8, *GLM_ARGS, *NODE0])
    assert_refused(outcome, "for a server that spans several nodes")


@pytest.mark.parametrize("visible", [2, 8])
def test_nodes_times_visible_gpus_must_make_the_tp(launch, visible):
    outcome = launch(["--check", "--profile", TWO_NODE, *GLM_ARGS, *NODE0],
                     gpus=gpus_like(RTX, visible))  # fmt: skip
    assert_refused(outcome, f"runs 4 GPUs on each node, but {visible} are visible here",
                   f"2 x {visible} = {2 * visible} != TP 8")  # fmt: skip


def test_each_node_checks_its_own_four_gpus(launch):
    outcome = launch(["--check", "--profile", TWO_NODE, *GLM_ARGS, *NODE0],
                     gpus=with_memory(gpus_like(RTX, 4), 97_887))  # fmt: skip
    assert outcome.code == 0, outcome.err
    assert json.loads(outcome.out)["gpus"].count("RTX PRO 6000") == 4


def test_the_multi_node_arch_check_still_applies(launch):
    outcome = launch(["--check", "--profile", TWO_NODE, *GLM_ARGS, *NODE0],
                     gpus=gpus_like(B200, 4))  # fmt: skip
    assert_refused(outcome, "compute capability 10.0")


@pytest.mark.parametrize(
    "flag", ["--nnodes", "--node-rank", "--dist-init-addr", "--nccl-init-addr"]
)
def test_extra_args_may_not_set_the_multi_node_flags(launch, flag):
    outcome = launch(["--dry-run", "--profile", TWO_NODE, *GLM_ARGS, *NODE0, "--", flag, "1"])
    assert_refused(outcome, f"extra SGLang arg {flag} is set by the launcher itself")


def test_a_profile_whose_tp_does_not_split_over_its_nodes_is_malformed(tmp_path):
    raw = json.loads((GLM_FIXTURE.parents[2] / "deploy/profiles" / f"{TWO_NODE}.json")
                     .read_text())  # fmt: skip
    raw.update(name="bad", tp=6, nodes=4)
    path = tmp_path / "bad.json"
    path.write_text(json.dumps(raw))
    with pytest.raises(Exception, match="does not split evenly over 4 nodes"):
        parse_profile_file(path)
