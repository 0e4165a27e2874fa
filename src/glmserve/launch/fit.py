"""Does the model fit, with room for KV? Computed from the model's config.json, never guessed.

The default SGLang line (glmserve.sglang_lines) sizes its KV pool from what is left of
`mem_fraction_static x GPU memory` after the weights, so a replica that is too small fails minutes into loading, or starts with a
pool that cannot hold one long request. This check runs before anything starts.

Weights (DeepSeek-V3-style MLA + MoE, which GLM-5's GlmMoeDsaForCausalLM is), per GPU:
- split across TP ranks: q_b/q, kv_b and o projections, dense MLPs, routed and shared experts,
  the vocab-parallel embedding and lm_head;
- repeated on every rank: the MLA latent projections q_a and kv_a (replicated linears in
  SGLang's deepseek_v2.py), the DSA indexer and the MoE router gate.
A ModelOpt NVFP4 checkpoint stores the expert linears as 4-bit values with one FP8 scale per
16 (0.5625 bytes per weight); everything else is counted at 2 bytes (BF16). That over-counts
if the checkpoint also quantizes attention, which errs on the side of refusing.

KV: MLA keeps one latent row per token per layer and every TP rank holds the whole pool, so
the pool's size in tokens does not grow with TP. A dense-MLA row is kv_lora_rank +
qk_rope_head_dim values (576 for GLM-5) at the KV dtype; SGLang's DSA FP8 layout ("nsa", "dsa"
from 0.5.17 on) packs it into 656 bytes plus a 132-byte indexer key.

MTP (speculative decoding from the model's own NextN layer, glmserve.launch.speculative) comes
on top, outside the static fraction: SGLang sizes the pool for the target alone, then the draft
worker loads the NextN layer (one more MoE decoder layer, in BF16: deepseek_nextn.py drops the
modelopt_fp4 quant config for it) and allocates its own KV for the same number of tokens, one
layer deep (it reuses the target's memory_pool_config). Both take from the 1 - fraction that
activations, NCCL and the CUDA graphs also live in.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

from glmserve.launch import speculative
from glmserve.launch.errors import LaunchError

if TYPE_CHECKING:
    from glmserve.launch.sglang_argv import ServerArgs

GIB = 1024**3
MIB = 1024**2
NVFP4_BYTES = 0.5625  # 4-bit value + an FP8 scale per 16 values
BF16_BYTES = 2
DSA_FP8_ROW_BYTES = 656 + 132  # packed NSA latent row + indexer key (FP8 + fp32 scale)
DSA_BACKENDS = ("nsa", "dsa")  # 0.5.17 renamed nsa to dsa (nsa stays its deprecated alias)


@dataclass(frozen=True)
class Fit:
    """The numbers behind a fit decision, per GPU, in bytes (printed by --dry-run)."""

    tp: int
    gpu_memory: int
    mem_fraction_static: float
    fraction_source: str  # "argv" or "SGLang default"
    weights_per_gpu: int
    kv_bytes_per_token: int
    kv_pool_tokens: int
    min_kv_tokens: int
    # MTP's draft (0 without one): its weights and its own KV, outside the static fraction.
    draft_weights_per_gpu: int = 0
    draft_kv_bytes: int = 0

    @property
    def headroom(self) -> int:
        """What the static fraction leaves of one GPU: activations, graphs, NCCL, the draft."""
        return int(self.gpu_memory * (1 - self.mem_fraction_static))

    @property
    def draft_bytes(self) -> int:
        return self.draft_weights_per_gpu + self.draft_kv_bytes

    @property
    def draft_fits(self) -> bool:
        return self.draft_bytes <= self.headroom

    @property
    def fits(self) -> bool:
        return self.kv_pool_tokens >= self.min_kv_tokens and self.draft_fits

    def as_dict(self) -> dict[str, Any]:
        return {
            "tp": self.tp,
            "gpu_memory_gib": round(self.gpu_memory / GIB, 1),
            "mem_fraction_static": self.mem_fraction_static,
            "mem_fraction_source": self.fraction_source,
            "weights_per_gpu_gib": round(self.weights_per_gpu / GIB, 1),
            "kv_bytes_per_token": self.kv_bytes_per_token,
            "kv_pool_tokens": self.kv_pool_tokens,
            "min_kv_tokens": self.min_kv_tokens,
            **self._draft_dict(),
            "fits": self.fits,
        }

    def _draft_dict(self) -> dict[str, Any]:
        if not self.draft_bytes:
            return {}  # no MTP: the report stays as it was
        return {
            "draft_weights_per_gpu_gib": round(self.draft_weights_per_gpu / GIB, 2),
            "draft_kv_gib": round(self.draft_kv_bytes / GIB, 2),
            "headroom_gib": round(self.headroom / GIB, 1),
        }


def _int(config: Mapping[str, Any], key: str, default: int | None = None) -> int:
    value = config.get(key, default)
    if not isinstance(value, int) or isinstance(value, bool) or value < 0:
        raise LaunchError(f"model config has no usable {key!r} ({value!r}); cannot size the model")
    return value


def weight_bytes(
    config: Mapping[str, Any], quantized_experts: bool, embeddings: bool = True
) -> tuple[int, int]:
    """(bytes split across TP ranks, bytes repeated on every rank) for the whole model
    (embeddings=False: without the embedding and lm_head, which an MTP draft shares)."""
    h = _int(config, "hidden_size")
    layers = _int(config, "num_hidden_layers")
    heads = _int(config, "num_attention_heads")
    vocab = _int(config, "vocab_size")
    nope, rope = _int(config, "qk_nope_head_dim"), _int(config, "qk_rope_head_dim")
    v_head, kv_rank = _int(config, "v_head_dim"), _int(config, "kv_lora_rank")
    q_rank = config.get("q_lora_rank")
    dense_layers = min(_int(config, "first_k_dense_replace", 0), layers)
    routed, shared = _int(config, "n_routed_experts", 0), _int(config, "n_shared_experts", 0)
    moe_inter = _int(config, "moe_intermediate_size", 0)
    inter = _int(config, "intermediate_size")

    attn_split = heads * (nope + rope) * (q_rank or h)  # q_b (or q when there is no q LoRA)
    attn_split += kv_rank * heads * (nope + v_head) + heads * v_head * h  # kv_b, o
    attn_rep = h * (kv_rank + rope) + (h * q_rank if q_rank else 0)  # kv_a, q_a
    if "index_topk" in config:  # the DSA indexer: query/key projections and head weights
        idx_heads, idx_dim = _int(config, "index_n_heads"), _int(config, "index_head_dim")
        attn_rep += (q_rank or h) * idx_heads * idx_dim + h * idx_dim + h * idx_heads
    moe_layers = layers - dense_layers if routed else 0
    expert_params = moe_layers * (routed + shared) * 3 * h * moe_inter
    dense_params = (layers - moe_layers) * 3 * h * inter
    gate_bytes = moe_layers * h * routed * 4  # fp32 router weights

    expert_bytes = expert_params * (NVFP4_BYTES if quantized_experts else BF16_BYTES)
    embedding_params = 2 * vocab * h if embeddings else 0
    split = expert_bytes + BF16_BYTES * (layers * attn_split + dense_params + embedding_params)
    repeated = BF16_BYTES * layers * attn_rep + gate_bytes
    return int(split), int(repeated)


def kv_bytes_per_token(config: Mapping[str, Any], kv_dtype: str, backend: str | None) -> int:
    """Bytes one token costs in the pool of every TP rank, over all layers."""
    layers = _int(config, "num_hidden_layers")
    row = _int(config, "kv_lora_rank") + _int(config, "qk_rope_head_dim")
    fp8 = kv_dtype.startswith("fp8")
    if backend in DSA_BACKENDS and fp8:
        return layers * DSA_FP8_ROW_BYTES
    return layers * row * (1 if fp8 else BF16_BYTES)


def default_mem_fraction(gpu_memory: int, tp: int, args: ServerArgs) -> float:
    """The pinned SGLang's own choice when --mem-fraction-static is not given
    (server_args._handle_gpu_memory_settings): reserve room for activations of one prefill
    chunk (1.5 MB per token), CUDA graphs (2 MB per batch size) and TP (1 GB per 8 ranks),
    at least 10 GB on GPUs over 60 GB, and give the rest to weights + KV."""
    mib = gpu_memory / MIB
    chunk = args.get("--chunked-prefill-size")
    graphs = args.get("--cuda-graph-max-bs")
    default_chunk, default_graphs = (16384, 512) if mib >= 160 * 1024 else (8192, 512)
    if mib < 160 * 1024 and tp < 4:
        default_graphs = 256
    chunk_tokens = int(chunk) if chunk else default_chunk
    graph_bs = int(graphs) if graphs else default_graphs
    reserved = 512 + max(chunk_tokens, 2048) * 1.5 + graph_bs * 2 + tp / 8 * 1024
    if mib > 60 * 1024:
        reserved = max(reserved, 10 * 1024)
    reserved += speculative.draft_reserve_mib(args)  # the draft model and its graphs
    return round((mib - reserved) / mib, 3)


def draft_bytes(
    config: Mapping[str, Any], args: ServerArgs, tp: int, kv_pool_tokens: int
) -> tuple[int, int]:
    """(draft weights per GPU, draft KV per GPU) of MTP from the model's own NextN layer, or
    (0, 0). The NextN layer is one MoE decoder layer plus eh_proj (2h x h, replicated), in BF16;
    it shares the target's embedding and lm_head (eagle_worker.py set_embed_and_head)."""
    spec = speculative.from_args(args)
    if spec is None or not spec.uses_nextn_layer:
        return 0, 0
    merged = speculative.effective_config(config, args)
    draft_layers = merged.get("num_nextn_predict_layers")
    if not isinstance(draft_layers, int) or draft_layers < 1:
        return 0, 0  # checks.check_model refuses this before the fit runs
    one_layer = {**merged, "num_hidden_layers": draft_layers, "first_k_dense_replace": 0}
    split, repeated = weight_bytes(one_layer, quantized_experts=False, embeddings=False)
    hidden = _int(merged, "hidden_size")
    weights = split // tp + repeated + BF16_BYTES * 2 * hidden * hidden * draft_layers
    kv_dtype = args.get("--kv-cache-dtype") or "auto"
    per_token = kv_bytes_per_token(one_layer, kv_dtype, args.get("--attention-backend"))
    return weights, per_token * kv_pool_tokens


def compute_fit(
    config: Mapping[str, Any],
    *,
    quant_algo: str | None,
    tp: int,
    gpu_memory: int,
    args: ServerArgs,
) -> Fit:
    """Per-GPU budget for a server started with `args` (the final SGLang argv, as SGLang's
    parser reads it: an abbreviated or repeated flag counts as SGLang counts it)."""
    split, repeated = weight_bytes(config, quantized_experts=(quant_algo or "").upper() == "NVFP4")
    per_gpu = split // tp + repeated
    given = args.get("--mem-fraction-static")
    fraction = float(given) if given is not None else default_mem_fraction(gpu_memory, tp, args)
    kv_dtype = args.get("--kv-cache-dtype") or "auto"
    per_token = kv_bytes_per_token(config, kv_dtype, args.get("--attention-backend"))
    budget = int(gpu_memory * fraction) - per_gpu
    context = args.get("--context-length") or config.get("max_position_embeddings")
    pool_tokens = max(budget, 0) // per_token
    draft_weights, draft_kv = draft_bytes(config, args, tp, pool_tokens)
    return Fit(
        tp=tp,
        gpu_memory=gpu_memory,
        mem_fraction_static=fraction,
        fraction_source="argv" if given is not None else "SGLang default",
        weights_per_gpu=per_gpu,
        kv_bytes_per_token=per_token,
        kv_pool_tokens=pool_tokens,
        min_kv_tokens=int(context or 0),
        draft_weights_per_gpu=draft_weights,
        draft_kv_bytes=draft_kv,
    )


def check_fit(fit: Fit, profile_name: str, where: str) -> None:
    """Refuse in one line when the weights do not fit, or leave no room for one full-length
    request's KV, or the fraction itself is impossible (more memory than the GPU has)."""
    if not 0 < fit.mem_fraction_static <= 1:
        raise LaunchError(
            f"profile '{profile_name}': --mem-fraction-static {fit.mem_fraction_static:g} is "
            "not a fraction of GPU memory, in (0, 1]"
        )
    if fit.fits:
        return
    if fit.kv_pool_tokens >= fit.min_kv_tokens:  # only the MTP draft does not fit
        raise LaunchError(
            f"profile '{profile_name}' does not fit {where}: the MTP draft needs "
            f"{fit.draft_bytes / GIB:.1f} GiB per GPU (NextN layer "
            f"{fit.draft_weights_per_gpu / GIB:.1f} GiB in BF16, its KV "
            f"{fit.draft_kv_bytes / GIB:.1f} GiB) outside --mem-fraction-static "
            f"{fit.mem_fraction_static:g}, which leaves {fit.headroom / GIB:.1f} GiB per GPU "
            "for it, activations and CUDA graphs; lower the fraction or turn MTP off"
        )
    usable = fit.gpu_memory * fit.mem_fraction_static / GIB
    weights = fit.weights_per_gpu / GIB
    if fit.kv_pool_tokens == 0:
        detail = f"the weights alone need {weights:.1f} GiB per GPU at TP {fit.tp}"
    else:
        detail = (
            f"after {weights:.1f} GiB of weights per GPU at TP {fit.tp}, the KV pool holds "
            f"{fit.kv_pool_tokens:,} tokens, less than one {fit.min_kv_tokens:,}-token request"
        )
    fraction = (
        f"--mem-fraction-static {fit.mem_fraction_static:g}"
        if fit.fraction_source == "argv"
        else f"SGLang's default mem fraction {fit.mem_fraction_static:g}"
    )
    raise LaunchError(
        f"profile '{profile_name}' does not fit {where}: {detail}, and {fraction} leaves "
        f"{usable:.1f} GiB per GPU for weights and KV; use more GPUs (a larger --tp, or more nodes)"
    )
