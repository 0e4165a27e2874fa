"""Operator smoke test for a real box: is FP8 KV correct here, before going live?

    docker compose run --rm smoke                 # the compose way (docs/deploy.md)
    python -m glmserve.smoke --profile P --model-path M --out DIR

FP8 KV on GLM-5's dense path has never been reported correct in public (recipes ran BF16 KV
after "garbled" FP8 output), so this starts the server once per variant (variants.py: BF16 KV,
the upstream full-pool cast, the patched gather, the native FP8 decode), sends the same fixed
greedy prompts to each (probes.py: short questions, a shared-prefix pair that must hit the
prefix cache, a long needle-in-a-haystack prompt), and compares them (verdict.py). It uses the
project's own client (glmserve.streaming) and server process handling (glmserve.serverproc).
"""
