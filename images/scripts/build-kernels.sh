#!/usr/bin/env bash
# Cross-compile the project's RVV kernels (app/sglang_rvv/kernels/csrc) into a torch extension
# for the riscv64 image's torch: the build host's clang, with the riscv64 base image's rootfs
# as sysroot (its libtorch-dev headers, libc10.so and libtorch_cpu.so).
#
#   images/scripts/build-kernels.sh SYSROOT OUTDIR
#
# SYSROOT: `podman image mount localhost/sglang-rvv-base:forky-riscv64`, or that rootfs unpacked.
# Writes OUTDIR/libsglang_rvv_kernels.so, the eager route's CPython entry beside it
# (csrc/entry into OUTDIR/libsglang_rvv_entry.so, on the sysroot's Python.h and
# libtorch_python) and OUTDIR/kernels.json (compiler and its version, flags, source digest,
# the sysroot's torch version, layout version). kernels.json is renamed
# into place last, so it only ever sits beside the library it describes; when it already
# records exactly these inputs, nothing is rebuilt. Compiler, flags and the source digest come
# from images/lock.toml [arch.riscv64.kernels]: another compiler version or other sources fail.
set -euo pipefail
# shellcheck source=lib.sh source-path=SCRIPTDIR
source "$(dirname "$0")/lib.sh"

PINS=arch.riscv64.kernels
CSRC="${REPO_DIR}/app/sglang_rvv/kernels/csrc"
LIB_NAME=libsglang_rvv_kernels.so
ENTRY_NAME=libsglang_rvv_entry.so  # sglang_rvv.kernels.entry.ENTRY_NAME
TARGET=riscv64-linux-gnu
WORKDIR=""

cleanup() {
  [[ -n ${WORKDIR} ]] && rm -rf "${WORKDIR}"
  return 0
}

# "19.1.7" from "Debian clang version 19.1.7 (3~deb12u1)"
clang_version() { "$1" --version | sed -n '1s/.*clang version \([0-9][0-9.]*\).*/\1/p'; }

# The C++ and Python sides of the layout contract must name one version.
layout_version() {
  local cxx py
  cxx=$(sed -n 's/^constexpr int64_t kLayoutVersion = \([0-9]*\);.*/\1/p' "${CSRC}/kernels.h")
  py=$(sed -n 's/^LAYOUT_VERSION = \([0-9]*\)$/\1/p' "${REPO_DIR}/app/sglang_rvv/layout.py")
  [[ -n ${cxx} && ${cxx} == "${py}" ]] \
    || die "layout version: csrc/kernels.h kLayoutVersion '${cxx}' != app/sglang_rvv/layout.py LAYOUT_VERSION '${py}'"
  echo "${cxx}"
}

# The torch the sysroot's python3-torch installs, as torch.__version__ reports it.
sysroot_torch_version() {
  local sysroot="$1" metadata
  metadata=$(find "${sysroot}/usr/lib/python3/dist-packages" -maxdepth 2 -path '*/torch-*.dist-info/METADATA' \
    2>/dev/null | head -n 1)
  [[ -n ${metadata} ]] || die "${sysroot} has no python3-torch (usr/lib/python3/dist-packages/torch-*.dist-info)"
  sed -n 's/^Version: //p' "${metadata}" | head -n 1
}

check_sysroot() {
  local sysroot="$1" libdir="$1/usr/lib/${TARGET}" lib
  [[ -d ${sysroot} ]] || die "sysroot ${sysroot} is not a directory"
  [[ -f ${sysroot}/usr/include/torch/library.h ]] \
    || die "${sysroot} has no torch C++ headers (usr/include/torch/library.h: the base image's libtorch-dev)"
  for lib in libc10.so libtorch_cpu.so; do
    [[ -e ${libdir}/${lib} ]] || die "${sysroot} has no ${libdir#"${sysroot}"}/${lib} (libtorch-dev)"
  done
}

# kernels.json: what the library was built from, in a stable form (compared byte for byte).
manifest() {
  python3 - "$@" <<'EOF'
import json, sys
compiler, version, march, march_rvv, source, torch_version, layout_version, *flags = sys.argv[1:]
print(json.dumps({"compiler": compiler, "compiler_version": version, "flags": flags, "march": march,
                  "march_rvv": march_rvv, "source_sha256": source, "torch_version": torch_version,
                  "layout_version": int(layout_version)}, indent=1, sort_keys=True))
EOF
}

# compile SRC OBJ MARCH: one translation unit, in the background (its pid in PIDS). The prefix
# maps keep the sysroot's and the checkout's paths out of __FILE__ (torch's assertion messages),
# so the library is the same bytes wherever it is built.
# compile SRC OBJ MARCH [FLAG...]
compile() {
  "${CXX}" "--target=${TARGET}" "--sysroot=${SYSROOT}" "-ffile-prefix-map=${SYSROOT}=" \
    "-ffile-prefix-map=${REPO_DIR}/=" "-march=$3" "${FLAGS[@]}" "${@:4}" -c "$1" -o "$2" &
  PIDS+=($!)
}

main() {
  [[ ${1:-} == -h || ${1:-} == --help ]] && { usage; exit 0; }
  (($# == 2)) || die "usage: ${PROG} SYSROOT OUTDIR (see --help)"
  SYSROOT=$(cd "$1" 2>/dev/null && pwd) || die "sysroot $1 is not a directory"
  local outdir="$2" compiler version want_version source want_source march march_rvv torch_version layout
  compiler=$(lock "${PINS}.compiler")
  command -v "${compiler}" >/dev/null || die "${compiler} not found (images/lock.toml ${PINS}.compiler; apt-get install ${compiler} lld-${compiler##*-})"
  CXX="${compiler/clang/clang++}"
  command -v "${CXX}" >/dev/null || die "${CXX} not found (the C++ driver of ${compiler})"
  [[ -x $("${CXX}" -print-prog-name=ld.lld) ]] || die "ld.lld for ${compiler} not found (apt-get install lld-${compiler##*-})"
  version=$(clang_version "${compiler}")
  want_version=$(lock "${PINS}.compiler_version")
  [[ ${version} == "${want_version}" ]] \
    || die "${compiler} is version ${version:-unknown}, images/lock.toml ${PINS}.compiler_version pins ${want_version}"
  source=$(python3 "${LOCK_PY}" kernels-source-sha256)
  want_source=$(lock "${PINS}.source_sha256")
  [[ ${source} == "${want_source}" ]] \
    || die "app/sglang_rvv/kernels/csrc digest ${source} != images/lock.toml ${PINS}.source_sha256 ${want_source} (run images/scripts/lock.py refresh once the change is reviewed)"
  check_sysroot "${SYSROOT}"
  mapfile -t FLAGS < <(lock "${PINS}.flags")
  march=$(lock "${PINS}.march")
  march_rvv=$(lock "${PINS}.march_rvv")
  torch_version=$(sysroot_torch_version "${SYSROOT}")
  layout=$(layout_version)

  log "$("${compiler}" --version | head -n 1), target ${TARGET}, sysroot ${SYSROOT} (torch ${torch_version})"
  log "flags: ${FLAGS[*]}; -march=${march_rvv} for *_rvv.cpp, -march=${march} for the rest;" \
    "-ffile-prefix-map for the sysroot and the checkout"
  mkdir -p "${outdir}"
  local want
  want=$(manifest "${compiler}" "${version}" "${march}" "${march_rvv}" "${source}" "${torch_version}" "${layout}" \
    "${FLAGS[@]}")
  if [[ -f ${outdir}/${LIB_NAME} && -f ${outdir}/${ENTRY_NAME} && -f ${outdir}/kernels.json \
    && $(<"${outdir}/kernels.json") == "${want}" ]]; then
    log "${outdir}/${LIB_NAME} is up to date (sources ${source:0:12}, torch ${torch_version})"
    return
  fi

  timer_start
  trap cleanup EXIT
  WORKDIR=$(mktemp -d "${outdir}/.build-XXXXXX")
  local src obj objs=() entry_objs=() pid python
  python=$(lock arch.riscv64.python)
  [[ -f ${SYSROOT}/usr/include/python${python}/Python.h ]] \
    || die "${SYSROOT} has no usr/include/python${python}/Python.h (python3-dev): the entry needs it"
  PIDS=()
  for src in "${CSRC}"/*.cpp; do
    obj="${WORKDIR}/$(basename "${src%.cpp}").o"
    objs+=("${obj}")
    if [[ ${src} == *_rvv.cpp ]]; then compile "${src}" "${obj}" "${march_rvv}"; else compile "${src}" "${obj}" "${march}"; fi
  done
  for src in "${CSRC}"/entry/*.cpp; do
    obj="${WORKDIR}/entry-$(basename "${src%.cpp}").o"
    entry_objs+=("${obj}")
    compile "${src}" "${obj}" "${march}" "-I${SYSROOT}/usr/include/python${python}"
  done
  for pid in "${PIDS[@]}"; do
    wait "${pid}" || die "compiling the kernels failed (see the compiler's messages above)"
  done
  # -z defs: an unresolved symbol fails here, not at dlopen on the board.
  "${CXX}" "--target=${TARGET}" "--sysroot=${SYSROOT}" -fuse-ld=lld -shared -Wl,-z,defs -Wl,--build-id=sha1 \
    -o "${WORKDIR}/${LIB_NAME}" "${objs[@]}" "-L${SYSROOT}/usr/lib/${TARGET}" -lc10 -ltorch_cpu \
    || die "linking ${LIB_NAME} failed (see above)"
  # The eager route's CPython entry (csrc/entry): an extension module, so without -z defs (the
  # interpreter's symbols come from the process that loads it), on libtorch_python.
  "${CXX}" "--target=${TARGET}" "--sysroot=${SYSROOT}" -fuse-ld=lld -shared -Wl,--build-id=sha1 \
    -o "${WORKDIR}/${ENTRY_NAME}" "${entry_objs[@]}" "-L${SYSROOT}/usr/lib/${TARGET}" -ltorch_python -ltorch_cpu -lc10 \
    || die "linking ${ENTRY_NAME} failed (see above)"
  printf '%s\n' "${want}" >"${WORKDIR}/kernels.json"
  rm -f "${outdir}/kernels.json"
  mv "${WORKDIR}/${LIB_NAME}" "${outdir}/${LIB_NAME}"
  mv "${WORKDIR}/${ENTRY_NAME}" "${outdir}/${ENTRY_NAME}"
  mv "${WORKDIR}/kernels.json" "${outdir}/kernels.json"
  timer_report "kernels build"
  log "${outdir}/${LIB_NAME}: $(du -h "${outdir}/${LIB_NAME}" | cut -f1), sha256 $(sha256sum "${outdir}/${LIB_NAME}" | cut -c1-12)"
}

main "$@"
