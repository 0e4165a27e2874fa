"""Run the REAL patched `flashinfer_mla_backend.py` on a CPU: stand-ins for what it imports.

SGLang cannot be imported here (it needs CUDA builds of sglang-kernel, FlashInfer's JIT, ...), so
the backend file from the real wheel, patched by the real apply tool, is executed with these
modules in place of its imports, just while it loads:

  * `flashinfer.BatchMLAPagedAttentionWrapper`: a torch MLA reference with FlashInfer 0.6.11's
    data flow: `plan()` stores (or, for CUDA-graph wrappers, copies into the captured buffers)
    `_kv_indices_buf` and hands the HOST indptr to `_cached_module.plan`; `run()` reads exactly
    `_kv_indices_buf` and the schedule of the last module plan (which SGLang's
    `fast_mla_decode_plan` calls directly on replay). A row of `ckv_cache` that run() reads
    and the gather did not write is NaN, and so is the output.
  * `create_flashinfer_kv_indices_triton`: its contract in torch (the Triton original loops on a
    device-loaded bound, which the interpreter cannot run).
  * `ForwardMode`, `SpecInput` (+ an EAGLE verify input with the real `generate_attn_arg_prefill`
    contract), `envs`, server args: the few members the backend touches.
  * `fp8_kv_gather`, `fp8_mla_decode`: the REAL patched modules, their kernels under
    TRITON_INTERPRET=1 (native decode's "not a CUDA device" refusal is waived, nothing else).
  * `AttentionBackend`: the real base class file from the wheel, when given.
  * 0.5.17's runtime context (`get_parallel`, `get_buffer`, ...) and the decode-context-parallel
    helpers the backend calls on every plan (`update_local_kv_lens_for_dcp`, its metadata
    class): the REAL files from that line's wheel (RUNTIME_RELS), when a site holding them is
    given; the unified-memory hooks as the static pool (no v2p table), the captured-prefill
    probes as "not capturing", and the DCP planner and EAGLE draft helpers (never reached at
    one rank without drafts) refuse if called.

The backend's hard-coded `device="cuda"` allocations become CPU tensors (CpuForCuda).
"""

from __future__ import annotations

import contextlib
import enum
import importlib.util
import sys
import types
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import torch
from torch.overrides import TorchFunctionMode

from glmserve.selftest.classcheck import BACKEND_MODULE, GATHER_MODULE, Parts
from glmserve.selftest.runner import load_kernel_module

NATIVE_MODULE = "sglang.srt.layers.attention.fp8_mla_decode"

BACKEND_REL = "sglang/srt/layers/attention/flashinfer_mla_backend.py"
GATHER_REL = "sglang/srt/layers/attention/fp8_kv_gather.py"
NATIVE_REL = "sglang/srt/layers/attention/fp8_mla_decode.py"
BASE_REL = "sglang/srt/layers/attention/base_attn_backend.py"
# 0.5.17: the pure-Python modules of the runtime context and DCP the backend runs through.
RUNTIME_REL = "sglang/srt/runtime_context.py"
DCP_LAYOUT_REL = "sglang/srt/layers/dcp/layout.py"
DCP_METADATA_REL = "sglang/srt/layers/dcp/metadata.py"
RUNTIME_RELS = (RUNTIME_REL, DCP_LAYOUT_REL, DCP_METADATA_REL)


class CpuForCuda(TorchFunctionMode):
    """`torch.empty(..., device="cuda")` and friends allocate on the CPU instead."""

    def __torch_function__(self, func, types, args=(), kwargs=None):
        kwargs = dict(kwargs or {})
        dev = kwargs.get("device")
        if dev is not None and torch.device(dev).type == "cuda":
            kwargs["device"] = "cpu"
        return func(*args, **kwargs)


# --- FlashInfer ------------------------------------------------------------------------------


class _Module:
    """What FlashInfer's JIT module keeps between plan() and run(): the host schedule."""

    def __init__(self) -> None:
        self.schedule: tuple[Any, Any, Any] | None = None

    def plan(self, float_ws, int_ws, pinned_ws, qo_indptr, kv_indptr, kv_len, heads, dim, causal):
        self.schedule = (qo_indptr.clone(), kv_indptr.clone(), bool(causal))
        return ("plan-info", heads, dim)


class RefMLAWrapper:
    """BatchMLAPagedAttentionWrapper's contract (0.6.11), computed in fp32 with torch."""

    def __init__(
        self, float_workspace_buffer, use_cuda_graph=False, qo_indptr=None, kv_indptr=None,
        kv_indices=None, kv_len_arr=None, backend="auto",
    ):  # fmt: skip
        self._float_workspace_buffer = float_workspace_buffer
        self.device = float_workspace_buffer.device
        self._int_workspace_buffer = torch.empty(8, dtype=torch.uint8)
        self._pin_memory_int_workspace_buffer = torch.empty(8, dtype=torch.uint8)
        self._use_cuda_graph = use_cuda_graph
        self._qo_indptr_buf = qo_indptr
        self._kv_indptr_buf = kv_indptr
        self._kv_indices_buf = kv_indices
        self._kv_len_arr_buf = kv_len_arr
        self._backend = backend

    def plan(
        self, qo_indptr, kv_indptr, kv_indices, kv_len_arr, num_heads, head_dim_ckv,
        head_dim_kpe, page_size, causal, sm_scale, q_data_type, kv_data_type, use_profiler=False,
    ):  # fmt: skip
        self._cached_module = _Module()
        if self._use_cuda_graph:
            self._qo_indptr_buf.copy_(qo_indptr)
            self._kv_indptr_buf.copy_(kv_indptr)
            self._kv_indices_buf[: len(kv_indices)].copy_(kv_indices)
            self._kv_len_arr_buf.copy_(kv_len_arr)
        else:
            self._qo_indptr_buf = qo_indptr.to(self.device)
            self._kv_indptr_buf = kv_indptr.to(self.device)
            self._kv_indices_buf = kv_indices.to(self.device)
            self._kv_len_arr_buf = kv_len_arr.to(self.device)
        self._causal = causal
        self._page_size = page_size
        self._sm_scale = sm_scale
        self._plan_info = self._cached_module.plan(
            self._float_workspace_buffer, self._int_workspace_buffer,
            self._pin_memory_int_workspace_buffer, qo_indptr.to("cpu"), kv_indptr.to("cpu"),
            kv_len_arr.to("cpu"), num_heads, head_dim_ckv, causal,
        )  # fmt: skip

    def run(self, q_nope, q_pe, ckv_cache, kpe_cache, out=None, lse=None, return_lse=False):
        qo_indptr, kv_indptr, _ = self._cached_module.schedule
        outs = []
        for b in range(len(kv_indptr) - 1):
            slots = self._kv_indices_buf[int(kv_indptr[b]) : int(kv_indptr[b + 1])].long()
            ckv = ckv_cache[slots, 0].float()
            kpe = kpe_cache[slots, 0].float()
            qs = slice(int(qo_indptr[b]), int(qo_indptr[b + 1]))
            qn, qp = q_nope[qs].float(), q_pe[qs].float()
            logits = torch.einsum("thd,kd->thk", qn, ckv) + torch.einsum("thd,kd->thk", qp, kpe)
            logits = logits * self._sm_scale
            if self._causal:
                n_q, n_kv = qn.shape[0], ckv.shape[0]
                allowed = torch.arange(n_kv)[None, :] <= torch.arange(n_q)[:, None] + (n_kv - n_q)
                logits = logits.masked_fill(~allowed[:, None, :], float("-inf"))
            outs.append(torch.einsum("thk,kd->thd", logits.softmax(-1), ckv))
        result = torch.cat(outs).to(q_nope.dtype)
        if out is None:
            return result
        out.copy_(result)
        return out


class RaggedWrapper:
    """Constructed by the backend; the harness never takes the ragged path."""

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        pass


# --- SGLang ----------------------------------------------------------------------------------


class ForwardMode(enum.IntEnum):
    EXTEND = enum.auto()
    DECODE = enum.auto()
    MIXED = enum.auto()
    IDLE = enum.auto()
    TARGET_VERIFY = enum.auto()
    DRAFT_EXTEND = enum.auto()

    def is_decode(self) -> bool:
        return self == ForwardMode.DECODE

    def is_idle(self) -> bool:
        return self == ForwardMode.IDLE

    def is_decode_or_idle(self) -> bool:
        return self in (ForwardMode.DECODE, ForwardMode.IDLE)

    def is_target_verify(self) -> bool:
        return self == ForwardMode.TARGET_VERIFY

    def is_draft_extend(self, include_v2: bool = False) -> bool:
        return self == ForwardMode.DRAFT_EXTEND


class SpecInput:
    # 0.5.17+: class-level defaults every SpecInput carries (read by the verify graph capture).
    ragged_verify_layout = None
    num_tokens_per_req = -1

    def __init__(self, kind: str) -> None:
        self.spec_input_type = kind


class _KvIndices:
    """create_flashinfer_kv_indices_triton[(bs,)](req_to_token, req_pool_indices, lens, kv_indptr,
    kv_start_idx, kv_indices, stride): kv_indices[indptr[i]:][:lens[i]] = req_to_token[req[i]][:lens[i]]."""

    def __getitem__(self, grid: tuple[int, ...]):
        def launch(
            req_to_token, req_pool_indices, lens, kv_indptr, kv_start_idx, kv_indices, stride
        ):
            for i in range(grid[0]):
                start = int(kv_start_idx[i]) if kv_start_idx is not None else 0
                n, at = int(lens[i]), int(kv_indptr[i])
                row = req_to_token[int(req_pool_indices[i])]
                kv_indices[at : at + n] = row[start : start + n]

        return launch


create_flashinfer_kv_indices_triton = _KvIndices()


class EagleVerifyInput(SpecInput):
    """The members of SGLang's EagleVerifyInput the MLA backend uses (0.5.12.post1 contract)."""

    def __init__(self, draft_token_num: int) -> None:
        super().__init__("EAGLE_VERIFY")
        self.draft_token_num = draft_token_num
        self.custom_mask = torch.ones(0, dtype=torch.bool)

    def generate_attn_arg_prefill(
        self, req_pool_indices, paged_kernel_lens, paged_kernel_lens_sum, req_to_token
    ):
        bs = len(req_pool_indices)
        k = self.draft_token_num
        qo_indptr = torch.arange(0, (bs + 1) * k, k, dtype=torch.int32)
        lens = paged_kernel_lens + k
        cum = torch.zeros(bs + 1, dtype=torch.int32)
        cum[1:] = torch.cumsum(lens, dim=0)
        kv_indices = torch.empty(paged_kernel_lens_sum + k * bs, dtype=torch.int32)
        create_flashinfer_kv_indices_triton[(bs,)](
            req_to_token, req_pool_indices, lens, cum, None, kv_indices, req_to_token.size(1)
        )
        return kv_indices, cum, qo_indptr, self.custom_mask


class _Env:
    def __init__(self, value: Any) -> None:
        self.value = value

    def get(self) -> Any:
        return self.value


class _UnreachedModule(types.ModuleType):
    """A module whose every function refuses: what the harness overrides but SGLang still names
    (0.5.17's `get_parallel()` evaluates its canonical getter before it reads the override)."""

    def __getattr__(self, name: str) -> Any:
        if name.startswith("__"):
            raise AttributeError(name)
        return _unreached(f"{self.__name__}.{name}")


@contextlib.contextmanager
def _running(runtime: bool) -> Iterator[None]:
    """Around the whole run: `device="cuda"` allocations on the CPU and, for 0.5.17, the
    parallel-state module the runtime context imports lazily, on every topology read."""
    late = {}
    if runtime:
        late = {name: types.ModuleType(name) for name in ("sglang", "sglang.srt")}
        late["sglang.srt.distributed"] = types.ModuleType("sglang.srt.distributed")
        for package in late.values():
            package.__path__ = []  # a package, so its submodule resolves
        state = "sglang.srt.distributed.parallel_state"
        late[state] = _UnreachedModule(state)
    with CpuForCuda(), _installed(late):
        yield


def _unreached(name: str) -> Any:
    def refuse(*args: Any, **kwargs: Any) -> Any:
        raise AssertionError(f"{name} is not reached at one rank without drafts")

    return refuse


def _runtime_modules(runtime_site: Path, mod: Any) -> dict[str, types.ModuleType]:
    """0.5.17's runtime context and DCP helpers: the real files, their few imports stood in."""
    found: dict[str, types.ModuleType] = {}
    found["sglang.srt.runtime_context"] = _load(
        "sglang.srt.runtime_context", runtime_site / RUNTIME_REL
    )
    with _installed(found):
        layout = _load("sglang.srt.layers.dcp.layout", runtime_site / DCP_LAYOUT_REL)
    metadata = _load("sglang.srt.layers.dcp.metadata", runtime_site / DCP_METADATA_REL)
    static_pool = types.SimpleNamespace(
        v2p_page_table=None, translate_kv_loc_dense=None, kernel_page_multiplier=1, enabled=False
    )
    found.update({
        "sglang.srt.layers.dcp": mod(
            "sglang.srt.layers.dcp",
            DecodeContextParallelMetadata=metadata.DecodeContextParallelMetadata,
            update_local_kv_lens_for_dcp=layout.update_local_kv_lens_for_dcp,
        ),
        "sglang.srt.layers.dcp.planner": mod(
            "x", plan_dcp_decode_metadata=_unreached("plan_dcp_decode_metadata")
        ),
        "sglang.srt.layers.attention.unified_mem_hooks": mod(
            "x", unified_mla_hooks=lambda allocator: static_pool
        ),
        "sglang.kernels": mod("sglang.kernels"),
        "sglang.kernels.ops": mod("sglang.kernels.ops"),
        "sglang.kernels.ops.attention": mod("sglang.kernels.ops.attention"),
        "sglang.kernels.ops.attention.utils": mod(
            "x", assert_buffer_fits=_unreached("assert_buffer_fits")
        ),
        "sglang.srt.model_executor.runner_backend_utils": mod(
            "sglang.srt.model_executor.runner_backend_utils"
        ),
        "sglang.srt.model_executor.runner_backend_utils.breakable_cuda_graph": mod(
            "x", is_in_breakable_cuda_graph=lambda: False
        ),
        "sglang.srt.model_executor.runner_backend_utils.tc_piecewise_cuda_graph": mod(
            "x", is_in_tc_piecewise_cuda_graph=lambda: False
        ),
        "sglang.srt.speculative.spec_utils": mod(
            "x",
            draft_kv_indices_buffer_width=_unreached("draft_kv_indices_buffer_width"),
            draft_kv_indices_used_len=_unreached("draft_kv_indices_used_len"),
            generate_draft_decode_kv_indices=_unreached("generate_draft_decode_kv_indices"),
        ),
    })  # fmt: skip
    return found


def _modules(
    gather: types.ModuleType,
    native: types.ModuleType | None,
    base: Path | None,
    runtime_site: Path | None = None,
) -> dict[str, types.ModuleType]:
    def mod(name: str, **attrs: Any) -> types.ModuleType:
        m = types.ModuleType(name)
        m.__path__ = []  # a package, so submodules resolve
        m.__dict__.update(attrs)
        return m

    envs = types.SimpleNamespace(
        SGLANG_ENABLE_TORCH_COMPILE=_Env(False),
        SGLANG_FLASHINFER_WORKSPACE_SIZE=_Env(1 << 20),
        SGLANG_ROLE_NAMESPACES=_Env("off"),  # 0.5.17's runtime context reads it at import
    )
    found = {
        "sglang": mod("sglang"),
        "sglang.srt": mod("sglang.srt"),
        "sglang.srt.compilation": mod("sglang.srt.compilation"),
        "sglang.srt.compilation.piecewise_context_manager": mod(
            "x", is_in_piecewise_cuda_graph=lambda: False
        ),
        "sglang.srt.environ": mod("x", envs=envs),
        "sglang.srt.layers": mod("sglang.srt.layers"),
        "sglang.srt.layers.attention": mod("sglang.srt.layers.attention"),
        "sglang.srt.layers.attention.flashinfer_backend": mod(
            "x", create_flashinfer_kv_indices_triton=create_flashinfer_kv_indices_triton
        ),
        "sglang.srt.layers.dp_attention": mod("x", get_attention_tp_size=lambda: 1),
        "sglang.srt.model_executor": mod("sglang.srt.model_executor"),
        "sglang.srt.model_executor.forward_batch_info": mod(
            "x", ForwardBatch=object, ForwardMode=ForwardMode
        ),
        "sglang.srt.server_args": mod("x", get_global_server_args=lambda: None),
        "sglang.srt.speculative": mod("sglang.srt.speculative"),
        "sglang.srt.speculative.spec_info": mod("x", SpecInput=SpecInput),
        "sglang.srt.utils": mod(
            "x", is_flashinfer_available=lambda: True, is_sm100_supported=lambda: False,
            next_power_of_2=lambda n: 1 << (n - 1).bit_length(),
        ),
        "flashinfer": mod(
            "flashinfer", BatchMLAPagedAttentionWrapper=RefMLAWrapper,
            BatchPrefillWithRaggedKVCacheWrapper=RaggedWrapper,
        ),
        GATHER_MODULE: gather,
    }  # fmt: skip
    if native is not None:
        found[NATIVE_MODULE] = native
    if runtime_site is not None:
        with _installed(found):  # the runtime context reads `envs` at import
            found.update(_runtime_modules(runtime_site, mod))
    attention_base = mod("x", AttentionBackend=type("AttentionBackend", (), {}))
    if base is not None:
        # The real base class, its two imports stood in for.
        found["sglang.kernel_api_logging"] = mod("x", debug_kernel_api=lambda f=None, **_: f)
        found["sglang.srt.utils.common"] = mod("x", is_npu=lambda: False)
        with _installed(found):
            attention_base = _load("sglang.srt.layers.attention.base_attn_backend", base)
    found["sglang.srt.layers.attention.base_attn_backend"] = attention_base
    return found


@contextlib.contextmanager
def _installed(modules: dict[str, types.ModuleType]) -> Iterator[None]:
    saved = {name: sys.modules.get(name) for name in modules}
    sys.modules.update(modules)
    try:
        yield
    finally:
        for name, old in saved.items():
            if old is None:
                sys.modules.pop(name, None)
            else:
                sys.modules[name] = old


def _load(name: str, path: Path) -> types.ModuleType:
    spec = importlib.util.spec_from_file_location(name, path)
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    sys.modules[name] = module
    try:
        spec.loader.exec_module(module)
    finally:
        sys.modules.pop(name, None)
    return module


def _native_on_cpu(path: Path) -> types.ModuleType:
    """The real native decode module; its refusal of a non-CUDA device (and only that) waived,
    since its kernel runs under the interpreter here."""
    native = load_kernel_module(path)
    refuse = native.unsupported_reason

    def unsupported_reason(model_runner: Any) -> str | None:
        reason = refuse(model_runner)
        return None if reason == f"device {torch.device(model_runner.device)}" else reason

    native.unsupported_reason = unsupported_reason
    return native


def cpu_parts(
    backend_file: Path,
    gather_file: Path,
    base_file: Path | None = None,
    runtime_site: Path | None = None,
) -> Parts:
    """The harness's Parts for a backend file and gather file (both real, patched) on the CPU;
    the native decode module beside the gather file is loaded too when the series has it, and
    0.5.17's runtime context and DCP helpers from `runtime_site` (a tree holding RUNTIME_RELS)."""
    gather = load_kernel_module(gather_file)
    native_file = gather_file.with_name(Path(NATIVE_REL).name)
    native = _native_on_cpu(native_file) if native_file.is_file() else None
    with _installed(_modules(gather, native, base_file, runtime_site)):
        backend = _load(f"_cpu_{BACKEND_MODULE.rsplit('.', 1)[1]}", backend_file)
    return Parts(
        backend=backend,
        gather=gather,
        verify_input=EagleVerifyInput,
        device=torch.device("cpu"),
        real_graphs=False,
        flashinfer_backends=("auto",),
        context=lambda: _running(runtime_site is not None),
    )
