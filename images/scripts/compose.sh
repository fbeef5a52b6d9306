#!/usr/bin/env bash
# Bring the compose/compose.yaml service up (and wait until it is healthy) or down.
#
#   images/scripts/compose.sh up [ARCH]     start, wait for the healthcheck, print a curl line
#   images/scripts/compose.sh down          stop and remove (the Inductor cache volume stays)
#
# Environment: PODMAN_COMPOSE (podman-compose; "podman compose" works too), SGLANG_RVV_PORT (30000), SGLANG_RVV_MODEL
# (models.default of images/lock.toml) or SGLANG_RVV_CHECKPOINT_DIR (a checkpoint directory
# built with make image MODEL_DIR=...), SGLANG_RVV_CACHE (cold: the model image; warm: the
# image with the prewarmed Inductor cache), SGLANG_RVV_IMAGE (overrides both),
# SGLANG_RVV_UP_TIMEOUT (600 s; 1800 s for an emulated arch), SGLANG_RVV_QEMU_CPU (an emulated
# arch's lock qemu_cpu); the rest of compose.yaml's variables pass through.
# The health status is driven by `podman healthcheck run` (the compose healthcheck, run
# inside the container): podman 4.3 schedules healthchecks with systemd timers, and
# without systemd nothing would ever run them.
set -euo pipefail
# shellcheck source=lib.sh source-path=SCRIPTDIR
source "$(dirname "$0")/lib.sh"

COMPOSE_FILE="${REPO_DIR}/compose/compose.yaml"
PROJECT=sglang-rvv
SERVICE=sglang

# podman-compose, minus podman's "unable to get systemd connection" healthcheck-timer
# noise. Filtered through a file, not a pipe: conmon outlives the command and would
# hold a pipe open (and whoever reads it) forever.
read -ra COMPOSE_CMD <<<"${PODMAN_COMPOSE:-podman-compose}"
compose() {
  local err rc=0
  err=$(mktemp)
  "${COMPOSE_CMD[@]}" -f "${COMPOSE_FILE}" "$@" 2>"${err}" || rc=$?
  grep -v 'unable to get systemd connection' "${err}" >&2 || true
  rm -f "${err}"
  return "${rc}"
}

container_id() {
  podman ps -a --filter "label=io.podman.compose.project=${PROJECT}" \
    --filter "label=com.docker.compose.service=${SERVICE}" --format '{{.ID}}' | head -n 1
}

container_state() { podman inspect --format '{{.State.Status}}' "$1" 2>/dev/null || echo gone; }

wait_healthy() {
  local id="$1" timeout="$2" began=${SECONDS} next_note=30
  while ! podman healthcheck run "${id}" >/dev/null 2>&1; do
    if [[ $(container_state "${id}") != running ]]; then
      podman logs --tail 40 "${id}" >&2 || true
      die "container ${id} is $(container_state "${id}") before becoming healthy (logs above)"
    fi
    ((SECONDS - began < timeout)) || die "container ${id} not healthy after ${timeout} s (podman logs ${id})"
    if ((SECONDS - began >= next_note)); then  # a long start says where it is
      log "starting ($((SECONDS - began)) s): $(podman logs --tail 1 "${id}" 2>&1 | cut -c1-160)"
      next_note=$((next_note + 30))
    fi
    sleep 3
  done
  log "healthy after $((SECONDS - began)) s"
}

up() {
  local arch="${1:-$(host_arch)}" id port
  port="${SGLANG_RVV_PORT:-30000}"
  local model
  model=$(model_key "${SGLANG_RVV_MODEL:-}")
  case "${SGLANG_RVV_CACHE:-cold}" in
    cold) SGLANG_RVV_IMAGE="${SGLANG_RVV_IMAGE:-$(image_name model "${arch}" "${model}")}" ;;
    warm) SGLANG_RVV_IMAGE="${SGLANG_RVV_IMAGE:-$(image_name cache "${arch}" "${model}")}" ;;
    *) die "SGLANG_RVV_CACHE='${SGLANG_RVV_CACHE}' must be cold or warm" ;;
  esac
  export SGLANG_RVV_IMAGE
  image_exists "${SGLANG_RVV_IMAGE}" || die "image ${SGLANG_RVV_IMAGE} not found: build it first (make image)"
  local timeout="${SGLANG_RVV_UP_TIMEOUT:-600}"
  if [[ ${arch} != "$(host_arch)" ]]; then
    need_emulation "${arch}"
    export SGLANG_RVV_QEMU_CPU="${SGLANG_RVV_QEMU_CPU:-$(lock "arch.${arch}.qemu_cpu")}"
    # Timings under qemu say nothing about the board: no load-time warm-up and route table.
    export SGLANG_RVV_WARMUP="${SGLANG_RVV_WARMUP:-0}"
    timeout="${SGLANG_RVV_UP_TIMEOUT:-1800}"
    log "${arch} under qemu-user (QEMU_CPU=${SGLANG_RVV_QEMU_CPU}, SGLANG_RVV_WARMUP=${SGLANG_RVV_WARMUP}): the first start takes minutes"
  fi
  compose up -d
  id=$(container_id)
  [[ -n ${id} ]] || die "podman-compose started no ${SERVICE} container"
  wait_healthy "${id}" "${timeout}"
  cat <<MSG
serving ${model} from ${SGLANG_RVV_IMAGE} on ${SGLANG_RVV_BIND:-127.0.0.1}:${port}
  curl http://127.0.0.1:${port}/v1/completions -H 'Content-Type: application/json' \\
    -d '{"prompt": "Hello", "max_tokens": 16, "temperature": 0}'
MSG
}

down() { compose down; }

main() {
  need_cmd podman "${COMPOSE_CMD[0]}"
  case "${1:-}" in
    up) shift; up "$@" ;;
    down) down ;;
    *) die "usage: compose.sh up [ARCH] | down" ;;
  esac
}

main "$@"
