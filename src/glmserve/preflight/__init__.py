"""The preflight: static checks of the patch's effect on an installed SGLang, read with `ast`
(nothing is imported): the marker and hashes, and data-flow rules on the patched
`flashinfer_mla_backend.py` (flow.py interprets it, rules.py states the rules, fichecks.py reads
FlashInfer's wrapper).

    python -m glmserve.preflight --target SITE | --rules-only FILE

Runs at image build time and at every start; builds on glmserve.series, needs no GPU or torch.
"""
