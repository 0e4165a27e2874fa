"""Hand-made wrong (and right) variants of the patched 0.5.12.post1 backend, for the rule tests.

Each mutant is (old, new) applied to the real patched `flashinfer_mla_backend.py`; `old` must
occur exactly once, so a change of the series that makes a mutant stale fails loudly instead of
silently testing nothing. WRONG mutants must be refused by the named rule with the message
fragment; RIGHT variants are other correct wirings the rules must accept.
"""

from __future__ import annotations

from dataclasses import dataclass

EXTEND_GATHER = """\
            k_buf = self._mla_kv_for_wrapper(
                forward_batch, layer, q.dtype, prefill_wrapper_paged
            )
"""
DECODE_GATHER = """\
        k_buffer = self._mla_kv_for_wrapper(
            forward_batch, layer, q.dtype, decode_wrapper
        )
"""
DECODE_RUN_KV = """\
            k_buffer[:, :, : layer.v_head_dim],
            k_buffer[:, :, layer.v_head_dim :],
"""
GUARD = """\
        if self.fp8_gather is None:
            return pool.to(dtype)
"""
GATHER_RETURN = "        return self.fp8_gather.cast(pool, kv_indices, dtype)\n"
DECODE_NOTE = """\
        if self.attn_backend.fp8_gather is not None:
            self.attn_backend.fp8_gather.note_rows(
                kv_indptr,
                fast_decode_kwargs["kv_indptr_cpu"] if init_metadata_replay else None,
            )
"""
DECODE_REPLAY_PLAN = """\
            wrapper.plan(
                fast_decode_kwargs["qo_indptr_cpu"],
"""
DECODE_INDPTR = """\
            kv_indptr[1 : bs + 1] = torch.cumsum(paged_kernel_lens, dim=0)
            kv_indptr = kv_indptr[: bs + 1]
            kv_indices = (
"""
PREFILL_NOTE = """\
            if self.attn_backend.fp8_gather is not None:
                self.attn_backend.fp8_gather.note_rows(kv_indptr)
"""
PREFILL_PLAN_TAIL = """\
                True,
                sm_scale,
                self.q_data_type,
                self.data_type,
            )
"""
CAPTURE_FAST_PLAN = (
    "            decode_wrapper.plan = partial(fast_mla_decode_plan, decode_wrapper)\n"
)
PLAN_ARGS = (
    "self.cuda_graph_qo_indptr_cpu, self.cuda_graph_kv_indptr_cpu, self.cuda_graph_kv_indices, "
    "self.cuda_graph_kv_lens, 16, 512, 64, 1, False, 1.0, torch.bfloat16, torch.bfloat16"
)
FIRST_CLASS = "class FlashInferMhaChunkKVRunner:\n"
# The native FP8 decode wiring (issue 10's series).
NATIVE_INDICES = (
    "        planned = self.fp8_native.planned(wrapper)\n"
    '        kv_indices = getattr(wrapper, "_kv_indices_buf", None)\n'
)
NATIVE_INDPTR = "        kv_indptr, sm_scale, qo_indptr, max_q_len = planned\n"
NATIVE_GUARD = "        if self.fp8_native is None or q_nope.dtype != torch.bfloat16:\n"
# Preceded by q_rope at the same depth: decode's call (forward_extend's is one level deeper).
NATIVE_POOL = (
    "                q_rope,\n"
    "                forward_batch.token_to_kv_pool.get_key_buffer(layer.layer_id),\n"
)
# The same call in forward_extend (speculative batches).
VERIFY_POOL = "".join("    " + line + "\n" for line in NATIVE_POOL.splitlines())
NATIVE_RECORD = """\
        if self.attn_backend.fp8_native is not None:
            # The native kernel reads what this plan covers: this step's kv_indptr (a view
            # of the persistent buffer, rewritten before every graph replay: the backend's
            # own, or the multi-step draft backend's for EAGLE draft decode) and the
            # wrapper's kv_indices.
            self.attn_backend.fp8_native.note_plan(wrapper, kv_indptr, sm_scale)
"""
HOST_ON_REPLAY = (
    'wrapper, fast_decode_kwargs["kv_indptr_cpu"] if init_metadata_replay else kv_indptr'
)
VERIFY_RECORD = """\
                native.note_plan(
                    wrapper_paged,
                    kv_indptr if spec_info is not None else None,
"""
VERIFY_NOTE = "                native.note_plan(\n"


@dataclass(frozen=True)
class Mutant:
    name: str
    edits: tuple[tuple[str, str], ...]
    rule: str | None = None  # None: a correct variant, accepted
    needle: str = ""


def one(name: str, old: str, new: str, rule: str | None = None, needle: str = "") -> Mutant:
    return Mutant(name, ((old, new),), rule, needle)


WRONG = [
    one(
        "extend gathers with the decode wrapper's indices",
        EXTEND_GATHER,
        EXTEND_GATHER.replace("prefill_wrapper_paged", "self.decode_wrapper"),
        "kv-source",
        "reads KV gathered at self.decode_wrapper._kv_indices_buf, not at the index buffer of the wrapper it runs (self.forward_metadata.prefill_wrapper)",
    ),
    one(
        "decode gathers with the eager wrapper, runs the step's (CUDA-graph) wrapper",
        DECODE_GATHER,
        DECODE_GATHER.replace("q.dtype, decode_wrapper", "q.dtype, self.decode_wrapper"),
        "kv-source",
        "reads KV gathered at self.decode_wrapper._kv_indices_buf, not at the index buffer of the wrapper it runs (self.forward_metadata.decode_wrapper)",
    ),
    one(
        "note_rows fed the persistent indptr buffer instead of this step's",
        DECODE_NOTE,
        DECODE_NOTE.replace("                kv_indptr,\n", "                self.kv_indptr,\n"),
        "plan-rows",
        "with kv_indptr kv_indptr[:len(req_pool_indices) + 1], but its row count is not noted",
    ),
    one(
        "the replay path loses the host indptr",
        DECODE_NOTE,
        DECODE_NOTE.replace(
            'fast_decode_kwargs["kv_indptr_cpu"] if init_metadata_replay else None', "None"
        ),
        "plan-rows",
        "with kv_indptr fast_decode_kwargs['kv_indptr_cpu'], but its row count is not noted",
    ),
    one(
        "the GLMSERVE_FP8_GATHER guard inverted",
        GUARD,
        GUARD.replace("is None", "is not None"),
        "switch-polarity",
        "calls cast() on a switch object although GLMSERVE_FP8_GATHER=0",
    ),
    one(
        "the guard inverted also casts with the gather on",
        GUARD,
        GUARD.replace("is None", "is not None"),
        "no-full-cast",
        "casts the KV pool",
    ),
    one(
        "run() fed a fresh sliced get_key_buffer(...)[...].to(...), the gather's result unused",
        DECODE_RUN_KV,
        "            forward_batch.token_to_kv_pool.get_key_buffer(layer.layer_id)"
        "[:, :, : layer.v_head_dim].to(q.dtype),\n"
        "            forward_batch.token_to_kv_pool.get_key_buffer(layer.layer_id)"
        "[:, :, layer.v_head_dim :].to(q.dtype),\n",
        "kv-source",
        "decode_wrapper.run() reads a full-pool cast instead of the gather's output",
    ),
    one(
        "a sliced full-pool cast computed on the decode path",
        DECODE_GATHER,
        DECODE_GATHER
        + "        spare = forward_batch.token_to_kv_pool.get_key_buffer(layer.layer_id)"
        "[:, :, :512].to(q.dtype)\n",
        "no-full-cast",
        "forward_decode casts the KV pool",
    ),
    one(
        "note_rows in a dead branch",
        PREFILL_NOTE,
        PREFILL_NOTE.replace("if self.attn_backend.fp8_gather is not None:", "if False:"),
        "plan-rows",
        "wrapper_paged.plan() plans with kv_indptr kv_indptr[:len(seq_lens) + 1], but its row count",
    ),
    one(
        "note_rows under the inverted switch (dead with the gather on)",
        PREFILL_NOTE,
        PREFILL_NOTE.replace("is not None", "is None"),
        "plan-rows",
        "wrapper_paged.plan() plans with kv_indptr",
    ),
    Mutant(
        "the target-verify / draft-extend path (spec_info) loses its row count",
        (
            (PREFILL_NOTE, ""),
            (
                "            custom_mask = None\n",
                "            custom_mask = None\n" + PREFILL_NOTE,
            ),
        ),
        "plan-rows",
        "plans with kv_indptr spec_info.generate_attn_arg_prefill(",
    ),
    one(
        "note_rows after the plan: too late for the replayed graph",
        PREFILL_NOTE + "            kv_len_arr",
        "            kv_len_arr",
        "plan-rows",
        "wrapper_paged.plan() plans with kv_indptr",
    ),
    Mutant(
        "the count noted before the indptr is written (a stale row count)",
        (
            (DECODE_NOTE, ""),
            (
                DECODE_INDPTR,
                "            if self.attn_backend.fp8_gather is not None:\n"
                "                self.attn_backend.fp8_gather.note_rows(kv_indptr[: bs + 1])\n"
                + DECODE_INDPTR,
            ),
        ),
        "plan-rows",
        "it was written after its row count was noted",
    ),
    one(
        "a plan through an alias, with no row count before it",
        CAPTURE_FAST_PLAN,
        CAPTURE_FAST_PLAN
        + f"            replan = decode_wrapper.plan\n            replan({PLAN_ARGS})\n",
        "plan-rows",
        "init_forward_metadata_capture_cuda_graph: replan() plans",
    ),
    one(
        "a plan through getattr(wrapper, 'plan'), with no row count before it",
        CAPTURE_FAST_PLAN,
        CAPTURE_FAST_PLAN + f'            getattr(decode_wrapper, "plan")({PLAN_ARGS})\n',
        "plan-rows",
        "init_forward_metadata_capture_cuda_graph: getattr(decode_wrapper, 'plan')() plans",
    ),
    one(
        "a plain-function plan (fast_mla_decode_plan(wrapper, ...)) with no row count",
        CAPTURE_FAST_PLAN,
        CAPTURE_FAST_PLAN + f"            fast_mla_decode_plan(decode_wrapper, {PLAN_ARGS})\n",
        "plan-rows",
        "with kv_indptr self.cuda_graph_kv_indptr_cpu",
    ),
    Mutant(
        "a plain-function replay plan whose host indptr is not counted",
        (
            (
                DECODE_REPLAY_PLAN,
                DECODE_REPLAY_PLAN.replace(
                    "wrapper.plan(\n", "fast_mla_decode_plan(\n                wrapper,\n"
                ),
            ),
            ('fast_decode_kwargs["kv_indptr_cpu"] if init_metadata_replay else None', "None"),
        ),
        "plan-rows",
        "with kv_indptr fast_decode_kwargs['kv_indptr_cpu'], but its row count is not noted",
    ),
    one(
        "a cast in a module-level helper the extend path calls",
        EXTEND_GATHER,
        "            k_buf = _upstream_kv(forward_batch, layer, q.dtype)\n",
        "no-full-cast",
        "forward_extend (via _upstream_kv) casts the KV pool",
    ),
    one(
        "the gather converts another pool than upstream does",
        GATHER_RETURN,
        GATHER_RETURN.replace(
            "cast(pool,", "cast(forward_batch.token_to_kv_pool.get_key_buffer(0),"
        ),
        "kv-source",
        "but upstream converts forward_batch.token_to_kv_pool.get_key_buffer(layer.layer_id)",
    ),
    one(
        "the switch read from the environment with the wrong polarity",
        GUARD,
        GUARD.replace(
            "if self.fp8_gather is None:",
            'if os.environ.get("GLMSERVE_FP8_GATHER", "1").strip() != "0":',
        ),
        "switch-polarity",
        "calls cast() on a switch object although GLMSERVE_FP8_GATHER=0",
    ),
    one(
        "the gather reads indices that are not a wrapper's buffer",
        GATHER_RETURN,
        GATHER_RETURN.replace("kv_indices,", "self.kv_indptr,"),
        "kv-source",
        "reads KV gathered at self.kv_indptr, not at the index buffer",
    ),
]
NATIVE_WRONG = [
    one(
        "native decode reads the eager wrapper's indices (stale under CUDA graphs)",
        NATIVE_INDICES,
        NATIVE_INDICES.replace("getattr(wrapper,", "getattr(self.decode_wrapper,"),
        "native-decode",
        "the native kernel's kv_indices is self.decode_wrapper._kv_indices_buf, not the index "
        "buffer of the wrapper whose plan gave its kv_indptr",
    ),
    one(
        "native decode reads the persistent indptr buffer instead of the planned one",
        NATIVE_INDPTR,
        "        _, sm_scale, qo_indptr, max_q_len = planned\n        kv_indptr = self.kv_indptr\n",
        "native-decode",
        "the native kernel's kv_indptr is self.kv_indptr, not the kv_indptr recorded",
    ),
    one(
        "native decode reads the wrapper's own indptr (never refreshed by the fast replay plan)",
        NATIVE_INDPTR,
        "        _, sm_scale, qo_indptr, max_q_len = planned\n"
        "        kv_indptr = wrapper._kv_indptr_buf\n",
        "native-decode",
        "the native kernel's kv_indptr is self.forward_metadata.decode_wrapper._kv_indptr_buf",
    ),
    one(
        "the plan recorded for native decode is the persistent buffer",
        NATIVE_RECORD,
        NATIVE_RECORD.replace("wrapper, kv_indptr,", "wrapper, self.kv_indptr,"),
        "native-decode",
        "records kv_indptr self.kv_indptr for native decode, not the device indptr",
    ),
    one(
        "the plan recorded for native decode is the host indptr on replay",
        NATIVE_RECORD,
        NATIVE_RECORD.replace("wrapper, kv_indptr", HOST_ON_REPLAY),
        "native-decode",
        "records kv_indptr fast_decode_kwargs['kv_indptr_cpu'] for native decode",
    ),
    one(
        "the replay plan is never recorded for native decode",
        NATIVE_RECORD,
        "        if not init_metadata_replay:\n"
        + "".join("    " + line + "\n" for line in NATIVE_RECORD.splitlines()),
        "native-decode",
        "plans a wrapper that is not recorded for native decode (note_plan) after it",
    ),
    Mutant(
        "no plan is ever recorded for native decode",
        ((NATIVE_RECORD, ""), (VERIFY_NOTE, "                (lambda *_: None)(\n")),
        "native-decode",
        "no plan is ever recorded for native decode",
    ),
    one(
        "the native kernel reads another layer's pool",
        NATIVE_POOL,
        NATIVE_POOL.replace("get_key_buffer(layer.layer_id)", "get_key_buffer(0)"),
        "native-decode",
        "the native kernel reads forward_batch.token_to_kv_pool.get_key_buffer(0), but upstream",
    ),
    one(
        "speculative batches' native kernel reads another layer's pool",
        VERIFY_POOL,
        VERIFY_POOL.replace("get_key_buffer(layer.layer_id)", "get_key_buffer(0)"),
        "native-decode",
        "forward_extend: the native kernel reads forward_batch.token_to_kv_pool.get_key_buffer(0)",
    ),
    one(
        "speculative batches' plan recorded with the persistent indptr buffer",
        VERIFY_RECORD,
        VERIFY_RECORD.replace("kv_indptr if spec_info", "self.kv_indptr if spec_info"),
        "native-decode",
        "records kv_indptr self.kv_indptr for native decode, not the device indptr",
    ),
    one(
        "the native kernel fed a 16-bit cast of the pool",
        NATIVE_POOL,
        NATIVE_POOL.replace(
            "get_key_buffer(layer.layer_id)", "get_key_buffer(layer.layer_id).to(q.dtype)"
        ),
        "no-full-cast",
        "forward_decode casts the KV pool",
    ),
    one(
        "the native guard inverted: native never runs with the mode on",
        NATIVE_GUARD,
        NATIVE_GUARD.replace("is None", "is not None"),
        "native-decode",
        "no forward path reaches its kernel with GLMSERVE_FP8_ATTENTION=native",
    ),
    one(
        "the native guard inverted also calls planned() on None in gather mode",
        NATIVE_GUARD,
        NATIVE_GUARD.replace("is None", "is not None"),
        "switch-polarity",
        "calls planned() on a switch object although GLMSERVE_FP8_ATTENTION=gather",
    ),
]
WRONG += NATIVE_WRONG
HELPER = FIRST_CLASS.replace(
    "class",
    "def _upstream_kv(fb, layer, dtype):\n    return fb.token_to_kv_pool.get_key_buffer(layer.layer_id).to(dtype)\n\n\nclass",
)
WRONG = [
    Mutant(m.name, (*m.edits, (FIRST_CLASS, HELPER)), m.rule, m.needle)
    if "module-level helper" in m.name
    else m
    for m in WRONG
]


# Wrong wirings whose effect shows in the numbers, run by the class checks on the CPU and the GPU
# (the rules refuse every mutant statically; the rest are caught by the rules alone: e.g. a lost
# host indptr only matters when the host count exceeds the device one).
OBSERVABLE = (
    "extend gathers with the decode wrapper's indices",
    "decode gathers with the eager wrapper, runs the step's (CUDA-graph) wrapper",
    "note_rows fed the persistent indptr buffer instead of this step's",
    "note_rows in a dead branch",
    "the target-verify / draft-extend path (spec_info) loses its row count",
    "the gather converts another pool than upstream does",
    "native decode reads the eager wrapper's indices (stale under CUDA graphs)",
    "the native kernel reads another layer's pool",
    "the native guard inverted: native never runs with the mode on",
)
assert set(OBSERVABLE) <= {m.name for m in WRONG}, "OBSERVABLE names a mutant WRONG lacks"

RIGHT = [
    one(
        "the replay plan as a plain function, its host indptr counted",
        DECODE_REPLAY_PLAN,
        DECODE_REPLAY_PLAN.replace(
            "wrapper.plan(\n", "fast_mla_decode_plan(\n                wrapper,\n"
        ),
    ),
    one(
        "the guard as truthiness",
        GUARD,
        GUARD.replace("if self.fp8_gather is None:", "if not self.fp8_gather:"),
    ),
    one(
        "the switch read from the environment",
        GUARD,
        GUARD.replace(
            "if self.fp8_gather is None:",
            'if os.environ.get("GLMSERVE_FP8_GATHER", "1").strip().lower() in ("0", "false"):',
        ),
    ),
    one(
        "an aliased plan with its row count",
        PREFILL_PLAN_TAIL,
        PREFILL_PLAN_TAIL
        + "            again = wrapper_paged.plan\n            if self.attn_backend.fp8_gather:\n                self.attn_backend.fp8_gather.note_rows(kv_indptr)\n"
        "            again(qo_indptr, kv_indptr, kv_indices, kv_len_arr, 16, 512, 64, 1, True, sm_scale, self.q_data_type, self.data_type)\n",
    ),
]


def mutate(source: str, mutant: Mutant) -> str:
    for old, new in mutant.edits:
        count = source.count(old)
        if count != 1:
            raise AssertionError(f"mutant {mutant.name!r}: {old[:60]!r} occurs {count} times")
        source = source.replace(old, new)
    return source


# The observable wrong wirings on 0.5.17's patched backend (the class-check tests): the same
# mistakes, spelled where that line moved the code (the pool read from `self.token_to_kv_pool`,
# `_mla_kv_for_wrapper` without the forward batch). Spellings 0.5.17 kept are taken from WRONG.
_LINE_0_5_17 = {
    "extend gathers with the decode wrapper's indices": (
        "                k_buf = self._mla_kv_for_wrapper(layer, q.dtype, prefill_wrapper_paged)\n",
        "                k_buf = self._mla_kv_for_wrapper(layer, q.dtype, self.decode_wrapper)\n",
    ),
    "decode gathers with the eager wrapper, runs the step's (CUDA-graph) wrapper": (
        "        k_buffer = self._mla_kv_for_wrapper(layer, q.dtype, decode_wrapper)\n",
        "        k_buffer = self._mla_kv_for_wrapper(layer, q.dtype, self.decode_wrapper)\n",
    ),
    "the gather converts another pool than upstream does": (
        GATHER_RETURN,
        GATHER_RETURN.replace("cast(pool,", "cast(self.token_to_kv_pool.get_key_buffer(0),"),
    ),
    "the native kernel reads another layer's pool": (
        "                q_rope,\n                self.token_to_kv_pool.get_key_buffer(layer.layer_id),\n",
        "                q_rope,\n                self.token_to_kv_pool.get_key_buffer(0),\n",
    ),
}
assert set(_LINE_0_5_17) <= set(OBSERVABLE)


def observable(line: str) -> list[Mutant]:
    """The OBSERVABLE wrong wirings, in OBSERVABLE's order, spelled for the patched backend of
    SGLang source series `line` (0.5.12.post1 or 0.5.17)."""
    by_name = {m.name: m for m in WRONG}
    if line == "0.5.12.post1":
        return [by_name[name] for name in OBSERVABLE]
    if line != "0.5.17":
        raise ValueError(f"no observable mutants for series {line}")
    return [
        one(name, *_LINE_0_5_17[name]) if name in _LINE_0_5_17 else by_name[name]
        for name in OBSERVABLE
    ]
