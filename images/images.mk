# sglang-rvv images: included by the top Makefile (the logic lives in images/scripts/).
#
#   make image [ARCH=amd64] [MODEL=tiny-llama | MODEL_DIR=DIR] [CACHE=cold|warm]
#        base (mmdebstrap + podman import) -> runtime -> model image (-> warm image)
#        MODEL_DIR: a local Hugging Face checkpoint directory, checked before anything is built
#        (images/scripts/checkpoint.py) and tagged by a digest of its files
#   make up [same variables] [PORT=30000]   compose up, wait until healthy, print a curl line
#   make down
#   make lock                               refresh the pins that follow from the repo, then check the lock
#   make images-setup                       podman, its containers.conf, qemu-riscv64 binfmt
#
# ARCH defaults to the host's, MODEL to models.default of images/lock.toml, CACHE to cold.
# Every build script keeps an image whose recorded inputs match, and tags only complete images.

IMAGES_SCRIPTS := images/scripts
IMAGES_HOST_ARCH := $(patsubst x86_64,amd64,$(patsubst aarch64,arm64,$(shell uname -m)))
ARCH ?= $(IMAGES_HOST_ARCH)
MODEL ?= $(shell python3 $(IMAGES_SCRIPTS)/lock.py get models.default)
CACHE ?= cold
PORT ?= 30000
# podman-compose comes from the locked venv (podman 4.3 has no `podman compose`): up and down need it.
PODMAN_COMPOSE ?= $(CURDIR)/.venv/bin/podman-compose
# A checkpoint directory instead of a lock model: every script below reads it from the environment.
MODEL_DIR ?=
ifneq ($(MODEL_DIR),)
MODEL :=
export SGLANG_RVV_CHECKPOINT_DIR := $(abspath $(MODEL_DIR))
endif
IMAGES_ENV := PODMAN_COMPOSE=$(PODMAN_COMPOSE) SGLANG_RVV_PORT=$(PORT) SGLANG_RVV_MODEL=$(MODEL) SGLANG_RVV_CACHE=$(CACHE)

.PHONY: image image-base image-runtime image-model image-cache images-setup model-dir-check lock up down

images-setup:
	$(IMAGES_SCRIPTS)/podman-setup.sh

lock:
	python3 $(IMAGES_SCRIPTS)/lock.py refresh

# The build scripts check the lock themselves and fail naming a stale pin: a build never edits it.
# A checkpoint directory that cannot be served stops the build before anything is built.
model-dir-check:
	@if [ -n "$(MODEL_DIR)" ]; then python3 $(IMAGES_SCRIPTS)/checkpoint.py check "$(MODEL_DIR)"; fi

image-base: model-dir-check images-setup
	$(IMAGES_SCRIPTS)/build-base.sh $(ARCH)

image-runtime: image-base
	$(IMAGES_SCRIPTS)/build-runtime.sh $(ARCH)

image-model: image-runtime
	$(IMAGES_SCRIPTS)/build-model.sh $(ARCH) $(MODEL)

image-cache: image-model
	$(IMAGES_SCRIPTS)/build-cache.sh $(ARCH) $(MODEL)

image: $(if $(filter warm,$(CACHE)),image-cache,image-model)
	@case "$(CACHE)" in cold|warm) ;; *) echo "CACHE=$(CACHE): use cold or warm" >&2; exit 2 ;; esac

up: venv image
	$(IMAGES_ENV) $(IMAGES_SCRIPTS)/compose.sh up $(ARCH)

down: venv
	$(IMAGES_ENV) $(IMAGES_SCRIPTS)/compose.sh down
