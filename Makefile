# The two commands of the README: `make demo` and `make test`. Both build .venv on first use.
PYTHON ?= python3
VENV ?= .venv
PY := $(VENV)/bin/python
TORCH_VERSION ?= 2.13.0

.PHONY: demo test bench clean lm-collapse pages

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

# Every results page (results/**/study.yaml) is what `kdcollapse study report` writes from its committed records
# (runs.json): exit 1 naming each stale file. The same check is tests/test_study.py::test_ported_pages_*.
pages: $(VENV)/.dev
	$(VENV)/bin/kdcollapse study report --check --runs-dir .no-runs-here $$(find results -name study.yaml | sort)

clean:
	rm -rf $(VENV) runs/demo .pytest_cache

# results/lm_collapse/distilled.md: SmolLM2-135M, the students of results/lm_distillation (STUDENTS: their
# distill-lm folder) and the students' untrained initialisations, on the same 16,384 test tokens, then the page's
# tables and figure. About 6 minutes of CPU time (half of it the teacher).
STUDENTS ?= runs/lm/study
LM_COLLAPSE ?= results/lm_collapse/distilled_test_16k
LM_ANALYZE = OMP_NUM_THREADS=1 $(VENV)/bin/kdcollapse analyze --layers all --block-size 64 --max-tokens 16384 \
	--no-ncc --no-progress
lm-collapse: $(VENV)/.dev
	$(LM_ANALYZE) --lm smollm2-135m --out $(LM_COLLAPSE)/teacher
	for s in 0 1 2; do \
	  $(LM_ANALYZE) --lm $(STUDENTS)/fkl_s$$s/student --out $(LM_COLLAPSE)/forward_kl_s$$s && \
	  $(LM_ANALYZE) --lm $(STUDENTS)/rkl_s$$s/student --out $(LM_COLLAPSE)/reverse_kl_s$$s && \
	  $(LM_ANALYZE) --lm $(STUDENTS)/fkl_s$$s-ce/student --out $(LM_COLLAPSE)/ce_only_s$$s && \
	  $(LM_ANALYZE) --lm $(STUDENTS)/fkl_s$$s/student --random-init $$s --out $(LM_COLLAPSE)/untrained_s$$s \
	  || exit 1; \
	done
	$(VENV)/bin/kdcollapse token-report results/lm_collapse/distilled.yaml
