# One-command setup and test. `make test` creates (or reuses) .venv, installs hf_mlcl with its dev
# extra, and runs the default (fast) test suite on two pytest-xdist workers. On a machine without CUDA,
# torch is pinned to the CPU build 2.13.0 *before* the package is installed so pip never pulls the CUDA
# wheels: on Linux PyPI's torch is the CUDA build, so the CPU one (2.13.0+cpu) comes from PyTorch's CPU index
# (alone: its dependencies come from PyPI with the package's own install below).
PYTHON ?= python3
VENV   ?= .venv
PY     := $(VENV)/bin/python
STAMP  := $(VENV)/.installed

.PHONY: install test test-slow lint demo bench clean

$(PY):
	$(PYTHON) -m venv $(VENV)
	$(PY) -m pip install --quiet --upgrade pip

$(STAMP): $(PY) pyproject.toml
	@if command -v nvidia-smi >/dev/null 2>&1 && nvidia-smi >/dev/null 2>&1; then \
	    echo "CUDA found: installing the default torch build"; \
	    $(PY) -m pip install --quiet "torch>=2.4"; \
	elif [ "$$(uname -s)" = Linux ]; then \
	    echo "no CUDA: installing the CPU build torch==2.13.0+cpu"; \
	    $(PY) -m pip install --quiet --no-deps --extra-index-url https://download.pytorch.org/whl/cpu \
	        "torch==2.13.0+cpu"; \
	else \
	    echo "no CUDA: installing torch==2.13.0 (CPU only on this system)"; \
	    $(PY) -m pip install --quiet "torch==2.13.0"; \
	fi
	$(PY) -m pip install --quiet -e ".[dev]"
	@# DeepSpeed's CPU shared-memory op, built once into the environment's own folder (tests/conftest.py)
	-TORCH_EXTENSIONS_DIR="$$($(PY) -c 'import sys; print(sys.prefix)')/torch_extensions" $(PY) -c \
	    "from deepspeed.comm.torch import build_shm_op; build_shm_op()"
	@touch $(STAMP)

install: $(STAMP)

test: $(STAMP)
	$(PY) -m pytest -q -n 2

test-slow: $(STAMP)
	$(PY) -m pytest -q -m slow

lint: $(STAMP)
	$(VENV)/bin/ruff check hf_mlcl tests benchmarks examples studies
	$(VENV)/bin/ruff format --check hf_mlcl tests benchmarks examples studies

demo: $(STAMP)
	$(VENV)/bin/hf-mlcl demo

clean:
	rm -rf $(VENV) build *.egg-info
