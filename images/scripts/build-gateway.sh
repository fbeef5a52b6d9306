#!/usr/bin/env bash
# Build the gateway image: the base image + the Shepherd Model Gateway (smg) at the lock's pins.
#
#   images/scripts/build-gateway.sh [--force] [ARCH]      (ARCH: amd64 or arm64; the host's by default)
#
# The gateway runs in front of REPLICAS=N appliances (compose/gateway.yaml, make up REPLICAS=N)
# on the controller or any amd64/arm64 host: never on a board, as smg has no riscv64 wheel.
# 1. stages a context: images/lock.toml [tools.gateway] at requirements/lock.txt's hashes,
#    images/gateway/'s files and the source revision; digests it with the base image id: an
#    image whose io.sglang-rvv.inputs label is that digest is kept (unless --force);
# 2. downloads the wheels into BUILD_DIR/wheelhouse-ARCH (shared with the runtime image), for
#    lock arch.ARCH.wheel_platforms where set (arm64: from any host), else the host's;
# 3. podman build --network=none (another arch's binaries run under qemu-user), tagged only
#    when complete.
set -euo pipefail
# shellcheck source=lib.sh source-path=SCRIPTDIR
source "$(dirname "$0")/lib.sh"

ARCH=""
FORCE=0
PLATFORM=()

# PLATFORM: pip download's arguments for ARCH's wheels: the lock's wheel_platforms with its
# Python, or none on an ARCH host (the host's own wheels).
set_wheel_platforms() {
  local platforms python tag
  platforms=$(lock_or "arch.${ARCH}.wheel_platforms" "")
  PLATFORM=()
  if [[ -z ${platforms} ]]; then
    [[ ${ARCH} == "$(host_arch)" ]] \
      || die "gateway ${ARCH} on a $(host_arch) host: images/lock.toml sets no arch.${ARCH}.wheel_platforms, so pip fetches ${ARCH}'s wheels on a ${ARCH} host only; build it there"
    return 0
  fi
  for tag in ${platforms}; do
    PLATFORM+=(--platform "${tag}")
  done
  python=$(lock "arch.${ARCH}.python")
  PLATFORM+=(--python-version "${python}" --implementation cp --abi "cp${python/./}")
}

# build CTX BASE DIGEST (build_step's FUNCTION): the wheels into the context, then the image.
build() {
  local ctx="$1" base="$2" digest="$3"
  fill_wheelhouse "${BUILD_DIR}/wheelhouse-${ARCH}" "${ctx}/requirements.txt" "${PLATFORM[@]}"
  link_wheels "${ctx}" "${BUILD_DIR}/wheelhouse-${ARCH}"
  build_image "${ctx}" "${ctx}/Containerfile" \
    --build-arg "BASE_IMAGE=${base}" \
    --build-arg "CONTEXT_DIGEST=${digest}" \
    --label "${LABEL_PREFIX}.image=gateway" \
    --label "${LABEL_PREFIX}.arch=${ARCH}" \
    --label "${LABEL_PREFIX}.gateway=$(sed -n 's/^\(smg==[^ ]*\).*/\1/p' "${ctx}/requirements.txt")" \
    --label "org.opencontainers.image.revision=$(<"${ctx}/REVISION")"
}

main() {
  build_start gateway "$@"
  local base ctx digest
  set_wheel_platforms
  need_emulation "${ARCH}"
  base=$(image_name base "${ARCH}")
  image_exists "${base}" || die "base image ${base} not found: run images/scripts/build-base.sh ${ARCH}"
  ctx="${BUILD_DIR}/gateway-context-${ARCH}"
  rm -rf "${ctx}"
  mkdir -p "${ctx}"
  python3 "${LOCK_PY}" tool-requirements gateway "${ctx}/requirements.txt"
  cp "${IMAGES_DIR}"/gateway/{Containerfile,gateway.py} "${IMAGES_DIR}/scripts/compile-pyc.py" "${ctx}/"
  stage_revision "${ctx}"
  digest=$(context_digest "${ctx}" "${base}")
  build_step "$(image_name gateway "${ARCH}")" "${digest}" build "${ctx}" "${base}" "${digest}"
  rm -rf "${ctx}"
}

main "$@"
