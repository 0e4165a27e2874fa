"""The patch series' GPU kernels (Triton), one source file each.

`fp8_mla_decode.py` (native FP8 MLA attention) and `fp8_kv_gather.py` (gather-then-cast) are
written, linted and tested here as ordinary code; `python -m glmserve.series.regen` writes each
into every SGLang line's diff as an added module (glmserve.series.kernels), and CI fails when a
diff's copy differs from its source. So the files import torch, Triton and the standard library
only: nothing of glmserve, nothing of SGLang.
"""
