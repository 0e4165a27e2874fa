# GLM-5-NVFP4 on Blackwell: the patched SGLang server image, the tools image (emulator, exporter,
# Locust) and the fleet's router. One file, four shipped stages:
#
#   tools-build  throw-away: pinned Python deps (optional build-time CA), glmserve wheel
#   tools        glmserve[emulator,exporter,loadtest,doctor] in a venv (docker build --target tools)
#   router       smg (the Shepherd Model Gateway) in a venv           (docker build --target router)
#   server       SGLang base + the patch series + glmserve core       (the default target)
#
# Both bases are build ARGs so CI can substitute local images (no registry there, see
# docs/deploy.md). The tools base is pinned by digest. The server is built on one SGLang line,
# SGLANG_LINE (0.5.12.post1: the patched dense-MLA line; 0.5.17: the current line, GLM-5 on DSA,
# the series also on the fa3 MLA path; 0.5.23: the newest release): its official image by
# version tag (by digest where glmserve.sglang_lines, the one table, holds one), and the build
# checks that base against the line's pins (SGLang, torch, FlashInfer, sglang-kernel).
# Classic-builder compatible on purpose (no RUN --mount, no syntax line): Compose falls back to
# the classic builder where buildx is missing, and a syntax line would need a registry pull.

# CPython 3.11 on Debian bookworm, multi-arch index digest.
ARG TOOLS_BASE_IMAGE=python:3.11.14-slim-bookworm@sha256:65a93d69fa75478d554f4ad27c85c1e69fa184956261b4301ebaf6dbb0a3543d
# The SGLang line: the one build argument that picks the base, the series and the labels (its
# version, CUDA and pins live in glmserve.sglang_lines, which tests/test_sglang_lines.py checks
# these defaults against). Its official image by version tag, CUDA 13.0, the full (devel) variant,
# not -runtime: FlashInfer JIT-compiles the MLA kernels with nvcc at first start. The build checks
# what the base holds against the line's pins; to pin it by digest as well, set BASE_IMAGE to what
# `python -m glmserve.sglang_lines build-args LINE` prints (the digest where the table knows it).
ARG SGLANG_LINE=0.5.12.post1
ARG BASE_IMAGE=lmsysorg/sglang:v${SGLANG_LINE}-cu130

# --------------------------------------------------------------------------------------------
FROM ${TOOLS_BASE_IMAGE} AS tools-build
SHELL ["/bin/bash", "-o", "pipefail", "-c"]
WORKDIR /src
# Optional extra CAs: docker/build-ca/ always exists (README only); .ca/ is git-ignored and may
# be absent, which the wildcard tolerates. Only this stage sees them; no later stage copies them.
COPY docker/build-ca/ .ca* /tmp/build-ca/
COPY docker/pip-ca.sh /usr/local/bin/pip-ca.sh
COPY constraints.txt pyproject.toml README.md ./
# Dependencies first, against a stub package, so editing src/ does not reinstall them.
RUN mkdir -p src/glmserve && touch src/glmserve/__init__.py \
    && python3 -m venv /opt/glmserve \
    && pip-ca.sh /opt/glmserve/bin/python install --no-cache-dir -c constraints.txt \
        ".[emulator,exporter,loadtest,doctor]" \
    && /opt/glmserve/bin/python -m pip uninstall -y glmserve \
    && rm -rf build src
# The stub's build/ would otherwise stand in for the real files: setuptools copies a source only
# when it is newer than its build/ copy, and COPY keeps the checkout's (older) mtimes.
COPY src/ src/
# The wheel also feeds the server stage, which then needs no network and no CA.
RUN pip-ca.sh /opt/glmserve/bin/python wheel --no-cache-dir --no-deps -c constraints.txt \
        -w /opt/wheels . \
    && /opt/glmserve/bin/python -m pip install --no-cache-dir --no-deps --no-index \
        /opt/wheels/glmserve-*.whl \
    && /opt/glmserve/bin/python -m pip check

# --------------------------------------------------------------------------------------------
FROM ${TOOLS_BASE_IMAGE} AS tools
COPY --from=tools-build /opt/glmserve /opt/glmserve
# The launch profiles (data): compose's launcher service dry-runs here, and the doctor checks
# GLMSERVE_PROFILE against them.
COPY deploy/profiles/ /opt/glmserve-app/deploy/profiles/
ENV PATH=/opt/glmserve/bin:$PATH \
    GLMSERVE_PROFILES_DIR=/opt/glmserve-app/deploy/profiles \
    PYTHONUNBUFFERED=1 \
    PYTHONDONTWRITEBYTECODE=1
# An unprivileged user. /run/glmserve holds the build-info file the emulator writes and
# loadtest-report/ Locust's reports; named volumes in compose inherit this ownership when
# they are first created.
RUN useradd --uid 10001 --user-group --create-home glmserve \
    && mkdir -p /run/glmserve /opt/glmserve-app/loadtest-report \
    && chown glmserve:glmserve /run/glmserve /opt/glmserve-app/loadtest-report \
    && python -c "import glmserve, starlette, uvicorn, httpx, prometheus_client, locust, yaml"
USER 10001:10001
WORKDIR /opt/glmserve-app
# No ENTRYPOINT: compose picks the command per service (emulator, exporter, Locust, doctor, launcher).
CMD ["python", "-m", "glmserve.emulator", "--host", "127.0.0.1", "--port", "30000", "--tpot-ms", "20", "--ttft-ms", "250"]

# --------------------------------------------------------------------------------------------
# The fleet's router: the Shepherd Model Gateway (smg from PyPI, sglang-router's maintained
# successor, a Rust binary in the wheel) for the fleet profile and the Kubernetes manifests,
# pinned in constraints.txt. Its own image: it needs neither glmserve nor the tools'
# dependencies, and the tools image stays without its 100 MB binary.
FROM ${TOOLS_BASE_IMAGE} AS router-build
SHELL ["/bin/bash", "-o", "pipefail", "-c"]
COPY docker/build-ca/ .ca* /tmp/build-ca/
COPY docker/pip-ca.sh /usr/local/bin/pip-ca.sh
COPY constraints.txt /tmp/constraints.txt
RUN python3 -m venv /opt/router \
    && pip-ca.sh /opt/router/bin/python install --no-cache-dir -c /tmp/constraints.txt smg \
    && /opt/router/bin/python -m pip check

FROM ${TOOLS_BASE_IMAGE} AS router
COPY --from=router-build /opt/router /opt/router
ENV PATH=/opt/router/bin:$PATH \
    PYTHONUNBUFFERED=1 \
    PYTHONDONTWRITEBYTECODE=1
RUN useradd --uid 10001 --user-group --no-create-home router \
    && python -c "import smg.launch_router"
USER 10001:10001
# compose (glmserve.fleet.render) and the Kubernetes manifests pass the whole argv, loopback and
# worker list included (glmserve.fleet.router.router_argv); alone, this image only shows help.
CMD ["python", "-m", "smg.launch_router", "--help"]

# --------------------------------------------------------------------------------------------
FROM ${BASE_IMAGE} AS server
SHELL ["/bin/bash", "-o", "pipefail", "-c"]
# What the image claims to be. The build below fails if the installed SGLang or the applied
# series disagree with these, so the labels cannot drift from the content.
# tests/stack/test_compose_files.py checks the defaults against patches/series.lock.json.
ARG GLMSERVE_VERSION=0.1.0
# Each line is its own source series (patches/<line>/), so the line names the series too.
ARG SGLANG_LINE
ARG PATCH_LOCK_SHA256=d08e10545eefac1b8e60313efbe276f47ce09ceebde83ea258cdf365d5401ce3
# The preflight also imports the new gather module (torch + Triton, present in the real base).
# CI's torch-less stand-in base passes --no-import; the static checks still run there.
ARG PREFLIGHT_ARGS=""
# The base's torch must be a CUDA 13 build: the digest above is documented as the -cu130 tag,
# and elsewhere as `latest`; this checks what it holds (torch/version.py, read, not imported).
ARG EXPECT_CUDA=13
LABEL org.opencontainers.image.title="glmserve-server" \
      org.opencontainers.image.description="SGLang ${SGLANG_LINE} with the FP8 KV patch series (native FP8 decode, gather-then-cast), for GLM-5-NVFP4 on Blackwell" \
      org.opencontainers.image.version="${GLMSERVE_VERSION}" \
      io.glmserve.sglang.version="${SGLANG_LINE}" \
      io.glmserve.patch.series="${SGLANG_LINE}" \
      io.glmserve.patch.lock-sha256="${PATCH_LOCK_SHA256}"
# JIT arch lists (TORCH_CUDA_ARCH_LIST, FLASHINFER_CUDA_ARCH_LIST) are NOT set here: each launch
# profile sets the one for its GPU (SM120: 12.0f, SM100: 10.0a), so JIT builds only what that GPU
# runs; an image-wide value would override the profile (the environment wins over a profile).
ENV FLASHINFER_WORKSPACE_BASE=/cache/jit \
    TRITON_CACHE_DIR=/cache/jit/triton \
    TORCHINDUCTOR_CACHE_DIR=/cache/jit/inductor \
    HF_HOME=/cache/huggingface \
    GLMSERVE_PROFILES_DIR=/opt/glmserve/deploy/profiles \
    PYTHONUNBUFFERED=1
WORKDIR /opt/glmserve-build
COPY patches/ patches/
COPY src/ src/
# Nothing is installed into SGLang's environment: the base pins torch, FlashInfer and
# sglang-kernel together. apply.py picks the series for the installed SGLang, refuses drift,
# applies all files or none (a failure fails the build), checks the after-hashes, byte-compiles
# every touched file and writes the marker. find_spec locates the package without importing it
# (its __init__ needs torch and friends), for a site-packages install or an editable checkout.
RUN site="$(python3 -c 'import importlib.util, pathlib; print(pathlib.Path(importlib.util.find_spec("sglang").origin).parent.parent)')" \
    && echo "SGLang package root: ${site}" \
    && python3 patches/apply.py --target "${site}" \
    && echo "${site}" >/opt/glmserve-build/sglang-site
# glmserve core is stdlib-only, so --no-deps adds nothing to the environment SGLang pinned.
# The preflight then checks the patch's effect on the installed code, and that the labels
# above (SGLang line, series, lock) are exactly what apply.py recorded, and that the base holds
# the line's torch, FlashInfer and sglang-kernel (--expect-line; a wrong base fails in one line).
COPY --from=tools-build /opt/wheels/ /tmp/glmserve-wheels/
RUN PIP_BREAK_SYSTEM_PACKAGES=1 PIP_ROOT_USER_ACTION=ignore python3 -m pip install --no-cache-dir --no-deps --no-index \
        /tmp/glmserve-wheels/glmserve-*.whl \
    && rm -rf /tmp/glmserve-wheels \
    && python3 -m glmserve.preflight --target "$(cat /opt/glmserve-build/sglang-site)" \
        --expect-line "${SGLANG_LINE}" --expect-series "${SGLANG_LINE}" \
        --expect-lock "${PATCH_LOCK_SHA256}" --expect-cuda "${EXPECT_CUDA}" ${PREFLIGHT_ARGS} \
    && mkdir -p /cache/jit /cache/huggingface /cache/home /run/glmserve \
    && useradd --uid 10001 --user-group --home-dir /cache/home --no-create-home glmserve \
    && chown -R 10001:10001 /cache /run/glmserve
COPY deploy/ /opt/glmserve/deploy/
VOLUME ["/cache/jit"]
WORKDIR /opt/glmserve
# SGLang serves as an unprivileged user: the GPUs are the NVIDIA runtime's world-usable device
# nodes, host IPC and the memlock limit need no capability, and everything it writes is under
# /cache (JIT caches, the Hugging Face cache, HOME for whatever else caches under ~) or
# /run/glmserve (the build info). The package itself, patched at build time, stays root's and
# read-only to it. Named volumes take these folders' owner when docker creates them; one made
# by an older, root-run image keeps root's (docs/deploy.md says how to hand it over).
ENV HOME=/cache/home
USER 10001:10001
EXPOSE 30000
# SIGTERM reaches SGLang directly: the launcher exec()s sglang.launch_server, whose server
# handles it. Compose adds `init: true` as well, so orphaned TP workers are reaped.
STOPSIGNAL SIGTERM
ENTRYPOINT ["python3", "-m", "glmserve.launch"]
