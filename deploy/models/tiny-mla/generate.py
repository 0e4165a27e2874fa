#!/usr/bin/env python3
"""Write the tiny MLA smoke-test model: config.json, tokenizer.json, tokenizer_config.json.

    python3 deploy/models/tiny-mla/generate.py [OUT_DIR]     (default: this script's folder)

The model is a plain-MLA DeepseekV3 shrunk to smoke-test size, with the attention geometry of
GLM-5 that the FP8 KV pool depends on (kv_lora_rank 512 + qk_rope_head_dim 64 = 576 per token, 16
heads per GPU as GLM-5's 64 heads at TP4..8 give). It has no weights: SGLang runs it with
`--load-format dummy`, so it is for timing only (its outputs do not depend on attention; a
model whose answers need attention, for accuracy and agreement: bench/accuracy, docs/accuracy.md). The tokenizer is a Hugging Face `tokenizers` WordLevel model written with
the stdlib json module (the project venv has no `tokenizers`); every one of the 32000 ids decodes
to a word, so random dummy-weight output always streams visible text.

Stdlib only, deterministic: tests/launch regenerates the files and compares them byte for byte.
"""

from __future__ import annotations

import json
import sys
from pathlib import Path

VOCAB_SIZE = 32000
SPECIAL = ["<unk>", "<s>", "</s>", "<pad>"]  # ids 0..3; config.json's bos/eos/pad match
PUNCTUATION = [".", ",", "!", "?", ":", ";", "'", '"', "(", ")", "-"]
# Common words first, so short English prompts tokenize to something other than <unk>.
_COMMON_WORDS = """
the of and to a in is it you that he was for on are with as i his they be at one have this from
or had by hot word but what some we can out other were all there when up use your how said an
each she which do their time if will way about many then them write would like so these her long
make thing see him two has look more day could go come did number sound no most people my over
know water than call first who may down side been now find any new work part take get place made
live where after back little only round man year came show every good me give our under name very
through just form sentence great think say help low line differ turn cause much mean before move
right boy old too same tell does set three want air well also play small end put home read hand
port large spell add even land here must big high such follow act why ask men change went light
kind off need house picture try us again animal point mother world near build self earth father
hello test token model stream server request response fast slow cache kernel memory
"""
WORDS = _COMMON_WORDS.split()

CONFIG = {
    "architectures": ["DeepseekV3ForCausalLM"],
    "model_type": "deepseek_v3",
    "vocab_size": VOCAB_SIZE,
    "hidden_size": 1024,
    "intermediate_size": 2048,
    "moe_intermediate_size": 256,
    "num_hidden_layers": 8,
    "num_attention_heads": 16,
    "num_key_value_heads": 16,
    "q_lora_rank": 256,
    "kv_lora_rank": 512,
    "qk_nope_head_dim": 128,
    "qk_rope_head_dim": 64,
    "v_head_dim": 128,
    "n_routed_experts": 8,
    "n_shared_experts": 1,
    "num_experts_per_tok": 2,
    "first_k_dense_replace": 1,
    "moe_layer_freq": 1,
    "n_group": 1,
    "topk_group": 1,
    "topk_method": "noaux_tc",
    "scoring_func": "sigmoid",
    "norm_topk_prob": True,
    "routed_scaling_factor": 2.5,
    "hidden_act": "silu",
    "max_position_embeddings": 131072,
    "rope_theta": 10000.0,
    "rope_scaling": None,
    "rms_norm_eps": 1e-06,
    "attention_bias": False,
    "attention_dropout": 0.0,
    "initializer_range": 0.02,
    "tie_word_embeddings": False,
    "bos_token_id": 1,
    "eos_token_id": 2,
    "pad_token_id": 3,
    "torch_dtype": "bfloat16",
    "use_cache": True,
}

# A plain role-prefixed template, so /v1/chat/completions works against the tiny model too.
CHAT_TEMPLATE = (
    "{% for message in messages %}{{ message['role'] }}: {{ message['content'] }}\n{% endfor %}"
    "{% if add_generation_prompt %}assistant:{% endif %}"
)


def vocabulary() -> list[str]:
    seen: set[str] = set()
    tokens: list[str] = []
    for tok in [*SPECIAL, *PUNCTUATION, *WORDS]:
        if tok not in seen:
            seen.add(tok)
            tokens.append(tok)
    n = 0
    while len(tokens) < VOCAB_SIZE:
        filler = f"w{n}"
        n += 1
        if filler not in seen:
            seen.add(filler)
            tokens.append(filler)
    return tokens


def tokenizer_json() -> dict:
    tokens = vocabulary()
    return {
        "version": "1.0",
        "truncation": None,
        "padding": None,
        "added_tokens": [
            {
                "id": i,
                "content": tok,
                "single_word": False,
                "lstrip": False,
                "rstrip": False,
                "normalized": False,
                "special": True,
            }
            for i, tok in enumerate(SPECIAL)
        ],
        "normalizer": None,
        # Whitespace = the regex \w+|[^\w\s]+ : words and runs of punctuation.
        "pre_tokenizer": {"type": "Whitespace"},
        "post_processor": None,
        # No decoder: tokenizers then joins decoded tokens with single spaces.
        "decoder": None,
        "model": {
            "type": "WordLevel",
            "vocab": {tok: i for i, tok in enumerate(tokens)},
            "unk_token": "<unk>",
        },
    }


def tokenizer_config() -> dict:
    return {
        "tokenizer_class": "PreTrainedTokenizerFast",
        "bos_token": "<s>",
        "eos_token": "</s>",
        "unk_token": "<unk>",
        "pad_token": "<pad>",
        "model_max_length": CONFIG["max_position_embeddings"],
        "clean_up_tokenization_spaces": False,
        "chat_template": CHAT_TEMPLATE,
    }


def write(out_dir: Path) -> list[Path]:
    out_dir.mkdir(parents=True, exist_ok=True)
    files = {
        "config.json": CONFIG,
        "tokenizer.json": tokenizer_json(),
        "tokenizer_config.json": tokenizer_config(),
    }
    written = []
    for name, payload in files.items():
        path = out_dir / name
        path.write_text(json.dumps(payload, indent=2, ensure_ascii=False) + "\n", encoding="utf-8")
        written.append(path)
    return written


if __name__ == "__main__":
    target = Path(sys.argv[1]) if len(sys.argv) > 1 else Path(__file__).resolve().parent
    for p in write(target):
        print(p)
