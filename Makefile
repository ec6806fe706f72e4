# megatron_loop: `make test` and `make demo` create or reuse .venv themselves.
PYTHON ?= python3
VENV   := .venv
PY     := $(VENV)/bin/python
STAMP  := $(VENV)/.installed
# Test files run on two pytest-xdist workers (one file per worker at a time, so module fixtures are
# built once); one torch thread each. TEST_WORKERS=0 runs them in this process.
TEST_WORKERS ?= 2

.PHONY: install test demo clean

$(STAMP): pyproject.toml Makefile
	test -x $(PY) || $(PYTHON) -m venv $(VENV)
	$(PY) -m pip install --upgrade pip setuptools wheel
	# torch first, pinned: the local CPU wheel here; on a GPU machine the same pin.
	$(PY) -m pip install "torch==2.13.0"
	$(PY) -m pip install -e ".[dev]"
	touch $(STAMP)

install: $(STAMP)

test: $(STAMP)
	OMP_NUM_THREADS=$${OMP_NUM_THREADS:-1} WANDB_MODE=disabled HF_HUB_OFFLINE=1 HF_DATASETS_OFFLINE=1 \
		$(PY) -m pytest -q -n $(TEST_WORKERS) --dist loadfile --durations=20 tests

demo: $(STAMP)
	PATH=$(CURDIR)/$(VENV)/bin:$$PATH bash tools/demo.sh

clean:
	rm -rf $(VENV) runs/demo
