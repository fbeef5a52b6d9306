# sglang-rvv images: included by the top Makefile (the logic lives in images/scripts/).
#
#   make image [ARCH=amd64] [MODEL=tiny-llama | MODEL_DIR=DIR] [CACHE=cold|warm]
#        base (mmdebstrap + podman import) -> runtime -> model image (-> warm image)
#        MODEL_DIR: a local Hugging Face checkpoint directory, checked before anything is built
#        (images/scripts/checkpoint.py) and tagged by a digest of its files
#   make up [same variables] [PORT=30000] [REPLICAS=1]   compose up, wait until healthy, print a
#        curl line; REPLICAS=N > 1: N appliances on their own CPUs behind the gateway (smg) on PORT
#        [WEIGHT_DTYPE=bf16|int8|int4|int4_a8] [GROUP_SIZE=N] [LM_HEAD_DTYPE=...]: the packed weight layout,
#        quantized at load from the BF16 checkpoint (empty: the layout's defaults)
#   make down
#   make image-archive [same variables]     make image, then `podman save` the model (CACHE=warm: warm)
#        image to .cache/images/archives/ for a target that loads it instead of building
#        (Ansible: sglang_rvv_build_image_archive=PATH; the path is the last line printed)
#   make lock                               refresh the pins that follow from the repo, then check the lock
#   make images-setup                       podman, its containers.conf, qemu-riscv64 and qemu-aarch64 binfmt
#
# ARCH defaults to the host's, MODEL to models.default of images/lock.toml, CACHE to cold.
# Every build script keeps an image whose recorded inputs match, and tags only complete images.

IMAGES_SCRIPTS := images/scripts
IMAGES_HOST_ARCH := $(shell python3 $(IMAGES_SCRIPTS)/lock.py arch-of $(shell uname -m))
ARCH ?= $(IMAGES_HOST_ARCH)
MODEL ?= $(shell python3 $(IMAGES_SCRIPTS)/lock.py get models.default)
CACHE ?= cold
PORT ?= 30000
REPLICAS ?= 1
WEIGHT_DTYPE ?= bf16
GROUP_SIZE ?=
LM_HEAD_DTYPE ?=
# up and down need podman-compose alone: a small venv of images/lock.toml's [tools.compose]
# at requirements/lock.txt's pins and hashes (podman 4.3 has no `podman compose`), not the
# development venv with torch and SGLang. PODMAN_COMPOSE=... uses another one.
COMPOSE_VENV := .cache/tools/compose
PODMAN_COMPOSE ?= $(CURDIR)/$(COMPOSE_VENV)/bin/podman-compose
# A checkpoint directory instead of a lock model: every script below reads it from the environment.
MODEL_DIR ?=
ifneq ($(MODEL_DIR),)
MODEL :=
export SGLANG_RVV_CHECKPOINT_DIR := $(abspath $(MODEL_DIR))
endif
IMAGES_ENV := PODMAN_COMPOSE=$(PODMAN_COMPOSE) SGLANG_RVV_PORT=$(PORT) SGLANG_RVV_MODEL=$(MODEL) SGLANG_RVV_CACHE=$(CACHE) \
	SGLANG_RVV_REPLICAS=$(REPLICAS) SGLANG_RVV_WEIGHT_DTYPE=$(WEIGHT_DTYPE) SGLANG_RVV_GROUP_SIZE=$(GROUP_SIZE) \
	SGLANG_RVV_LM_HEAD_DTYPE=$(LM_HEAD_DTYPE)

.PHONY: image image-base image-runtime image-model image-cache image-gateway image-archive images-setup model-dir-check compose-tool lock up down

images-setup:
	$(IMAGES_SCRIPTS)/podman-setup.sh

lock:
	python3 $(IMAGES_SCRIPTS)/lock.py refresh

# The build scripts check the lock themselves and fail naming a stale pin: a build never edits it.
# A checkpoint directory that cannot be served, or a MODEL the lock does not know, stops the build
# before anything is built.
model-dir-check:
	@if [ -n "$(MODEL_DIR)" ]; then python3 $(IMAGES_SCRIPTS)/checkpoint.py check "$(MODEL_DIR)"; \
	else python3 $(IMAGES_SCRIPTS)/lock.py model-kind "$(MODEL)" >/dev/null; fi

image-base: model-dir-check images-setup
	$(IMAGES_SCRIPTS)/build-base.sh $(ARCH)

image-runtime: image-base
	$(IMAGES_SCRIPTS)/build-runtime.sh $(ARCH)

image-model: image-runtime
	$(IMAGES_SCRIPTS)/build-model.sh $(ARCH) $(MODEL)

image-cache: image-model
	$(IMAGES_SCRIPTS)/build-cache.sh $(ARCH) $(MODEL)

# The gateway runs on this host, whatever ARCH the appliances are.
image-gateway: images-setup
	$(IMAGES_SCRIPTS)/build-base.sh $(IMAGES_HOST_ARCH)
	$(IMAGES_SCRIPTS)/build-gateway.sh $(IMAGES_HOST_ARCH)

image: $(if $(filter warm,$(CACHE)),image-cache,image-model) $(if $(filter 1,$(REPLICAS)),,image-gateway)
	@case "$(CACHE)" in cold|warm) ;; *) echo "CACHE=$(CACHE): use cold or warm" >&2; exit 2 ;; esac

image-archive: image
	$(IMAGES_SCRIPTS)/image-archive.sh $(if $(filter warm,$(CACHE)),cache,model) $(ARCH) $(MODEL)

# .installed is written last: an interrupted install is redone from scratch next time.
$(COMPOSE_VENV)/.installed: requirements/lock.txt images/lock.toml
	$(NEED_PY311)
	@echo "compose-tool: podman-compose in $(COMPOSE_VENV) (3 hash-pinned wheels)"
	rm -rf $(COMPOSE_VENV)
	$(PYTHON) -m venv $(COMPOSE_VENV)
	python3 $(IMAGES_SCRIPTS)/lock.py tool-requirements compose $(COMPOSE_VENV)/requirements.txt
	$(COMPOSE_VENV)/bin/pip install --quiet --disable-pip-version-check --no-deps --require-hashes \
		--only-binary=:all: -r $(COMPOSE_VENV)/requirements.txt \
		2> >(grep -v 'is ignored: it is neither a file nor a directory' >&2)
	touch $@

compose-tool: $(if $(filter $(CURDIR)/$(COMPOSE_VENV)/bin/podman-compose,$(PODMAN_COMPOSE)),$(COMPOSE_VENV)/.installed)

up: image compose-tool
	$(IMAGES_ENV) $(IMAGES_SCRIPTS)/compose.sh up $(ARCH)

down: compose-tool
	$(IMAGES_ENV) $(IMAGES_SCRIPTS)/compose.sh down
