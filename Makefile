# sglang-rvv: this Makefile only orchestrates; the logic lives in app/, images/, ansible/ and tests/.
SHELL := /bin/bash
PYTHON ?= python3
VENV := .venv
PY := $(VENV)/bin/python
# One Inductor cache for everything run from here: compiled artifacts are shared
# across tests, benchmarks and runs, which keeps the suite's compile count low.
export TORCHINDUCTOR_CACHE_DIR ?= $(CURDIR)/.cache/inductor
PYTEST := $(PY) -m pytest

TINY_MODEL := .cache/models/tiny-llama
PORT ?= 30000

.DEFAULT_GOAL := help
include images/images.mk

# The board's inventory (see ansible/inventory/example.yml).
INVENTORY ?= ansible/inventory/example.yml
# The board's playbooks (ansible/): provision, build, deploy, reproduce, gateway; site = provision,
# build, deploy and gateway.
BOARD_PLAYBOOKS := provision build deploy reproduce gateway site

.PHONY: help venv check test lane-times peer-test lint bench bench-serve board-model board-gate served-count count-setup peer-build peer-compare serve clean \
	$(BOARD_PLAYBOOKS)

help:
	@echo "make venv   - create .venv from requirements/lock.txt (the pinned stack)"
	@echo "make check  - the fast tier: tests/unit and tests/integration (no server, no container; a few minutes)"
	@echo "make test   - the whole suite, in two lanes at once, balanced by the last run's per-file times"
	@echo "make lane-times - keep the last make test's per-file times (tests/lane-times.json) for a fresh clone's lanes"
	@echo "make peer-test - the peer's tiers: its core (in make test too) and its whole build, llama-bench and the"
	@echo "              reproduce role's peer step under qemu (tests/peer, tests/peer_tools)"
	@echo "make lint   - ruff, shellcheck, yamllint, ansible-lint"
	@echo "make serve  - serve the built-in tiny model with --enable-cpu-rvv-inductor on 127.0.0.1:$(PORT)"
	@echo "make bench  - the benchmark suite on a Llama-3.2-1B-shaped model (one-batch, serving, HF generate, kernel;"
	@echo "              flag off/on, cold/warm cache) into results/HOST/TIMESTAMP/, then sglang-rvv report (about 10 min)"
	@echo "make bench-serve - sglang one_batch, flag off vs on, on a Llama-3.2-1B-shaped model"
	@echo "make board-gate - the board model's count gates for every layout (make test: bf16)"
	@echo "make board-model - count decode steps of the board models' shapes under qemu (riscv64 runtime image) and"
	@echo "              price them with the stated board model into results/HOST/TIMESTAMP/board-model.json (RUN=DIR: into DIR;"
	@echo "              SERVING=MODEL_DIR: SGLang's serving loop of that checkpoint too, every process, per token;"
	@echo "              LM_HEAD_DTYPE=int4: lm_head in that layout in every policy-on count)"
	@echo "make served-count - SGLang's served token under qemu (riscv64 runtime image), every process counted and priced"
	@echo "              by the board model, into RUN_DIR/served-count.json (SHAPES= default qwen3-0.6b, LAYOUTS= default int4,"
	@echo "              LM_HEAD_DTYPE=, CANDIDATES=K: an int4"
	@echo "              lm_head's exact picks, THREADS=, RUN=DIR; 20-40 min a row); the run directory is the last line"
	@echo "make peer-build - llama.cpp, the board model's peer (peer/build.sh): riscv64 RVV and a host llama-quantize,"
	@echo "              into .cache/peer/ (the board's IME1 build, ime, needs SpacemiT's toolchain)"
	@echo "make peer-compare - llama.cpp and the appliance counted under qemu and priced by one board model, side by side,"
	@echo "              into RUN_DIR/peer-compare.json (SHAPES=, FORMATS= any llama-quantize type, THREADS=, PATHS=vec_dot|repack,"
	@echo "              LAYOUTS= the appliance's layouts or none, PREFILL= the counted prefill's tokens (128), SERVED=int4: the"
	@echo "              served token too, as make served-count counts it, RUN=DIR);"
	@echo "              the run directory is the last line"
	@echo "make image  - build the images (ARCH=$(ARCH) MODEL=$(MODEL) CACHE=cold|warm); root, podman"
	@echo "make image-archive - make image, then podman save it to .cache/images/archives/ (a board loads it: Ansible's"
	@echo "              sglang_rvv_build_image_archive)"
	@echo "make up     - make image, then serve it with compose on 127.0.0.1:$(PORT); make down stops it"
	@echo "              (REPLICAS=N: N appliances on their own CPUs behind the gateway, smg, on the same port;"
	@echo "              WEIGHT_DTYPE=int8|int4|int4_a8: packed weights quantized at load, GROUP_SIZE=N, LM_HEAD_DTYPE=...)"
	@echo "make provision INVENTORY=FILE - check a Banana Pi BPI-F3, install podman, tune it (Ansible)"
	@echo "make build / deploy / reproduce INVENTORY=FILE - build the images on the board / serve them / benchmark there"
	@echo "make gateway INVENTORY=FILE - the gateway (smg) on the inventory's gateway host, in front of every board that serves"
	@echo "make site INVENTORY=FILE - provision + build + deploy (+ gateway) (ANSIBLE_ARGS='-e sglang_rvv_model=...' passes variables)"
	@echo "make lock   - refresh images/lock.toml's derived pins (versions, digests, cache keys) and check it"

venv: $(VENV)/.installed

# requirements/lock.txt pins CPython 3.11 wheels: this venv and images.mk's compose tool need one.
NEED_PY311 = @$(PYTHON) -c 'import sys; sys.exit(0 if sys.version_info[:2] == (3, 11) else \
	"the lock pins CPython 3.11 wheels; run with PYTHON=python3.11")'

$(VENV)/.installed: requirements/lock.txt pyproject.toml
	$(NEED_PY311)
	rm -rf $(VENV)
	$(PYTHON) -m venv $(VENV)
	$(VENV)/bin/pip install --quiet --no-deps --require-hashes -r requirements/lock.txt
	$(VENV)/bin/pip install --quiet --no-deps --no-build-isolation -e .
	$(PY) -m sglang_rvv_boot
	touch $@

# The tiers are tests/ directories, each a marker (tests/conftest.py): unit, integration, e2e,
# images, ansible, infra.
check: venv
	$(PYTEST) -m "unit or integration"

# Two pytest runs at once (tests/lanes.py), the test files split between them by the last run's
# wall time per file. Each lane lists its slowest tests and its wall time per test file at the
# end: CI has a time limit, and this is where it goes.
test: venv lint
	$(PY) tests/lanes.py --durations=25

# A fresh clone (CI) has no last run: it balances its lanes by the times kept here.
lane-times:
	cp .cache/test-lanes/times.json tests/lane-times.json

# llama.cpp, the board model's peer, built and run under qemu: make test runs tests/peer (its core
# build's answer and count); the whole build (llama-bench, a host llama-quantize: 20 min cold) only here.
peer-test: venv
	$(PYTEST) tests/peer tests/peer_tools --durations=10

# Python, the image scripts, and Ansible with the compose files (as tests/ansible/test_lint.py does).
lint: venv
	$(PY) -m ruff check app tests
	$(VENV)/bin/shellcheck -x -P images/scripts images/scripts/*.sh images/base/*.sh peer/*.sh
	$(VENV)/bin/yamllint --strict ansible compose .yamllint
	cd ansible && PATH=$(CURDIR)/$(VENV)/bin:$$PATH ansible-lint --profile production -q

$(TINY_MODEL)/config.json: | venv
	$(PY) -m sglang_rvv.checkpoint $(TINY_MODEL) --arch llama --seed 0 > /dev/null

serve: venv $(TINY_MODEL)/config.json
	$(PY) -m sglang_rvv.launch $(TINY_MODEL) --port $(PORT) --enable-cpu-rvv-inductor

# The suite prints only its run directory on stdout (progress goes to stderr).
bench: venv count-setup
	run=$$($(PY) -m sglang_rvv.bench suite --shape llama-3.2-1b) && \
	$(PY) -m sglang_rvv.boardmodel --run-dir "$$run" > /dev/null && $(VENV)/bin/sglang-rvv report "$$run"

# Like the suite, it prints only its run directory on stdout. Needs the riscv64 runtime image.
board-model: venv count-setup
	@$(PY) -m sglang_rvv.boardmodel $(if $(RUN),--run-dir $(RUN)) $(if $(SERVING),--serving $(SERVING)) \
		$(if $(LM_HEAD_DTYPE),--lm-head $(LM_HEAD_DTYPE))

# Like board-model, it prints only its run directory on stdout. Needs the riscv64 runtime image.
served-count: venv count-setup
	@$(PY) -m sglang_rvv.boardmodel.served $(if $(SHAPES),--shapes $(SHAPES)) $(if $(LAYOUTS),--layouts $(LAYOUTS)) \
		$(if $(LM_HEAD_DTYPE),--lm-head $(LM_HEAD_DTYPE)) $(if $(CANDIDATES),--candidates $(CANDIDATES)) \
		$(if $(THREADS),--threads $(THREADS)) $(if $(RUN),--run-dir $(RUN))

# The board model's gates for every layout (make test gates bf16 only: each layout is one more
# counted process under qemu).
board-gate: venv count-setup
	SGLANG_RVV_GATE_LAYOUTS=all $(PYTEST) tests/images/test_board_model.py

# The counting qemu (images/lock.toml [tools.count]): Debian's dynamic qemu-user beside the static one.
count-setup:
	@$(IMAGES_SCRIPTS)/count-setup.sh

# llama.cpp, the board model's peer: its own build and folder, never in an image.
PEER_VARIANTS ?= rvv host
peer-build:
	@peer/build.sh $(PEER_VARIANTS) > /dev/null

# Like board-model, it prints only its run directory on stdout. Needs the riscv64 runtime image
# unless LAYOUTS=none.
peer-compare: venv count-setup peer-build
	@$(PY) -m sglang_rvv.boardmodel.compare $(if $(SHAPES),--shapes $(SHAPES)) $(if $(FORMATS),--formats $(FORMATS)) \
		$(if $(THREADS),--threads $(THREADS)) $(if $(PATHS),--paths $(PATHS)) $(if $(LAYOUTS),--layouts $(LAYOUTS)) \
		$(if $(PREFILL),--prefill $(PREFILL)) $(if $(SERVED),--served $(SERVED)) $(if $(RUN),--run-dir $(RUN))

bench-serve: venv
	$(PY) -m sglang_rvv.bench one-batch

$(BOARD_PLAYBOOKS): venv
	cd ansible && ../$(VENV)/bin/ansible-playbook -i $(abspath $(INVENTORY)) $@.yml $(ANSIBLE_ARGS)

clean:
	rm -rf $(VENV) .cache
