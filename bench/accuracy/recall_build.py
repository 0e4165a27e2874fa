#!/usr/bin/env python3
"""Build the recall model's weights: an induction circuit written into the MLA shapes SGLang
serves, deterministic in --seed, so every machine rebuilds the same bytes in a second.

    python bench/accuracy/recall_build.py --out DIR            # checkpoint + build.json
    python bench/accuracy/recall_build.py --out DIR --check    # + the CPU accuracy check

Why built, not learned: gradient descent on this architecture did not form the two-layer
circuit in the minutes the lab GPU allows (docs/accuracy.md has the runs). What matters for the
end-to-end check is that every answer token depends on attention reading the right KV rows of
the right layer at the right positions, and a written circuit guarantees exactly that, with
margins we can state:

  residual (hidden 160):  [const | code(x_t) | code(x_t-1) | answer]   (1 + 3 x 52 dims)
  layer 0, head 0: a previous-token head, by position alone: q_pe and k_pe come from the
      constant dim, and rope turns their product into sum_i cos((d - 1) theta_i) over the 12
      fastest rope frequencies: largest at distance d = 1 by >= 1.08 at every distance up to
      64k, times PREV_SHARPNESS in the softmax. Its value is the token's code (the latent's
      first 52 dims), written to the residual's code(x_t-1) part.
  layer 1, head 0: the induction head: the query is code(x_t), the keys are each row's
      code(x_p-1) (latent dims 0..51), the value is code(x_p) (latent dims 52..103), written to
      the answer part. In the recall task every answer token occurs once in the haystack, so
      the row whose predecessor is the current token holds the next answer token.
  lm_head reads the answer part: logit = READOUT * code(v) . answer / 52.
  NextN: eh_proj puts code(x_t+1) (the embedding) in the code part and the hidden's code(x_t)
      in the code(x_t-1) part; its attention is layer 1's head, so it finds the row whose own
      token is x_t+1 and answers the token after it: x_t+2. Chained steps get the draft's own
      output, which has the same layout, so every draft depth predicts the next answer token.

Codes are random +-1 vectors (seeded). Every latent row holds +-1 exactly (an FP8 e4m3 value),
so an FP8 pool stores the content bits unrounded; only the positional k_pe is rounded.
"""

from __future__ import annotations

import argparse
import json
import math
import sys
import time
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).resolve().parent))

import recall_model as rm
import recall_task as task

CODE = 52  # dims per code
HIDDEN = 160  # 1 + 3 * CODE, rounded up
CONST = 0
C0, P0, A0 = 1, 1 + CODE, 1 + 2 * CODE  # where code(x_t), code(x_t-1) and the answer start
S_CONST = 4.0  # the constant dim's value in every embedding
KAPPA = 16.0  # |k_pe| per rope pair of the previous-token head (inside FP8's normal range)
PREV_FREQS = 12  # the fastest rope frequencies the previous-token head uses
PREV_SHARPNESS = 12.0  # softmax logits per unit of its positional score
MATCH = 1.5  # induction softmax logits per agreeing code dim (a full match: 78)
READOUT = 20.0  # the retrieved token's logit (peaked, yet other logprobs stay comparable)

SHAPE = rm.Shape(hidden_size=HIDDEN, intermediate_size=32, moe_intermediate_size=16)


def rope_freqs() -> torch.Tensor:
    half = rm.ROPE // 2
    return 1.0 / SHAPE.rope_theta ** (torch.arange(half, dtype=torch.float64) / half)


def _rms(filled: int) -> float:
    """RMS of a residual with the constant and `filled` +-1 dims (what each norm sees)."""
    return math.sqrt((S_CONST**2 + filled) / HIDDEN)


def codes(seed: int) -> torch.Tensor:
    g = torch.Generator().manual_seed(seed)
    return torch.randint(0, 2, (task.VOCAB_SIZE, CODE), generator=g).double() * 2 - 1


def _induction_head(attn: rm.MLA, rms_in: float) -> None:
    """Head 0: query code(x_t) from the code part, key code(x_p-1), value code(x_p)."""
    q, kv_a, kv_b, o = (w.weight.data for w in (attn.q_proj, attn.kv_a_proj_with_mqa, attn.kv_b_proj, attn.o_proj))  # fmt: skip
    d = torch.arange(CODE)
    q[d, C0 + d] = MATCH * math.sqrt(rm.QK_DIM) * rms_in  # q_nope: score = MATCH * code . code'
    kv_a[d, P0 + d] = 1.0  # latent 0..51: code(x_p-1), the key
    kv_a[CODE + d, C0 + d] = 1.0  # latent 52..103: code(x_p), the value
    attn.kv_a_layernorm.weight.data.fill_(math.sqrt(2 * CODE / rm.KV_LORA))  # rows hold +-1
    kv_b[d, d] = 1.0  # k_nope
    kv_b[rm.NOPE + d, CODE + d] = 1.0  # v
    o[A0 + d, d] = 1.0


def _previous_token_head(attn: rm.MLA, rms_in: float) -> None:
    """Head 0 attends to the row before its own, by position: its value is the token's code."""
    q, kv_a, kv_b, o = (w.weight.data for w in (attn.q_proj, attn.kv_a_proj_with_mqa, attn.kv_b_proj, attn.o_proj))  # fmt: skip
    const = S_CONST / rms_in  # the normed constant dim
    theta = rope_freqs()[:PREV_FREQS]
    i = torch.arange(PREV_FREQS)
    # rope rotates q by t*theta and k by p*theta: q = c (cos theta, -sin theta) and k = (kappa, 0)
    # give c * kappa * cos((t - p - 1) theta), times SDPA's 192**-0.5
    c = PREV_SHARPNESS * math.sqrt(rm.QK_DIM) / KAPPA
    q[rm.NOPE + 2 * i, CONST] = c * torch.cos(theta) / const
    q[rm.NOPE + 2 * i + 1, CONST] = -c * torch.sin(theta) / const
    kv_a[rm.KV_LORA + 2 * i, CONST] = KAPPA / const
    d = torch.arange(CODE)
    kv_a[d, C0 + d] = 1.0  # latent 0..51: code(x_p)
    attn.kv_a_layernorm.weight.data.fill_(math.sqrt(CODE / rm.KV_LORA))
    kv_b[rm.NOPE + d, d] = 1.0  # v
    o[P0 + d, d] = 1.0


def build(seed: int) -> rm.RecallModel:
    """The recall model's weights (float64 arithmetic, stored as the model's float32)."""
    torch.set_default_dtype(torch.float64)
    try:
        model = rm.RecallModel(SHAPE)
    finally:
        torch.set_default_dtype(torch.float32)
    for name, p in model.named_parameters():
        p.data.fill_(1.0 if name.endswith("norm.weight") or "layernorm" in name else 0.0)
    code = codes(seed)
    d = torch.arange(CODE)
    emb = model.embed_tokens.weight.data
    emb[:, CONST] = S_CONST
    emb[:, C0 : C0 + CODE] = code
    _previous_token_head(model.layers[0].self_attn, _rms(CODE))
    _induction_head(model.layers[1].self_attn, _rms(2 * CODE))
    model.lm_head.weight.data[:, A0 : A0 + CODE] = code * READOUT * _rms(3 * CODE) / CODE
    nx = model.nextn
    eh = nx.eh_proj.weight.data  # input: [enorm(embedding), hnorm(hidden)]
    eh[CONST, CONST] = _rms(CODE)
    eh[C0 + d, C0 + d] = _rms(CODE)  # code(x_t+1)
    eh[P0 + d, HIDDEN + C0 + d] = _rms(3 * CODE)  # the hidden's code(x_t)
    _induction_head(nx.layer.self_attn, _rms(2 * CODE))
    return model.float()


def margins(seed: int) -> dict:
    """What the circuit guarantees: the previous-token head's positional gap, and how close the
    nearest other token's code comes (in agreeing dims, of CODE)."""
    theta = rope_freqs()[:PREV_FREQS]
    dist = torch.arange(65536, dtype=torch.float64)
    score = torch.cos((dist[:, None] - 1) * theta).sum(1)
    gap = float(score[1] - torch.cat([score[:1], score[2:]]).max())
    code = codes(seed)
    gram = code @ code.T
    gram.fill_diagonal_(-CODE)
    nearest = int(gram.max())
    return {
        "previous_token_gap": round(gap, 4),
        "previous_token_gap_logits": round(PREV_SHARPNESS * gap, 2),
        "nearest_code_dot": nearest,
        "induction_gap_logits": MATCH * (CODE - nearest),
        "readout_gap_logits": round(READOUT * (CODE - nearest) / CODE, 2),
    }  # fmt: skip


def main(argv: list[str]) -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--out", required=True, help="checkpoint folder")
    p.add_argument("--seed", type=int, default=31)
    p.add_argument("--check", action="store_true", help="CPU accuracy at 1k and 2k context")
    a = p.parse_args(argv)
    t0 = time.monotonic()
    model = build(a.seed)
    out = Path(a.out)
    files = rm.write_checkpoint(model, out)
    report = {"command": " ".join(["recall_build.py", *argv]), "seed": a.seed,
              "size": rm.size_report(SHAPE), "margins": margins(a.seed)}  # fmt: skip
    print(f"[recall-build] wrote {', '.join(f.name for f in files)} to {out} "
          f"({(out / 'model.safetensors').stat().st_size / 1e6:.1f} MB); margins {report['margins']}")  # fmt: skip
    if a.check:
        import recall_eval

        served = rm.read_checkpoint(out).eval()  # the bf16 weights SGLang loads
        report["check"] = recall_eval.evaluate(served, [1024, 2048], 5, 1, 16, "cpu")
        print(f"[recall-build] CPU check: {report['check']}")
    (out / "build.json").write_text(json.dumps(report, indent=1) + "\n")
    print(f"[recall-build] done in {time.monotonic() - t0:.1f} s")
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
