# megatron_loop: `make test` and `make demo` create or reuse .venv themselves.
PYTHON ?= python3
VENV   := .venv
PY     := $(VENV)/bin/python
STAMP  := $(VENV)/.installed

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
	OMP_NUM_THREADS=$${OMP_NUM_THREADS:-2} WANDB_MODE=disabled HF_HUB_OFFLINE=1 HF_DATASETS_OFFLINE=1 \
		$(PY) -m pytest -q tests

demo: $(STAMP)
	PATH=$(CURDIR)/$(VENV)/bin:$$PATH bash tools/demo.sh

clean:
	rm -rf $(VENV) runs/demo
