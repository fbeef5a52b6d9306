# Shared helpers for images/scripts/*.sh; sourced, never executed.
# shellcheck shell=bash

IMAGES_DIR="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
REPO_DIR="$(cd "${IMAGES_DIR}/.." && pwd)"
LOCK_PY="${IMAGES_DIR}/scripts/lock.py"
PROG="$(basename "$0")"

log() { printf '%s: %s\n' "${PROG}" "$*" >&2; }
die() { printf '%s: error: %s\n' "${PROG}" "$*" >&2; exit 1; }

need_cmd() {
  local cmd
  for cmd in "$@"; do
    command -v "${cmd}" >/dev/null 2>&1 || die "missing command '${cmd}' (run images/scripts/podman-setup.sh)"
  done
}

need_root() {
  [[ ${EUID} -eq 0 ]] || die "must run as root (rootful podman, mmdebstrap)"
}

# SGLANG_RVV_LOCK names another lock file (tests use one with a mirror-only model).
LOCK_ARGS=(${SGLANG_RVV_LOCK:+--lock "${SGLANG_RVV_LOCK}"})

# lock KEY... : print values from images/lock.toml (see lock.py get --help)
lock() { python3 "${LOCK_PY}" "${LOCK_ARGS[@]}" get "$@"; }
# lock_or KEY DEFAULT : a value from the lock, or DEFAULT where the key is not set
lock_or() { python3 "${LOCK_PY}" "${LOCK_ARGS[@]}" get "$1" 2>/dev/null || echo "$2"; }

# host_arch: this machine's arch name (amd64, arm64, riscv64): images/lock.toml arch.*.machine.
host_arch() { python3 "${LOCK_PY}" "${LOCK_ARGS[@]}" arch-of "$(uname -m)" || exit 2; }  # lock.py names the problem

image_exists() { podman image exists "$1"; }

# usage: the calling script's header comment (line 2 up to its first line of code), as --help.
usage() { sed -n '2,/^[^#]/s/^# \{0,1\}//p' "$0"; }

# The commit this tree is: git's HEAD ("-dirty" appended when the work tree differs from it,
# untracked files included), or in a `git archive` export (Ansible's build role ships one) the
# hash git wrote into images/REVISION; "unknown" otherwise.
source_revision() {
  local revision
  if revision=$(git -C "${REPO_DIR}" rev-parse HEAD 2>/dev/null); then
    [[ -z $(git -C "${REPO_DIR}" status --porcelain) ]] || revision+="-dirty"
    echo "${revision}"
  elif revision=$(<"${IMAGES_DIR}/REVISION") && [[ ${revision} =~ ^[0-9a-f]{40}$ ]]; then
    echo "${revision}"
  else
    echo unknown
  fi
}

# stage_revision CTX: source_revision into CTX/REVISION, so the context digest (the inputs
# label) covers the org.opencontainers.image.revision label read back from it: an image kept
# because its inputs match then names the commit it was built from, not an older one.
stage_revision() { source_revision >"$1/REVISION"; }

# promote_image SRC DEST...: tag SRC as every DEST, then drop the temporary SRC name
# (atomic from the reader's side: a DEST names either the old image or the complete
# new one). Images the DESTs named before are removed once nothing names them.
promote_image() {
  local src="$1" dest old=() id
  shift
  for dest in "$@"; do
    old+=("$(podman image inspect --format '{{.Id}}' "${dest}" 2>/dev/null || true)")
  done
  for dest in "$@"; do
    podman tag "${src}" "${dest}"
  done
  podman untag "${src}" "${src}" >/dev/null 2>&1 || true
  for id in "${old[@]}"; do
    [[ -n ${id} ]] || continue
    [[ -z $(podman image inspect --format '{{join .RepoTags ""}}' "${id}" 2>/dev/null) ]] || continue
    podman rmi "${id}" >/dev/null 2>&1 || true
  done
}

# heartbeat LABEL CMD...: run CMD; while it runs, log every SGLANG_RVV_HEARTBEAT_S (30) s that
# LABEL is still going, so a long quiet step (a download, a build step) never looks hung.
# CMD runs in the background and is waited for, so a signal's trap (build_step's) runs at once,
# not when CMD ends; HEARTBEAT_PIDS names CMD and the ticker until then (stop_heartbeat).
HEARTBEAT_PIDS=()
heartbeat() {
  local label="$1" began rc=0
  shift
  began=$(date +%s)
  (
    # The sleep is killed with the ticker: left behind, it would hold our stderr open.
    trap 'kill "${nap}" 2>/dev/null; exit 0' TERM
    while :; do
      sleep "${SGLANG_RVV_HEARTBEAT_S:-30}" & nap=$!
      wait "${nap}"
      log "${label}: still running ($(( $(date +%s) - began )) s)"
    done
  ) &
  HEARTBEAT_PIDS=("$!")
  "$@" <&0 &
  HEARTBEAT_PIDS+=("$!")
  wait "$!" || rc=$?
  stop_heartbeat
  return "${rc}"
}

# stop_heartbeat: end the running heartbeat's ticker and command (if any), and wait for them.
stop_heartbeat() {
  local pid
  for pid in "${HEARTBEAT_PIDS[@]}"; do
    kill "${pid}" 2>/dev/null || true
  done
  for pid in "${HEARTBEAT_PIDS[@]}"; do
    wait "${pid}" 2>/dev/null || true
  done
  HEARTBEAT_PIDS=()
}

# fill_wheelhouse DIR REQUIREMENTS [PIP DOWNLOAD ARGS...]: download the hash-pinned wheels
# into DIR (files already there are reused, and checked).
fill_wheelhouse() {
  local wheelhouse="$1" requirements="$2"
  shift 2
  mkdir -p "${wheelhouse}"
  log "wheelhouse ${wheelhouse}: pip download of $(grep -c '==' "${requirements}") wheels (hash-checked)"
  # (pip's config may name local indexes that lack some packages: drop those warnings)
  heartbeat "pip download" python3 -m pip download --quiet --disable-pip-version-check --no-deps \
    --require-hashes --only-binary=:all: "$@" --dest "${wheelhouse}" -r "${requirements}" \
    2> >(grep -v 'is ignored: it is neither a file nor a directory' >&2) \
    || die "pip download of ${requirements} failed (see above): the wheelhouse lacks a locked wheel"
}

# link_wheels CTX WHEELHOUSE: the wheelhouse as CTX/wheels (hard links where possible).
link_wheels() {
  local ctx="$1" wheelhouse="$2"
  cp -al "${wheelhouse}" "${ctx}/wheels" 2>/dev/null || cp -a "${wheelhouse}" "${ctx}/wheels"
}

# suite_aptopts: mmdebstrap's --aptopt for ARCH's Debian suite, into the array SUITE_APTOPTS.
suite_aptopts() {
  SUITE_APTOPTS=()
  # Debian testing's Release file can be past its Valid-Until; the lock says where to accept that.
  if [[ $(lock_or "arch.${ARCH}.apt_check_valid_until" true) == false ]]; then
    SUITE_APTOPTS+=(--aptopt='Acquire::Check-Valid-Until "false"')
  fi
}

# make_pyroot DIR: a rootfs of this host's arch holding ARCH's python (python3.X-minimal) alone,
# from ARCH's suite (86 MB, 15 s), whose Python writes a foreign rootfs's .pyc natively instead
# of under qemu-user: .pyc bytes depend on the Python version, not on the CPU that wrote them.
# So the caller uses it only where deb_version gives the very version the foreign rootfs holds.
make_pyroot() {
  local dir="$1" suite python
  suite=$(lock "arch.${ARCH}.debian_suite")
  python=$(lock "arch.${ARCH}.python")
  suite_aptopts
  rm -rf "${dir}"
  log "mmdebstrap ${suite} $(host_arch) (python${python}-minimal, to compile the .pyc natively)"
  heartbeat "mmdebstrap ${suite} $(host_arch)" mmdebstrap --quiet --mode=root --format=directory \
    --variant=essential --include="python${python}-minimal" "${SUITE_APTOPTS[@]}" --dpkgopt=force-unsafe-io \
    --dpkgopt='path-exclude=/usr/share/doc/*' --dpkgopt='path-exclude=/usr/share/man/*' \
    --dpkgopt='path-exclude=/usr/share/locale/*' "${suite}" "${dir}" "$(lock base.mirror)"
}

# deb_version ROOT PACKAGE: the version of PACKAGE installed in the rootfs at ROOT, or nothing.
deb_version() { dpkg-query --admindir="$1/var/lib/dpkg" -W -f='${Version}' "$2" 2>/dev/null || true; }

# context_digest CTX BASE: a digest of a staged build context and the image it builds on.
context_digest() {
  local ctx="$1" base="$2"
  {
    podman image inspect --format '{{.Id}}' "${base}"
    (cd "${ctx}" && find . -type f -print0 | LC_ALL=C sort -z | xargs -0 sha256sum)
  } | sha256sum | cut -c1-64
}

timer_start() { TIMER_START=$(date +%s); }
timer_report() { log "$1 took $(( $(date +%s) - TIMER_START )) s"; }

# Used by the scripts that source this file:
# shellcheck disable=SC2034
BUILD_DIR="${SGLANG_RVV_BUILD_DIR:-${REPO_DIR}/.cache/images}"
# shellcheck disable=SC2034
LABEL_PREFIX=$(python3 "${LOCK_PY}" label-prefix)  # lock.py's, which labels every image

# image_name base|runtime|gateway ARCH, image_name model|cache ARCH MODEL: the local tag of that image.
# model = runtime + the checkpoint; cache = model + its prewarmed Inductor cache;
# gateway = base + smg, in front of a fleet.
image_name() {
  case "$1" in
    base) echo "localhost/sglang-rvv-base:$(lock "arch.$2.debian_suite")-$2" ;;
    runtime) echo "localhost/sglang-rvv-runtime:$(lock app.version)-$2" ;;
    gateway) echo "localhost/sglang-rvv-gateway:$(lock app.version)-$2" ;;
    model) echo "localhost/sglang-rvv:$(lock app.version)-$3-$2" ;;
    cache) echo "localhost/sglang-rvv:$(lock app.version)-$3-warm-$2" ;;
    *) die "unknown image '$1'" ;;
  esac
}

# model_key [MODEL]: the model a build or compose run is about. With SGLANG_RVV_CHECKPOINT_DIR
# (make's MODEL_DIR), that directory's key (checkpoint.py name: its name and a digest of its
# files; a directory that cannot be served exits here, after checkpoint.py's one line); else
# MODEL, or models.default.
model_key() {
  if [[ -n ${SGLANG_RVV_CHECKPOINT_DIR:-} ]]; then
    [[ -z ${1:-} ]] || die "give a model (${1}) or a checkpoint directory (${SGLANG_RVV_CHECKPOINT_DIR}), not both"
    python3 "${IMAGES_DIR}/scripts/checkpoint.py" name "${SGLANG_RVV_CHECKPOINT_DIR}" || exit 2
  else
    echo "${1:-$(lock models.default)}"
  fi
}

# image_label IMAGE KEY: a label of a local image ('' when unset).
image_label() {
  podman image inspect --format "{{index .Labels \"$2\"}}" "$1" 2>/dev/null | sed 's/^<no value>$//'
}

# qemu_arch ARCH: the machine name qemu-user and binfmt_misc know ARCH by (x86_64, aarch64, riscv64).
qemu_arch() { lock "arch.$1.machine"; }

# Foreign-arch builds run that arch's binaries through qemu-user via binfmt_misc.
need_emulation() {
  local arch="$1" entry
  [[ ${arch} == "$(host_arch)" ]] && return 0
  entry="/proc/sys/fs/binfmt_misc/qemu-$(qemu_arch "${arch}")"
  if ! { [[ -r ${entry} ]] && grep -q '^enabled' "${entry}"; }; then
    die "building for ${arch} on $(host_arch) needs ${entry} enabled (run images/scripts/podman-setup.sh)"
  fi
}

# need_arch_image IMAGE: the lock pins IMAGE for ARCH (arm64 pins the gateway only), or exit
# with lock.py's reason.
need_arch_image() { python3 "${LOCK_PY}" "${LOCK_ARGS[@]}" require-image "${ARCH}" "$1" || exit 1; }

# Parse a build script's "[--force] [ARCH] [MODEL]" into FORCE, ARCH and (for scripts that
# declare MODEL) MODEL; --help prints the script's header comment (usage).
parse_build_args() {
  while (($#)); do
    # shellcheck disable=SC2034  # FORCE and MODEL are read by the calling build script
    case "$1" in
      --force) FORCE=1 ;;
      -h|--help) usage; exit 0 ;;
      -*) die "unknown option '$1'" ;;
      *)
        if [[ -z ${ARCH} ]]; then
          ARCH="$1"
        elif [[ -v MODEL && -z ${MODEL} ]]; then
          MODEL="$1"
        else
          die "unexpected argument '$1' (see --help)"
        fi
        ;;
    esac
    shift
  done
  ARCH="${ARCH:-$(host_arch)}"
}

# need_lock_current: images/lock.toml agrees with the repo, or exit naming each stale pin.
need_lock_current() {
  python3 "${LOCK_PY}" check >/dev/null || die "images/lock.toml does not match the repo (see above)"
}

# build_lock NAME: hold BUILD_DIR/locks/NAME.lock until this script exits. Two builds that
# share a staging directory (make test runs two lanes of tests at once) then take turns, and
# the second finds the first's image up to date instead of deleting its context mid-build.
build_lock() {
  local lock="${BUILD_DIR}/locks/$1.lock"
  need_cmd flock
  mkdir -p "${BUILD_DIR}/locks"
  exec {BUILD_LOCK_FD}>"${lock}"
  if ! flock -n "${BUILD_LOCK_FD}"; then
    log "waiting for another build that holds ${lock}"
    flock "${BUILD_LOCK_FD}"
  fi
}

# build_start IMAGE ARGS...: what every build script does first: parse ARGS
# (parse_build_args), need root, podman and python3, and a lock that pins IMAGE (base,
# runtime, model, cache, gateway) for ARCH; then take the build lock of what IMAGE stages
# (the runtime and the gateway share the arch's wheelhouse).
build_start() {
  local kind="$1"
  shift
  parse_build_args "$@"
  need_root
  need_cmd podman python3
  need_arch_image "${kind}"
  case "${kind}" in
    runtime|gateway) build_lock "wheelhouse-${ARCH}" ;;
    *) build_lock "${kind}-${ARCH}" ;;
  esac
}

# The one label the keep-or-rebuild decision reads, on every image the build scripts make: a
# digest of everything the image was built from (each script says what that is).
INPUTS_LABEL="${LABEL_PREFIX}.inputs"

# kept IMAGE INPUTS: true, and says so, when IMAGE was built from INPUTS (its INPUTS_LABEL) and
# the build script was not given --force (FORCE=1).
kept() {
  local image="$1" inputs="$2"
  ((!${FORCE:-0})) && image_exists "${image}" && [[ $(image_label "${image}" "${INPUTS_LABEL}") == "${inputs}" ]] \
    || return 1
  log "${image} is up to date (inputs ${inputs:0:12})"
}

# Temporary image names of this run, removed on exit (remove_tmp_refs, which build_step traps):
# a failed or interrupted build leaves no name, and so no half-made image, behind. A step still
# running (a podman build) is stopped first, so it cannot tag its image after the names went.
TMP_REFS=()
remove_tmp_refs() {
  local ref
  stop_heartbeat
  for ref in "${TMP_REFS[@]}"; do
    podman rmi --ignore "${ref}" >/dev/null 2>&1
  done
  return 0
}

# build_step [--also TAG]... IMAGE INPUTS FUNCTION [ARGS...]: the build scripts' one skeleton
# once their inputs are known. IMAGE built from INPUTS is kept (kept: "is up to date").
# Otherwise FUNCTION ARGS... stages what the image needs and calls build_image, which builds it
# under a temporary name labelled INPUTS; only then is it tagged IMAGE (and each TAG), and the
# time and size reported.
build_step() {
  local also=()
  while [[ ${1:-} == --also ]]; do
    also+=("$2")
    shift 2
  done
  STEP_IMAGE="$1" STEP_INPUTS="$2" STEP_TMP=""
  shift 2
  kept "${STEP_IMAGE}" "${STEP_INPUTS}" && return 0
  timer_start
  trap remove_tmp_refs EXIT
  trap 'exit 129' HUP
  trap 'exit 130' INT
  trap 'exit 143' TERM
  "$@"
  if [[ -z ${STEP_TMP} ]] || ! image_exists "${STEP_TMP}"; then
    die "${STEP_IMAGE}: $1 built no image"
  fi
  promote_image "${STEP_TMP}" "${STEP_IMAGE}" "${also[@]}"
  timer_report "${STEP_IMAGE}"
  log "${STEP_IMAGE}${also[*]:+ (also ${also[*]})}: $(podman image inspect --format '{{.Size}}' "${STEP_IMAGE}" | numfmt --to=iec)"
}


# build_image [--verbose] CONTEXT CONTAINERFILE [PODMAN BUILD ARGS...]: inside build_step, build
# its image for ARCH, offline, with clamped timestamps and the INPUTS_LABEL, under a temporary
# name (STEP_TMP). --verbose shows podman build's output (else only its heartbeat).
build_image() {
  local verbose=0 args
  if [[ $1 == --verbose ]]; then
    verbose=1
    shift
  fi
  STEP_TMP="${STEP_IMAGE}-tmp-$$"
  TMP_REFS+=("${STEP_TMP}")
  args=(--pull=never --network=none --layers=false --arch "${ARCH}" --format oci
    --identity-label=false --omit-history --timestamp "$(lock base.source_date_epoch)"
    "${@:3}" --label "${INPUTS_LABEL}=${STEP_INPUTS}" --tag "${STEP_TMP}" --file "$2" "$1")
  if ((verbose)); then
    heartbeat "${STEP_IMAGE} build" podman build "${args[@]}"
  else
    heartbeat "${STEP_IMAGE} build" podman build --quiet "${args[@]}" >/dev/null
  fi
}
