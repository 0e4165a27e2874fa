"""Startup self-test: the target GPU proves the patch before SGLang serves.

    python -m glmserve.selftest [--timeout 30] [--module PATH] [--backend PATH] [--json]

Three parts:

* the gather kernel: the SHIPPED ``fp8_kv_gather.py`` (the one the series added to the installed
  SGLang) through the real FlashInfer MLA wrapper (``backend="fa2"``, the SM120 kernel family)
  with hand-set counts, bit-identical (``torch.equal``) to the upstream full-pool ``.to(bf16)``:
  scattered slots, duplicate slots (radix prefix sharing), the last pool row, more referenced
  slots than pool rows (the contiguous full-pool mode), a causal multi-token (extend) batch,
  count 0 (nothing written), one CUDA graph captured once and replayed;
* the wiring (classcheck.py): the installed, PATCHED ``FlashInferMLAAttnBackend`` itself, against
  the same class with the series switched off, for eager decode, paged extend with a prefix,
  target verify and CUDA-graph decode replayed through SGLang's fast replay plan, with
  FlashInfer's ``auto`` backend (what the server runs) and fa2, decode on gather-then-cast
  (bit for bit);
* native FP8 decode (``fp8_mla_decode.py``), unless the decode path is pinned to gather: the kernel
  held to fp64, no worse than 1.5x FlashInfer on the BF16 cast (glmserve.selftest.nativecheck),
  then the patched class decoding through it (classcheck, native mode). Its verdict is reported
  separately (``native``): a failure there does not fail the self-test; the launcher serves
  with gather-then-cast. ``--native-fault drop-last-token`` injects a fault the
  native check must refuse;
* when native passed: both decode paths timed on this GPU (``timing``,
  glmserve.selftest.pathtiming), so the launcher can serve with the faster one.

Pools hold real-valued latents quantized to FP8, so softmax is spread and a wrong row changes
the output; the shadow is poisoned with NaN before every call, so a row nothing refreshed
reaches the output as NaN.

The switches are glmserve.switches' (FP8_GATHER, FP8_ATTENTION, the timing shape).

Exit status: 0 passed or skipped (no GPU, the series switched off, or a GPU without hardware
e4m3, where the patched SGLang turns the gather off itself), 1 failed. The check runs in a
child process so a hung GPU cannot hang the launcher: FlashInfer's one-off JIT builds (the same
builds the server needs) and SGLang's imports get their own, longer allowance
(``jit_timeout_s``); ``timeout_s`` bounds the checks themselves.
"""

from __future__ import annotations

import argparse
import contextlib
import importlib.util
import json
import math
import os
import queue
import subprocess
import sys
import threading
import time
from collections.abc import Callable
from dataclasses import asdict, dataclass, field
from pathlib import Path
from types import ModuleType
from typing import Any

from glmserve.selftest.nativecheck import FAULTS
from glmserve.switches import (
    FP8_ATTENTION,
    FP8_GATHER,
    GATHER_OFF,
    NATIVE,
    SELFTEST_HEADS,
    SwitchError,
    fp8_attention_path,
    fp8_attention_request,
    fp8_gather_on,
)

# Hardware e4m3 -> f32 convert (Ada, Hopper, Blackwell). Below it the Triton kernel cannot
# compile, and the patched SGLang turns the gather off itself (fp8_kv_gather.py says the same).
MIN_E4M3_CAPABILITY = (8, 9)
KERNEL_REL = Path("srt", "layers", "attention", "fp8_kv_gather.py")
_READY = "GLMSERVE-SELFTEST-READY"
_RESULT = "GLMSERVE-SELFTEST-RESULT "

# MLA geometry of GLM-5 / DeepSeek-V3: kv_lora_rank 512 + rope 64 = one 576-wide latent row.
CKV_DIM = 512
KPE_DIM = 64
ROW_DIM = CKV_DIM + KPE_DIM


def capability_note(major: int, minor: int) -> str:
    """The one line saying why the gather is off on this GPU (the launcher prints it too)."""
    return (
        f"compute capability {major}.{minor} has no hardware FP8 e4m3 convert (needs "
        f"{MIN_E4M3_CAPABILITY[0]}.{MIN_E4M3_CAPABILITY[1]}): the patched SGLang turns the "
        "gather off and runs the upstream full-pool cast"
    )


@dataclass(frozen=True)
class SelfTestReport:
    status: str  # "passed" | "failed" | "skipped"
    detail: str
    # The native FP8 decode kernel's own verdict ("passed: ...", "failed: ...", "skipped: ...",
    # "" when not run). A failure there does not fail the self-test: the launcher then serves
    # with gather-then-cast, which the gather checks above have proven.
    native: str = ""
    # Both decode paths timed on this GPU once both passed (glmserve.selftest.pathtiming):
    # heads, context, batches, native_us, gather_us, faster; {} when not timed.
    timing: dict[str, Any] = field(default_factory=dict)

    @property
    def ok(self) -> bool:
        return self.status in ("passed", "skipped")


class SelfTestFailure(AssertionError):
    """A case where the patched path differs from the upstream cast."""


# --------------------------------------------------------------------------------------------
# Locating and loading the shipped kernel


def installed_kernel_path() -> Path | None:
    """Path of the series-added kernel module in the installed SGLang, without importing SGLang."""
    spec = importlib.util.find_spec("sglang")
    if spec is None or not spec.submodule_search_locations:
        return None
    for base in spec.submodule_search_locations:
        candidate = Path(base, KERNEL_REL)
        if candidate.is_file():
            return candidate
    return None


def load_kernel_module(path: Path) -> ModuleType:
    """Load fp8_kv_gather.py from a file (SGLang's package __init__ is heavy and not needed)."""
    spec = importlib.util.spec_from_file_location(
        f"_glmserve_fp8_kv_gather_{abs(hash(path))}", path
    )
    if spec is None or spec.loader is None:
        raise ImportError(f"cannot load {path}")
    module = importlib.util.module_from_spec(spec)
    # Triton's @jit needs the defining module registered while it inspects the source.
    sys.modules[spec.name] = module
    spec.loader.exec_module(module)
    return module


# --------------------------------------------------------------------------------------------
# The check itself (device-agnostic: FlashInfer on the GPU, a torch reference in CPU tests)

# attention(q_nope, q_pe, kv, kv_indptr, kv_indices, qo_indptr, causal) -> output tensor
Attention = Callable[..., Any]


def random_fp8_pool(torch: Any, rows: int, device: Any, generator: Any) -> Any:
    """A [rows, 1, 576] float8_e4m3fn pool of real-valued latents, quantized the way the model
    writes them (plain ``.to(fp8)``, no scale): logits stay spread, so softmax mixes many rows
    and a wrong row changes the output (random bytes would make it one-hot)."""
    latents = torch.randn(rows, 1, ROW_DIM, generator=generator)
    return latents.to(torch.float8_e4m3fn).to(device)


def _indptr(torch: Any, lens: list[int], device: Any) -> Any:
    out = [0]
    for n in lens:
        out.append(out[-1] + n)
    return torch.tensor(out, dtype=torch.int32, device=device)


def build_cases(torch: Any, pool_rows: int, generator: Any) -> list[dict[str, Any]]:
    """Index sets exercising the gather contract; each is one attention batch."""
    p = pool_rows

    def perm(n: int) -> list[int]:
        return torch.randperm(p, generator=generator)[:n].tolist()

    shared = perm(min(p // 4, 300))
    cases: list[dict[str, Any]] = []
    # Decode: scattered slots, one of them the last pool row.
    a, b = perm(97), perm(33)
    a[len(a) // 2] = p - 1
    cases.append({"name": "decode scattered + last row", "lens_q": [1, 1], "kv": [a, b]})
    # Decode: radix-shared prefix, the same slots referenced by three requests.
    cases.append(
        {
            "name": "decode duplicates (shared prefix)",
            "lens_q": [1, 1, 1],
            "kv": [shared + perm(5), shared + perm(17), shared],
        }
    )
    # More referenced slots than pool rows: the kernel converts the whole pool contiguously.
    many = [perm(p) for _ in range(2)]
    cases.append({"name": "decode N > pool rows (full pool)", "lens_q": [1, 1], "kv": many})
    # Extend (paged prefill): several query tokens per request, causal.
    c = shared[:40] + perm(24)
    cases.append({"name": "extend causal, shared prefix", "lens_q": [8, 3], "kv": [c, perm(11)]})
    return cases


def run_checks(
    torch: Any,
    kernel: ModuleType,
    attention: Attention,
    *,
    device: Any,
    pool_rows: int,
    heads: int,
    seed: int,
    graph_attention: Callable[..., Any] | None = None,
) -> list[str]:
    """Run every case; return one line per passed case, raise SelfTestFailure on the first miss."""
    gen = torch.Generator().manual_seed(seed)
    pool = random_fp8_pool(torch, pool_rows, device, gen)
    upstream_kv = pool.to(torch.bfloat16)  # what upstream hands FlashInfer
    shadow = torch.empty(pool.shape, dtype=torch.bfloat16, device=device)
    rows = torch.zeros(1, dtype=torch.int32, device=device)
    passed: list[str] = []

    # Count 0: the kernel must write nothing at all.
    shadow.fill_(float("nan"))
    idx = torch.tensor([0, pool_rows - 1], dtype=torch.int32, device=device)
    kernel.gather_cast(pool, idx, rows, shadow)
    if not bool(torch.isnan(shadow).all()):
        raise SelfTestFailure("count 0: the kernel wrote rows it was not asked for")
    passed.append("count 0: nothing written")

    for case in build_cases(torch, pool_rows, gen):
        kv_lists = case["kv"]
        lens_q = case["lens_q"]
        kv_indices = torch.tensor(
            [s for lst in kv_lists for s in lst], dtype=torch.int32, device=device
        )
        kv_indptr = _indptr(torch, [len(lst) for lst in kv_lists], device)
        qo_indptr = _indptr(torch, lens_q, device)
        n_q = sum(lens_q)
        q_nope = torch.randn(n_q, heads, CKV_DIM, generator=gen).to(device, torch.bfloat16)
        q_pe = torch.randn(n_q, heads, KPE_DIM, generator=gen).to(device, torch.bfloat16)
        causal = max(lens_q) > 1
        ref = attention(q_nope, q_pe, upstream_kv, kv_indptr, kv_indices, qo_indptr, causal)
        shadow.fill_(float("nan"))
        rows.copy_(kv_indptr[-1:])
        kernel.gather_cast(pool, kv_indices, rows, shadow)
        got = attention(q_nope, q_pe, shadow, kv_indptr, kv_indices, qo_indptr, causal)
        if not bool(torch.isfinite(ref).all()):
            raise SelfTestFailure(f"{case['name']}: upstream output is not finite")
        if not torch.equal(got, ref):
            bad = (got != ref).any(dim=-1).sum().item()
            raise SelfTestFailure(
                f"{case['name']}: patched output differs from the upstream cast "
                f"({bad} of {got.shape[0] * got.shape[1]} head rows)"
            )
        passed.append(f"{case['name']}: bit-identical ({int(kv_indptr[-1])} slots)")

    if graph_attention is not None:
        passed.append(graph_attention(pool, upstream_kv, shadow, rows, gen))
    return passed


# --------------------------------------------------------------------------------------------
# The GPU run: FlashInfer fa2 MLA wrapper


def _flashinfer_attention(torch: Any, flashinfer: Any, device: Any, heads: int) -> Attention:
    workspace = torch.empty(128 * 1024 * 1024, dtype=torch.uint8, device=device)
    sm_scale = 1.0 / math.sqrt(192 + KPE_DIM)  # GLM-5: qk_nope 192 + rope 64

    def attention(q_nope, q_pe, kv, kv_indptr, kv_indices, qo_indptr, causal):
        wrapper = flashinfer.mla.BatchMLAPagedAttentionWrapper(workspace, backend="fa2")
        kv_lens = kv_indptr[1:] - kv_indptr[:-1]
        wrapper.plan(
            qo_indptr, kv_indptr, kv_indices, kv_lens, heads, CKV_DIM, KPE_DIM, 1, causal,
            sm_scale, torch.bfloat16, torch.bfloat16,
        )  # fmt: skip
        out = torch.full_like(q_nope, float("nan"))
        wrapper.run(q_nope, q_pe, kv[:, :, :CKV_DIM], kv[:, :, CKV_DIM:], out=out)
        return out

    return attention


def _flashinfer_graph_check(
    torch: Any, flashinfer: Any, kernel: ModuleType, device: Any, heads: int
) -> Callable[..., str]:
    """Capture gather + attention ONCE, replay with other slots and counts (as SGLang does)."""

    def check(pool, upstream_kv, shadow, rows, gen) -> str:
        p = pool.shape[0]
        bs, max_kv = 4, 512
        workspace = torch.empty(128 * 1024 * 1024, dtype=torch.uint8, device=device)
        sm_scale = 1.0 / math.sqrt(192 + KPE_DIM)
        qo_buf = torch.arange(bs + 1, dtype=torch.int32, device=device)
        kv_indptr_buf = torch.zeros(bs + 1, dtype=torch.int32, device=device)
        kv_indices_buf = torch.zeros(bs * max_kv, dtype=torch.int32, device=device)
        kv_len_buf = torch.ones(bs, dtype=torch.int32, device=device)
        wrapper = flashinfer.mla.BatchMLAPagedAttentionWrapper(
            workspace, use_cuda_graph=True, qo_indptr=qo_buf, kv_indptr=kv_indptr_buf,
            kv_indices=kv_indices_buf, kv_len_arr=kv_len_buf, backend="fa2",
        )  # fmt: skip
        q_nope = torch.randn(bs, heads, CKV_DIM, generator=gen).to(device, torch.bfloat16)
        q_pe = torch.randn(bs, heads, KPE_DIM, generator=gen).to(device, torch.bfloat16)
        out_g = torch.empty_like(q_nope)

        def plan(lens: list[int], dup: bool) -> None:
            lists = [torch.randperm(p, generator=gen)[:n].tolist() for n in lens]
            if dup:  # the last request repeats the first one's slots
                lists[-1] = lists[0][: lens[-1]]
            lists[0][0] = p - 1
            idx = torch.tensor([s for lst in lists for s in lst], dtype=torch.int32, device=device)
            indptr = _indptr(torch, lens, device)
            wrapper.plan(
                qo_buf, indptr, idx, indptr[1:] - indptr[:-1], heads, CKV_DIM, KPE_DIM, 1,
                False, sm_scale, torch.bfloat16, torch.bfloat16,
            )  # fmt: skip
            rows.copy_(indptr[-1:])  # outside the graph, like the patched SGLang planner

        def step() -> None:
            kernel.gather_cast(pool, wrapper._kv_indices_buf, rows, shadow)
            wrapper.run(q_nope, q_pe, shadow[:, :, :CKV_DIM], shadow[:, :, CKV_DIM:], out=out_g)

        plan([37, 200, 1, 64], dup=False)
        step()  # eager warm-up (Triton compile) before capture
        torch.cuda.synchronize()
        graph = torch.cuda.CUDAGraph()
        with torch.cuda.graph(graph):
            step()
        checked = 0
        for lens, dup in (([5, 512, 77, 300], True), ([1, 1, 1, 1], False), ([512] * 4, True)):
            plan(lens, dup)
            ref = torch.empty_like(q_nope)
            wrapper.run(
                q_nope, q_pe, upstream_kv[:, :, :CKV_DIM], upstream_kv[:, :, CKV_DIM:], out=ref
            )
            shadow.fill_(float("nan"))
            out_g.fill_(float("nan"))
            graph.replay()
            torch.cuda.synchronize()
            if not torch.equal(out_g, ref):
                raise SelfTestFailure(f"CUDA graph replay with kv lens {lens}: output differs")
            checked += 1
        return f"CUDA graph captured once, {checked} replays with new slots/counts: bit-identical"

    return check


def _native_verdict(
    torch: Any,
    attention: Attention,
    device: Any,
    seed: int,
    inject,
    pool_rows: int = 65_537,
    heads: int = 16,
) -> str:
    """Run glmserve.selftest.nativecheck on the installed fp8_mla_decode.py, as one line.

    `heads`: the model's heads per rank (the tile form the server runs); `attention` must be
    planned for the same count. Empty or auto (the launcher decides after timing both) checks
    native like an explicit native (switches.fp8_attention_path)."""
    from glmserve.selftest import nativecheck

    mode = fp8_attention_path(os.environ)
    if mode != NATIVE:
        return f"skipped: {FP8_ATTENTION.name}={mode}"
    path = installed_kernel_path()
    native_path = path.parent / nativecheck.NATIVE_REL.name if path else None
    if native_path is None or not native_path.is_file():
        return "skipped: this series has no native decode module"
    if torch.cuda.get_device_capability(device) < (8, 9):
        return "skipped: compute capability below 8.9"

    def upstream(q_nope, q_pe, kv, kv_indptr, kv_indices, out):
        qo_indptr = torch.arange(q_nope.shape[0] + 1, dtype=torch.int32, device=device)
        out.copy_(attention(q_nope, q_pe, kv, kv_indptr, kv_indices, qo_indptr, False))

    try:
        module = load_kernel_module(native_path)
        lines = nativecheck.run_native_checks(
            torch, module, upstream, device=device, seed=seed, pool_rows=pool_rows,
            inject=inject, heads=heads,
        )  # fmt: skip
    except nativecheck.NativeCheckFailure as exc:
        return f"failed: native FP8 decode is WRONG: {exc}"
    except Exception as exc:
        return f"failed: native FP8 decode crashed: {type(exc).__name__}: {exc}"
    return "passed: " + "; ".join(lines)


class LineNotPorted(Exception):
    """The class checks do not drive this SGLang line's backend API (classcheck.unported_line)."""


def _child(
    module_path: str | None,
    seed: int,
    native_fault: str | None = None,
    backend_path: str | None = None,
) -> int:
    """Runs in the child process: prints READY after warm-up, then one RESULT line."""
    t0 = time.monotonic()
    try:
        import torch

        major, minor = torch.cuda.get_device_capability()
        if (major, minor) < MIN_E4M3_CAPABILITY:
            report = SelfTestReport("skipped", capability_note(major, minor))
            print(_RESULT + json.dumps(asdict(report)), flush=True)
            return 0
        path = Path(module_path) if module_path else installed_kernel_path()
        if path is None or not path.is_file():
            raise SelfTestFailure(
                "the patched SGLang module sglang/srt/layers/attention/fp8_kv_gather.py is "
                "missing: was the patch series applied?"
            )
        kernel = load_kernel_module(path)
        # Imported here: only the GPU run needs FlashInfer and SGLang.
        import flashinfer
        import flashinfer.mla

        from glmserve.selftest import classcheck

        unported = classcheck.unported_line(Path(backend_path) if backend_path else path)
        if unported is not None:
            raise LineNotPorted(
                f"{unported} (serving without them needs GLMSERVE_SKIP_SELFTEST=1; the GPU "
                "proof of that line is bench/device_run.sh lines)"
            )
        device = torch.device("cuda")
        heads = 16
        attention = _flashinfer_attention(torch, flashinfer, device, heads)
        parts = classcheck.installed_parts(
            torch,
            backend_path=Path(backend_path) if backend_path else None,
            gather_path=path if module_path else None,
        )
        native_mode = fp8_attention_path(os.environ) == NATIVE and NATIVE in parts.decode_modes
        # The native check runs at the model's heads per rank (the tile form the server runs:
        # kv-M at 8, heads-M at 16), against FlashInfer planned for the same count.
        native_heads = _served_heads()
        native_attention = (
            attention
            if native_heads == heads
            else _flashinfer_attention(torch, flashinfer, device, native_heads)
        )
        # Warm-up: FlashInfer JIT (causal and non-causal, auto and fa2), the Triton compiles,
        # SGLang's imports; the same code paths as the checks, on small pools.
        warm = run_checks(
            torch, kernel, attention, device=device, pool_rows=1024, heads=heads, seed=seed + 1
        )
        warm += classcheck.run_class_checks(
            torch, parts, geometry=classcheck.WARM, seed=seed + 1, modes=("gather",)
        )
        del warm
        # The native kernel's Triton compile (and its graph capture) belongs to warm-up too.
        _native_verdict(torch, native_attention, device, seed + 1, native_fault, pool_rows=4096,
                        heads=native_heads)  # fmt: skip
        if native_mode:
            with contextlib.suppress(Exception):  # judged below; here only compiled
                classcheck.run_class_checks(
                    torch, parts, geometry=classcheck.WARM, seed=seed + 1, modes=("native",)
                )
        torch.cuda.synchronize()
        print(_READY, flush=True)
        t1 = time.monotonic()
        lines = run_checks(
            torch,
            kernel,
            attention,
            device=device,
            pool_rows=65_537,
            heads=heads,
            seed=seed,
            graph_attention=_flashinfer_graph_check(torch, flashinfer, kernel, device, heads),
        )
        lines += [
            f"class {line}"
            for line in classcheck.run_class_checks(torch, parts, seed=seed, modes=("gather",))
        ]
        torch.cuda.synchronize()
        t2 = time.monotonic()
        detail = (
            f"{len(lines)} checks bit-identical to the upstream cast on "
            f"{torch.cuda.get_device_name()} ({path}); warm-up {t1 - t0:.1f} s, "
            f"checks {t2 - t1:.1f} s: " + "; ".join(lines)
        )
        native = _native_verdict(
            torch, native_attention, device, seed, native_fault, heads=native_heads
        )
        if native_mode and native.startswith("passed"):
            native = _native_class_verdict(torch, parts, seed, native)
        timing = {}
        if native_mode and native.startswith("passed"):
            timing = _time_paths(torch, flashinfer, kernel, path, device, seed)
        report = SelfTestReport("passed", detail, native, timing)
    except LineNotPorted as exc:
        report = SelfTestReport("failed", f"self-test cannot prove this SGLang line: {exc}")
    except SelfTestFailure as exc:
        report = SelfTestReport("failed", f"patched FP8 KV gather is WRONG: {exc}")
    except AssertionError as exc:  # classcheck.WiringFailure: the class's wiring is wrong
        report = SelfTestReport("failed", f"patched FP8 KV wiring is WRONG: {exc}")
    except Exception as exc:  # any crash of the patched path is a failure to prove it
        report = SelfTestReport("failed", f"self-test crashed: {type(exc).__name__}: {exc}")
    print(_RESULT + json.dumps(asdict(report)), flush=True)
    return 0 if report.ok else 1


def _served_heads() -> int:
    """The model's heads per rank the launcher passes (switches.SELFTEST_HEADS), else its
    default."""
    try:
        (heads,) = SELFTEST_HEADS.read(os.environ)
    except SwitchError:
        (heads,) = SELFTEST_HEADS.default
    return heads


def _time_paths(
    torch: Any, flashinfer: Any, gather: ModuleType, gather_path: Path, device: Any, seed: int
) -> dict[str, Any]:
    """Both decode paths timed (pathtiming); {"error": ...} if timing itself fails, which
    leaves the launcher on its default rather than failing a proven kernel."""
    from glmserve.selftest import pathtiming

    try:
        heads, batches = pathtiming.requested_shape()
        verify_tokens = pathtiming.requested_verify_tokens()
        native = load_kernel_module(gather_path.parent / "fp8_mla_decode.py")
        return pathtiming.time_decode_paths(
            torch, flashinfer, gather, native, device, heads, batches, seed, verify_tokens
        )
    except Exception as exc:
        return {"error": f"{type(exc).__name__}: {exc}"}


def _native_class_verdict(torch: Any, parts: Any, seed: int, kernel_verdict: str) -> str:
    """The patched class decoding through the native kernel (classcheck's native mode)."""
    from glmserve.selftest import classcheck

    try:
        lines = classcheck.run_class_checks(torch, parts, seed=seed, modes=("native",))
    except classcheck.WiringFailure as exc:
        return f"failed: native FP8 decode wiring is WRONG: {exc}"
    except Exception as exc:
        return (
            f"failed: native FP8 decode crashed in the patched class: {type(exc).__name__}: {exc}"
        )
    return kernel_verdict + "; " + "; ".join(f"class {line}" for line in lines)


# --------------------------------------------------------------------------------------------
# The parent: skip decisions and timeouts


def _gpu_present() -> tuple[bool, str]:
    try:
        import torch
    except ImportError:
        return False, "torch is not installed"
    if not torch.cuda.is_available():
        return False, "no CUDA GPU visible"
    return True, ""


def _read_lines(stream: Any, sink: queue.Queue[str | None]) -> None:
    for line in stream:
        sink.put(line.rstrip("\n"))
    sink.put(None)


def run_selftest(
    timeout_s: float = 30.0,
    *,
    jit_timeout_s: float = 600.0,
    module_path: str | None = None,
    seed: int | None = None,
    native_fault: str | None = None,
    backend_path: str | None = None,
) -> SelfTestReport:
    """Prove the patched gather on this GPU. Never raises; see the module docstring."""
    try:
        gather_on, _ = fp8_gather_on(os.environ), fp8_attention_request(os.environ)
    except SwitchError as exc:
        return SelfTestReport("failed", str(exc))
    if not gather_on:
        return SelfTestReport(
            "skipped", f"{FP8_GATHER.name}={GATHER_OFF}: the upstream full cast is in use"
        )
    present, why = _gpu_present()
    if not present:
        return SelfTestReport("skipped", f"no GPU self-test: {why}")

    seed = seed if seed is not None else int.from_bytes(os.urandom(4), "little")
    cmd = [sys.executable, "-m", "glmserve.selftest", "--child", "--seed", str(seed)]
    if module_path:
        cmd += ["--module", str(module_path)]
    if native_fault:
        cmd += ["--native-fault", native_fault]
    if backend_path:
        cmd += ["--backend", str(backend_path)]
    env = dict(os.environ)
    package_root = str(Path(__file__).resolve().parents[2])
    env["PYTHONPATH"] = os.pathsep.join(p for p in (package_root, env.get("PYTHONPATH")) if p)
    proc = subprocess.Popen(
        cmd, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True, env=env
    )
    lines: queue.Queue[str | None] = queue.Queue()
    threading.Thread(target=_read_lines, args=(proc.stdout, lines), daemon=True).start()
    tail: list[str] = []
    deadline = time.monotonic() + jit_timeout_s
    phase = "warm-up (FlashInfer JIT build)"
    try:
        while True:
            remaining = deadline - time.monotonic()
            if remaining <= 0:
                proc.kill()
                limit = jit_timeout_s if phase.startswith("warm") else timeout_s
                return SelfTestReport(
                    "failed", f"self-test {phase} did not finish in {limit:.0f} s"
                )
            try:
                line = lines.get(timeout=remaining)
            except queue.Empty:
                continue
            if line is None:
                break
            if line == _READY:
                phase = "checks"
                deadline = time.monotonic() + timeout_s
            elif line.startswith(_RESULT):
                doc = json.loads(line[len(_RESULT) :])
                proc.wait(timeout=30)
                return SelfTestReport(
                    doc["status"], doc["detail"], doc.get("native", ""), doc.get("timing", {})
                )
            else:
                tail = [*tail[-20:], line]
    finally:
        if proc.poll() is None:
            proc.kill()
    proc.wait()
    return SelfTestReport(
        "failed", f"self-test exited {proc.returncode} without a result: " + " | ".join(tail[-5:])
    )


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(
        prog="python -m glmserve.selftest", description=__doc__.split("\n")[0]
    )
    parser.add_argument("--timeout", type=float, default=30.0, help="seconds for the checks")
    parser.add_argument("--jit-timeout", type=float, default=600.0, help="seconds for warm-up")
    parser.add_argument("--module", help="test this fp8_kv_gather.py instead of the installed one")
    parser.add_argument(
        "--backend", help="test this flashinfer_mla_backend.py instead of the installed one"
    )
    parser.add_argument("--seed", type=int, default=None)
    parser.add_argument(
        "--native-fault",
        choices=FAULTS,
        help="inject a fault into the native decode kernel (its check must refuse it)",
    )
    parser.add_argument("--json", action="store_true", help="print the report as JSON")
    parser.add_argument("--child", action="store_true", help=argparse.SUPPRESS)
    args = parser.parse_args(argv)
    if args.child:
        seed = args.seed if args.seed is not None else 0
        return _child(args.module, seed, args.native_fault, args.backend)
    report = run_selftest(
        args.timeout,
        jit_timeout_s=args.jit_timeout,
        module_path=args.module,
        seed=args.seed,
        native_fault=args.native_fault,
        backend_path=args.backend,
    )
    if args.json:
        print(json.dumps(asdict(report)))
    else:
        print(f"glmserve self-test {report.status.upper()}: {report.detail}")
        if report.native:
            print(f"glmserve native FP8 decode self-test {report.native}")
        if report.timing:
            from glmserve.selftest import pathtiming

            line = report.timing.get("error") or pathtiming.summary(report.timing)
            print(f"glmserve FP8 decode paths timed: {line}")
    return 0 if report.ok else 1


if __name__ == "__main__":
    sys.exit(main())
