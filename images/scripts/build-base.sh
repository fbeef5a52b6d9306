#!/usr/bin/env bash
# Build the Debian base image for one arch, from images/lock.toml, without a registry:
# mmdebstrap writes a rootfs tarball, `podman import` turns it into an image, and
# images/base/Containerfile adds metadata and the lock's labels.
#
#   images/scripts/build-base.sh [--force] [ARCH]     (ARCH defaults to the host's)
#
# The result is tagged only when complete (temporary names until then). An existing
# image whose io.sglang-rvv.base-inputs label matches the lock is kept unless --force.
set -euo pipefail
# shellcheck source=lib.sh source-path=SCRIPTDIR
source "$(dirname "$0")/lib.sh"

FORCE=0
ARCH=""
ROOTFS_REF=""
TMP_REF=""

parse_args() { parse_build_args '2,10' "$@"; }

# Downloaded .debs are kept in BUILD_DIR/debs-SUITE-ARCH between builds (mmdebstrap's
# sync-in/sync-out recipe); the image itself never contains them. apt's partial/ keeps the
# apt package's old mtime unless apt downloaded something, and the SOURCE_DATE_EPOCH clamp
# only lowers mtimes: the touch makes a build with a filled cache equal a cold one.
make_rootfs() {
  local out="$1" workdir="$2" packages mirror suite cache
  suite=$(lock "arch.${ARCH}.debian_suite")
  cache="${BUILD_DIR}/debs-${suite}-${ARCH}"
  mkdir -p "${cache}"
  mirror=$(lock base.mirror)
  packages=$(lock "arch.${ARCH}.packages" | paste -sd, -)
  # Debian testing's Release file can be past its Valid-Until; the lock says where to accept that.
  local aptopts=()
  if [[ $(lock_or "arch.${ARCH}.apt_check_valid_until" true) == false ]]; then
    aptopts+=(--aptopt='Acquire::Check-Valid-Until "false"')
  fi
  python3 "${LOCK_PY}" export "${ARCH}" >"${workdir}/base.json"
  log "mmdebstrap ${suite} ${ARCH} (+ ${packages}) from ${mirror}"
  SOURCE_DATE_EPOCH=$(lock base.source_date_epoch) heartbeat "mmdebstrap ${suite} ${ARCH}" mmdebstrap \
    --quiet \
    --mode=root \
    --format=tar \
    --skip=essential/unlink \
    --setup-hook="mkdir -p \"\$1/var/cache/apt/archives\"" \
    --setup-hook="sync-in '${cache}' /var/cache/apt/archives/" \
    --variant="$(lock base.variant)" \
    --architectures="${ARCH}" \
    --include="${packages}" \
    --aptopt='APT::Install-Recommends "false"' \
    "${aptopts[@]}" \
    --dpkgopt='path-exclude=/usr/share/doc/*' \
    --dpkgopt='path-include=/usr/share/doc/*/copyright' \
    --dpkgopt='path-exclude=/usr/share/man/*' \
    --dpkgopt='path-exclude=/usr/share/locale/*' \
    --dpkgopt='path-exclude=/usr/share/info/*' \
    --customize-hook="'${IMAGES_DIR}/base/customize.sh' \"\$1\" '$(lock "arch.${ARCH}.debian_version")' '$(lock "arch.${ARCH}.python")' '${workdir}/base.json'" \
    --customize-hook="sync-out /var/cache/apt/archives '${cache}'" \
    --customize-hook="touch -d @\${SOURCE_DATE_EPOCH} \"\$1/var/cache/apt/archives/partial\"" \
    "${suite}" "${out}" "${mirror}"
}

import_rootfs() {
  local tarball="$1" tmp_ref="$2"
  heartbeat "podman import" podman import --quiet --arch "${ARCH}" --os linux "${tarball}" "${tmp_ref}" >/dev/null
}

build_image() {
  local rootfs_ref="$1" tmp_ref="$2" labels
  mapfile -t labels < <(python3 "${LOCK_PY}" labels "${ARCH}" base)
  podman build --quiet \
    --pull=never --network=none --layers=false --arch "${ARCH}" \
    --identity-label=false --omit-history --timestamp "$(lock base.source_date_epoch)" \
    --build-arg "ROOTFS=${rootfs_ref}" \
    "${labels[@]}" \
    --tag "${tmp_ref}" \
    --file "${IMAGES_DIR}/base/Containerfile" "${IMAGES_DIR}/base" >/dev/null
}

cleanup() {
  [[ -n ${ROOTFS_REF} ]] && podman rmi --ignore "${ROOTFS_REF}" >/dev/null 2>&1
  [[ -n ${TMP_REF} ]] && podman rmi --ignore "${TMP_REF}" >/dev/null 2>&1
  return 0
}

main() {
  parse_args "$@"
  need_root
  need_cmd podman mmdebstrap python3
  python3 "${LOCK_PY}" check >/dev/null || die "images/lock.toml does not match the repo (see above)"
  local image want workdir suffix
  image=$(image_name base "${ARCH}")
  want=$(python3 "${LOCK_PY}" base-inputs "${ARCH}")
  kept "${image}" base-inputs "${want}" && return
  need_emulation "${ARCH}"
  timer_start
  workdir="${BUILD_DIR}/base-${ARCH}"
  mkdir -p "${workdir}"
  suffix="tmp-$$"
  rm -rf "${workdir}"/rootfs.tar*
  trap cleanup EXIT
  make_rootfs "${workdir}/rootfs.tar.${suffix}" "${workdir}"
  mv "${workdir}/rootfs.tar.${suffix}" "${workdir}/rootfs.tar"
  ROOTFS_REF="localhost/sglang-rvv-rootfs:${ARCH}-${suffix}"
  TMP_REF="${image}-${suffix}"
  import_rootfs "${workdir}/rootfs.tar" "${ROOTFS_REF}"
  build_image "${ROOTFS_REF}" "${TMP_REF}"
  promote_image "${TMP_REF}" "${image}"
  TMP_REF=""
  timer_report "base ${ARCH}"
  log "${image}: $(podman image inspect --format '{{.Size}}' "${image}" | numfmt --to=iec), rootfs.tar $(du -h "${workdir}/rootfs.tar" | cut -f1)"
}

main "$@"
