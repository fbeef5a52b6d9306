#!/usr/bin/env bash
# Build the Debian base image for one arch, from images/lock.toml, without a registry:
# mmdebstrap writes a rootfs tarball, `podman import` turns it into an image, and
# images/base/Containerfile adds metadata and the lock's labels.
#
#   images/scripts/build-base.sh [--force] [ARCH]     (ARCH defaults to the host's)
#
# The result is tagged only when complete (temporary names until then). An existing
# image whose io.sglang-rvv.inputs label is the lock's base inputs (lock.py base-inputs,
# also the label io.sglang-rvv.base-inputs of this image and of every image built on it)
# is kept unless --force.
set -euo pipefail
# shellcheck source=lib.sh source-path=SCRIPTDIR
source "$(dirname "$0")/lib.sh"

FORCE=0
ARCH=""

# Downloaded .debs are kept in BUILD_DIR/debs-SUITE-ARCH between builds (mmdebstrap's
# sync-in/sync-out recipe); the image itself never contains them. apt's partial/ keeps the
# apt package's old mtime unless apt downloaded something, and the SOURCE_DATE_EPOCH clamp
# only lowers mtimes: the touch makes a build with a filled cache equal a cold one.
# A foreign arch's rootfs, where dpkg runs under qemu, has its .pyc compiled natively
# (images/base/pyc.sh says why) by the Python of a rootfs of this host's arch, and dpkg skips
# its fsyncs (they cost under emulation, and a build cut short leaves nothing used anyway).
make_rootfs() {
  local out="$1" workdir="$2" packages mirror suite cache python foreign=()
  suite=$(lock "arch.${ARCH}.debian_suite")
  python=$(lock "arch.${ARCH}.python")
  cache="${BUILD_DIR}/debs-${suite}-${ARCH}"
  mkdir -p "${cache}"
  mirror=$(lock base.mirror)
  packages=$(lock "arch.${ARCH}.packages" | paste -sd, -)
  suite_aptopts
  python3 "${LOCK_PY}" export "${ARCH}" >"${workdir}/base.json"
  if [[ ${ARCH} != "$(host_arch)" ]]; then
    make_pyroot "${workdir}/pyroot"
    foreign=(--dpkgopt=force-unsafe-io
             --essential-hook="'${IMAGES_DIR}/base/pyc.sh' defer \"\$1\""
             --customize-hook="'${IMAGES_DIR}/base/pyc.sh' compile \"\$1\" '${workdir}/pyroot' '${python}' '${IMAGES_DIR}/scripts/compile-pyc.py'")
  fi
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
    "${SUITE_APTOPTS[@]}" \
    --dpkgopt='path-exclude=/usr/share/doc/*' \
    --dpkgopt='path-include=/usr/share/doc/*/copyright' \
    --dpkgopt='path-exclude=/usr/share/man/*' \
    --dpkgopt='path-exclude=/usr/share/locale/*' \
    --dpkgopt='path-exclude=/usr/share/info/*' \
    "${foreign[@]}" \
    --customize-hook="'${IMAGES_DIR}/base/customize.sh' \"\$1\" '$(lock "arch.${ARCH}.debian_version")' '${python}' '${workdir}/base.json'" \
    --customize-hook="sync-out /var/cache/apt/archives '${cache}'" \
    --customize-hook="touch -d @\${SOURCE_DATE_EPOCH} \"\$1/var/cache/apt/archives/partial\"" \
    "${suite}" "${out}" "${mirror}"
}

# build WORKDIR (build_step's FUNCTION): the rootfs tarball (kept as WORKDIR/rootfs.tar),
# imported under a temporary name, then images/base/Containerfile on it with the lock's labels.
build() {
  local workdir="$1" suffix="tmp-$$" rootfs_ref labels
  need_emulation "${ARCH}"
  mkdir -p "${workdir}"
  rm -rf "${workdir}"/rootfs.tar*
  make_rootfs "${workdir}/rootfs.tar.${suffix}" "${workdir}"
  mv "${workdir}/rootfs.tar.${suffix}" "${workdir}/rootfs.tar"
  rm -rf "${workdir}/pyroot"
  log "rootfs.tar: $(du -h "${workdir}/rootfs.tar" | cut -f1)"
  rootfs_ref="localhost/sglang-rvv-rootfs:${ARCH}-${suffix}"
  TMP_REFS+=("${rootfs_ref}")
  heartbeat "podman import" podman import --quiet --arch "${ARCH}" --os linux "${workdir}/rootfs.tar" "${rootfs_ref}" >/dev/null
  mapfile -t labels < <(python3 "${LOCK_PY}" labels "${ARCH}" base)
  build_image "${IMAGES_DIR}/base" "${IMAGES_DIR}/base/Containerfile" --build-arg "ROOTFS=${rootfs_ref}" "${labels[@]}"
}

main() {
  build_start base "$@"
  need_cmd mmdebstrap
  need_lock_current
  build_step "$(image_name base "${ARCH}")" "$(python3 "${LOCK_PY}" base-inputs "${ARCH}")" build "${BUILD_DIR}/base-${ARCH}"
}

main "$@"
