# Each target sets up the virtual environment itself, so both work on a fresh machine.
PYTHON ?= python3
VENV := .venv
PY := $(VENV)/bin/python
STAMP := $(VENV)/.installed

export HF_HUB_OFFLINE := 1

.PHONY: demo exactness test test-fast lint bench bench-generate clean

$(STAMP): pyproject.toml
	$(PYTHON) -m venv $(VENV)
	$(PY) -m pip install --quiet "torch==2.13.0"
	$(PY) -m pip install --quiet -e ".[test,dev,hf,plot,triton]"
	touch $(STAMP)

demo: $(STAMP)
	$(VENV)/bin/specsample generate "def parse(text):" --compare

exactness: $(STAMP)
	$(VENV)/bin/specsample demo

lint: $(STAMP)
	$(VENV)/bin/ruff check .
	$(VENV)/bin/mypy

test: lint
	$(PY) -m pytest -n 2 --dist worksteal

test-fast: lint
	$(PY) -m pytest -n 2 --dist worksteal -m "not slow"

bench: $(STAMP)
	$(PY) benchmarks/bench_sampler.py

bench-generate: $(STAMP)
	$(PY) benchmarks/bench_generate.py --threads 1

clean:
	rm -rf $(VENV) .pytest_cache .mypy_cache .ruff_cache .hypothesis
