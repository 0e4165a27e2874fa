"""GPU proof that the FP8 KV pool's fused store writes the bytes the upstream store writes.

The patched pool (memory_pool.py) converts BF16 to FP8 inside SGLang's own scatter kernel
(`set_mla_kv_buffer_triton_fp8_quant`) instead of two `.to()` casts before the scatter: every
row it writes must equal `.to(float8_e4m3fn)` of the input bit for bit, over normal values,
subnormals, the saturation range past +-448 and exact zeros, for the latent and the rope part.
"""

from __future__ import annotations

import pytest

pytestmark = pytest.mark.gpu

torch = pytest.importorskip("torch")

from glmserve.selftest import runner  # noqa: E402

DEV = torch.device("cuda")


def test_the_fused_store_writes_the_upstream_casts_bytes():
    from sglang.srt.mem_cache.utils import set_mla_kv_buffer_triton_fp8_quant

    gather_path = runner.installed_kernel_path()
    assert gather_path is not None, "no patched SGLang on sys.path"
    gather = runner.load_kernel_module(gather_path)
    gen = torch.Generator(device=DEV).manual_seed(3)
    rows, n = 4096, 700
    nope = torch.randn(n, 1, 512, device=DEV, generator=gen)
    rope = torch.randn(n, 1, 64, device=DEV, generator=gen)
    nope[:100] *= 1e-3  # e4m3 subnormals
    nope[100:200] *= 600.0  # past +-448: saturates
    rope[200:300] = 0.0
    nope, rope = nope.bfloat16(), rope.bfloat16()
    assert gather.fused_fp8_kv_store(torch.float8_e4m3fn, nope)
    loc = torch.randperm(rows, device=DEV, generator=gen)[:n].to(torch.int64)
    fused = torch.zeros(rows, 1, 576, dtype=torch.uint8, device=DEV)
    upstream = torch.zeros_like(fused)
    set_mla_kv_buffer_triton_fp8_quant(fused, loc, nope, rope, torch.float8_e4m3fn)
    cast = torch.cat([nope, rope], dim=-1).to(torch.float8_e4m3fn).view(torch.uint8)
    upstream[loc] = cast
    torch.cuda.synchronize()
    assert torch.equal(fused, upstream)
