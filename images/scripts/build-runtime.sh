#!/usr/bin/env bash
# Build the runtime image for one arch from the local base image, offline.
#
#   images/scripts/build-runtime.sh [--force] [ARCH]      (ARCH defaults to the host's)
#
# 1. checks images/lock.toml against the repo and the base image's labels against the lock;
# 2. stages a build context (requirements, app sources, the arch's pins, this folder's files,
#    the source revision) and digests it with the base image id: an image whose
#    io.sglang-rvv.inputs label is that digest is kept (unless --force);
# 3. downloads the locked wheels into BUILD_DIR/wheelhouse-ARCH on the host (pip,
#    hash-checked; files already there are reused) and links them into the context.
#    Torch source 'wheel': all of requirements/lock.txt, for the host's arch. 'debian'
#    (riscv64): the venv sees the base's Debian packages (python3-torch and the rest) and
#    adds the arch's wheelhouse: pure-Python wheels, and SGLang repacked as py3-none-any
#    (repack-pure.py, checked against its pinned sha256); plus the RVV kernel extension,
#    cross-compiled on the host against the base image's rootfs (build-kernels.sh), and a
#    native Python to write the venv's .pyc (stage_pyroot; outside the digest: a tool);
# 4. podman build --network=none (a foreign arch under qemu-user); the image checks itself
#    against the pins while building;
# 5. tags the result (version and arch tags) only when it is complete.
set -euo pipefail
# shellcheck source=lib.sh source-path=SCRIPTDIR
source "$(dirname "$0")/lib.sh"

ARCH=""
FORCE=0
TORCH_SOURCE=""

check_supported() {
  TORCH_SOURCE=$(lock "arch.${ARCH}.torch.source")
  case "${TORCH_SOURCE}" in
    wheel)
      [[ ${ARCH} == "$(host_arch)" ]] \
        || die "runtime ${ARCH}: the wheelhouse is downloaded for the host ($(host_arch)); cross-arch wheelhouses are not supported yet"
      ;;
    debian)
      [[ $(lock "arch.${ARCH}.torch.patched_wheels") == "{}" ]] \
        || die "runtime ${ARCH}: arch.${ARCH}.torch.patched_wheels pins a wheelhouse, but installing patched wheels is not implemented yet (empty the table to build on Debian's $(lock "arch.${ARCH}.torch.debian_package"))"
      log "runtime ${ARCH}: torch from Debian's $(lock "arch.${ARCH}.torch.debian_package") $(lock "arch.${ARCH}.torch.version"), SGLang $(lock sglang.version) from the arch's wheelhouse"
      ;;
    *) die "runtime ${ARCH}: unknown torch source '${TORCH_SOURCE}' (arch.${ARCH}.torch.source)" ;;
  esac
  need_emulation "${ARCH}"
}

check_base() {
  local base="$1" want have
  image_exists "${base}" || die "base image ${base} not found: run images/scripts/build-base.sh ${ARCH}"
  want=$(python3 "${LOCK_PY}" base-inputs "${ARCH}")
  have=$(image_label "${base}" "${LABEL_PREFIX}.base-inputs")
  [[ ${have} == "${want}" ]] \
    || die "base image ${base} was built from other inputs (label ${LABEL_PREFIX}.base-inputs=${have:-none}, lock gives ${want}): run images/scripts/build-base.sh ${ARCH}"
}

# The repacked wheels' sources are requirements/lock.txt's x86_64 wheels, whatever the host.
SOURCE_PLATFORM=(--platform manylinux_2_34_x86_64 --python-version 3.11 --implementation cp --abi cp311)

# Each repacked wheel is made from its downloaded source and must hash to its pin.
repack_wheels() {
  local wheelhouse="$1" name source want have repacked
  while read -r name source want; do
    log "repacking ${source} as py3-none-any (native extensions dropped)"
    repacked=$(python3 "${IMAGES_DIR}/scripts/repack-pure.py" "${wheelhouse}/${source}" "${wheelhouse}") \
      || die "repack of ${source} failed (see above)"
    have=$(sha256sum "${repacked}" | cut -d' ' -f1)
    [[ ${have} == "${want}" ]] \
      || die "${repacked##*/}: sha256 ${have} != lock arch.${ARCH}.wheelhouse.repacked.${name}.sha256 ${want} (the source wheel or repack-pure.py changed; pin the new digest only after checking why)"
  done < <(python3 "${LOCK_PY}" repacked "${ARCH}")
}

# The RVV kernels, cross-compiled against the base image's own rootfs (its libtorch-dev).
build_kernels() {
  local base="$1" ctx="$2" sysroot
  [[ $(lock_or "arch.${ARCH}.kernels.compiler" none) != none ]] || return 0
  sysroot=$(podman image mount "${base}") || die "cannot mount ${base} as the kernels' sysroot"
  "${IMAGES_DIR}/scripts/build-kernels.sh" "${sysroot}" "${ctx}/src/app/sglang_rvv/kernels/lib" \
    || { podman image unmount "${base}" >/dev/null; die "the RVV kernel build failed (see above)"; }
  podman image unmount "${base}" >/dev/null
}

# The venv's .pyc, for a foreign arch: written during the build by this host's CPU, not under
# qemu-user, where its 5643 files (SGLang's 4001 among them) took 144 s of the riscv64 build on
# a quiet machine; the native ones are byte for byte the same. CTX/pyroot is
# then a native rootfs (make_pyroot) holding the very python3.X-minimal version the base holds,
# trimmed to /usr, and CTX/pyroot/run-python starts its python by its own loader where the
# Containerfile mounts it (the build container's /lib has no loader of this host's arch).
# For this host's arch, or where the mirror now gives another version, CTX/pyroot stays empty
# and the image's own python compiles (compile-pyc.py: the same files, checked-hash).
stage_pyroot() {
  local ctx="$1" base="$2" dir="$1/pyroot" python sysroot want have loaders loader
  mkdir -p "${dir}"
  [[ ${ARCH} != "$(host_arch)" ]] || return 0
  python=$(lock "arch.${ARCH}.python")
  sysroot=$(podman image mount "${base}") || die "cannot mount ${base} to read its python version"
  want=$(deb_version "${sysroot}" "python${python}-minimal")
  podman image unmount "${base}" >/dev/null
  make_pyroot "${dir}" || log "mmdebstrap of a native python${python}-minimal failed (see above)"
  have=$(deb_version "${dir}" "python${python}-minimal")
  shopt -s nullglob
  loaders=("${dir}"/usr/lib/*-linux-*/ld-linux*.so.?)
  shopt -u nullglob
  if [[ -z ${want} || ${have} != "${want}" || ${#loaders[@]} != 1 ]]; then
    log "the native python${python}-minimal is ${have:-missing} (loaders: ${#loaders[@]}), the base's ${want:-missing}: the venv's .pyc are compiled under emulation"
    rm -rf "${dir}" && mkdir "${dir}"
    return 0
  fi
  find "${dir}" -mindepth 1 -maxdepth 1 ! -name usr -exec rm -rf {} +
  loader=/mnt/pyroot${loaders[0]#"${dir}"}
  printf '#!/bin/sh\n# python%s %s of %s (build-runtime.sh stage_pyroot), by its own loader.\nexec %s --library-path %s /mnt/pyroot/usr/bin/python%s "$@"\n' \
    "${python}" "${have}" "$(host_arch)" "${loader}" "${loader%/*}" "${python}" >"${dir}/run-python"
  chmod 0755 "${dir}/run-python"
  log "the venv's .pyc are compiled natively, by python${python}-minimal ${have} of $(host_arch)"
}

# Everything but the wheels (which requirements.txt pins by hash).
stage_context() {
  local ctx="$1"
  rm -rf "${ctx}"
  mkdir -p "${ctx}/src"
  python3 "${LOCK_PY}" runtime-requirements "${ctx}/requirements.txt" "${ARCH}"
  python3 "${LOCK_PY}" export "${ARCH}" >"${ctx}/lock.json"
  tar -C "${REPO_DIR}" --exclude=__pycache__ --exclude='*.egg-info' -cf - pyproject.toml README.md app \
    | tar -C "${ctx}/src" -xf -
  cp "${IMAGES_DIR}"/runtime/{Containerfile,healthcheck.py,check-runtime.py} "${IMAGES_DIR}/scripts/compile-pyc.py" "${ctx}/"
  stage_revision "${ctx}"
}

# build CTX BASE DIGEST (build_step's FUNCTION): the wheelhouse (and the RVV kernels and the
# native Python) into the context, then the image.
build() {
  local ctx="$1" base="$2" digest="$3" wheelhouse="${BUILD_DIR}/wheelhouse-${ARCH}" platform=() labels
  python3 "${LOCK_PY}" download-requirements "${ARCH}" "${ctx}/download.txt"
  [[ ${TORCH_SOURCE} == wheel ]] || platform=("${SOURCE_PLATFORM[@]}")
  fill_wheelhouse "${wheelhouse}" "${ctx}/download.txt" "${platform[@]}"
  rm "${ctx}/download.txt"
  repack_wheels "${wheelhouse}"
  timer_report "wheelhouse"
  link_wheels "${ctx}" "${wheelhouse}"
  build_kernels "${base}" "${ctx}"
  stage_pyroot "${ctx}" "${base}"
  mapfile -t labels < <(python3 "${LOCK_PY}" labels "${ARCH}" runtime)
  build_image --verbose "${ctx}" "${ctx}/Containerfile" \
    --build-arg "BASE_IMAGE=${base}" \
    --build-arg "SOURCE_DATE_EPOCH=$(lock base.source_date_epoch)" \
    --build-arg "CONTEXT_DIGEST=${digest}" \
    --build-arg "TORCH_SOURCE=${TORCH_SOURCE}" \
    --build-arg "INDUCTOR_CACHE_KEY=$(lock "arch.${ARCH}.inductor_cache_key")" \
    --build-arg "QEMU_CPU=$( [[ ${ARCH} == "$(host_arch)" ]] || lock_or "arch.${ARCH}.qemu_cpu" '')" \
    "${labels[@]}" \
    --label "org.opencontainers.image.revision=$(<"${ctx}/REVISION")"
}

main() {
  build_start runtime "$@"
  need_lock_current
  check_supported
  local base ctx digest
  base=$(image_name base "${ARCH}")
  check_base "${base}"
  ctx="${BUILD_DIR}/runtime-context-${ARCH}"
  stage_context "${ctx}"
  digest=$(context_digest "${ctx}" "${base}")
  build_step --also "localhost/sglang-rvv-runtime:${ARCH}" "$(image_name runtime "${ARCH}")" "${digest}" \
    build "${ctx}" "${base}" "${digest}"
  rm -rf "${ctx}"
}

main "$@"
