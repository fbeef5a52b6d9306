#!/usr/bin/env bash
# mmdebstrap customize hook for the base rootfs (runs on the host, not in the chroot).
#   customize.sh ROOT DEBIAN_VERSION PYTHON BASE_JSON
# Checks that the suite gave the Debian and Python versions the lock pins, then
# records the installed packages and the lock's base inputs in the image.
set -euo pipefail

ROOT="$1"
WANT_DEBIAN="$2"
WANT_PYTHON="$3"
BASE_JSON="$4"
META_DIR="${ROOT}/usr/share/sglang-rvv"

die() { printf 'customize.sh: error: %s\n' "$*" >&2; exit 1; }

check_debian_version() {
  local have
  have=$(cut -d. -f1 "${ROOT}/etc/debian_version")
  [[ ${have} == "${WANT_DEBIAN}" ]] \
    || die "rootfs is Debian $(cat "${ROOT}/etc/debian_version"), lock arch.*.debian_version is ${WANT_DEBIAN}"
}

check_python_version() {
  [[ -x ${ROOT}/usr/bin/python${WANT_PYTHON} ]] \
    || die "rootfs has no /usr/bin/python${WANT_PYTHON} (lock arch.*.python); found: $(find "${ROOT}/usr/bin" -maxdepth 1 -name 'python3.*' -printf '%f ')"
}

write_manifest() {
  mkdir -p "${META_DIR}"
  dpkg-query --admindir="${ROOT}/var/lib/dpkg" -W -f='${Package}\t${Version}\t${Architecture}\n' \
    | LC_ALL=C sort >"${META_DIR}/manifest-packages.txt"
  cp "${BASE_JSON}" "${META_DIR}/base.json"
  chmod 0644 "${META_DIR}/manifest-packages.txt" "${META_DIR}/base.json"
}

main() {
  check_debian_version
  check_python_version
  write_manifest
}

main "$@"
