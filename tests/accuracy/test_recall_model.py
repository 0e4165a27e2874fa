"""The recall model on the CPU: the checkpoint SGLang loads (names, config, bytes), the 16-head
widening, and the FP8 decode it is served with (absorbed MLA over the 576-wide latent rows, what
every FP8 path of the patch computes) against the model's own MHA form."""

from __future__ import annotations

import json
import struct

import pytest

torch = pytest.importorskip("torch")

import recall_model as rm  # noqa: E402  (bench/accuracy)
import recall_task as task  # noqa: E402

SMALL = rm.Shape(hidden_size=32, intermediate_size=32, heads=2, moe_intermediate_size=16)


def _model(shape: rm.Shape = SMALL, seed: int = 0, scale: float = 4.0) -> rm.RecallModel:
    torch.manual_seed(seed)
    m = rm.RecallModel(shape)
    with torch.no_grad():
        for p in m.parameters():
            if p.dim() >= 2:
                p.mul_(scale)  # logits far from uniform, so differences show
    return m.eval()


def _ids(n: int = 96, seed: int = 1) -> torch.Tensor:
    stacks, qs = task.bench_set(seed, n + 2, 1, 2)
    return torch.tensor([stacks[0].prompt(q.key) for q in qs])


def test_checkpoint_names_are_what_sglangs_deepseek_loader_reads() -> None:
    names = set(_model().state())
    n = SMALL.layers
    must = {
        "model.embed_tokens.weight", "model.norm.weight", "lm_head.weight",
        "model.layers.0.self_attn.q_proj.weight", "model.layers.0.self_attn.kv_a_proj_with_mqa.weight",
        "model.layers.0.self_attn.kv_a_layernorm.weight", "model.layers.0.self_attn.kv_b_proj.weight",
        "model.layers.0.self_attn.o_proj.weight", "model.layers.1.mlp.gate_proj.weight",
        f"model.layers.{n}.enorm.weight", f"model.layers.{n}.hnorm.weight",
        f"model.layers.{n}.eh_proj.weight", f"model.layers.{n}.shared_head.norm.weight",
        f"model.layers.{n}.mlp.gate.weight", f"model.layers.{n}.mlp.gate.e_score_correction_bias",
        f"model.layers.{n}.mlp.experts.7.down_proj.weight",
        f"model.layers.{n}.mlp.shared_experts.up_proj.weight",
    }  # fmt: skip
    assert must <= names
    # SGLang's NextN loader takes these two from the target model (shared), and a dense layer
    # has no router: neither may be in the file.
    assert not any(
        k.endswith(("shared_head.head.weight",)) or k == f"model.layers.{n}.embed_tokens.weight"
        for k in names
    )
    assert not any(k.startswith("model.layers.0.mlp.experts") for k in names)


def test_config_is_a_deepseek_v3_with_one_nextn_layer_that_sglang_runs_as_moe() -> None:
    cfg = rm.Shape().config()
    assert cfg["architectures"] == ["DeepseekV3ForCausalLM"] and cfg["model_type"] == "deepseek_v3"
    assert cfg["num_nextn_predict_layers"] == 1 and cfg["q_lora_rank"] is None
    assert (cfg["kv_lora_rank"], cfg["qk_rope_head_dim"]) == (512, 64)  # the served geometry
    # FlashInfer's SM90 ragged prefill compiles (192, 128) for MLA: nope + rope, v
    assert (cfg["qk_nope_head_dim"] + cfg["qk_rope_head_dim"], cfg["v_head_dim"]) == (192, 128)
    # every target layer dense; the NextN layer (SGLang: always sparse) routes 2 of 8, a
    # power of two, as sgl-kernel's fused gate wants
    assert cfg["first_k_dense_replace"] == cfg["num_hidden_layers"] == 2
    assert (cfg["n_routed_experts"], cfg["num_experts_per_tok"], cfg["n_group"]) == (8, 2, 1)
    assert cfg["rope_interleave"] is True and cfg["rope_scaling"] is None
    assert cfg["vocab_size"] == task.VOCAB_SIZE and cfg["max_position_embeddings"] >= 32768 + 16
    assert rm.Shape.from_config(cfg) == rm.Shape()


def test_safetensors_bytes_are_deterministic_and_read_back_exactly(tmp_path) -> None:
    m = _model()
    a, b = tmp_path / "a.safetensors", tmp_path / "b.safetensors"
    rm.save_safetensors(a, m.state())
    rm.save_safetensors(b, _model().state())
    assert a.read_bytes() == b.read_bytes()
    raw = a.read_bytes()
    (n,) = struct.unpack("<Q", raw[:8])
    header = json.loads(raw[8 : 8 + n])
    assert (8 + n) % 8 == 0
    bias = f"model.layers.{SMALL.layers}.mlp.gate.e_score_correction_bias"
    assert header[bias]["dtype"] == "F32"
    assert {h["dtype"] for k, h in header.items() if k not in ("__metadata__", bias)} == {"BF16"}
    back = rm.load_safetensors(a)
    for k, t in m.state().items():
        want = t.to(torch.float32 if k == bias else torch.bfloat16)
        assert torch.equal(back[k], want), k


def test_a_written_checkpoint_reloads_to_the_same_logits(tmp_path) -> None:
    m = _model(rm.Shape(hidden_size=32, intermediate_size=32, heads=8, moe_intermediate_size=16))
    rm.write_checkpoint(m, tmp_path / "ckpt")
    assert json.loads((tmp_path / "ckpt" / "tokenizer.json").read_text()) == task.tokenizer_json()
    back = rm.read_checkpoint(tmp_path / "ckpt").eval()
    ids = _ids()
    with torch.no_grad():
        m_bf = rm.RecallModel(m.shape)
        m_bf.load_state({k: v.to(torch.bfloat16) for k, v in m.state().items()})
        want, _, _ = m_bf.eval().target(ids)
        got, _, _ = back.target(ids)
    assert torch.equal(got, want)


def test_widening_doubles_the_heads_and_keeps_the_function() -> None:
    m = _model(rm.Shape(hidden_size=32, intermediate_size=32, heads=8, moe_intermediate_size=16))
    wide = rm.widen(m).eval()
    assert wide.shape.heads == 16
    assert wide.state()["model.layers.0.self_attn.kv_b_proj.weight"].shape == (16 * 256, 512)
    ids = _ids()
    with torch.no_grad():
        a, _, _ = m.target(ids)
        b, _, _ = wide.target(ids)
        _, da = m(ids, chain=3, region=ids.shape[1] - 4)
        _, db = wide(ids, chain=3, region=ids.shape[1] - 4)
    assert torch.allclose(a, b, atol=1e-4, rtol=1e-4)
    for (x, px), (y, py) in zip(da, db, strict=True):
        assert torch.equal(px, py) and torch.allclose(x, y, atol=1e-4, rtol=1e-4)
    # adjacent copies: a kernel that swaps heads 2i and 2i+1 could not be told apart
    q = wide.state()["model.layers.0.self_attn.q_proj.weight"].view(16, 192, -1)
    assert torch.equal(q[0], q[1]) and not torch.equal(q[1], q[2])


def _absorbed_decode(layer: rm.Layer, x: torch.Tensor, fp8: bool) -> torch.Tensor:
    """SGLang's MLA decode for the last position of x (B, T, H): q_nope absorbed into the
    latent by w_kc, scores against the cached [c_kv, k_pe] rows (576 wide, FP8 e4m3 when
    fp8), the latent output taken back through w_vc, then o_proj. Returns (B, H)."""
    a = layer.self_attn
    hn = layer.input_layernorm(x)
    t = x.shape[1]
    pos = torch.arange(t)
    rows = a.cache_rows(hn, pos, fp8=False)
    if fp8:
        rows = rows.to(torch.float8_e4m3fn).to(rows.dtype)  # what an FP8 pool returns
    c, k_pe = rows.split([rm.KV_LORA, rm.ROPE], dim=-1)  # (B, T, 512), (B, T, 64)
    w_kc, w_vc = a.absorbed()  # (h, 128, 512) each
    q = a.queries(hn, pos)[:, :, -1]  # (B, h, 192)
    q_nope, q_pe = q[..., : rm.NOPE], q[..., rm.NOPE :]
    q_lat = torch.einsum("bhn,hnc->bhc", q_nope, w_kc)  # (B, h, 512)
    scores = torch.einsum("bhc,btc->bht", q_lat, c) + torch.einsum("bhr,btr->bht", q_pe, k_pe)
    p = (scores * rm.QK_DIM**-0.5).softmax(-1)
    o_lat = torch.einsum("bht,btc->bhc", p, c)
    o = torch.einsum("bhc,hvc->bhv", o_lat, w_vc)  # (B, h, 128)
    return a.o_proj(o.reshape(o.shape[0], -1))


@pytest.mark.parametrize("fp8", [False, True])
def test_the_absorbed_decode_sglang_serves_equals_the_models_mha_form(fp8: bool) -> None:
    m = _model(rm.Shape(hidden_size=32, intermediate_size=32, heads=8, moe_intermediate_size=16))
    layer = m.layers[0]
    x = m.embed_tokens(_ids())
    with torch.no_grad():
        hn = layer.input_layernorm(x)
        pos = torch.arange(x.shape[1])
        rows = layer.self_attn.cache_rows(hn, pos, fp8=fp8)  # training's FP8 rounding
        k, v = layer.self_attn.keys_values(rows)
        mha = layer.self_attn.out(rm.attend(layer.self_attn.queries(hn, pos), k, v))[:, -1]
        absorbed = _absorbed_decode(layer, x, fp8)
        plain = _absorbed_decode(layer, x, not fp8)
    assert torch.allclose(mha, absorbed, atol=1e-4, rtol=1e-3)
    # and the KV dtype visibly matters: this check sees FP8 rounding
    assert not torch.allclose(mha, plain, atol=1e-4, rtol=1e-3)


def test_fake_fp8_rounds_as_the_pool_does_and_passes_gradients() -> None:
    x = torch.linspace(-3, 3, 101, requires_grad=True)
    y = rm.fake_fp8(x)
    assert torch.equal(y.detach(), x.detach().to(torch.float8_e4m3fn).float())
    y.sum().backward()
    assert torch.equal(x.grad, torch.ones_like(x))


def test_chained_draft_steps_see_the_draft_cache_sglang_keeps() -> None:
    pos1 = torch.arange(6)
    pos2 = torch.arange(3, 6)
    pos3 = torch.arange(4, 6)
    keys = [(pos1, None, None), (pos2, None, None)]
    mask = rm.RecallModel._chain_mask(pos3, keys, 3)
    # step 3 at j=5: target-fed rows 0..3, step 2's row at 4, its own row
    assert mask[1].tolist() == [True] * 4 + [False] * 2 + [False, True, False] + [False, True]
    assert mask[0].tolist() == [True] * 3 + [False] * 3 + [True, False, False] + [True, False]


def test_miswired_attention_changes_the_answer() -> None:
    m = _model(rm.Shape(hidden_size=32, intermediate_size=32, heads=8, moe_intermediate_size=16))
    ids = _ids()
    with torch.no_grad():
        good, _, _ = m.target(ids)
        for mode in ("previous_layer", "shifted_rows"):
            bad, _, _ = m.target(ids, miswire=mode)
            assert (bad - good).abs().max() > 1e-2, mode
