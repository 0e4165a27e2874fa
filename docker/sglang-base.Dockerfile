# CI-only stand-in for the official SGLang image (BASE_IMAGE of the server stage): the same CPython
# minor as the tools image plus the pinned SGLang wheel, installed without its GPU dependencies
# (torch, FlashInfer, sglang-kernel). That is enough for the server stage to apply the patch
# series to the real SGLang source, byte-compile it, run the preflight and the launcher's
# --dry-run; it cannot serve. docker/ci-bases.sh downloads the wheel into the build context.
ARG PYTHON_IMAGE=glmserve-ci/python:3.11-bookworm
FROM ${PYTHON_IMAGE}
COPY sglang-*.whl /tmp/wheels/
# The official image installs SGLang into the system interpreter; do the same here.
RUN PIP_BREAK_SYSTEM_PACKAGES=1 PIP_ROOT_USER_ACTION=ignore python3 -m pip install --no-cache-dir --no-deps --no-index \
        /tmp/wheels/sglang-*.whl \
    && rm -rf /tmp/wheels
