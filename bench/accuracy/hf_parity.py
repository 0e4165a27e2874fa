#!/usr/bin/env python3
"""The exported checkpoint against Hugging Face transformers' DeepseekV3 (the reference SGLang's
DeepseekV3ForCausalLM mirrors), on the CPU in float32.

    PYTHONPATH=/tmp/hf-site python bench/accuracy/hf_parity.py [--model DIR] [--out FILE.md]

transformers is not a project dependency (it is big, and CI does not need it): install the
version the device bundle carries into a folder of its own, e.g.
    pip install --target /tmp/hf-site transformers==5.6.0 tokenizers==0.22.2 safetensors==0.8.0
Checks, on one recall prompt:
  1. the target: transformers' DeepseekV3ForCausalLM.from_pretrained(DIR) (safetensors read by
     the real `safetensors` package) against recall_model's logits;
  2. the NextN layer: transformers' own DeepseekV3DecoderLayer (a MoE layer, as SGLang's NextN
     decoder always is) and RMSNorms, wired as SGLang's DeepseekModelNextN.forward wires them
     (eh_proj(cat(enorm(embed(x[t+1])), hnorm(h[t]))) -> decoder -> shared_head.norm -> lm_head),
     fed transformers' own final hidden states, against recall_model's depth-1 draft logits;
  3. the 16-head widening: transformers on the widened checkpoint against the 8-head logits.
Without --model it checks a seeded random model (weights scaled up so the logits are far from
uniform); with it, that checkpoint (e.g. the built one). Writes a Markdown report (--out) and
exits 1 if a difference exceeds --tolerance.
"""

from __future__ import annotations

import argparse
import datetime as dt
import hashlib
import json
import sys
import tempfile
from pathlib import Path

import torch

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE))

import recall_model as rm  # noqa: E402
import recall_task as task  # noqa: E402


def hf_nextn(hf, cfg, tensors, n_layers):
    """transformers' modules, wired as SGLang's DeepseekModelNextN."""
    from transformers.models.deepseek_v3 import modeling_deepseek_v3 as m

    prefix = f"model.layers.{n_layers}."
    layer = m.DeepseekV3DecoderLayer(cfg, layer_idx=n_layers)  # >= first_k_dense_replace: MoE
    norms = {
        k: m.DeepseekV3RMSNorm(cfg.hidden_size, eps=cfg.rms_norm_eps)
        for k in ("enorm", "hnorm", "head")
    }
    eh = torch.nn.Linear(2 * cfg.hidden_size, cfg.hidden_size, bias=False)
    own = {k[len(prefix) :]: v.float() for k, v in tensors.items() if k.startswith(prefix)}
    sd = {}
    for k, v in own.items():
        if not k.startswith(
            ("self_attn.", "mlp.", "input_layernorm.", "post_attention_layernorm.")
        ):
            continue
        if ".experts." in k and "shared_experts" not in k:
            continue
        sd[k] = v
    e = cfg.n_routed_experts
    sd["mlp.experts.gate_up_proj"] = torch.stack(
        [
            torch.cat(
                [own[f"mlp.experts.{i}.gate_proj.weight"], own[f"mlp.experts.{i}.up_proj.weight"]]
            )
            for i in range(e)
        ]
    )
    sd["mlp.experts.down_proj"] = torch.stack(
        [own[f"mlp.experts.{i}.down_proj.weight"] for i in range(e)]
    )
    missing, unexpected = layer.load_state_dict(sd, strict=False)
    if missing or unexpected:
        raise SystemExit(f"NextN layer: missing {missing}, unexpected {unexpected}")
    norms["enorm"].weight.data = own["enorm.weight"]
    norms["hnorm"].weight.data = own["hnorm.weight"]
    norms["head"].weight.data = own["shared_head.norm.weight"]
    eh.weight.data = own["eh_proj.weight"]

    def run(ids: torch.Tensor, hidden: torch.Tensor) -> torch.Tensor:
        emb = hf.model.embed_tokens(ids[:, 1:])
        x = eh(torch.cat([norms["enorm"](emb), norms["hnorm"](hidden[:, :-1])], dim=-1))
        pos = torch.arange(x.shape[1])[None]
        pe = hf.model.rotary_emb(x, position_ids=pos)
        x = layer(x, attention_mask=None, position_ids=pos, position_embeddings=pe)
        return hf.lm_head(norms["head"](x))

    return run


def main(argv: list[str]) -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--model", help="checkpoint folder (default: a seeded random model)")
    p.add_argument("--out", help="Markdown report")
    p.add_argument("--context", type=int, default=512)
    p.add_argument("--tolerance", type=float, default=2e-3, help="max |d logit| allowed")
    a = p.parse_args(argv)
    try:
        import transformers
        from transformers import AutoConfig, DeepseekV3ForCausalLM
    except ImportError as exc:
        print(
            f"hf_parity: transformers is not importable ({exc}); see the docstring", file=sys.stderr
        )
        return 2
    torch.manual_seed(0)
    with tempfile.TemporaryDirectory() as tmp:
        if a.model:
            model_dir = Path(a.model)
            ours = rm.read_checkpoint(model_dir)
            digest = hashlib.sha256((model_dir / "model.safetensors").read_bytes()).hexdigest()
            source = f"{model_dir} (model.safetensors sha256 {digest[:16]})"
        else:
            ours = rm.RecallModel(rm.Shape())
            with torch.no_grad():
                for prm in ours.parameters():
                    if prm.dim() >= 2:
                        prm.mul_(4.0)  # std 0.08: logits far from uniform
            model_dir = Path(tmp) / "random"
            rm.write_checkpoint(ours, model_dir)
            ours = rm.read_checkpoint(model_dir)  # the bf16-rounded weights both sides read
            source = "seeded random weights (torch.manual_seed(0), std 0.08)"
        ours = ours.float().eval()
        wide_dir = Path(tmp) / "wide"
        rm.write_checkpoint(rm.widen(ours), wide_dir)

        stacks, qs = task.bench_set(7, a.context, 1, 2)
        ids = torch.tensor([stacks[0].prompt(q.key) + list(q.answer) for q in qs])
        with torch.no_grad():
            mine, _, _ = ours.target(ids)
            _, drafts = ours(ids, chain=1)
            mine_draft = drafts[0][0]
            hf = DeepseekV3ForCausalLM.from_pretrained(
                model_dir, torch_dtype=torch.float32, attn_implementation="sdpa"
            ).eval()
            out = hf(ids, output_hidden_states=True)
            theirs = out.logits
            hidden = out.hidden_states[-1]
            tensors = rm.load_safetensors(model_dir / "model.safetensors")
            cfg = AutoConfig.from_pretrained(model_dir)
            cfg._attn_implementation = "sdpa"
            theirs_draft = hf_nextn(hf, cfg, tensors, ours.shape.layers)(ids, hidden)
            wide = DeepseekV3ForCausalLM.from_pretrained(
                wide_dir, torch_dtype=torch.float32, attn_implementation="sdpa"
            ).eval()
            theirs_wide = wide(ids).logits

    def compare(x, y, ahead=1):
        """`ahead`: logits at position p predict ids[p + ahead] (the target 1, the draft 2)."""
        # Argmax is compared where the reference decides it: a top-1 lead over 2 x tolerance.
        # The built model ties exactly at positions the task does not score (inside the
        # prompt), where either side's argmax is float noise.
        top2 = y.topk(2, dim=-1).values
        decided = (top2[..., 0] - top2[..., 1]) > 2 * a.tolerance
        agree = x.argmax(-1) == y.argmax(-1)
        return {
            "max_abs_diff": float((x - y).abs().max()),
            "logit_range": float(y.abs().max()),
            "decided_share": float(decided.float().mean()),
            "argmax_agree": float(agree[decided].float().mean()),
            "answers_decided": bool(decided[:, answer_from - ahead : t - ahead].all()),
        }

    t = ids.shape[1]
    answer_from = t - len(qs[0].answer)  # position of the first answer token
    checks = {
        "target (DeepseekV3ForCausalLM)": compare(mine, theirs),
        "NextN draft, depth 1 (DeepseekV3DecoderLayer, MoE)": compare(
            mine_draft, theirs_draft, ahead=2
        ),
        "16-head widening (DeepseekV3ForCausalLM on the wide checkpoint)": compare(
            mine, theirs_wide
        ),
    }
    ok = all(c["max_abs_diff"] <= a.tolerance and c["argmax_agree"] == 1.0 for c in checks.values())
    # The positions that predict the answer tokens must be among the compared ones (a built
    # checkpoint; a random one decides nothing on purpose).
    ok = ok and (not a.model or all(c["answers_decided"] for c in checks.values()))
    lines = [
        f"# The recall checkpoint against transformers' DeepseekV3 — {dt.datetime.now(dt.timezone.utc):%Y-%m-%d %H:%M UTC}",
        "",
        f"Command: `python bench/accuracy/hf_parity.py {' '.join(argv)}`  ",
        f"transformers {transformers.__version__}, torch {torch.__version__}, CPU, float32 on both sides; "
        f"weights: {source}; input: {ids.shape[0]} recall prompts of {ids.shape[1]} tokens (prompt + answer).",
        "",
        "| check | max abs logit diff | largest logit | positions decided | argmax agreement there | answer positions decided |",
        "|---|---|---|---|---|---|",
    ]
    for name, c in checks.items():
        lines.append(
            f"| {name} | {c['max_abs_diff']:.2e} | {c['logit_range']:.2f} | "
            f"{c['decided_share']:.1%} | {c['argmax_agree']:.4f} | "
            f"{'yes' if c['answers_decided'] else 'no'} |"
        )
    lines += [
        "",
        f"Tolerance {a.tolerance:g} (argmax compared where the reference's top-1 leads by more "
        f"than {2 * a.tolerance:g}): {'PASS' if ok else 'FAIL'}.",
        "",
    ]
    text = "\n".join(lines)
    print(text)
    print(json.dumps(checks))
    if a.out:
        Path(a.out).write_text(text)
    return 0 if ok else 1


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
