"""Moved. glmserve.patching was three packages in one; it is now
glmserve.series (the patch series tool), glmserve.preflight (the static checks) and
glmserve.selftest (the GPU start-up self-test). Only the old `python -m glmserve.patching[.X]`
entry points remain here, as thin shims that run the new ones.
"""
