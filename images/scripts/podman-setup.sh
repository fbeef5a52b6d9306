#!/usr/bin/env bash
# Make this host able to build and run the sglang-rvv images with rootful podman.
# Idempotent: installs only missing Debian packages, writes the containers.conf
# drop-in only when a probe container fails to run without it, registers qemu-user
# for riscv64 (the boards' images) and aarch64 (the arm64 gateway) only when binfmt_misc
# is available.
#
#   images/scripts/podman-setup.sh [--check] [--no-emulation] [--require-emulation]
#
#   --check              install and write nothing; exit 1 if anything is missing
#   --no-emulation       skip the binfmt (qemu-riscv64, qemu-aarch64) step
#   --require-emulation  fail when either cannot be enabled
set -euo pipefail
# shellcheck source=lib.sh source-path=SCRIPTDIR
source "$(dirname "$0")/lib.sh"

# arch-test: mmdebstrap needs it to build a foreign-arch rootfs (riscv64 on amd64).
# clang-19, lld-19: build-kernels.sh compiles the riscv64 runtime's RVV kernels with them
# (lock arch.riscv64.kernels), cross on amd64, natively on the board.
PACKAGES=(podman runc catatonit mmdebstrap arch-test qemu-user-static binfmt-support clang-19 lld-19)
DROPIN=/etc/containers/containers.conf.d/sglang-rvv.conf
WANT_NOFILE=20000
WANT_NPROC=32768
BINFMT_DIR=/proc/sys/fs/binfmt_misc
# A static binary of the host's arch (from qemu-user-static) is the whole rootfs
# of the probe container: no image or registry needed to test `podman run --init`.
PROBE_BIN=/usr/bin/qemu-x86_64-static
CATATONIT=/usr/bin/catatonit
PODMAN_INIT=/usr/libexec/podman/catatonit

# Foreign arches (qemu names) the images are built and tested for on any host.
EMULATED=(riscv64 aarch64)

CHECK_ONLY=0
EMULATION=auto


parse_args() {
  while (($#)); do
    case "$1" in
      --check) CHECK_ONLY=1 ;;
      --no-emulation) EMULATION=no ;;
      --require-emulation) EMULATION=yes ;;
      -h|--help) usage; exit 0 ;;
      *) die "unknown argument '$1' (see --help)" ;;
    esac
    shift
  done
}

missing_packages() {
  local pkg
  for pkg in "${PACKAGES[@]}"; do
    dpkg-query -W -f='${Status}' "${pkg}" 2>/dev/null | grep -q 'install ok installed' || echo "${pkg}"
  done
}

install_packages() {
  local missing
  mapfile -t missing < <(missing_packages)
  if ((${#missing[@]} == 0)); then
    log "packages present: ${PACKAGES[*]}"
    return
  fi
  ((CHECK_ONLY)) && die "missing Debian packages: ${missing[*]}"
  log "installing ${missing[*]}"
  apt-get update -qq
  DEBIAN_FRONTEND=noninteractive apt-get install -y -qq --no-install-recommends "${missing[@]}" >/dev/null
}

podman_works() { podman info >/dev/null 2>&1; }

# Run a throwaway container (--init, default ulimits); prints podman's error on failure.
probe_container() {
  local rootfs rc=0
  podman_works || { podman info 2>&1 | tail -n 3; return 1; }
  [[ $(host_arch) == amd64 ]] || return 0  # no probe binary for other hosts: podman info only
  rootfs=$(mktemp -d)
  cp "${PROBE_BIN}" "${rootfs}/probe"
  podman run --rm --init --network=none --rootfs "${rootfs}" /probe --version >/dev/null 2>"${rootfs}.err" || rc=$?
  ((rc == 0)) || tail -n 3 "${rootfs}.err"
  rm -rf "${rootfs}" "${rootfs}.err"
  return "${rc}"
}

min() { (($1 < $2)) && echo "$1" || echo "$2"; }

# ulimit -H prints "unlimited" or a number.
hard_limit() {
  local value
  value=$(ulimit -H "$1")
  if [[ ${value} == unlimited ]]; then
    echo "$2"
  else
    min "${value}" "$2"
  fi
}

render_dropin() {
  local nofile nproc
  nofile=$(hard_limit -n "${WANT_NOFILE}")
  nproc=$(hard_limit -u "${WANT_NPROC}")
  cat <<CONF
# Written by sglang-rvv images/scripts/podman-setup.sh: rootful podman 4.3 in a VM
# without systemd or journald. Remove this file to return to the defaults.
[containers]
default_ulimits = ["nofile=${nofile}:${nofile}", "nproc=${nproc}:${nproc}"]

[engine]
runtime = "runc"
cgroup_manager = "cgroupfs"
events_logger = "file"
CONF
  # Debian's catatonit lives in /usr/bin; podman 4.3 looks in /usr/libexec/podman.
  if [[ ! -x ${PODMAN_INIT} && -x ${CATATONIT} ]]; then
    echo "init_path = \"${CATATONIT}\""
  fi
}

write_dropin() {
  local tmp
  tmp=$(mktemp "${DROPIN}.XXXXXX")
  render_dropin >"${tmp}"
  chmod 0644 "${tmp}"
  mv -f "${tmp}" "${DROPIN}"
}

configure_podman() {
  local err
  if [[ -f ${DROPIN} ]]; then
    if cmp -s <(render_dropin) "${DROPIN}"; then
      log "containers.conf drop-in up to date: ${DROPIN}"
    elif ((CHECK_ONLY)); then
      die "${DROPIN} differs from what this script writes"
    else
      write_dropin
      log "rewrote ${DROPIN}"
    fi
  elif err=$(probe_container); then
    log "podman runs containers with its defaults; no drop-in needed"
  elif ((CHECK_ONLY)); then
    die "podman cannot run a container and ${DROPIN} is missing: ${err}"
  else
    log "podman cannot run a container with its defaults (${err##*$'\n'}); writing ${DROPIN}"
    mkdir -p "$(dirname "${DROPIN}")"
    write_dropin
  fi
  err=$(probe_container) || die "podman still cannot run a container: ${err}"
  log "podman $(podman version --format '{{.Client.Version}}') ready (runtime $(podman info --format '{{.Host.OCIRuntime.Name}}'))"
}

registered() { [[ -r ${BINFMT_DIR}/qemu-$1 ]] && grep -q '^enabled' "${BINFMT_DIR}/qemu-$1"; }

try_enable() {
  registered "$1" && return 0
  ((CHECK_ONLY)) && return 1
  if [[ ! -e ${BINFMT_DIR}/register ]]; then
    mount -t binfmt_misc binfmt_misc "${BINFMT_DIR}" 2>/dev/null || return 1
  fi
  update-binfmts --enable "qemu-$1" >/dev/null 2>&1 || return 1
  registered "$1"
}

setup_emulation() {
  local machine
  [[ ${EMULATION} == no ]] && return
  for machine in "${EMULATED[@]}"; do
    [[ ${machine} == "$(uname -m)" ]] && continue
    if try_enable "${machine}"; then
      log "${machine} emulation enabled ($(head -n 1 "${BINFMT_DIR}/qemu-${machine}"), $(grep '^flags' "${BINFMT_DIR}/qemu-${machine}"))"
    elif [[ ${EMULATION} == yes ]]; then
      die "cannot enable qemu-${machine} in binfmt_misc (needs root, the binfmt_misc module and qemu-user-static)"
    else
      log "warning: ${machine} emulation unavailable; ${machine} images cannot be built here"
    fi
  done
}

main() {
  parse_args "$@"
  need_root
  install_packages
  configure_podman
  setup_emulation
}

main "$@"
