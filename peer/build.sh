#!/usr/bin/env bash
# Build llama.cpp, the board model's peer, from the tree vendored in the sdist that
# images/lock.toml [peer.llama_cpp] pins by sha256. A benchmark peer, never in an appliance image.
#
#   peer/build.sh [--core] VARIANT...     VARIANT: rvv | ime | host
#
#   rvv   riscv64, GCC's cross compiler, RVV 1.0 (lock: march, riscv64_flags), shared libraries:
#         llama-bench, llama-simple, llama-quantize and peer-count (peer/driver), with the
#         toolchain's riscv64 C and C++ runtime in sysroot/ (qemu -L on any host; on a board,
#         sysroot/lib/ld-linux-riscv64-lp64d.so.1 --library-path sysroot/lib BINARY)
#   ime   the same with the SpacemiT IME1 backend (lock: ime_flags), for make reproduce on a K1,
#         never run here (qemu has no IME instructions). It needs a toolchain that assembles
#         SpacemiT's vmadot: Debian's GCC and binutils do not, and the build says so at configure
#   host  llama-quantize for this host (static), to make the GGUF files
#
#   --core  rvv only: llama-simple and peer-count, without llama.cpp's common library, which
#           llama-bench and llama-quantize need and which is about half the build: what make
#           test's answer and count run. A whole rvv build serves a --core ask.
#
# Each variant goes to .cache/peer/llama.cpp-VARIANT/ (SGLANG_RVV_PEER_DIR overrides .cache/peer)
# with peer.json, what it was built from. peer.json is renamed into place last, after the
# directory itself, so a build cut short leaves the previous one or nothing; a variant whose
# peer.json records exactly these inputs is not rebuilt. The compilers run in a rootfs of this
# host's arch (lock: toolchain_suite, toolchain_packages), made by mmdebstrap and imported as a
# podman image, tagged by a digest of what it was made from. The last line on stdout is each
# variant's directory.
set -euo pipefail
# shellcheck source=lib.sh source-path=SCRIPTDIR/../images/scripts
source "$(dirname "$0")/../images/scripts/lib.sh"

PINS=peer.llama_cpp
PEER_DIR="${SGLANG_RVV_PEER_DIR:-${REPO_DIR}/.cache/peer}"
DRIVER="${REPO_DIR}/peer/driver/peer_count.cpp"
TOOLCHAIN_IMAGE=localhost/sglang-rvv-peer-toolchain
WORKDIR=""
CORE=0

cleanup() {
  [[ -n ${WORKDIR} ]] && rm -rf "${WORKDIR}"
  return 0
}

# The sdist, downloaded by pip (hash-checked), unpacked once into PEER_DIR/src-SHA12.
source_tree() {
  local sha sdist src
  sha=$(lock "${PINS}.sha256")
  sdist="${PEER_DIR}/sdist/$(lock "${PINS}.sdist")"
  src="${PEER_DIR}/src-${sha:0:12}"
  if [[ ! -f ${src}/.complete ]]; then
    if [[ ! -f ${sdist} || $(sha256sum "${sdist}" | cut -d' ' -f1) != "${sha}" ]]; then
      mkdir -p "${PEER_DIR}/sdist"
      printf '%s==%s --hash=sha256:%s\n' "$(lock "${PINS}.package")" "$(lock "${PINS}.version")" "${sha}" \
        >"${PEER_DIR}/sdist/requirements.txt"
      log "pip download of $(lock "${PINS}.package")==$(lock "${PINS}.version") (sdist, hash-checked)"
      heartbeat "pip download" python3 -m pip download --quiet --disable-pip-version-check --no-deps \
        --no-binary=:all: --require-hashes -r "${PEER_DIR}/sdist/requirements.txt" \
        --dest "${PEER_DIR}/sdist" 2> >(grep -v 'is ignored: it is neither a file nor a directory' >&2) \
        || die "pip download of the llama.cpp sdist failed (see above); images/lock.toml ${PINS} pins it"
    fi
    [[ $(sha256sum "${sdist}" | cut -d' ' -f1) == "${sha}" ]] \
      || die "${sdist} does not have sha256 ${sha} (images/lock.toml ${PINS}.sha256)"
    rm -rf "${src}" "${src}.tmp"
    mkdir -p "${src}.tmp"
    tar -xzf "${sdist}" -C "${src}.tmp" --strip-components=1 "$(basename "${sdist}" .tar.gz)/$(lock "${PINS}.tree")"
    mv "${src}.tmp" "${src}"
    touch "${src}/.complete"
  fi
  SRC="${src}/$(lock "${PINS}.tree")"
  [[ -d ${SRC}/ggml/src/ggml-cpu/arch/riscv ]] || die "${SRC} has no ggml-cpu/arch/riscv: not the pinned tree"
}

# The compilers' rootfs as a podman image, tagged by a digest of the suite, mirror and packages.
toolchain() {
  local suite packages key tmp
  suite=$(lock "${PINS}.toolchain_suite")
  packages=$(lock "${PINS}.toolchain_packages" | paste -sd, -)
  key=$(printf '%s\n' "${suite}" "$(lock base.mirror)" "${packages}" "$(host_arch)" | sha256sum | cut -c1-16)
  TOOLCHAIN="${TOOLCHAIN_IMAGE}:${key}"
  image_exists "${TOOLCHAIN}" && return
  local -a SUITE_APTOPTS
  ARCH=riscv64 suite_aptopts  # the riscv64 base's suite too: its apt options (Valid-Until)
  tmp="${WORKDIR}/toolchain.tar"
  log "mmdebstrap ${suite} $(host_arch) (+ ${packages}): the peer's compilers"
  heartbeat "mmdebstrap ${suite} $(host_arch)" mmdebstrap --quiet --mode=root --format=tar --variant=apt \
    --include="${packages}" --aptopt='APT::Install-Recommends "false"' "${SUITE_APTOPTS[@]}" \
    --dpkgopt='path-exclude=/usr/share/doc/*' --dpkgopt='path-exclude=/usr/share/man/*' \
    --dpkgopt='path-exclude=/usr/share/locale/*' "${suite}" "${tmp}" "$(lock base.mirror)" \
    || die "mmdebstrap of the peer's toolchain failed (see above)"
  podman import --quiet "${tmp}" "${TOOLCHAIN}" >/dev/null || die "podman import of the peer's toolchain failed"
  rm -f "${tmp}"
}

# in_toolchain CMD...: run CMD in the toolchain with the source read-only at /src, the driver at
# /driver and the work directory at /work, without a network.
in_toolchain() {
  podman run --rm --network=none -v "${SRC}:/src:ro" -v "${REPO_DIR}/peer/driver:/driver:ro" \
    -v "${WORKDIR}:/work" -w /work "${TOOLCHAIN}" "$@"
}

# The full version of a compiler in the toolchain ("14.4.0").
compiler_version() { in_toolchain "$1" -dumpfullversion; }

# variant_settings VARIANT: CC, CXX, MAJOR, CMAKE_EXTRA, TARGETS (what this call builds) and
# WHOLE (the variant's whole target list) for one variant.
variant_settings() {
  local cross=riscv64-linux-gnu- rv_flags
  mapfile -t rv_flags < <(lock "${PINS}.riscv64_flags")
  case "$1" in
    rvv | ime)
      MAJOR=$(lock "${PINS}.compiler_major")
      [[ $1 == ime ]] && MAJOR=$(lock "${PINS}.ime_compiler_major")
      CC="${cross}gcc-${MAJOR}" CXX="${cross}g++-${MAJOR}"
      CMAKE_EXTRA=(-DCMAKE_SYSTEM_NAME=Linux -DCMAKE_SYSTEM_PROCESSOR=riscv64 "${rv_flags[@]}")
      TARGETS=(llama-bench llama-simple llama-quantize)
      if [[ $1 == ime ]]; then
        mapfile -t -O "${#CMAKE_EXTRA[@]}" CMAKE_EXTRA < <(lock "${PINS}.ime_flags")
        TARGETS=(llama-bench llama-simple)
      fi
      WHOLE=("${TARGETS[@]}")
      [[ $1 == rvv ]] && ((CORE)) && TARGETS=(llama-simple)
      ;;
    host)
      MAJOR=$(lock "${PINS}.compiler_major")
      # Static: the toolchain's glibc is newer than a stable host's, and this binary runs on the host.
      CC="gcc-${MAJOR}" CXX="g++-${MAJOR}" TARGETS=(llama-quantize) WHOLE=(llama-quantize)
      CMAKE_EXTRA=(-DBUILD_SHARED_LIBS=OFF -DCMAKE_EXE_LINKER_FLAGS=-static)
      ;;
    *) die "unknown variant '$1': choose rvv, ime or host (see --help)" ;;
  esac
  [[ $1 == rvv ]] || ((!CORE)) || die "--core is a subset of the rvv build; build ${1} without it"
}

# peer.json: what a variant was built from, in a stable form (compared byte for byte).
manifest() {
  python3 - "$@" <<'EOF'
import json, sys
variant, sdist, sha, compiler, version, driver, targets, *flags = sys.argv[1:]
print(json.dumps({"variant": variant, "sdist": sdist, "sdist_sha256": sha, "compiler": compiler,
                  "compiler_version": version, "driver_sha256": driver, "targets": targets.split(),
                  "cmake_flags": flags},
                 indent=1, sort_keys=True))
EOF
}

build_variant() {
  local variant="$1" out="${PEER_DIR}/llama.cpp-$1" version flags want whole driver_sha
  variant_settings "${variant}"
  version=$(compiler_version "${CXX}") || die "${CXX} is not in the toolchain image ${TOOLCHAIN}"
  [[ ${version%%.*} == "${MAJOR}" ]] || die "${CXX} is version ${version}, images/lock.toml ${PINS} asks for ${MAJOR}"
  mapfile -t flags < <(lock "${PINS}.cmake_flags")
  flags+=("${CMAKE_EXTRA[@]}")
  driver_sha=$(sha256sum "${DRIVER}" | cut -d' ' -f1)
  want=$(manifest "${variant}" "$(lock "${PINS}.sdist")" "$(lock "${PINS}.sha256")" "${CXX}" "${version}" \
    "${driver_sha}" "${TARGETS[*]}" "${flags[@]}")
  whole=$(manifest "${variant}" "$(lock "${PINS}.sdist")" "$(lock "${PINS}.sha256")" "${CXX}" "${version}" \
    "${driver_sha}" "${WHOLE[*]}" "${flags[@]}")
  if [[ -f ${out}/peer.json && ( $(<"${out}/peer.json") == "${want}" || $(<"${out}/peer.json") == "${whole}" ) ]]; then
    log "${out} is up to date (${CXX} ${version})"
    echo "${out}"
    return
  fi
  log "llama.cpp ${variant}: ${CXX} ${version}; ${flags[*]}; targets ${TARGETS[*]}"
  timer_start
  local script
  script=$(cat <<EOF
set -e
cmake -S /src -B build -DCMAKE_C_COMPILER=${CC} -DCMAKE_CXX_COMPILER=${CXX} ${flags[*]} > configure.log
grep -E 'RISCV64_SPACEMIT_IME_SPEC|riscv64 detected|CMAKE_BUILD_TYPE' configure.log || true
EOF
)
  if [[ ${variant} == ime ]]; then
    # Configure probes the assembler with vmadot. Without IME1 the build would fail minutes later
    # at GCC's -march: llama.cpp asks GCC >= 15 for xsmtvdotii, which only SpacemiT's GCC knows.
    script+=$'\n'"grep -q RISCV64_SPACEMIT_IME1 configure.log || { echo '${CXX} and its assembler know no IME1 \
instruction (vmadot, extension xsmtvdotii): upstream GNU binutils and GCC lack them, so the IME build needs the \
SpacemiT toolchain (llama.cpp docs/build-riscv64-spacemit.md), which this build does not have' >&2; exit 3; }"
  fi
  script+=$'\n'"cmake --build build -j $(nproc) --target ${TARGETS[*]} > build.log 2>&1 || { tail -n 40 build.log; exit 1; }
mkdir -p out/bin
cp -a build/bin/. out/bin/"
  if [[ ${variant} != host ]]; then
    # peer-count, on the build's own libraries; and the toolchain's riscv64 runtime beside them.
    script+=$'\n'"${CXX} -O2 -std=c++17 -Wall -Wextra -Werror -I/src/include -I/src/ggml/include \
/driver/peer_count.cpp -o out/bin/peer-count -Lbuild/bin -lllama -lggml -lggml-base -Wl,-rpath,'\$ORIGIN'
mkdir -p out/sysroot/lib
for lib in ld-linux-riscv64-lp64d.so.1 libc.so.6 libm.so.6 libstdc++.so.6 libgcc_s.so.1; do
  cp -L /usr/riscv64-linux-gnu/lib/\$lib out/sysroot/lib/
done"
  fi
  heartbeat "llama.cpp ${variant} build" in_toolchain bash -c "${script}" \
    || die "the llama.cpp ${variant} build failed (the lines above say why)"
  if [[ ${variant} != host ]]; then
    # llama.cpp derives -march from the GGML_RV_* flags: it must be the K1's the lock names.
    local march
    march=$(grep -o -- '-march=[^ ]*' "${WORKDIR}"/build/ggml/src/CMakeFiles/ggml-cpu.dir/flags.make | sort -u | paste -sd' ')
    [[ ${march} == "-march=$(lock "${PINS}.march")"* ]] \
      || die "the ${variant} build's ggml-cpu has ${march:-no -march}, images/lock.toml ${PINS}.march is $(lock "${PINS}.march")"
    log "ggml-cpu built with ${march}"
    printf '%s\n' "${march#-march=}" >"${WORKDIR}/out/march.txt"
  fi
  printf '%s\n' "${want}" >"${WORKDIR}/out/peer.json.new"
  rm -rf "${out}.old"
  [[ -e ${out} ]] && mv "${out}" "${out}.old"
  mv "${WORKDIR}/out" "${out}"
  mv "${out}/peer.json.new" "${out}/peer.json"
  rm -rf "${out}.old" "${WORKDIR:?}"/build
  timer_report "llama.cpp ${variant} build"
  echo "${out}"
}

main() {
  [[ ${1:-} == -h || ${1:-} == --help ]] && { usage; exit 0; }
  [[ ${1:-} == --core ]] && { CORE=1; shift; }
  (($# >= 1)) || die "usage: ${PROG} VARIANT... (rvv, ime, host; see --help)"
  local variant
  for variant in "$@"; do variant_settings "${variant}"; done  # an unknown one fails before any work
  need_cmd podman mmdebstrap
  mkdir -p "${PEER_DIR}"
  trap cleanup EXIT
  source_tree
  for variant in "$@"; do
    WORKDIR=$(mktemp -d "${PEER_DIR}/.build-XXXXXX")
    toolchain
    build_variant "${variant}"
    rm -rf "${WORKDIR}"
  done
}

main "$@"
