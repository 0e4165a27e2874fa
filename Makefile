# One entry point for humans and CI. `make test` is the README's test command; .ci/run calls it.
PYTHON ?= python3
VENV   ?= .venv
PY      = $(VENV)/bin/python
EXTRAS  = emulator,exporter,loadtest,doctor,fleet,kernels,router,dev

.PHONY: test lint venv demo

$(VENV)/.installed: pyproject.toml constraints.txt
	$(PYTHON) -m venv $(VENV)
	$(PY) -m pip install -q --disable-pip-version-check -c constraints.txt -e '.[$(EXTRAS)]'
	touch $@

venv: $(VENV)/.installed

lint: venv
	$(VENV)/bin/ruff check .
	$(VENV)/bin/ruff format --check .

# Lint, then every test. GPU tests skip visibly here (they run on the H200 through bench/);
# stack tests skip without a Docker engine, and fail instead of skipping when CI=true.
test: lint
	$(VENV)/bin/pytest $(PYTEST_ARGS)

# The no-GPU demo, with or without a registry: emulator + exporter + Prometheus (+ Grafana when
# its image is here), then where to look (docker/demo.sh). CI runs it through tests/stack.
demo: venv
	@bash docker/demo.sh
