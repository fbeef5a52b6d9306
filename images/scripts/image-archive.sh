#!/usr/bin/env bash
# Write a model (or warm) image to a `podman save` archive, for a target that loads it instead
# of building it: a board too slow to build, or the emulated board of the tests (Ansible's
# build role with sglang_rvv_build_image_archive=PATH; `make image-archive` builds first).
#
#   images/scripts/image-archive.sh model|cache [ARCH] [MODEL]
#   SGLANG_RVV_CHECKPOINT_DIR=DIR images/scripts/image-archive.sh model|cache [ARCH]
#
# The archive is .cache/images/archives/TAG-ID.tar (TAG the image's tag, ID the first 12 hex
# digits of its id); its path is the last line printed. It is written under a temporary name
# and renamed once complete, so a path that exists is a whole archive. An archive of the same
# image id is kept; the tag's archives of other ids are removed (one per tag, a few GB each).
# The image's labels say which commit, arch and model it is: the build role checks them
# against what it ships before it copies anything.
set -euo pipefail
# shellcheck source=lib.sh source-path=SCRIPTDIR
source "$(dirname "$0")/lib.sh"

[[ ${1:-} == --help ]] && { usage; exit 0; }
[[ ${1:-} == model || ${1:-} == cache ]] || die "usage: image-archive.sh model|cache [ARCH] [MODEL]"
need_cmd podman
kind="$1"
arch="${2:-$(host_arch)}"
image=$(image_name "${kind}" "${arch}" "$(model_key "${3:-}")")
image_exists "${image}" || die "image ${image} not found: build it first (make image ARCH=${arch} ...)"

id=$(podman image inspect --format '{{.Id}}' "${image}")
tag="${image##*:}"
dir="${BUILD_DIR}/archives"
archive="${dir}/${tag}-${id:0:12}.tar"
mkdir -p "${dir}"
if [[ -f ${archive} ]]; then
  log "${archive} holds ${image} (${id:0:12}): kept"
else
  log "saving ${image} (${id:0:12}) to ${archive}"
  timer_start
  rm -f "${archive}.partial"  # an interrupted save's
  podman save --quiet --format docker-archive -o "${archive}.partial" "${image}"
  mv "${archive}.partial" "${archive}"
  timer_report "saving $(du -h "${archive}" | cut -f1)B"
fi
for old in "${dir}/${tag}"-*.tar*; do
  [[ ${old} == "${archive}" || ! -e ${old} ]] || { log "removing ${old} (another image id)"; rm -f "${old}"; }
done
echo "${archive}"
