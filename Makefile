# megatron_loop: `make test` and `make demo` create or reuse .venv themselves.
PYTHON ?= python3
VENV   := .venv
PY     := $(VENV)/bin/python
STAMP  := $(VENV)/.installed
# The exact versions every install gets (docs/DEPENDENCIES.md): pip's constraint, through the environment so
# that the build environments of source distributions (DeepSpeed's) obey it too; no pip cache is read.
LOCK   := requirements-lock.txt
PIP    := PIP_CONSTRAINT=$(CURDIR)/$(LOCK) PIP_NO_CACHE_DIR=1 PIP_DISABLE_PIP_VERSION_CHECK=1 $(PY) -m pip
# Test files run on two pytest-xdist workers (one file per worker at a time, so module fixtures are
# built once); one torch thread each. TEST_WORKERS=0 runs them in this process.
TEST_WORKERS ?= 2
TEST_ENV := OMP_NUM_THREADS=$${OMP_NUM_THREADS:-1} WANDB_MODE=disabled HF_HUB_OFFLINE=1 HF_DATASETS_OFFLINE=1
# make test-latest PIN='transformers==5.23.0' adds requirements to the drift check's resolution
PIN ?=

.PHONY: install test demo clean lock test-latest

$(STAMP): pyproject.toml Makefile $(LOCK)
	test -x $(PY) || $(PYTHON) -m venv $(VENV)
	$(PIP) install pip setuptools wheel
	# torch first, at the lock's version: the local CPU wheel here; on a GPU machine the same pin.
	$(PIP) install torch
	$(PIP) install -e ".[dev]"
	$(PY) tools/deps.py check
	touch $(STAMP)

install: $(STAMP)

test: $(STAMP)
	$(TEST_ENV) $(PY) -m pytest -q -n $(TEST_WORKERS) --dist loadfile --durations=20 tests

demo: $(STAMP)
	PATH=$(CURDIR)/$(VENV)/bin:$$PATH bash tools/demo.sh

# Re-resolve the newest versions inside pyproject's ranges (a new environment, no pip cache) and rewrite the lock.
lock:
	$(PYTHON) tools/deps.py lock

# The tests that touch each dependency's API (pytest -m deps) in a second environment at the newest versions
# pyproject allows; the outcome is recorded in docs/DEPENDENCIES.md.
test-latest:
	$(TEST_ENV) $(PYTHON) tools/deps.py drift --record $(if $(PIN),--pin $(PIN))

clean:
	rm -rf $(VENV) .venv-lock .venv-drift runs/demo
