"""The SHIPPED native decode kernel compiles for the Blackwell targets it ships to (and SM90).

No GPU is needed: Triton compiles to PTX and its bundled ptxas assembles for sm_120a (RTX PRO
6000), sm_100a (B200) and sm_90a (H100/H200). For the launch configuration the kernel picks
on that target for 8 heads (GLM-5 at TP8) and for 16, the resource report must show no register
spills and shared memory within the target's per-block limit (so the host-side choice by shared
memory, `launch_config`, is right for the target); the PTX must use the hardware e4m3 -> fp16
convert.
Runs in a child process: the interpreter tests in this directory set TRITON_INTERPRET=1.
"""

from __future__ import annotations

import json
import subprocess
import sys
import textwrap

import pytest

pytest.importorskip("triton")

from glmserve.series.kernels import KERNELS_DIR

CHILD = textwrap.dedent(
    r"""
    import importlib.util, json, os, re, subprocess, sys, tempfile
    import triton
    from triton.backends.compiler import GPUTarget
    from triton.compiler import ASTSource

    spec = importlib.util.spec_from_file_location("fp8_mla_decode_compile", sys.argv[1])
    m = importlib.util.module_from_spec(spec)
    sys.modules[spec.name] = m
    spec.loader.exec_module(m)
    bindir = os.path.join(os.path.dirname(triton.__file__), "backends", "nvidia", "bin")
    PTRS = {"kv_ptr": "*u8", "kv_indptr_ptr": "*i32", "kv_indices_ptr": "*i32",
            "qo_indptr_ptr": "*i32",
            "part_out_ptr": "*fp32", "part_lse_ptr": "*fp32"}

    def signature(fn, const):
        sig, attrs = {}, {}
        for i, name in enumerate(fn.arg_names):
            if name in const:
                sig[name] = "constexpr"
            elif name.endswith("_ptr"):
                sig[name] = PTRS.get(name, "*bf16")
                attrs[(i,)] = [["tt.divisibility", 16]]
            elif name == "qk_scale":
                sig[name] = "fp32"
            else:
                sig[name] = "i32"
                if name.startswith("stride"):
                    attrs[(i,)] = [["tt.divisibility", 16]]
        return sig, attrs

    def build(fn, const, cc, warps, stages):
        sig, attrs = signature(fn, const)
        k = triton.compile(ASTSource(fn, sig, const, attrs), target=GPUTarget("cuda", cc, 32),
                           options=dict(num_warps=warps, num_stages=stages))
        ptxas = os.path.join(bindir, "ptxas" if cc < 100 else "ptxas-blackwell")
        with tempfile.TemporaryDirectory() as tmp:
            path = os.path.join(tmp, "k.ptx")
            open(path, "w").write(k.asm["ptx"])
            report = subprocess.run([ptxas, "-v", f"--gpu-name=sm_{cc}a", path, "-o", path + ".o"],
                                    capture_output=True, text=True)
        spilled = sum(int(n) for n in re.findall(r"(\d+) bytes spill", report.stderr))
        return {"rc": report.returncode, "stderr": report.stderr[-400:], "spill_bytes": spilled,
                "shared": k.metadata.shared, "cvt_e4m3": "cvt.rn.f16x2.e4m3x2" in k.asm["ptx"]}

    def fake_cuda(smem, major):
        # launch_config reads (SMs, shared memory per block, major) of the device: the target's.
        m._DEVICE_INFO[0] = (132, smem, major)
        return m.torch.device("cuda", 0)

    out = {}
    for cc, smem in ((120, 101376), (100, 232448), (90, 232448)):
        device = fake_cuda(smem, cc // 10)
        # Decode at 8 and 16 heads; MTP verify (4 query tokens per request) at 8.
        for heads, qt in ((8, 1), (16, 1), (8, 4)):
            cfg = m.launch_config(heads, device, qt)
            const = dict(HP=cfg.heads_per_program, QT=qt, BLOCK_N=cfg.block_n, D_PE=m.D_ROPE,
                         FORM=cfg.form, ASM_CVT=True, ON_CPU=False)
            r = build(m._mla_decode_fp8_stage1, const, cc, cfg.num_warps, cfg.num_stages)
            r["smem_limit"] = smem
            out[f"sm_{cc} stage1 heads={heads} qt={qt} {cfg}"] = r
        for qt in (1, 4):
            const = dict(QT=qt, BLOCK_S=m.MERGE_BLOCK_S, BLOCK_D=m.MERGE_BLOCK_D)
            r = build(m._mla_decode_fp8_merge, const, cc, 4, 1)
            r["smem_limit"], r["cvt_e4m3"] = smem, True
            out[f"sm_{cc} merge qt={qt}"] = r
    print(json.dumps(out))
    """
)


def test_native_kernel_compiles_without_spills_for_sm120_sm100_sm90(tmp_path):
    proc = subprocess.run(
        [sys.executable, "-c", CHILD, str(KERNELS_DIR / "fp8_mla_decode.py")],
        capture_output=True,
        text=True,
        timeout=600,
        env={"PATH": "/usr/bin:/bin", "HOME": str(tmp_path)},  # no TRITON_INTERPRET here
    )
    assert proc.returncode == 0, proc.stderr[-2000:]
    results = json.loads(proc.stdout.strip().splitlines()[-1])
    assert {k.split()[0] for k in results} == {"sm_120", "sm_100", "sm_90"}
    for name, r in results.items():
        assert r["rc"] == 0, f"{name}: ptxas failed: {r['stderr']}"
        assert r["spill_bytes"] == 0, f"{name}: spills: {r['stderr']}"
        assert r["shared"] <= r["smem_limit"], f"{name}: {r['shared']} B shared memory"
        assert r["cvt_e4m3"], f"{name}: no hardware e4m3 -> fp16 convert in the PTX"
