#!/usr/bin/env bash
# Build the model image: the runtime image plus one verified checkpoint at /models/model.
#
#   images/scripts/build-model.sh [--force] [ARCH] [MODEL]   (defaults: host arch, models.default)
#
# The checkpoint comes from images/scripts/model.sh (generated, mirrored or downloaded, and
# verified against images/lock.toml). An image labelled with the same inputs (runtime image
# id + the model's pins) is kept unless --force; a new one is tagged only when complete.
set -euo pipefail
# shellcheck source=lib.sh source-path=SCRIPTDIR
source "$(dirname "$0")/lib.sh"

FORCE=0
ARCH=""
MODEL=""
TMP_REF=""

main() {
  parse_build_args '2,9' "$@"
  need_root
  need_cmd podman python3
  MODEL="${MODEL:-$(lock models.default)}"
  local runtime image dir inputs ctx
  runtime=$(image_name runtime "${ARCH}")
  image=$(image_name model "${ARCH}" "${MODEL}")
  image_exists "${runtime}" || die "runtime image ${runtime} not found: run images/scripts/build-runtime.sh ${ARCH}"
  dir=$("${IMAGES_DIR}/scripts/model.sh" "${MODEL}")
  inputs=$({ podman image inspect --format '{{.Id}}' "${runtime}"; lock "models.${MODEL}"; } | sha256sum | cut -c1-64)
  if ((!FORCE)) && image_exists "${image}" && [[ $(image_label "${image}" "${LABEL_PREFIX}.model-inputs") == "${inputs}" ]]; then
    log "${image} is up to date (model-inputs ${inputs:0:12})"
    return
  fi
  timer_start
  ctx="${BUILD_DIR}/model-context-${MODEL}-${ARCH}"
  rm -rf "${ctx}"
  mkdir -p "${ctx}"
  cp -al "${dir}" "${ctx}/model" 2>/dev/null || cp -a "${dir}" "${ctx}/model"
  lock "models.${MODEL}" | python3 -c 'import json, sys; print(json.dumps({"name": sys.argv[1], **json.load(sys.stdin)}, indent=1, sort_keys=True))' \
    "${MODEL}" >"${ctx}/model.json"
  trap cleanup_tmp_ref EXIT
  build_and_promote "${image}" "${ctx}" "${IMAGES_DIR}/model/Containerfile" \
    --build-arg "RUNTIME_IMAGE=${runtime}" \
    --label "${LABEL_PREFIX}.image=model" \
    --label "${LABEL_PREFIX}.cache=none" \
    --label "${LABEL_PREFIX}.model=${MODEL}" \
    --label "${LABEL_PREFIX}.model-revision=$(lock "models.${MODEL}.revision" 2>/dev/null || echo "tiny-seed-$(lock "models.${MODEL}.seed")")" \
    --label "${LABEL_PREFIX}.model-inputs=${inputs}"
  rm -rf "${ctx}"
  timer_report "model image ${MODEL} ${ARCH}"
}

main "$@"
