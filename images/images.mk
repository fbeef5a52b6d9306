# sglang-rvv images: a Makefile fragment (include it from the top Makefile, or run
# `make -f images/images.mk TARGET` from the repo root). Logic lives in images/scripts/.
#
#   make image [ARCH=amd64]     base (mmdebstrap + podman import), runtime, tiny model
#   make up / make down         compose/compose.yaml with podman-compose, waits until healthy
#   make image-base | image-runtime | image-model | images-setup | images-lock
#
# ARCH defaults to the host's; MODEL to models.default of images/lock.toml; PORT to 30000.
# Every script is idempotent: an image whose recorded inputs match is kept.

IMAGES_DIR := $(patsubst %/,%,$(dir $(lastword $(MAKEFILE_LIST))))
IMAGES_SCRIPTS := $(IMAGES_DIR)/scripts
IMAGES_HOST_ARCH := $(patsubst x86_64,amd64,$(patsubst aarch64,arm64,$(shell uname -m)))
ARCH ?= $(IMAGES_HOST_ARCH)
MODEL ?= $(shell python3 $(IMAGES_SCRIPTS)/lock.py get models.default)
PORT ?= 30000
# podman-compose comes from the locked venv when there is one (podman 4.3 has no `podman compose`).
PODMAN_COMPOSE ?= $(firstword $(wildcard $(CURDIR)/.venv/bin/podman-compose) podman-compose)
IMAGES_ENV := PODMAN_COMPOSE=$(PODMAN_COMPOSE) SGLANG_RVV_PORT=$(PORT) SGLANG_RVV_MODEL=$(MODEL)

.PHONY: image image-base image-runtime image-model images-setup images-lock up down

images-setup:
	$(IMAGES_SCRIPTS)/podman-setup.sh

images-lock:
	python3 $(IMAGES_SCRIPTS)/lock.py check

image-base: images-setup images-lock
	$(IMAGES_SCRIPTS)/build-base.sh $(ARCH)

image-runtime: image-base
	$(IMAGES_SCRIPTS)/build-runtime.sh $(ARCH)

image-model: image-runtime
	$(IMAGES_SCRIPTS)/model.sh $(MODEL) $(ARCH)

image: image-runtime image-model

up: image
	$(IMAGES_ENV) $(IMAGES_SCRIPTS)/compose.sh up $(ARCH)

down:
	$(IMAGES_ENV) $(IMAGES_SCRIPTS)/compose.sh down
