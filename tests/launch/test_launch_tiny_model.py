"""The tiny MLA smoke-test model: the committed files are exactly what generate.py writes, and the
tokenizer is a well-formed `tokenizers` WordLevel model covering every id the model can emit."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

from support.launch import TINY_MODEL

FILES = ("config.json", "tokenizer.json", "tokenizer_config.json")


def test_committed_files_match_the_generator(tmp_path: Path):
    subprocess.run(
        [sys.executable, str(TINY_MODEL / "generate.py"), str(tmp_path)],
        check=True,
        capture_output=True,
    )
    for name in FILES:
        assert (tmp_path / name).read_bytes() == (TINY_MODEL / name).read_bytes(), (
            f"{name} is stale: run python3 deploy/models/tiny-mla/generate.py"
        )


def test_config_has_the_glm5_mla_geometry():
    config = json.loads((TINY_MODEL / "config.json").read_text())
    assert config["architectures"] == ["DeepseekV3ForCausalLM"]
    # 512 + 64 = the 576-wide latent row of GLM-5's FP8 KV pool; 16 heads as at TP4.
    assert config["kv_lora_rank"] == 512 and config["qk_rope_head_dim"] == 64
    assert config["num_attention_heads"] == 16
    assert config["num_hidden_layers"] == 8 and config["n_routed_experts"] == 8
    assert config["vocab_size"] == 32000
    assert "quantization_config" not in config


def test_tokenizer_is_a_complete_wordlevel_model():
    tok = json.loads((TINY_MODEL / "tokenizer.json").read_text())
    config = json.loads((TINY_MODEL / "config.json").read_text())
    model = tok["model"]
    assert model["type"] == "WordLevel" and tok["version"] == "1.0"
    vocab = model["vocab"]
    # Every id the model can sample decodes to a token: ids are exactly 0..vocab_size-1.
    assert sorted(vocab.values()) == list(range(config["vocab_size"]))
    assert model["unk_token"] in vocab
    for added in tok["added_tokens"]:
        assert vocab[added["content"]] == added["id"] and added["special"]
    special = {a["content"]: a["id"] for a in tok["added_tokens"]}
    assert special["<s>"] == config["bos_token_id"] and special["</s>"] == config["eos_token_id"]
    assert tok["pre_tokenizer"] == {"type": "Whitespace"}


def test_tokenizer_config_names_the_fast_tokenizer_and_a_chat_template():
    cfg = json.loads((TINY_MODEL / "tokenizer_config.json").read_text())
    assert cfg["tokenizer_class"] == "PreTrainedTokenizerFast"
    assert "add_generation_prompt" in cfg["chat_template"]
