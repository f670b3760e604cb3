# The two commands of the README: `make demo` and `make test`. Both build .venv on first use.
PYTHON ?= python3
VENV ?= .venv
PY := $(VENV)/bin/python
TORCH_VERSION ?= 2.13.0

.PHONY: demo test bench clean

$(VENV)/.installed: pyproject.toml
	$(PYTHON) -m venv $(VENV)
	$(PY) -m pip install -q torch==$(TORCH_VERSION)
	$(PY) -m pip install -q -e '.[all]'
	touch $@

$(VENV)/.dev: $(VENV)/.installed
	$(PY) -m pip install -q -e '.[dev,all,llm]'
	touch $@

# On a slow or loaded machine: make demo DEMO_ARGS=--quick
demo: $(VENV)/.installed
	$(VENV)/bin/kdcollapse demo $(DEMO_ARGS)

test: $(VENV)/.dev
	$(PY) -m pytest -q

clean:
	rm -rf $(VENV) runs/demo .pytest_cache
