#!/usr/bin/env bash
# Build the gateway image: the base image + the Shepherd Model Gateway (smg) at the lock's pins.
#
#   images/scripts/build-gateway.sh [--force] [ARCH]      (ARCH defaults to the host's)
#
# The gateway runs in front of REPLICAS=N appliances (compose/gateway.yaml, make up REPLICAS=N)
# on the controller or any amd64 host: never on a board, as smg has no riscv64 wheel.
# 1. stages a context: images/lock.toml [tools.gateway] at requirements/lock.txt's hashes,
#    images/gateway/'s files; digests it with the base image id: an image labelled with that
#    digest is kept (unless --force);
# 2. downloads the wheels into BUILD_DIR/wheelhouse-ARCH (shared with the runtime image);
# 3. podman build --network=none, tagged only when complete.
set -euo pipefail
# shellcheck source=lib.sh source-path=SCRIPTDIR
source "$(dirname "$0")/lib.sh"

ARCH=""
FORCE=0
TMP_REF=""

main() {
  parse_build_args '2,11' "$@"
  need_root
  need_cmd podman python3
  [[ ${ARCH} == amd64 && $(host_arch) == amd64 ]] \
    || die "gateway ${ARCH}: requirements/lock.txt pins x86_64 wheels, so the gateway builds on and for amd64 only (host: $(host_arch)); run it on the controller"
  local base image ctx digest
  base=$(image_name base "${ARCH}")
  image=$(image_name gateway "${ARCH}")
  image_exists "${base}" || die "base image ${base} not found: run images/scripts/build-base.sh ${ARCH}"
  ctx="${BUILD_DIR}/gateway-context-${ARCH}"
  rm -rf "${ctx}"
  mkdir -p "${ctx}"
  python3 "${LOCK_PY}" tool-requirements gateway "${ctx}/requirements.txt"
  cp "${IMAGES_DIR}"/gateway/{Containerfile,gateway.py} "${IMAGES_DIR}/scripts/compile-pyc.py" "${ctx}/"
  digest=$(context_digest "${ctx}" "${base}")
  if kept "${image}" context-digest "${digest}"; then
    rm -rf "${ctx}"
    return
  fi
  timer_start
  fill_wheelhouse "${BUILD_DIR}/wheelhouse-${ARCH}" "${ctx}/requirements.txt"
  link_wheels "${ctx}" "${BUILD_DIR}/wheelhouse-${ARCH}"
  trap cleanup_tmp_ref EXIT
  build_and_promote "${image}" "${ctx}" "${ctx}/Containerfile" \
    --build-arg "BASE_IMAGE=${base}" \
    --build-arg "CONTEXT_DIGEST=${digest}" \
    --label "${LABEL_PREFIX}.image=gateway" \
    --label "${LABEL_PREFIX}.gateway=$(sed -n 's/^\(smg==[^ ]*\).*/\1/p' "${ctx}/requirements.txt")" \
    --label "${LABEL_PREFIX}.context-digest=${digest}" \
    --label "org.opencontainers.image.revision=$(source_revision)"
  rm -rf "${ctx}"
  timer_report "gateway ${ARCH}"
}

main "$@"
