#!/usr/bin/env bash
# mmdebstrap hooks for a base rootfs of another arch (runs on the host, not in the chroot):
# the .pyc of the Debian Python packages are compiled by this host's CPU, not under qemu.
#
#   pyc.sh defer ROOT                          (--essential-hook)
#   pyc.sh compile ROOT PYROOT PYTHON COMPILE  (--customize-hook)
#
# Each python3-* package's postinst runs `py3compile -p PACKAGE`, which for the riscv64 base
# took 7 of the build's 16 minutes under qemu-user (compileall of dist-packages, measured on
# this machine kind), and a cold CI run builds that base on its critical path. `defer` diverts
# py3compile to a no-op before those packages are configured; `compile` puts Debian's back and
# writes the .pyc of everything in dist-packages (what those calls compile: the same 11320
# files) with COMPILE (images/scripts/compile-pyc.py: checked-hash .pyc, sorted order) run by
# PYROOT's Python, a native rootfs of the same suite holding only python PYTHON, bound to the
# same paths: 28 s. .pyc bytes do not depend on the CPU that wrote them, only on the Python
# version, so PYROOT's python PYTHON-minimal must be the very Debian version ROOT's is; where
# the mirror gives another (one arch's build lagging), the same script runs under qemu instead.
set -euo pipefail

DIVERTED=/usr/bin/py3compile.deferred
# What Debian's py3compile compiles for the packages' `py3compile -p` calls.
DIRS=(/usr/lib/python3/dist-packages /usr/share/python3)

die() { printf 'pyc.sh: error: %s\n' "$*" >&2; exit 1; }
log() { printf 'pyc.sh: %s\n' "$*" >&2; }

defer() {
  local root="$1"
  chroot "${root}" dpkg-divert --quiet --local --rename --divert "${DIVERTED}" --add /usr/bin/py3compile
  printf '#!/bin/sh\n# sglang-rvv base build: the .pyc are compiled once, natively, at the end (images/base/pyc.sh).\nexit 0\n' \
    >"${root}/usr/bin/py3compile"
  chmod 0755 "${root}/usr/bin/py3compile"
}

version_of() {  # version_of ROOT PACKAGE
  dpkg-query --admindir="$1/var/lib/dpkg" -W -f='${Version}' "$2" 2>/dev/null || true
}

compile() {
  local root="$1" pyroot="$2" python="$3" script="$4" want have dir runner
  [[ -e ${root}${DIVERTED} ]] || die "${root} has no ${DIVERTED}: the defer hook did not run"
  rm -f "${root}/usr/bin/py3compile"
  chroot "${root}" dpkg-divert --quiet --local --rename --remove /usr/bin/py3compile
  [[ -x ${root}/usr/bin/py3compile ]] || die "Debian's py3compile did not come back to ${root}/usr/bin"
  want=$(version_of "${root}" "python${python}-minimal")
  have=$(version_of "${pyroot}" "python${python}-minimal")
  [[ -n ${want} ]] || die "${root} has no python${python}-minimal (lock arch.*.python)"
  runner="${pyroot}"
  if [[ ${have} != "${want}" ]]; then
    log "the native python${python}-minimal is ${have:-missing}, the rootfs's ${want}: compiling under emulation"
    runner="${root}"
  fi
  install -m 0644 "${script}" "${runner}/tmp/compile-pyc.py"
  for dir in "${DIRS[@]}"; do
    [[ -d ${root}${dir} ]] || continue
    if [[ ${runner} == "${pyroot}" ]]; then
      mkdir -p "${pyroot}${dir}"
      mount --bind "${root}${dir}" "${pyroot}${dir}"
      # shellcheck disable=SC2064 # the paths are fixed now
      trap "umount '${pyroot}${dir}'" EXIT
    fi
    chroot "${runner}" "python${python}" -I -S /tmp/compile-pyc.py "${dir}" >&2
    if [[ ${runner} == "${pyroot}" ]]; then
      umount "${pyroot}${dir}"
      trap - EXIT
    fi
  done
  rm -f "${runner}/tmp/compile-pyc.py"
}

case "${1:-}" in
  defer) [[ $# == 2 ]] || die "usage: pyc.sh defer ROOT"; defer "$2" ;;
  compile) [[ $# == 5 ]] || die "usage: pyc.sh compile ROOT PYROOT PYTHON COMPILE"; compile "$2" "$3" "$4" "$5" ;;
  *) die "usage: pyc.sh defer ROOT | pyc.sh compile ROOT PYROOT PYTHON COMPILE" ;;
esac
