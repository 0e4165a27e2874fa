"""Hand-made wrong (and right) variants of the patched 0.5.17 `flashattention_backend.py` (the fa3
absorbed-MLA path), and of the 0.5.17 flashinfer backend's ports past decode context parallelism,
for the rule tests. Same form as backend_mutants.py: each edit's `old` occurs exactly once."""

from __future__ import annotations

from support.backend_mutants import Mutant, one

DECODE_GATHER = """\
            kv_cache = self._mla_kv_cache(
                layer, q.dtype, metadata.page_table, metadata.cache_seqlens_int32
            )
"""
EXTEND_GATHER = """\
                kv_cache = self._mla_kv_cache(
                    layer, q.dtype, page_table, None if is_cp_mode else cache_seqlens
                )
"""
GUARD = """\
        if self.fp8_gather is None:
            return pool.to(dtype)
"""
GATHER_CALL = "            pool, page_table, cache_seqlens, self.page_size, dtype\n"
EXPAND_GUARD = (
    "        if self.fp8_gather is not None:\n            kv_cache = self._mla_kv_cache(\n"
)
DECODE_EXPAND_KV = (
    "\n                    k_cache=k_rope_expand,\n                    v_cache=c_kv_expand,\n"
)

FA_WRONG = [
    one(
        "decode gathers through the speculative expand table",
        DECODE_GATHER,
        DECODE_GATHER.replace(
            "metadata.page_table", "self.forward_metadata_spec_decode_expand.page_table"
        ),
        "kv-source",
        "reads KV gathered through the page table "
        "self.forward_metadata_spec_decode_expand.page_table, not through its own page_table "
        "(self.forward_metadata.page_table)",
    ),
    one(
        "decode gathers for the query offsets instead of the cache lengths",
        DECODE_GATHER,
        DECODE_GATHER.replace("metadata.cache_seqlens_int32", "metadata.cu_seqlens_q"),
        "kv-source",
        "reads KV gathered for the lengths self.forward_metadata.cu_seqlens_q, not for its own "
        "cache_seqlens",
    ),
    one(
        "the GLMSERVE_FP8_GATHER guard inverted",
        GUARD,
        GUARD.replace("is None", "is not None"),
        "switch-polarity",
        "calls cast_pages() on a switch object although GLMSERVE_FP8_GATHER=0",
    ),
    one(
        "the guard inverted also casts with the gather on",
        GUARD,
        GUARD.replace("is None", "is not None"),
        "no-full-cast",
        "casts the KV pool self.token_to_kv_pool.get_key_buffer(layer.layer_id)",
    ),
    one(
        "the cascade's second call reads the first call's gather",
        DECODE_EXPAND_KV,
        DECODE_EXPAND_KV.replace("k_rope_expand", "k_rope_cache").replace(
            "c_kv_expand", "c_kv_cache"
        ),
        "kv-source",
        "not through its own page_table (self.forward_metadata_spec_decode_expand.page_table)",
    ),
    one(
        "the expand helper skips its own gather with the series on",
        EXPAND_GUARD,
        EXPAND_GUARD.replace("is not None", "is None"),
        "kv-source",
        "not through its own page_table (self.forward_metadata_spec_decode_expand.page_table)",
    ),
    one(
        "the upstream cast left on the decode path",
        DECODE_GATHER,
        "            kv_cache = self.token_to_kv_pool.get_key_buffer(layer.layer_id).to(q.dtype)\n",
        "no-full-cast",
        "forward_decode casts the KV pool",
    ),
    one(
        "the upstream cast left on the decode path reaches the kernel",
        DECODE_GATHER,
        "            kv_cache = self.token_to_kv_pool.get_key_buffer(layer.layer_id).to(q.dtype)\n",
        "kv-source",
        "forward_decode: flash_attn_with_kvcache() reads a full-pool cast instead of the gather",
    ),
    one(
        "a sliced full-pool cast computed on the extend path",
        EXTEND_GATHER,
        EXTEND_GATHER
        + "                spare = self.token_to_kv_pool.get_key_buffer(layer.layer_id)"
        "[:, :, :512].to(q.dtype)\n",
        "no-full-cast",
        "forward_extend casts the KV pool",
    ),
    one(
        "the gather converts another layer's pool than upstream does",
        GATHER_CALL,
        GATHER_CALL.replace("pool,", "self.token_to_kv_pool.get_key_buffer(0),"),
        "kv-source",
        "but upstream converts self.token_to_kv_pool.get_key_buffer(layer.layer_id)",
    ),
    one(
        "the gather walks the token table instead of the call's page table",
        GATHER_CALL,
        GATHER_CALL.replace("page_table,", "self.req_to_token,"),
        "kv-source",
        "reads KV gathered through the page table self.req_to_token",
    ),
    one(
        "the extend gather never runs (a dead branch)",
        EXTEND_GATHER,
        "                if False:\n"
        + "".join("    " + line + "\n" for line in EXTEND_GATHER.splitlines())
        + "                else:\n"
        "                    kv_cache = self.token_to_kv_pool.get_key_buffer(0)\n",
        "kv-source",
        "forward_extend: flash_attn_with_kvcache() reads self.token_to_kv_pool.get_key_buffer(0)",
    ),
]

FA_RIGHT = [
    one(
        "the guard as truthiness",
        GUARD,
        GUARD.replace("if self.fp8_gather is None:", "if not self.fp8_gather:"),
    ),
    one(
        "decode gathers every column of its table (correct, only slower)",
        DECODE_GATHER,
        DECODE_GATHER.replace("metadata.cache_seqlens_int32", "None"),
    ),
]

# The 0.5.17 flashinfer backend: the row count must follow decode context parallelism's
# replacement of the paged extend's indptr (its buffer's layout), and every plan stays noted.
PREFILL_DCP_NOTE = """\
                if attn_dcp_metadata.dcp_kv_indices is not None:
                    kv_indices = attn_dcp_metadata.dcp_kv_indices
            if self.attn_backend.fp8_gather is not None:
                self.attn_backend.fp8_gather.note_rows(kv_indptr)
"""
FI_DCP_WRONG = [
    Mutant(
        "the extend's row count noted before DCP replaces its indptr",
        (
            (
                PREFILL_DCP_NOTE,
                PREFILL_DCP_NOTE.replace(
                    "            if self.attn_backend.fp8_gather is not None:\n"
                    "                self.attn_backend.fp8_gather.note_rows(kv_indptr)\n",
                    "",
                ),
            ),
            (
                "            # mla paged prefill\n            if attn_dcp_metadata is not None:\n",
                "            # mla paged prefill\n"
                "            if self.attn_backend.fp8_gather is not None:\n"
                "                self.attn_backend.fp8_gather.note_rows(kv_indptr)\n"
                "            if attn_dcp_metadata is not None:\n",
            ),
        ),
        "plan-rows",
        "plans with kv_indptr attn_dcp_metadata.dcp_kv_indptr, but its row count is not noted",
    ),
    one(
        "the DCP extend branch gathers its step buffer's rows from the pool instead",
        "                k_buf = forward_batch.attn_dcp_metadata.dcp_kv_buffer.to(q.dtype)\n",
        "                k_buf = self.token_to_kv_pool.get_key_buffer(layer.layer_id).to(q.dtype)\n",
        "no-full-cast",
        "forward_extend casts the KV pool",
    ),
]
