#!/usr/bin/env bash
# Build the model image: the runtime image plus one verified checkpoint at /models/model.
#
#   images/scripts/build-model.sh [--force] [ARCH] [MODEL]   (defaults: host arch, models.default)
#   SGLANG_RVV_CHECKPOINT_DIR=DIR images/scripts/build-model.sh [--force] [ARCH]
#
# A lock model comes from images/scripts/model.sh (generated, mirrored or downloaded, and
# verified against images/lock.toml). A user's checkpoint directory (make's MODEL_DIR) is
# checked, copied and hashed by images/scripts/checkpoint.py; its model key (the directory's
# name + a digest of its files) names the image, so a changed file builds a new one. The
# served model name is the lock's key or the directory's name (SGLANG_RVV_MODEL_NAME in the
# image). An image whose io.sglang-rvv.inputs label is the same inputs (a digest of the
# runtime image id and the model's pins or key) is kept unless --force; a new one is tagged
# only when complete.
set -euo pipefail
# shellcheck source=lib.sh source-path=SCRIPTDIR
source "$(dirname "$0")/lib.sh"

FORCE=0
ARCH=""
MODEL=""

# model_inputs RUNTIME: what the image is built from: the runtime image and the lock's pins
# of MODEL, or (a checkpoint directory) its key, which holds the digest of its files.
model_inputs() {
  { podman image inspect --format '{{.Id}}' "$1"; lock "models.${MODEL}" 2>/dev/null || echo "${MODEL}"; } \
    | sha256sum | cut -c1-64
}

# stage_lock_model CTX: models.MODEL of the lock, verified, into CTX/model and CTX/model.json.
stage_lock_model() {
  local ctx="$1" dir
  dir=$("${IMAGES_DIR}/scripts/model.sh" "${MODEL}")
  cp -al "${dir}" "${ctx}/model" 2>/dev/null || cp -a "${dir}" "${ctx}/model"
  lock "models.${MODEL}" | python3 -c 'import json, sys; print(json.dumps({"name": sys.argv[1], **json.load(sys.stdin)}, indent=1, sort_keys=True))' \
    "${MODEL}" >"${ctx}/model.json"
}

# stage_checkpoint: SGLANG_RVV_CHECKPOINT_DIR checked, copied and hashed into its build context
# (checkpoint.py stage); prints the copy's key. The copy is what gets built, so its key names the
# image: a file that changed since model_key named the directory gives another key, and so
# another image.
stage_checkpoint() {
  local staging="${BUILD_DIR}/model-context-staging-${ARCH}-$$" key
  rm -rf "${staging}"
  mkdir -p "${staging}"
  log "staging ${SGLANG_RVV_CHECKPOINT_DIR} (check, copy, sha256 of every file)"
  key=$(python3 "${IMAGES_DIR}/scripts/checkpoint.py" stage "${SGLANG_RVV_CHECKPOINT_DIR}" "${staging}") \
    || { rm -rf "${staging}"; die "${SGLANG_RVV_CHECKPOINT_DIR} cannot be served (above); nothing was built"; }
  [[ ${key} == "${MODEL}" ]] || log "${SGLANG_RVV_CHECKPOINT_DIR} changed while it was staged: building it as ${key}"
  rm -rf "${BUILD_DIR}/model-context-${key}-${ARCH}"
  mv "${staging}" "${BUILD_DIR}/model-context-${key}-${ARCH}"
  echo "${key}"
}

# build RUNTIME (build_step's FUNCTION): the checkpoint into a context (a checkpoint directory's
# is staged already), then the image.
build() {
  local runtime="$1" ctx served revision origin=()
  ctx="${BUILD_DIR}/model-context-${MODEL}-${ARCH}"
  if [[ -n ${SGLANG_RVV_CHECKPOINT_DIR:-} ]]; then
    served=$(python3 -c 'import json, sys; print(json.load(open(sys.argv[1]))["name"])' "${ctx}/model.json")
    revision="dir:${MODEL##*-}"
  else
    rm -rf "${ctx}"
    mkdir -p "${ctx}"
    stage_lock_model "${ctx}"
    served="${MODEL}"
    case "$(lock "models.${MODEL}.kind")" in
      hf) revision=$(lock "models.${MODEL}.revision") ;;
      tiny) revision="tiny-seed-$(lock "models.${MODEL}.seed")" ;;
      gguf)  # where the weights come from and what converted them, as model.json has it in full
        revision="pypi:$(lock "models.${MODEL}.origin.package")==$(lock "models.${MODEL}.origin.version")"
        origin=(
          --label "${LABEL_PREFIX}.model-origin=${revision}/$(lock "models.${MODEL}.origin.file") sha256:$(lock "models.${MODEL}.origin.sha256")"
          --label "${LABEL_PREFIX}.model-licence=$(lock "models.${MODEL}.origin.licence")"
          --label "${LABEL_PREFIX}.model-conversion=transformers==$(lock "models.${MODEL}.conversion.transformers") gguf==$(lock "models.${MODEL}.conversion.gguf") torch==$(lock "models.${MODEL}.conversion.torch") bfloat16"
        ) ;;
    esac
  fi
  build_image "${ctx}" "${IMAGES_DIR}/model/Containerfile" \
    --build-arg "RUNTIME_IMAGE=${runtime}" \
    --build-arg "MODEL_NAME=${served}" \
    --label "${LABEL_PREFIX}.image=model" \
    --label "${LABEL_PREFIX}.cache=none" \
    --label "${LABEL_PREFIX}.model=${MODEL}" \
    --label "${LABEL_PREFIX}.model-name=${served}" \
    --label "${LABEL_PREFIX}.model-revision=${revision}" \
    "${origin[@]}" \
    --label "${LABEL_PREFIX}.model-sha256=$(python3 -c 'import json, sys; print(json.dumps(json.load(open(sys.argv[1]))["sha256"], sort_keys=True, separators=(",", ":")))' "${ctx}/model.json")"
  rm -rf "${ctx}"
}

main() {
  build_start model "$@"
  local runtime
  MODEL=$(model_key "${MODEL}")
  [[ -n ${SGLANG_RVV_CHECKPOINT_DIR:-} ]] || python3 "${LOCK_PY}" "${LOCK_ARGS[@]}" model-kind "${MODEL}" >/dev/null || exit 1
  runtime=$(image_name runtime "${ARCH}")
  image_exists "${runtime}" || die "runtime image ${runtime} not found: run images/scripts/build-runtime.sh ${ARCH}"
  if [[ -n ${SGLANG_RVV_CHECKPOINT_DIR:-} ]]; then
    kept "$(image_name model "${ARCH}" "${MODEL}")" "$(model_inputs "${runtime}")" && return 0
    MODEL=$(stage_checkpoint)
  fi
  build_step "$(image_name model "${ARCH}" "${MODEL}")" "$(model_inputs "${runtime}")" build "${runtime}"
  rm -rf "${BUILD_DIR}/model-context-${MODEL}-${ARCH}"  # left staged when the copy's image was up to date
}

main "$@"
