"""Self-test through the live wiring: the PATCHED `FlashInferMLAAttnBackend` itself, against the
same class with the series switched off (`switches.FP8_GATHER` 0, the upstream full cast): bit
for bit where the patch runs gather-then-cast, and against fp64 where decode runs the native FP8
kernel (`switches.FP8_ATTENTION` native, not bit-identical by design).

The kernel self-test (runner.py) proves the gather kernel with hand-set counts. This proves the
wiring around it: `note_rows` at every plan, the wrapper's own index buffer handed to the gather,
the shared shadow, the plan record native decode reads, and SGLang's own CUDA-graph capture and
fast replay plan. It builds the smallest faithful harness the pinned SGLang lets us build (it
ships no attention test kit): a model runner and forward batches carrying exactly the fields the
backend reads, the backend constructed by its real `__init__`, planned by its real
`init_forward_metadata*`, run by its real `forward_decode` / `forward_extend`.

Cases, each on several layers with their own pools of real-valued latents quantized to FP8 (so
softmax is spread and a wrong row changes the output, not only an argmax):
  * eager decode: scattered slots, a radix-shared prefix, the last pool row, a long context;
  * paged extend with a prefix (causal, several query tokens per request);
  * target verify (speculative decoding: an EAGLE verify input, its own wrapper), eagerly and
    in one CUDA graph captured once and replayed with other lengths (the native kernel must read
    each replay's plan: the speculative indptrs are new tensors every step);
  * decode in one CUDA graph captured once, replayed with other lengths through SGLang's
    `init_forward_metadata_replay_cuda_graph` (its `fast_mla_decode_plan`).
The shadow is poisoned with NaN before every call and every replay, so a row the wiring failed
to refresh reaches the output as NaN (the upstream output must be finite), and the gather's
device row count is zeroed before every plan, so a plan the wiring does not count gathers
nothing instead of riding on a larger count left by an earlier step.

Which SGLang and FlashInfer it runs on is the caller's `Parts`: the installed ones on the GPU
(`installed_parts`), stand-ins on the CPU (tests/support/sglang_standins.py), where the real
backend file and the real gather kernel (Triton interpreter) still run, and CUDA graphs are
emulated by re-running the captured batch after SGLang's replay planning.
"""

from __future__ import annotations

import contextlib
import importlib.util
import math
import os
import sys
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from pathlib import Path
from types import ModuleType, SimpleNamespace
from typing import Any

from glmserve.switches import FP8_ATTENTION, FP8_GATHER, GATHER_OFF, GATHER_ON

BACKEND_MODULE = "sglang.srt.layers.attention.flashinfer_mla_backend"
GATHER_MODULE = "sglang.srt.layers.attention.fp8_kv_gather"
CKV, KPE = 512, 64
ROW = CKV + KPE
QK_NOPE = 192  # GLM-5 / DeepSeek-V3: the softmax scale uses the head dim before absorption
SM_SCALE = 1.0 / math.sqrt(QK_NOPE + KPE)


# Native decode is not bit-identical: each (token, head) row's relative error against fp64 may be
# at most this many times the upstream path's worst row (issue 10's bar), or the floor: bf16
# output rounding (2^-9) plus fp16 softmax weights, which a reference rounding only once (the
# CPU stand-in for FlashInfer) beats. A wrong row, a stale indptr or another layer's pool is
# off by order 1, far above either.
NATIVE_ERR_RATIO = 1.5
NATIVE_ERR_FLOOR = 5e-3


# The SGLang source series whose flashinfer_mla_backend API this harness drives (one BackendApi
# each, below): 0.5.12.post1's (0.5.9 - 0.5.12.post1: capture / replay entry points, server args,
# forward_batch.token_to_kv_pool) and 0.5.17's (runtime context, init_forward_metadata_out_graph,
# the pools on the model runner, decode context parallelism held at one rank). 0.5.23 is not
# driven (it cannot run on the lab GPU), so the self-test refuses there in one line instead of
# crashing on a missing attribute.
CLASS_CHECK_SERIES = ("0.5.12.post1", "0.5.17")


def patched_series(backend_path: Path) -> str | None:
    """The source series the tree holding this backend file was patched with, read from the
    marker the apply tool leaves (None: no readable marker)."""
    import json

    site = backend_path.resolve().parents[4]
    try:
        series = json.loads((site / "sglang" / ".glmserve-patch.json").read_text())["series"]
    except (OSError, ValueError, KeyError, TypeError):
        return None
    return str(series)


def unported_line(backend_path: Path) -> str | None:
    """Why the class checks cannot run on the SGLang the backend file belongs to (None: they
    can), read from the marker beside it: the source series the tree was patched with."""
    series = patched_series(backend_path)
    if series is None or series in CLASS_CHECK_SERIES:
        return None  # no marker: the checks themselves will say what is wrong
    return (
        f"the class checks drive the flashinfer MLA backend API of series "
        f"{', '.join(CLASS_CHECK_SERIES)}; this tree is patched with series {series}, whose "
        "backend API they are not ported to yet"
    )


class WiringFailure(AssertionError):
    """The patched class's output differs from the upstream cast's (or is not finite)."""


class BackendApi:
    """SGLang 0.5.9 - 0.5.12.post1: where the harness configures and plans the backend."""

    @staticmethod
    def settings(args: Any) -> dict[str, Callable[[], Any]]:
        """The backend module's globals that read server arguments and the TP size."""
        return {"get_attention_tp_size": lambda: 1, "get_global_server_args": lambda: args}

    @staticmethod
    def single_rank(fmb: ModuleType) -> contextlib.AbstractContextManager[Any]:
        return contextlib.nullcontext()

    @staticmethod
    def capture(backend: Any, cap: Any) -> None:
        """Plan the batch a CUDA graph is captured with (before the capture)."""
        backend.init_forward_metadata_capture_cuda_graph(
            cap.batch_size, cap.positions.numel(), cap.req_pool_indices, cap.seq_lens, None,
            cap.forward_mode, cap.spec_info,
        )  # fmt: skip

    @staticmethod
    def in_graph(backend: Any, cap: Any) -> None:
        """What the graph itself records of the planning (nothing on this line)."""

    @staticmethod
    def replay(backend: Any, fb: Any) -> None:
        """Plan a replay of the captured graph with `fb`'s lengths."""
        backend.init_forward_metadata_replay_cuda_graph(
            fb.batch_size, fb.req_pool_indices, fb.seq_lens, fb.seq_lens_sum, None,
            fb.forward_mode, fb.spec_info, fb.seq_lens_cpu,
        )  # fmt: skip


class RuntimeContextApi(BackendApi):
    """SGLang 0.5.17: configuration read from the runtime context's namespace bags, the topology
    from `get_parallel()` (held at one rank without decode context parallelism through its own
    override hook, which the DCP helpers read too), and one entry point, run before a capture
    (`in_capture=True`) and before each replay, with the recorded part in
    `init_forward_metadata_in_graph`."""

    @staticmethod
    def settings(args: Any) -> dict[str, Callable[[], Any]]:
        disagg = SimpleNamespace(disaggregation_mode=args.disaggregation_mode)
        schedule = SimpleNamespace(disable_chunked_prefix_cache=args.disable_chunked_prefix_cache)
        kernel = SimpleNamespace(flashinfer_mla_disable_ragged=args.flashinfer_mla_disable_ragged)
        execution = SimpleNamespace(kernel=kernel)
        return {
            "get_disagg": lambda: disagg,
            "get_schedule": lambda: schedule,
            "get_exec": lambda: execution,
        }

    @staticmethod
    def single_rank(fmb: ModuleType) -> contextlib.AbstractContextManager[Any]:
        return fmb.get_parallel().override(attn_tp_size=1, attn_dcp_size=1, dcp_enabled=False)

    @staticmethod
    def capture(backend: Any, cap: Any) -> None:
        backend.init_forward_metadata_out_graph(cap, in_capture=True)

    @staticmethod
    def in_graph(backend: Any, cap: Any) -> None:
        backend.init_forward_metadata_in_graph(cap)

    @staticmethod
    def replay(backend: Any, fb: Any) -> None:
        backend.init_forward_metadata_out_graph(fb)


def backend_api(fmb: ModuleType) -> type[BackendApi]:
    """The API of the backend module's line: 0.5.17 reads its configuration from the runtime
    context (`get_parallel` and the namespace bags), earlier lines from the server args."""
    return RuntimeContextApi if hasattr(fmb, "get_parallel") else BackendApi


@dataclass
class Parts:
    """The SGLang pieces the harness drives."""

    backend: ModuleType  # the (patched) flashinfer_mla_backend module
    gather: ModuleType  # the fp8_kv_gather module that backend uses
    verify_input: Callable[[int], Any]  # draft_token_num -> an EAGLE verify SpecInput
    device: Any  # torch.device
    real_graphs: bool  # CUDA graphs (GPU) or emulated replays (CPU)
    flashinfer_backends: tuple[str, ...] = ("auto", "fa2")
    # Entered around the whole run (the CPU stand-ins redirect `device="cuda"` allocations).
    context: Callable[[], contextlib.AbstractContextManager[Any]] = contextlib.nullcontext

    @property
    def api(self) -> type[BackendApi]:
        return backend_api(self.backend)

    @property
    def decode_modes(self) -> tuple[str, ...]:
        """The decode paths the installed series has: native FP8 (the default) and gather."""
        return ("native", "gather") if hasattr(self.backend, "mla_decode_fp8") else ("gather",)


@dataclass
class Geometry:
    heads: int = 16
    pool_rows: int = 200_003
    layers: int = 2
    max_reqs: int = 16
    max_ctx: int = 4096
    decode_lens: tuple[int, ...] = (512, 300, 4096, 1)
    replay_lens: tuple[tuple[int, ...], ...] = ((1, 4096, 300, 77), (4096,) * 4, (1, 1, 1, 1))
    capture_len: int = 64
    extend_q: tuple[int, ...] = (2, 5, 1, 3)
    extend_prefix: tuple[int, ...] = (100, 300, 2000, 0)
    verify_lens: tuple[int, ...] = (40, 700, 1, 129)
    verify_replay_lens: tuple[tuple[int, ...], ...] = ((1, 2000, 300, 77), (600,) * 4)
    draft_tokens: int = 3
    shared_prefix: int = 300


# The GPU warm-up: every JIT build and compile the checks need, on small pools.
WARM = Geometry(
    pool_rows=5003, max_ctx=512, decode_lens=(100, 40, 512, 1), replay_lens=((1, 512, 40, 7),),
    extend_prefix=(30, 60, 400, 0), verify_lens=(20, 90, 1, 33),
    verify_replay_lens=((1, 300, 40, 7),),
)  # fmt: skip
# The CPU tests: the Triton interpreter and a torch reference are slow.
SMALL = Geometry(
    heads=2, pool_rows=1500, layers=2, max_reqs=16, max_ctx=256,
    decode_lens=(120, 40, 256, 1), replay_lens=((1, 200, 40, 7), (256,) * 4),
    capture_len=16, extend_q=(2, 3, 1, 2), extend_prefix=(30, 60, 100, 0),
    verify_lens=(20, 90, 1, 33), verify_replay_lens=((1, 200, 40, 7),), draft_tokens=2,
    shared_prefix=30,
)  # fmt: skip


@dataclass
class _World:
    torch: Any
    parts: Parts
    geo: Geometry
    pools: list[Any]
    layers: list[Any]
    req_to_token: Any
    gen: Any  # on the device: pools and queries
    lines: list[str] = field(default_factory=list)
    mode: str = "gather"  # the decode path under test
    server_args: Any = None  # what the backend module reads as its server arguments
    native_calls: int = 0  # calls of the native kernel from the backend (Python side)

    @property
    def kv_pool(self) -> Any:
        return SimpleNamespace(get_key_buffer=lambda layer_id: self.pools[layer_id])


def installed_parts(
    torch: Any, *, backend_path: Path | None = None, gather_path: Path | None = None
) -> Parts:
    """The installed SGLang/FlashInfer on this GPU; `backend_path`/`gather_path` swap in other
    files (fault injection), loaded under private names so the installed modules stay intact."""
    import importlib

    if gather_path is None and backend_path is None:
        backend = importlib.import_module(BACKEND_MODULE)
        gather = sys.modules[GATHER_MODULE]
    else:
        gather = (
            _load_file("_glmserve_classcheck_gather", gather_path)
            if gather_path is not None
            else importlib.import_module(GATHER_MODULE)
        )
        if backend_path is None:
            spec = importlib.util.find_spec(BACKEND_MODULE)
            assert spec is not None and spec.origin is not None
            backend_path = Path(spec.origin)
        saved = sys.modules.get(GATHER_MODULE)
        sys.modules[GATHER_MODULE] = gather  # the backend's `from ... import` binds to it
        try:
            backend = _load_file("_glmserve_classcheck_backend", backend_path)
        finally:
            if saved is not None:
                sys.modules[GATHER_MODULE] = saved
    return Parts(backend, gather, _verify_input_factory(torch), torch.device("cuda"), True)


def _verify_input_factory(torch: Any) -> Callable[[int], Any]:
    """SGLang's own EAGLE verify input; if its module cannot be imported in this environment
    (it pulls in the scheduler and sgl_kernel), the same contract built from SGLang's SpecInput
    and its own index kernel, so target verify is still run through the backend."""
    try:
        import inspect

        from sglang.srt.speculative.eagle_info import EagleVerifyInput

        if "device" in inspect.signature(EagleVerifyInput.create_idle_input).parameters:
            return lambda k: EagleVerifyInput.create_idle_input(1, 1, k, "cuda")  # 0.5.17
        return lambda k: EagleVerifyInput.create_idle_input(1, 1, k)
    except Exception:  # an optional module failing to import in a trimmed environment
        pass
    try:
        from sglang.srt.layers.attention.utils import create_flashinfer_kv_indices_triton
    except ImportError:  # 0.5.17 has no attention/utils.py; its MLA backend imports it from here
        from sglang.srt.layers.attention.flashinfer_backend import (
            create_flashinfer_kv_indices_triton,
        )
    from sglang.srt.speculative.spec_info import SpecInput, SpecInputType

    class VerifyInput(SpecInput):
        def __init__(self, draft_token_num: int) -> None:
            super().__init__(SpecInputType.EAGLE_VERIFY)
            self.draft_token_num = draft_token_num

        def get_spec_adjust_token_coefficient(self) -> tuple[int, int]:
            return self.draft_token_num, self.draft_token_num

        def generate_attn_arg_prefill(self, req_pool_indices, lens, lens_sum, req_to_token):
            dev, bs, k = req_pool_indices.device, len(req_pool_indices), self.draft_token_num
            qo_indptr = torch.arange(0, (bs + 1) * k, k, dtype=torch.int32, device=dev)
            cum = torch.zeros(bs + 1, dtype=torch.int32, device=dev)
            cum[1:] = torch.cumsum(lens + k, dim=0)
            kv_indices = torch.empty(lens_sum + k * bs, dtype=torch.int32, device=dev)
            create_flashinfer_kv_indices_triton[(bs,)](
                req_to_token, req_pool_indices, lens + k, cum, None, kv_indices,
                req_to_token.size(1),
            )  # fmt: skip
            return kv_indices, cum, qo_indptr, None

    return VerifyInput


def _load_file(name: str, path: Path) -> ModuleType:
    spec = importlib.util.spec_from_file_location(name, path)
    if spec is None or spec.loader is None:
        raise ImportError(f"cannot load {path}")
    module = importlib.util.module_from_spec(spec)
    sys.modules[name] = module  # dataclass / triton.jit look the module up while it loads
    spec.loader.exec_module(module)
    return module


@contextlib.contextmanager
def _switch(enabled: bool, mode: str) -> Iterator[None]:
    wanted = {
        **FP8_GATHER.setting(GATHER_ON if enabled else GATHER_OFF),
        **FP8_ATTENTION.setting(mode),
    }
    old = {name: os.environ.get(name) for name in wanted}
    os.environ.update(wanted)
    try:
        yield
    finally:
        for name, value in old.items():
            if value is None:
                os.environ.pop(name, None)
            else:
                os.environ[name] = value


@contextlib.contextmanager
def _configured(world: _World, fi_backend: str) -> Iterator[None]:
    """Server arguments and TP size the backend reads, FlashInfer's kernel family forced
    (`auto` is what the server runs: fa3 on SM90; fa2 is SM120's family), and the native kernel
    counted, so a decode that silently takes another path is seen."""
    parts = world.parts
    fmb, api = parts.backend, parts.api
    args = SimpleNamespace(
        disaggregation_mode="null",
        disable_chunked_prefix_cache=True,
        # Extends without a prefix would take the ragged wrapper, which never reads the pool.
        flashinfer_mla_disable_ragged=True,
        page_size=1,
        # The verify cases' draft tokens: the host bound the native kernel is planned with.
        speculative_num_draft_tokens=world.geo.draft_tokens,
    )
    settings = api.settings(args)
    saved = {name: getattr(fmb, name) for name in (*settings, "BatchMLAPagedAttentionWrapper")}
    base = saved["BatchMLAPagedAttentionWrapper"]
    forced = base
    if fi_backend != "auto":

        class Forced(base):  # type: ignore[misc, valid-type]
            def __init__(self, *a: Any, **kw: Any) -> None:
                kw["backend"] = fi_backend
                super().__init__(*a, **kw)

        forced = Forced
    for name, value in settings.items():
        setattr(fmb, name, value)
    fmb.BatchMLAPagedAttentionWrapper = forced
    world.server_args = args
    kernel = getattr(fmb, "mla_decode_fp8", None)
    if kernel is not None:
        saved["mla_decode_fp8"] = kernel

        def counted(*a: Any, **kw: Any) -> Any:
            world.native_calls += 1
            return kernel(*a, **kw)

        fmb.mla_decode_fp8 = counted
    try:
        with api.single_rank(fmb):
            yield
    finally:
        for name, value in saved.items():
            setattr(fmb, name, value)


def _model_runner(world: _World) -> Any:
    geo = world.geo
    return SimpleNamespace(
        model_config=SimpleNamespace(
            context_len=geo.max_ctx, num_attention_heads=geo.heads, kv_lora_rank=CKV,
            qk_nope_head_dim=QK_NOPE, qk_rope_head_dim=KPE, v_head_dim=CKV, scaling=SM_SCALE,
        ),
        device=world.parts.device, page_size=1, dtype=world.torch.bfloat16,
        kv_cache_dtype=world.torch.float8_e4m3fn, server_args=world.server_args,
        req_to_token_pool=SimpleNamespace(size=geo.max_reqs, req_to_token=world.req_to_token),
        # 0.5.17 reads the pool from the model runner (a static pool: no unified-memory table).
        token_to_kv_pool=world.kv_pool, token_to_kv_pool_allocator=SimpleNamespace(),
    )  # fmt: skip


def _make_backend(world: _World, enabled: bool, mode: str) -> Any:
    with _switch(enabled, mode):
        backend = world.parts.backend.FlashInferMLAAttnBackend(_model_runner(world))
    has_state = getattr(backend, "fp8_gather", None) is not None
    if has_state != enabled:
        raise WiringFailure(
            f"{FP8_GATHER.name}={int(enabled)}: the backend's gather state is "
            f"{'present' if has_state else 'absent'}"
        )
    native = getattr(backend, "fp8_native", None) is not None
    if native != (enabled and mode == "native"):
        raise WiringFailure(
            f"{FP8_GATHER.name}={int(enabled)} {FP8_ATTENTION.name}={mode}: native decode is "
            f"{'on' if native else 'off'} on an FP8 pool with 512+64 MLA dims"
        )
    return backend


def _poison(world: _World) -> None:
    """NaN in every shadow row, so a row the wiring did not refresh cannot hide."""
    shadows = getattr(world.parts.gather, "_SHADOWS", None)
    if shadows is None:
        raise WiringFailure("the gather module has no _SHADOWS registry to poison")
    for shadow in shadows.values():
        shadow.fill_(float("nan"))


def _forget_count(backend: Any) -> None:
    """Zero the gather's row count before every plan: a plan whose wiring fails to record this
    step's count then gathers nothing, instead of riding on a larger count from an earlier step."""
    state = getattr(backend, "fp8_gather", None)
    rows = getattr(state, "rows", None)
    if rows is None:
        raise WiringFailure("the backend's gather state has no device row count (rows)")
    rows.zero_()


def _plan(backend: Any, poison: bool, plan: Callable[[], Any]) -> None:
    if poison:
        _forget_count(backend)
    plan()


def _compare(world: _World, name: str, got: list[Any], want: list[Any]) -> None:
    torch = world.torch
    for i, (a, b) in enumerate(zip(got, want, strict=True)):
        if not bool(torch.isfinite(b).all()):
            raise WiringFailure(f"{name}: layer {i}: the upstream output is not finite")
        if not torch.equal(a, b):
            rows = a.view(-1, world.geo.heads, CKV)
            bad = (rows != b.view_as(rows)).any(dim=-1).sum().item()
            nan = bool(torch.isnan(a).any())
            raise WiringFailure(
                f"{name}: layer {i}: the patched class differs from the upstream cast in {bad} of "
                f"{rows.shape[0] * rows.shape[1]} head rows{' (NaN: unrefreshed rows)' if nan else ''}"
            )


def _reference(world: _World, fb: Any, qs: list[Any]) -> list[Any]:
    """Decode attention in fp64 on the same FP8 values, from the batch's own slots."""
    torch, geo = world.torch, world.geo
    reqs, lens = fb.req_pool_indices.tolist(), fb.seq_lens.tolist()
    outs = []
    for q, pool in zip(qs, world.pools, strict=True):
        rows = []
        for b, (req, n) in enumerate(zip(reqs, lens, strict=True)):
            slots = world.req_to_token[req, :n].long()
            kv = pool.view(torch.uint8)[slots].view(torch.float8_e4m3fn).double()[:, 0]
            qb = q[b].view(geo.heads, ROW).double()
            logits = (qb[:, :CKV] @ kv[:, :CKV].T + qb[:, CKV:] @ kv[:, CKV:].T) * SM_SCALE
            rows.append(logits.softmax(-1) @ kv[:, :CKV])
        outs.append(torch.stack(rows))
    return outs


def _verify_reference(world: _World, fb: Any, qs: list[Any]) -> list[Any]:
    """Target verify in fp64: request b's draft token t sees its first seq_len + t + 1 slots."""
    torch, geo = world.torch, world.geo
    k = geo.draft_tokens
    reqs, lens = fb.req_pool_indices.tolist(), fb.seq_lens.tolist()
    outs = []
    for q, pool in zip(qs, world.pools, strict=True):
        rows = []
        for b, (req, n) in enumerate(zip(reqs, lens, strict=True)):
            slots = world.req_to_token[req, : n + k].long()
            kv = pool.view(torch.uint8)[slots].view(torch.float8_e4m3fn).double()[:, 0]
            for t in range(k):
                seen = kv[: n + t + 1]
                qb = q[b * k + t].view(geo.heads, ROW).double()
                logits = (qb[:, :CKV] @ seen[:, :CKV].T + qb[:, CKV:] @ seen[:, CKV:].T) * SM_SCALE
                rows.append(logits.softmax(-1) @ seen[:, :CKV])
        outs.append(torch.stack(rows))
    return outs


def _row_errors(world: _World, got: Any, ref: Any) -> Any:
    """Relative error of each (token, head) row against the fp64 reference."""
    rows = got.view(ref.shape).double()
    return (rows - ref).norm(dim=-1) / ref.norm(dim=-1).clamp_min(1e-30)


def _close(world: _World, name: str, got: list[Any], upstream: list[Any], ref: list[Any]) -> None:
    """Native decode: finite, and no worse than NATIVE_ERR_RATIO x the upstream path."""
    torch = world.torch
    for i, (a, b, r) in enumerate(zip(got, upstream, ref, strict=True)):
        if not bool(torch.isfinite(b).all()):
            raise WiringFailure(f"{name}: layer {i}: the upstream output is not finite")
        if not bool(torch.isfinite(a).all()):
            raise WiringFailure(f"{name}: layer {i}: native decode output is not finite")
        err, err_up = _row_errors(world, a, r).max().item(), _row_errors(world, b, r).max().item()
        if err > max(NATIVE_ERR_RATIO * err_up, NATIVE_ERR_FLOOR):
            raise WiringFailure(
                f"{name}: layer {i}: native decode's worst row is {err:.2e} off fp64, upstream's "
                f"{err_up:.2e} (allowed {NATIVE_ERR_RATIO}x)"
            )


def _seq(torch: Any, values: tuple[int, ...] | list[int], device: Any) -> Any:
    return torch.tensor(list(values), dtype=torch.int32, device=device)


def _decode_batch(world: _World, reqs: list[int], lens: tuple[int, ...]) -> Any:
    torch, dev = world.torch, world.parts.device
    seq = _seq(torch, lens, dev)
    return SimpleNamespace(
        forward_mode=world.parts.backend.ForwardMode.DECODE, batch_size=len(reqs),
        req_pool_indices=torch.tensor(reqs, dtype=torch.int64, device=dev),
        seq_lens=seq, seq_lens_cpu=seq.cpu(), seq_lens_sum=int(sum(lens)),
        token_to_kv_pool=world.kv_pool, out_cache_loc=None, spec_info=None,
        positions=torch.zeros(len(reqs), dtype=torch.int64, device=dev),  # one token each
        attn_dcp_metadata=None,
    )  # fmt: skip


def _queries(world: _World, rows: int) -> list[Any]:
    torch = world.torch
    return [
        torch.randn(rows, world.geo.heads * ROW, generator=world.gen, device=world.parts.device).to(
            torch.bfloat16
        )
        for _ in world.layers
    ]


def _decode(world: _World, backend: Any, fb: Any, qs: list[Any], poison: bool) -> list[Any]:
    outs = []
    for q, layer in zip(qs, world.layers, strict=True):
        if poison:
            _poison(world)
        outs.append(backend.forward_decode(q, None, None, layer, fb, save_kv_cache=False))
    return outs


def _extend(world: _World, backend: Any, fb: Any, qs: list[Any], poison: bool) -> list[Any]:
    outs = []
    for q, layer in zip(qs, world.layers, strict=True):
        if poison:
            _poison(world)
        outs.append(backend.forward_extend(q, None, None, layer, fb, save_kv_cache=False))
    return outs


def _judge(
    world: _World, name: str, fb: Any, qs: list[Any], got: list[Any], want: list[Any]
) -> None:
    """Bitwise for gather-then-cast; against fp64 for native decode (not bit-identical)."""
    if world.mode == "native":
        _close(world, name, got, want, _reference(world, fb, qs))
    else:
        _compare(world, name, got, want)


def _case_decode(world: _World, patched: Any, upstream: Any) -> None:
    geo = world.geo
    reqs = list(range(len(geo.decode_lens)))
    fb = _decode_batch(world, reqs, geo.decode_lens)
    qs = _queries(world, len(reqs))
    results = []
    for backend, poison in ((patched, True), (upstream, False)):
        _plan(backend, poison, lambda b=backend: b.init_forward_metadata(fb))
        before = world.native_calls
        results.append(_decode(world, backend, fb, qs, poison))
        ran = world.native_calls - before
        wanted = len(world.layers) if backend is patched and world.mode == "native" else 0
        if ran != wanted:
            raise WiringFailure(
                f"eager decode: the native kernel ran {ran} times for {len(world.layers)} layers "
                f"with {FP8_ATTENTION.name}={world.mode} ({'upstream' if backend is upstream else 'patched'})"
            )
    _judge(world, "eager decode", fb, qs, *results)
    world.lines.append(f"eager decode ({sum(geo.decode_lens)} slots, shared prefix, last row)")


def _case_extend(world: _World, patched: Any, upstream: Any) -> None:
    torch, geo, dev = world.torch, world.geo, world.parts.device
    # Requests the decode case did not use: the decode wrapper's indices must not do here.
    reqs = [4 + i for i in range(len(geo.extend_q))]
    seq = [a + b for a, b in zip(geo.extend_q, geo.extend_prefix, strict=True)]
    seq_t = _seq(torch, seq, dev)
    fb = SimpleNamespace(
        forward_mode=world.parts.backend.ForwardMode.EXTEND, batch_size=len(reqs),
        req_pool_indices=torch.tensor(reqs, dtype=torch.int64, device=dev),
        seq_lens=seq_t, seq_lens_cpu=seq_t.cpu(), seq_lens_sum=sum(seq),
        extend_prefix_lens=_seq(torch, geo.extend_prefix, dev),
        extend_prefix_lens_cpu=list(geo.extend_prefix),
        extend_seq_lens=_seq(torch, geo.extend_q, dev), extend_seq_lens_cpu=list(geo.extend_q),
        attn_attend_prefix_cache=None, token_to_kv_pool=world.kv_pool, out_cache_loc=None,
        spec_info=None, attn_dcp_metadata=None,
    )  # fmt: skip
    qs = _queries(world, sum(geo.extend_q))
    results = []
    for backend, poison in ((patched, True), (upstream, False)):
        _plan(backend, poison, lambda b=backend: b.init_forward_metadata(fb))
        results.append(_extend(world, backend, fb, qs, poison))
    _compare(world, "paged extend with a prefix", *results)
    world.lines.append(f"paged extend ({sum(geo.extend_q)} query tokens over prefixes)")


def _verify_batch(world: _World, reqs: list[int], lens: tuple[int, ...]) -> Any:
    """A target-verify batch: `lens` tokens in the cache per request, then its draft tokens."""
    torch, dev, k = world.torch, world.parts.device, world.geo.draft_tokens
    seq = _seq(torch, lens, dev)
    return SimpleNamespace(
        forward_mode=world.parts.backend.ForwardMode.TARGET_VERIFY, batch_size=len(reqs),
        req_pool_indices=torch.tensor(reqs, dtype=torch.int64, device=dev),
        seq_lens=seq, seq_lens_cpu=seq.cpu(), seq_lens_sum=int(sum(lens)),
        extend_prefix_lens=None, extend_prefix_lens_cpu=[0] * len(reqs),
        attn_attend_prefix_cache=None, token_to_kv_pool=world.kv_pool, out_cache_loc=None,
        spec_info=world.parts.verify_input(k), attn_dcp_metadata=None,
        positions=torch.zeros(len(reqs) * k, dtype=torch.int64, device=dev),
    )  # fmt: skip


def _verify_native(world: _World) -> bool:
    """Whether the patched class serves speculative batches natively here: native mode, and no
    more heads than the installed kernel module's VERIFY_MAX_HEADS (gather-then-cast above)."""
    state = getattr(world.parts.backend, "Fp8NativeDecode", None)
    limit = state.__init__.__globals__.get("VERIFY_MAX_HEADS") if state is not None else None
    return world.mode == "native" and (limit is None or world.geo.heads <= limit)


def _native_ran(world: _World, backend: Any, patched: Any, before: int, what: str) -> None:
    """The native kernel ran once per layer for the patched class when it serves the batch,
    else never."""
    ran = world.native_calls - before
    wanted = len(world.layers) if backend is patched and _verify_native(world) else 0
    if ran != wanted:
        who = "patched" if backend is patched else "upstream"
        raise WiringFailure(
            f"{what}: the native kernel ran {ran} times for {len(world.layers)} layers with "
            f"{FP8_ATTENTION.name}={world.mode} ({who})"
        )


def _judge_verify(world: _World, name: str, fb: Any, qs: list[Any], got, want) -> None:
    """Bitwise for gather-then-cast; against fp64 (causal) for the native kernel."""
    if _verify_native(world):
        _close(world, name, got, want, _verify_reference(world, fb, qs))
    else:
        _compare(world, name, got, want)


def _case_verify(world: _World, patched: Any, upstream: Any) -> None:
    geo = world.geo
    reqs = [8 + i for i in range(len(geo.verify_lens))]
    k = geo.draft_tokens
    results = []
    qs = _queries(world, len(reqs) * k)
    for backend, poison in ((patched, True), (upstream, False)):
        fb = _verify_batch(world, reqs, geo.verify_lens)
        _plan(backend, poison, lambda b=backend, f=fb: b.init_forward_metadata(f))
        before = world.native_calls
        results.append(_extend(world, backend, fb, qs, poison))
        _native_ran(world, backend, patched, before, "target verify")
    _judge_verify(world, "target verify", _verify_batch(world, reqs, geo.verify_lens), qs,
                  *results)  # fmt: skip
    world.lines.append(f"target verify ({len(reqs)} requests x {k} draft tokens)")


def _replays(
    world: _World,
    patched: Any,
    upstream: Any,
    cap: Any,
    qs: list[Any],
    run: Callable[..., list[Any]],
    batch_of: Callable[[tuple[int, ...]], Any],
    replay_lens: tuple[tuple[int, ...], ...],
    max_tokens: int,
) -> Iterator[tuple[tuple[int, ...], dict[str, list[Any]]]]:
    """Capture `run` over the batch `cap` once per backend (a real CUDA graph on the GPU), then
    for each lengths tuple plan a replay through SGLang's own replay entry and replay it; yields
    (lengths, {"patched": outputs, "upstream": outputs}). On the CPU the captured batch and
    buffers run again after the replay plan (the graph's emulation)."""
    torch, geo, parts = world.torch, world.geo, world.parts
    api = parts.api
    captured = {}
    for name, backend in (("patched", patched), ("upstream", upstream)):
        backend.init_cuda_graph_state(geo.max_reqs, max_tokens)
        _plan(backend, name == "patched", lambda b=backend: api.capture(b, cap))
        api.in_graph(backend, cap)
        outs = run(world, backend, cap, qs, False)  # eager warm-up: compiles, allocates
        graph = None
        if parts.real_graphs:
            torch.cuda.synchronize()
            graph = torch.cuda.CUDAGraph()
            with torch.cuda.graph(graph):
                api.in_graph(backend, cap)
                outs = run(world, backend, cap, qs, False)
        captured[name] = (backend, graph, outs)
    for lens in replay_lens:
        results = {}
        for name, (backend, graph, outs) in captured.items():
            fb = batch_of(lens)
            _plan(backend, name == "patched", lambda b=backend, f=fb: api.replay(b, f))
            if name == "patched":
                _poison(world)
            if graph is not None:
                for o in outs:
                    o.fill_(float("nan"))
                graph.replay()
                torch.cuda.synchronize()
                results[name] = [o.clone() for o in outs]
            else:
                results[name] = run(world, backend, cap, qs, name == "patched")
        yield lens, results


def _case_verify_graph(world: _World, patched: Any, upstream: Any) -> None:
    """Target verify captured in a CUDA graph once, replayed with other lengths after SGLang's
    replay planning: the native kernel must read each replay's plan, not the captured one."""
    geo = world.geo
    bs = len(geo.verify_lens)
    reqs = [8 + i for i in range(bs)]
    qs = _queries(world, bs * geo.draft_tokens)
    cap = _verify_batch(world, reqs, (geo.capture_len,) * bs)

    def batch_of(lens: tuple[int, ...]) -> Any:
        return _verify_batch(world, reqs, lens)

    replays = _replays(world, patched, upstream, cap, qs, _extend, batch_of,
                       geo.verify_replay_lens, geo.max_reqs * geo.draft_tokens)  # fmt: skip
    for lens, results in replays:
        _judge_verify(
            world, f"CUDA-graph target verify with lengths {list(lens)}", batch_of(lens), qs,
            results["patched"], results["upstream"],
        )  # fmt: skip
    how = "captured once" if world.parts.real_graphs else "emulated (no GPU)"
    world.lines.append(f"CUDA-graph target verify {how}, {len(geo.verify_replay_lens)} replays")


def _case_graph(world: _World, patched: Any, upstream: Any) -> None:
    """Capture decode once per backend, replay with other lengths through SGLang's replay plan."""
    geo = world.geo
    reqs = list(range(len(geo.decode_lens)))
    cap = _decode_batch(world, reqs, (geo.capture_len,) * len(reqs))
    qs = _queries(world, len(reqs))

    def batch_of(lens: tuple[int, ...]) -> Any:
        return _decode_batch(world, reqs, lens)

    replays = _replays(world, patched, upstream, cap, qs, _decode, batch_of, geo.replay_lens,
                       geo.max_reqs)  # fmt: skip
    for lens, results in replays:
        _judge(
            world, f"CUDA-graph replay with lengths {list(lens)}", batch_of(lens), qs,
            results["patched"], results["upstream"],
        )  # fmt: skip
    how = "captured once" if world.parts.real_graphs else "emulated (no GPU)"
    world.lines.append(f"CUDA-graph decode {how}, {len(geo.replay_lens)} fast-plan replays")


CASES = (_case_decode, _case_extend, _case_verify, _case_graph, _case_verify_graph)


def _world(torch: Any, parts: Parts, geo: Geometry, seed: int) -> _World:
    dev = parts.device
    gen = torch.Generator(device=dev).manual_seed(seed)
    cpu_gen = torch.Generator().manual_seed(seed)
    p = geo.pool_rows
    # Real-valued latents quantized the way the model writes them (plain .to(fp8), no scale).
    pools = [
        torch.randn(p, 1, ROW, generator=gen, device=dev).to(torch.float8_e4m3fn)
        for _ in range(geo.layers)
    ]
    layers = [
        SimpleNamespace(
            layer_id=i, tp_q_head_num=geo.heads, tp_k_head_num=1, tp_v_head_num=1,
            head_dim=ROW, v_head_dim=CKV, logit_cap=0.0, scaling=SM_SCALE,
            k_scale_float=None,
        )
        for i in range(geo.layers)
    ]  # fmt: skip
    # Every request its own scattered slots, except a radix-shared prefix and the last row.
    slots = torch.randperm(p, generator=cpu_gen)
    need = geo.max_reqs * geo.max_ctx
    slots = slots.repeat(need // p + 1)[:need].view(geo.max_reqs, geo.max_ctx).clone()
    slots[1, : geo.shared_prefix] = slots[0, : geo.shared_prefix]
    slots[2, 7] = p - 1
    req_to_token = slots.to(torch.int32).to(dev)
    return _World(torch, parts, geo, pools, layers, req_to_token, gen)


def run_class_checks(
    torch: Any,
    parts: Parts,
    *,
    geometry: Geometry | None = None,
    seed: int = 0,
    modes: tuple[str, ...] | None = None,
) -> list[str]:
    """Every case for every FlashInfer backend in `parts` and every decode mode (of `modes`,
    default all the series has); one line per passed case, WiringFailure on the first miss."""
    geo = geometry or Geometry()
    lines: list[str] = []
    with parts.context():
        world = _world(torch, parts, geo, seed)
    for fi_backend in parts.flashinfer_backends:
        for mode in [m for m in parts.decode_modes if modes is None or m in modes]:
            world.lines, world.mode = [], mode
            with parts.context(), _configured(world, fi_backend):
                patched = _make_backend(world, True, mode)
                upstream = _make_backend(world, False, mode)
                for case in CASES:
                    try:
                        case(world, patched, upstream)
                    except WiringFailure as exc:
                        raise WiringFailure(f"FlashInfer {fi_backend}, {mode}: {exc}") from None
            lines += [f"{fi_backend}, {mode} decode: {line}" for line in world.lines]
    return lines
