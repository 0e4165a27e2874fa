# One entry point for humans and CI. `make test` is the README's test command; .ci/run calls it.
PYTHON ?= python3
VENV   ?= .venv
PY      = $(VENV)/bin/python
# What a user runs on the host: Locust, the doctor, the dashboard preview, the emulator, the
# exporter and the fleet command.
TOOLS   = emulator,exporter,loadtest,doctor,fleet
# ... and what the tests need besides: torch and Triton (the kernel tests), smg (the router),
# pytest, ruff, kubernetes-validate.
EXTRAS  = $(TOOLS),kernels,router,dev
PIP     = $(PY) -m pip install -q --disable-pip-version-check -c constraints.txt

.PHONY: test lint venv venv-tools demo

# Each install says what it brings and how long it took (pip itself is kept quiet).
$(VENV)/.installed: pyproject.toml constraints.txt
	@echo "venv: the tools ($(TOOLS)) and the test suite's needs (torch, Triton, smg, pytest, ...) into $(VENV): about 2 GB, 1-2 minutes the first time; the tools alone: make venv-tools"
	@start=$$(date +%s) && $(PYTHON) -m venv $(VENV) && $(PIP) -e '.[$(EXTRAS)]' \
	    && echo "venv: done in $$(( $$(date +%s) - start )) s ($$(du -sh $(VENV) | cut -f1))"
	@touch $@ $(VENV)/.installed-tools

$(VENV)/.installed-tools: pyproject.toml constraints.txt
	@echo "venv-tools: Locust, the doctor, the dashboard preview, the emulator, the exporter and the fleet command ($(TOOLS)) into $(VENV): about 300 MB, about a minute"
	@start=$$(date +%s) && $(PYTHON) -m venv $(VENV) && $(PIP) -e '.[$(TOOLS)]' \
	    && echo "venv-tools: done in $$(( $$(date +%s) - start )) s ($$(du -sh $(VENV) | cut -f1)); . $(VENV)/bin/activate for locust"
	@touch $@

venv: $(VENV)/.installed

# Only what runs on the host (no torch, no test tools): what the README's "Using it" needs.
venv-tools: $(VENV)/.installed-tools

lint: venv
	$(VENV)/bin/ruff check .
	$(VENV)/bin/ruff format --check .

# Lint, then every test. GPU tests skip visibly here (they run on the H200 through bench/);
# stack tests skip without a Docker engine, and fail instead of skipping when CI=true. The 15
# slowest tests are listed at the end: CI on a 2-core machine should stay under 20 minutes.
test: lint
	$(VENV)/bin/pytest --durations=15 $(PYTEST_ARGS)

# The no-GPU demo, with or without a registry: emulator + exporter + Prometheus (+ Grafana when
# its image is here), then where to look (docker/demo.sh). CI runs it through tests/stack.
demo: venv-tools
	@bash docker/demo.sh
