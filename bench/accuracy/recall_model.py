"""The recall model in plain torch: a DeepSeek-V3 MLA decoder (what SGLang's DeepseekV3ForCausalLM
serves) plus its NextN (MTP) layer, with the checkpoint's own parameter names, so the builder
(recall_build.py), export, the CPU checks and the SGLang servers all see one set of weights.

Shapes: the attention geometry the patch serves is fixed (kv_lora_rank 512, qk_rope_head_dim 64,
and qk_nope = v = 128: FlashInfer's SM90 ragged prefill, which SGLang's flashinfer MLA backend
picks on Hopper, compiles only (192, 128) among MLA's head dims; a smaller v would not start);
everything else is small. 8 heads (GLM-5 at TP8 per rank); `widen` doubles them exactly (each
head twice, o_proj halved) for the 16-head tile form of the native kernel, so both variants
compute the same function.

What SGLang does, mirrored here (sglang/srt/models/deepseek_v2.py, deepseek_nextn.py in 0.5.12.post1):
  * q_lora_rank None: q = q_proj(x); kv_a_proj_with_mqa(x) = [c_kv (512), k_pe (64)];
    the KV cache holds [kv_a_layernorm(c_kv), rope(k_pe)]; kv_b_proj(c) = per head [k_nope, v].
  * rope GPT-J style (pairs 2i, 2i+1; config rope_interleave true), softmax scale 192**-0.5.
  * layers < first_k_dense_replace are dense MLPs; the NextN layer is always a MoE (noaux_tc:
    sigmoid scores, top-k by score + e_score_correction_bias, renormalized, times
    routed_scaling_factor, plus the shared expert).
  * NextN at position t: eh_proj(cat(enorm(embed(x[t+1])), hnorm(h[t]))) -> decoder -> shared_head.norm
    -> the target's lm_head predicts x[t+2]; h is the target's hidden after its final norm (what
    the logits processor hands the EAGLE draft). Chained draft steps feed the draft's own normed
    output back as h: `chain` runs that too, with the draft KV cache SGLang keeps (the target-fed
    rows up to the chain's start, then one row per draft step).
"""

from __future__ import annotations

import json
import struct
from dataclasses import asdict, dataclass, replace
from pathlib import Path

import recall_task as task
import torch
import torch.nn.functional as F
from torch import nn

KV_LORA, ROPE, NOPE, V_DIM = 512, 64, 128, 128
QK_DIM = NOPE + ROPE


@dataclass(frozen=True)
class Shape:
    vocab_size: int = task.VOCAB_SIZE
    hidden_size: int = 128
    intermediate_size: int = 256
    layers: int = 2
    heads: int = 8
    moe_intermediate_size: int = 64
    n_routed_experts: int = 8
    experts_per_tok: int = 2
    rope_theta: float = 10000.0
    max_positions: int = 65536
    eps: float = 1e-6

    def config(self) -> dict:
        """config.json as SGLang and transformers read a DeepSeek-V3 checkpoint."""
        return {
            "architectures": ["DeepseekV3ForCausalLM"],
            "model_type": "deepseek_v3",
            "vocab_size": self.vocab_size,
            "hidden_size": self.hidden_size,
            "intermediate_size": self.intermediate_size,
            "moe_intermediate_size": self.moe_intermediate_size,
            "num_hidden_layers": self.layers,
            "num_nextn_predict_layers": 1,
            "num_attention_heads": self.heads,
            "num_key_value_heads": self.heads,
            "q_lora_rank": None,
            "kv_lora_rank": KV_LORA,
            "qk_nope_head_dim": NOPE,
            "qk_rope_head_dim": ROPE,
            "v_head_dim": V_DIM,
            "n_routed_experts": self.n_routed_experts,
            "n_shared_experts": 1,
            "num_experts_per_tok": self.experts_per_tok,
            # every target layer dense; only the NextN layer (always a MoE in SGLang) routes
            "first_k_dense_replace": self.layers,
            "moe_layer_freq": 1,
            "n_group": 1,
            "topk_group": 1,
            "topk_method": "noaux_tc",
            "scoring_func": "sigmoid",
            "norm_topk_prob": True,
            "routed_scaling_factor": 1.0,
            "hidden_act": "silu",
            "max_position_embeddings": self.max_positions,
            "rope_theta": self.rope_theta,
            "rope_scaling": None,
            "rope_interleave": True,
            "rms_norm_eps": self.eps,
            "attention_bias": False,
            "attention_dropout": 0.0,
            "initializer_range": 0.02,
            "tie_word_embeddings": False,
            "bos_token_id": task.BOS,
            "eos_token_id": 2,
            "pad_token_id": 3,
            "torch_dtype": "bfloat16",
            "use_cache": True,
        }

    @classmethod
    def from_config(cls, cfg: dict) -> Shape:
        return cls(
            vocab_size=cfg["vocab_size"],
            hidden_size=cfg["hidden_size"],
            intermediate_size=cfg["intermediate_size"],
            layers=cfg["num_hidden_layers"],
            heads=cfg["num_attention_heads"],
            moe_intermediate_size=cfg["moe_intermediate_size"],
            n_routed_experts=cfg["n_routed_experts"],
            experts_per_tok=cfg["num_experts_per_tok"],
            rope_theta=cfg["rope_theta"],
            max_positions=cfg["max_position_embeddings"],
            eps=cfg["rms_norm_eps"],
        )


SMOKE_SHAPE = Shape(
    hidden_size=32,
    intermediate_size=32,
    heads=1,
    moe_intermediate_size=16,
    n_routed_experts=2,
    experts_per_tok=1,
)


# ---------------------------------------------------------------- building blocks


class RMSNorm(nn.Module):
    def __init__(self, dim: int, eps: float) -> None:
        super().__init__()
        self.weight = nn.Parameter(torch.ones(dim))
        self.eps = eps

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        dtype = x.dtype
        xf = x.float()
        xf = xf * torch.rsqrt(xf.pow(2).mean(-1, keepdim=True) + self.eps)
        return self.weight * xf.to(dtype)


def rope(x: torch.Tensor, positions: torch.Tensor, theta: float) -> torch.Tensor:
    """GPT-J style rotary embedding of the last dim (pairs 2i, 2i+1), positions along dim -2."""
    half = x.shape[-1] // 2
    inv = 1.0 / theta ** (torch.arange(0, half, device=x.device, dtype=torch.float32) / half)
    ang = positions.to(torch.float32)[:, None] * inv[None, :]
    cos, sin = ang.cos(), ang.sin()
    xf = x.float()
    a, b = xf[..., 0::2], xf[..., 1::2]
    out = torch.stack((a * cos - b * sin, a * sin + b * cos), dim=-1).flatten(-2)
    return out.to(x.dtype)


def fake_fp8(x: torch.Tensor) -> torch.Tensor:
    """Round to FP8 e4m3 (what an FP8 KV pool stores, scale 1) with a straight-through gradient."""
    return x + (x.to(torch.float8_e4m3fn).to(x.dtype) - x).detach()


class MLP(nn.Module):
    def __init__(self, hidden: int, inner: int) -> None:
        super().__init__()
        self.gate_proj = nn.Linear(hidden, inner, bias=False)
        self.up_proj = nn.Linear(hidden, inner, bias=False)
        self.down_proj = nn.Linear(inner, hidden, bias=False)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.down_proj(F.silu(self.gate_proj(x)) * self.up_proj(x))


class Gate(nn.Module):
    def __init__(self, hidden: int, experts: int) -> None:
        super().__init__()
        self.weight = nn.Parameter(torch.empty(experts, hidden))
        # DeepSeek-V3 balances load by moving this bias; here it stays 0 (and F32, as SGLang's).
        self.register_buffer("e_score_correction_bias", torch.zeros(experts))


class MoE(nn.Module):
    def __init__(self, shape: Shape) -> None:
        super().__init__()
        h, e = shape.hidden_size, shape.n_routed_experts
        self.top_k = shape.experts_per_tok
        self.gate = Gate(h, e)
        self.experts = nn.ModuleList(MLP(h, shape.moe_intermediate_size) for _ in range(e))
        self.shared_experts = MLP(h, shape.moe_intermediate_size)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        scores = F.linear(x.float(), self.gate.weight.float()).sigmoid()
        choice = scores + self.gate.e_score_correction_bias
        idx = choice.topk(self.top_k, dim=-1).indices
        w = scores.gather(-1, idx)
        w = w / w.sum(-1, keepdim=True)  # norm_topk_prob; routed_scaling_factor 1.0
        dense = torch.zeros_like(scores).scatter(-1, idx, w.to(scores.dtype)).to(x.dtype)
        # Every expert on every token: at these sizes cheaper than dispatching.
        out = torch.stack([ex(x) for ex in self.experts], dim=-2)
        return (dense.unsqueeze(-1) * out).sum(-2) + self.shared_experts(x)


class MLA(nn.Module):
    def __init__(self, shape: Shape) -> None:
        super().__init__()
        h, n = shape.hidden_size, shape.heads
        self.heads, self.theta = n, shape.rope_theta
        self.q_proj = nn.Linear(h, n * QK_DIM, bias=False)
        self.kv_a_proj_with_mqa = nn.Linear(h, KV_LORA + ROPE, bias=False)
        self.kv_a_layernorm = RMSNorm(KV_LORA, shape.eps)
        self.kv_b_proj = nn.Linear(KV_LORA, n * (NOPE + V_DIM), bias=False)
        self.o_proj = nn.Linear(n * V_DIM, h, bias=False)

    def cache_rows(self, x: torch.Tensor, pos: torch.Tensor, fp8: bool) -> torch.Tensor:
        """What the KV pool holds per token: [kv_a_layernorm(c_kv) (512), rope(k_pe) (64)]."""
        c, k_pe = self.kv_a_proj_with_mqa(x).split([KV_LORA, ROPE], dim=-1)
        rows = torch.cat([self.kv_a_layernorm(c), rope(k_pe, pos, self.theta)], dim=-1)
        return fake_fp8(rows) if fp8 else rows

    def queries(self, x: torch.Tensor, pos: torch.Tensor) -> torch.Tensor:
        b, t, _ = x.shape
        q = self.q_proj(x).view(b, t, self.heads, QK_DIM).transpose(1, 2)
        q_nope, q_pe = q.split([NOPE, ROPE], dim=-1)
        return torch.cat([q_nope, rope(q_pe, pos, self.theta)], dim=-1)

    def keys_values(self, rows: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        """K (B, heads, T, 192) and V padded to 192 (equal head dims keep SDPA on flash)."""
        b, t, _ = rows.shape
        c, k_pe = rows.split([KV_LORA, ROPE], dim=-1)
        kv = self.kv_b_proj(c).view(b, t, self.heads, NOPE + V_DIM).transpose(1, 2)
        k_nope, v = kv.split([NOPE, V_DIM], dim=-1)
        k = torch.cat([k_nope, k_pe.unsqueeze(1).expand(b, self.heads, t, ROPE)], dim=-1)
        return k, F.pad(v, (0, QK_DIM - V_DIM))

    def absorbed(self) -> tuple[torch.Tensor, torch.Tensor]:
        """(w_kc, w_vc), each (heads, 128, 512): kv_b_proj split as MLA decode absorbs it (q_nope
        through w_kc into the latent, the latent output back through w_vc)."""
        w = self.kv_b_proj.weight.view(self.heads, NOPE + V_DIM, KV_LORA)
        return w[:, :NOPE], w[:, NOPE:]

    def out(self, o: torch.Tensor) -> torch.Tensor:
        b, _, t, _ = o.shape
        return self.o_proj(o[..., :V_DIM].transpose(1, 2).reshape(b, t, self.heads * V_DIM))


def attend(q, k, v, mask: torch.Tensor | None = None) -> torch.Tensor:
    if mask is None:
        return F.scaled_dot_product_attention(q, k, v, is_causal=True)
    return F.scaled_dot_product_attention(q, k, v, attn_mask=mask)


class Layer(nn.Module):
    def __init__(self, shape: Shape, moe: bool) -> None:
        super().__init__()
        self.input_layernorm = RMSNorm(shape.hidden_size, shape.eps)
        self.self_attn = MLA(shape)
        self.post_attention_layernorm = RMSNorm(shape.hidden_size, shape.eps)
        self.mlp = MoE(shape) if moe else MLP(shape.hidden_size, shape.intermediate_size)

    def forward(
        self, x: torch.Tensor, pos: torch.Tensor, fp8: bool, rows_from: torch.Tensor | None = None
    ) -> tuple[torch.Tensor, torch.Tensor]:
        """Causal self-attention + MLP. Returns (output, this layer's cache rows).
        `rows_from`: attend over these cache rows instead of this layer's own (a miswiring)."""
        a = self.self_attn
        hn = self.input_layernorm(x)
        rows = a.cache_rows(hn, pos, fp8)
        k, v = a.keys_values(rows if rows_from is None else rows_from)
        x = x + a.out(attend(a.queries(hn, pos), k, v))
        return x + self.mlp(self.post_attention_layernorm(x)), rows


class NextN(nn.Module):
    """model.layers.{N}: enorm, hnorm, eh_proj, the decoder layer, shared_head.norm."""

    def __init__(self, shape: Shape) -> None:
        super().__init__()
        h = shape.hidden_size
        self.enorm = RMSNorm(h, shape.eps)
        self.hnorm = RMSNorm(h, shape.eps)
        self.eh_proj = nn.Linear(2 * h, h, bias=False)
        self.layer = Layer(shape, moe=True)
        self.shared_head = nn.Module()
        self.shared_head.norm = RMSNorm(h, shape.eps)

    def inputs(self, emb_next: torch.Tensor, hidden: torch.Tensor) -> torch.Tensor:
        return self.eh_proj(torch.cat([self.enorm(emb_next), self.hnorm(hidden)], dim=-1))


class RecallModel(nn.Module):
    def __init__(self, shape: Shape) -> None:
        super().__init__()
        self.shape = shape
        self.embed_tokens = nn.Embedding(shape.vocab_size, shape.hidden_size)
        self.layers = nn.ModuleList(Layer(shape, moe=False) for _ in range(shape.layers))
        self.norm = RMSNorm(shape.hidden_size, shape.eps)
        self.lm_head = nn.Linear(shape.hidden_size, shape.vocab_size, bias=False)
        self.nextn = NextN(shape)
        self.reset()

    def reset(self) -> None:
        for name, p in self.named_parameters():
            if name.endswith("norm.weight") or "layernorm" in name or name.endswith("enorm.weight"):
                nn.init.ones_(p)
            else:
                nn.init.normal_(p, std=0.02)

    def target(
        self, ids: torch.Tensor, fp8: bool = False, miswire: str = "", logits_from: int = 0
    ) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
        """(logits at positions >= logits_from, hidden after the final norm, embeddings).
        miswire (CPU checks of the scorer):
        'previous_layer': each layer after the first attends over the previous layer's rows;
        'shifted_rows': every layer reads the latent (c_kv) of the row before the one it should
        (row 0 repeated) beside the right row's k_pe, as a kernel that addresses the two parts
        of a row separately could; a whole-row shift would carry its rope positions along."""
        pos = torch.arange(ids.shape[1], device=ids.device)
        emb = self.embed_tokens(ids)
        x, prev = emb, None
        for i, layer in enumerate(self.layers):
            rows_from = None
            if miswire == "previous_layer" and i > 0:
                rows_from = prev
            elif miswire == "shifted_rows":
                own = layer.self_attn.cache_rows(layer.input_layernorm(x), pos, fp8)
                shifted = torch.cat([own[:, :1], own[:, :-1]], dim=1)
                rows_from = torch.cat([shifted[..., :KV_LORA], own[..., KV_LORA:]], dim=-1)
            x, prev = layer(x, pos, fp8, rows_from)
        h = self.norm(x)
        return self.lm_head(h[:, logits_from:]), h, emb

    def forward(
        self, ids: torch.Tensor, fp8: bool = False, chain: int = 1, region: int = 0
    ) -> tuple[torch.Tensor, list[tuple[torch.Tensor, torch.Tensor]]]:
        """Target logits at positions >= region - 1 (they predict ids[p + 1]) and, per draft
        depth d = 1..chain, (logits, positions j): logits at j predict ids[j + 2]. Attention
        reads every row from position 0; logits, and the deeper draft steps, only near the
        answer region (region: the first query's index; 0 = everywhere), where the loss is."""
        lo = max(region - 1, 0)
        logits, h, emb = self.target(ids, fp8, logits_from=lo)
        t = ids.shape[1]
        nx = self.nextn
        a = nx.layer.self_attn
        pos1 = torch.arange(t - 1, device=ids.device)
        u = nx.inputs(emb[:, 1:], h[:, :-1])
        out, rows1 = self._nextn_layer(u, pos1, fp8, None)
        g = nx.shared_head.norm(out)
        start1 = max(0, region - chain)
        drafts = [(self.lm_head(g[:, start1:]), pos1[start1:])]
        k1, v1 = a.keys_values(rows1)
        keys = [(pos1, k1, v1)]
        prev_pos, prev_g = pos1, g
        for d in range(2, chain + 1):
            start = max(1, region - (chain - d))
            posd = torch.arange(start, t - 1, device=ids.device)
            # the previous step's output at j - 1 becomes this step's hidden at j
            hid = prev_g[:, (posd - 1) - prev_pos[0]]
            u = nx.inputs(emb[:, posd + 1], hid)
            mask = self._chain_mask(posd, keys, d)
            out, rows = self._nextn_layer(u, posd, fp8, (keys, mask))
            g = nx.shared_head.norm(out)
            drafts.append((self.lm_head(g), posd))
            kd, vd = a.keys_values(rows)
            keys.append((posd, kd, vd))
            prev_pos, prev_g = posd, g
        return logits, drafts

    def _nextn_layer(self, u, pos, fp8, chained):
        layer = self.nextn.layer
        a = layer.self_attn
        hn = layer.input_layernorm(u)
        rows = a.cache_rows(hn, pos, fp8)
        q = a.queries(hn, pos)
        if chained is None:
            k, v = a.keys_values(rows)
            o = attend(q, k, v)
        else:
            keys, mask = chained
            kd, vd = a.keys_values(rows)
            k = torch.cat([kk for _, kk, _ in keys] + [kd], dim=2)
            v = torch.cat([vv for _, _, vv in keys] + [vd], dim=2)
            o = attend(q, k, v, mask)
        x = u + a.out(o)
        return x + layer.mlp(layer.post_attention_layernorm(x)), rows

    @staticmethod
    def _chain_mask(posd: torch.Tensor, keys: list, d: int) -> torch.Tensor:
        """Draft step d at position j sees the target-fed rows (depth 1) up to j - d + 1, then
        depth m's row at j - d + m for m = 2..d (the last one is its own)."""
        j = posd[:, None]
        parts = [keys[0][0][None, :] <= j - d + 1]
        for m, (pm, _, _) in enumerate(keys[1:], start=2):
            parts.append(pm[None, :] == j - d + m)
        parts.append(torch.eye(len(posd), dtype=torch.bool, device=posd.device))
        return torch.cat(parts, dim=1)

    # ------------------------------------------------------------ checkpoint names

    def state(self) -> dict[str, torch.Tensor]:
        """The checkpoint: HF/SGLang DeepSeek-V3 names; the NextN layer as model.layers.{N}.*
        (its embed_tokens and shared_head.head are the target's: SGLang shares them)."""
        out: dict[str, torch.Tensor] = {}
        n = self.shape.layers
        for name, t in self.state_dict().items():
            if (
                name.startswith("embed_tokens.")
                or name.startswith("layers.")
                or name.startswith("norm.")
            ):
                key = "model." + name
            elif name.startswith("lm_head."):
                key = name
            elif name.startswith("nextn.layer."):
                key = f"model.layers.{n}." + name[len("nextn.layer.") :]
            elif name.startswith("nextn."):
                key = f"model.layers.{n}." + name[len("nextn.") :]
            else:
                raise AssertionError(name)
            out[key] = t.detach()
        return out

    def load_state(self, tensors: dict[str, torch.Tensor]) -> None:
        mine = self.state()
        missing = sorted(set(mine) - set(tensors))
        if missing:
            raise ValueError(f"checkpoint lacks {missing[:3]}")
        own = dict(self.state_dict())
        by_key = {k: name for name, k in zip(own, self._keys(), strict=True)}
        with torch.no_grad():
            for key, name in by_key.items():
                own[name].copy_(tensors[key].to(own[name].dtype))

    def _keys(self) -> list[str]:
        return list(self.state())


# ---------------------------------------------------------------- checkpoint files


def save_safetensors(path: Path, tensors: dict[str, torch.Tensor]) -> None:
    """The safetensors format (8-byte header length, JSON header, raw little-endian data),
    written here so the export needs no extra package; names sorted, so the bytes depend only
    on the values. F32 stays F32 (e_score_correction_bias), everything else is BF16."""
    header: dict = {"__metadata__": {"format": "pt"}}
    blobs, offset = [], 0
    for name in sorted(tensors):
        keep_f32 = name.endswith("e_score_correction_bias")
        t = (
            tensors[name]
            .detach()
            .cpu()
            .to(torch.float32 if keep_f32 else torch.bfloat16)
            .contiguous()
        )
        dtype = "F32" if keep_f32 else "BF16"
        raw = t.view(torch.int32 if dtype == "F32" else torch.int16).numpy().tobytes()
        header[name] = {
            "dtype": dtype,
            "shape": list(t.shape),
            "data_offsets": [offset, offset + len(raw)],
        }
        blobs.append(raw)
        offset += len(raw)
    head = json.dumps(header, separators=(",", ":")).encode()
    head += b" " * (-len(head) % 8)
    with open(path, "wb") as f:
        f.write(struct.pack("<Q", len(head)))
        f.write(head)
        for raw in blobs:
            f.write(raw)


def load_safetensors(path: Path) -> dict[str, torch.Tensor]:
    data = Path(path).read_bytes()
    (n,) = struct.unpack("<Q", data[:8])
    header = json.loads(data[8 : 8 + n])
    base = 8 + n
    out = {}
    for name, meta in header.items():
        if name == "__metadata__":
            continue
        a, b = meta["data_offsets"]
        dtype = {"BF16": torch.bfloat16, "F32": torch.float32}[meta["dtype"]]
        out[name] = torch.frombuffer(bytearray(data[base + a : base + b]), dtype=dtype).reshape(
            meta["shape"]
        )
    return out


def write_checkpoint(model: RecallModel, out_dir: Path) -> list[Path]:
    """config.json, model.safetensors, tokenizer.json, tokenizer_config.json."""
    out_dir.mkdir(parents=True, exist_ok=True)
    shape = model.shape
    files = {
        "config.json": shape.config(),
        "tokenizer.json": task.tokenizer_json(),
        "tokenizer_config.json": task.tokenizer_config(shape.max_positions),
    }
    written = []
    for name, payload in files.items():
        p = out_dir / name
        p.write_text(json.dumps(payload, indent=2) + "\n", encoding="utf-8")
        written.append(p)
    st = out_dir / "model.safetensors"
    save_safetensors(st, model.state())
    return [*written, st]


def read_checkpoint(model_dir: Path) -> RecallModel:
    shape = Shape.from_config(json.loads((Path(model_dir) / "config.json").read_text()))
    model = RecallModel(shape)
    model.load_state(load_safetensors(Path(model_dir) / "model.safetensors"))
    return model


def widen(model: RecallModel, factor: int = 2) -> RecallModel:
    """The same function with `factor` times the heads: every head repeated (adjacent copies),
    o_proj's columns repeated and divided by `factor` (exact in bf16: a power of two)."""
    shape = replace(model.shape, heads=model.shape.heads * factor)
    wide = RecallModel(shape)
    src = model.state()
    dst = {}
    for key, t in src.items():
        if key.endswith("self_attn.q_proj.weight"):
            dst[key] = (
                t.view(model.shape.heads, QK_DIM, -1)
                .repeat_interleave(factor, 0)
                .reshape(-1, t.shape[1])
            )
        elif key.endswith("self_attn.kv_b_proj.weight"):
            dst[key] = (
                t.view(model.shape.heads, NOPE + V_DIM, -1)
                .repeat_interleave(factor, 0)
                .reshape(-1, t.shape[1])
            )
        elif key.endswith("self_attn.o_proj.weight"):
            cols = t.view(t.shape[0], model.shape.heads, V_DIM).repeat_interleave(factor, 1)
            dst[key] = (cols / factor).reshape(t.shape[0], -1)
        else:
            dst[key] = t
    wide.load_state(dst)
    return wide


def size_report(shape: Shape) -> dict:
    m = RecallModel(shape)
    n = sum(t.numel() for t in m.state().values())
    return {"parameters": n, "bf16_bytes": 2 * n, **asdict(shape)}
