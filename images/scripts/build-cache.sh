#!/usr/bin/env bash
# Build the warm image: the model image plus a prewarmed Inductor cache.
#
#   images/scripts/build-cache.sh [--force] [ARCH] [MODEL]   (defaults: host arch, models.default)
#   SGLANG_RVV_CHECKPOINT_DIR=DIR images/scripts/build-cache.sh [--force] [ARCH]   (a checkpoint directory's image)
#
# 1. runs the model image once with `python -m sglang_rvv.cache_build warm`: SGLang starts
#    with --cpu-rvv-warmup, which compiles every shape key (projection x bucket), then stops;
#    the cache and its manifest (torch, app, CPU capability, compiler, model config, keys)
#    land in a host directory, at the same path the runtime later uses;
# 2. copies that directory into the image (images/cache/Containerfile).
# The warm-up runs on this host's CPU: its artifacts and manifest are for this CPU's ISA,
# which the entrypoint checks at every start. An image whose io.sglang-rvv.inputs label is
# the model image's id is kept unless --force.
set -euo pipefail
# shellcheck source=lib.sh source-path=SCRIPTDIR
source "$(dirname "$0")/lib.sh"

FORCE=0
ARCH=""
MODEL=""
APP_UID=10001

warm_cache() {
  local model_image="$1" out="$2" target
  target="/var/cache/sglang-rvv/inductor/$(lock "arch.${ARCH}.inductor_cache_key")"
  rm -rf "${out}"
  mkdir -p "${out}"
  chown "${APP_UID}:${APP_UID}" "${out}"
  log "warming the Inductor cache with ${model_image} (SGLang log follows)"
  podman run --rm --init --network=none --no-healthcheck \
    -v "${out}:${target}" "${model_image}" \
    python -m sglang_rvv.cache_build warm /models/model "${target}" \
    || die "warm-up in ${model_image} failed (log above)"
}

# build MODEL_IMAGE CTX (build_step's FUNCTION): the warm-up, then the image.
build() {
  local model_image="$1" ctx="$2"
  warm_cache "${model_image}" "${ctx}/inductor"
  build_image "${ctx}" "${IMAGES_DIR}/cache/Containerfile" \
    --build-arg "MODEL_IMAGE=${model_image}" \
    --label "${LABEL_PREFIX}.image=cache" \
    --label "${LABEL_PREFIX}.cache=warm"
}

main() {
  build_start cache "$@"
  MODEL=$(model_key "${MODEL}")
  local model_image ctx
  model_image=$(image_name model "${ARCH}" "${MODEL}")
  image_exists "${model_image}" || die "model image ${model_image} not found: run images/scripts/build-model.sh ${ARCH} ${MODEL}"
  [[ $(image_label "${model_image}" "${LABEL_PREFIX}.serving") != unavailable ]] \
    || die "${model_image} cannot serve (no SGLang: ${ARCH} without the patched wheelhouse), so there is nothing to warm; build with CACHE=cold"
  ctx="${BUILD_DIR}/cache-context-${MODEL}-${ARCH}"
  build_step "$(image_name cache "${ARCH}" "${MODEL}")" "$(podman image inspect --format '{{.Id}}' "${model_image}")" \
    build "${model_image}" "${ctx}"
  rm -rf "${ctx}"
}

main "$@"
