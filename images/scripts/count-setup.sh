#!/usr/bin/env bash
# count-setup.sh: the board model's counting qemu, as images/lock.toml [tools.count] pins it:
# Debian's dynamic qemu-user (it takes -plugin; qemu-user-static does not). The two install side
# by side and binfmt_misc keeps running qemu-riscv64-static for podman, which this checks after.
# Idempotent; root when the package is missing.
set -euo pipefail
# shellcheck source=lib.sh source-path=SCRIPTDIR
source "$(dirname "$0")/lib.sh"

# make test's two lanes may both ask at once (the board model's tests and the peer's): one apt at a time.
build_lock count-setup
pkg=$(lock tools.count.qemu_package)
want=$(lock tools.count.qemu_package_version)
have=$(dpkg-query -W -f='${Status} ${Version}' "${pkg}" 2>/dev/null | sed -n 's/^install ok installed //p')
if [[ "${have}" == "${want}" ]]; then
  log "${pkg} ${want} present"
else
  need_root
  log "installing ${pkg}=${want} (found: ${have:-none})"
  apt-get update -qq
  DEBIAN_FRONTEND=noninteractive apt-get install -y -qq --no-install-recommends "${pkg}=${want}" >/dev/null \
    || die "apt cannot install ${pkg}=${want}: update images/lock.toml [tools.count] with a reviewed reason"
fi
binfmt=/proc/sys/fs/binfmt_misc/qemu-riscv64
if [[ -r "${binfmt}" ]] && ! grep -q 'qemu-riscv64-static\|riscv64-binfmt-P' "${binfmt}"; then
  die "binfmt_misc now runs $(sed -n 's/^interpreter //p' "${binfmt}") for riscv64; podman needs qemu-riscv64-static: rerun images/scripts/podman-setup.sh"
fi
