#!/usr/bin/env bash
# Bring the appliance up (and wait until it is healthy) or down: one compose/compose.yaml
# service, or with REPLICAS=N > 1 a fleet of N of them behind the gateway.
#
#   images/scripts/compose.sh up [ARCH]     start, wait for the healthchecks, print a curl line
#   images/scripts/compose.sh gateway URL...   the gateway alone, in front of these appliances
#                                           (boards elsewhere: Ansible's gateway.yml); kept when
#                                           it already runs with this image and these URLs
#   images/scripts/compose.sh down          stop and remove everything up started (the Inductor
#                                           cache volumes stay)
#
# Environment: PODMAN_COMPOSE (podman-compose; "podman compose" works too), SGLANG_RVV_PORT (30000), SGLANG_RVV_MODEL
# (models.default of images/lock.toml) or SGLANG_RVV_CHECKPOINT_DIR (a checkpoint directory
# built with make image MODEL_DIR=...), SGLANG_RVV_CACHE (cold: the model image; warm: the
# image with the prewarmed Inductor cache), SGLANG_RVV_IMAGE (overrides both),
# SGLANG_RVV_UP_TIMEOUT (600 s; 1800 s for an emulated arch), SGLANG_RVV_QEMU_CPU (an emulated
# arch's lock qemu_cpu), SGLANG_RVV_REPLICAS (1), SGLANG_RVV_PROJECT (sglang-rvv); the rest of the compose files' variables pass through
# (SGLANG_RVV_WEIGHT_DTYPE, SGLANG_RVV_GROUP_SIZE, SGLANG_RVV_LM_HEAD_DTYPE: the packed weight layout).
# A fleet (SGLANG_RVV_REPLICAS=N): replica I is project sglang-rvv-replica-I on 127.0.0.1:PORT+I
# with its own share of this host's CPUs (compose/replica.yaml), and the gateway
# (compose/gateway.yaml, image build-gateway.sh) listens on PORT in front of them all.
# The health status is driven by `podman healthcheck run` (the compose healthcheck, run
# inside the container): podman 4.3 schedules healthchecks with systemd timers, and
# without systemd nothing would ever run them.
set -euo pipefail
# shellcheck source=lib.sh source-path=SCRIPTDIR
source "$(dirname "$0")/lib.sh"

COMPOSE_DIR="${REPO_DIR}/compose"
# SGLANG_RVV_PROJECT names another compose project than the app's name (the lock's app.name,
# sglang-rvv): make test's second lane serves from its own, so that one lane's `make down`
# leaves the other's appliance running.
PROJECT="${SGLANG_RVV_PROJECT:-$(lock app.name)}"
REPLICA_PROJECT="${PROJECT}-replica-"
GATEWAY_PROJECT="${PROJECT}-gateway"

# compose PROJECT FILE... -- ARGS...: podman-compose on these compose files, minus podman's
# "unable to get systemd connection" healthcheck-timer noise. Filtered through a file, not a
# pipe: conmon outlives the command and would hold a pipe open (and whoever reads it) forever.
read -ra COMPOSE_CMD <<<"${PODMAN_COMPOSE:-podman-compose}"
compose() {
  local project="$1" files=() err rc=0
  shift
  while [[ $1 != -- ]]; do files+=(-f "${COMPOSE_DIR}/$1"); shift; done
  shift
  err=$(mktemp)
  "${COMPOSE_CMD[@]}" -p "${project}" "${files[@]}" "$@" 2>"${err}" || rc=$?
  grep -v 'unable to get systemd connection' "${err}" >&2 || true
  rm -f "${err}"
  return "${rc}"
}

# container_id PROJECT: the project's one container.
container_id() {
  podman ps -a --filter "label=io.podman.compose.project=$1" --format '{{.ID}}' | head -n 1
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

# cpu_shares N: N CPU lists (cpuset syntax), an even split of the CPUs this process may use;
# with more replicas than CPUs, replicas share CPUs round robin.
cpu_shares() {
  python3 - "$1" <<'PY'
import os, sys
n, cpus = int(sys.argv[1]), sorted(os.sched_getaffinity(0))
for i in range(n):
    share = cpus[i * len(cpus) // n:(i + 1) * len(cpus) // n] or [cpus[i % len(cpus)]]
    print(",".join(map(str, share)))
PY
}

# start_appliances ARCH PORT REPLICAS: compose up the appliance (1) or the fleet's replicas,
# then wait for every one; prints the URLs of a fleet's replicas.
start_appliances() {
  local arch="$1" port="$2" replicas="$3" timeout i ids=() shares=()
  timeout="${SGLANG_RVV_UP_TIMEOUT:-600}"
  if [[ ${arch} != "$(host_arch)" ]]; then
    need_emulation "${arch}"
    export SGLANG_RVV_QEMU_CPU="${SGLANG_RVV_QEMU_CPU:-$(lock "arch.${arch}.qemu_cpu")}"
    # Timings under qemu say nothing about the board: no load-time warm-up and route table.
    export SGLANG_RVV_WARMUP="${SGLANG_RVV_WARMUP:-0}"
    # /health generates one token: seconds under qemu, more on a busy host.
    export SGLANG_RVV_HEALTH_TIMEOUT="${SGLANG_RVV_HEALTH_TIMEOUT:-60}"
    # SGLang's own 8-token warm-up request: minutes under qemu, and the first request does the same.
    export SGLANG_RVV_SERVER_WARMUP="${SGLANG_RVV_SERVER_WARMUP:-0}"
    # SGLang kills a server whose forward step takes over 300 s: a chat prompt's prefill did under qemu.
    export SGLANG_RVV_WATCHDOG_TIMEOUT="${SGLANG_RVV_WATCHDOG_TIMEOUT:-1800}"
    timeout="${SGLANG_RVV_UP_TIMEOUT:-1800}"
    log "${arch} under qemu-user (QEMU_CPU=${SGLANG_RVV_QEMU_CPU}, SGLANG_RVV_WARMUP=${SGLANG_RVV_WARMUP}," \
      "SGLANG_RVV_SERVER_WARMUP=${SGLANG_RVV_SERVER_WARMUP}): the first start takes minutes"
  fi
  if ((replicas == 1)); then
    compose "${PROJECT}" compose.yaml -- up -d >&2
    ids=("$(container_id "${PROJECT}")")
  else
    mapfile -t shares < <(cpu_shares "${replicas}")
    for ((i = 1; i <= replicas; i++)); do
      log "replica ${i}: 127.0.0.1:$((port + i)), CPUs ${shares[i - 1]}, memory ${SGLANG_RVV_MEMORY:-8g}"
      SGLANG_RVV_BIND=127.0.0.1 SGLANG_RVV_PORT=$((port + i)) SGLANG_RVV_CPUSET="${shares[i - 1]}" \
        compose "${REPLICA_PROJECT}${i}" compose.yaml replica.yaml -- up -d >&2
      ids+=("$(container_id "${REPLICA_PROJECT}${i}")")
    done
  fi
  for i in "${ids[@]}"; do
    [[ -n ${i} ]] || die "podman-compose started no appliance container"
    wait_healthy "${i}" "${timeout}"
  done
  ((replicas == 1)) || for ((i = 1; i <= replicas; i++)); do echo "http://127.0.0.1:$((port + i))"; done
}

up() {
  local arch="${1:-$(host_arch)}" port model replicas workers
  port="${SGLANG_RVV_PORT:-30000}"
  replicas="${SGLANG_RVV_REPLICAS:-1}"
  [[ ${replicas} =~ ^[1-9][0-9]*$ ]] || die "SGLANG_RVV_REPLICAS='${replicas}' must be a whole number >= 1 (make up REPLICAS=N)"
  model=$(model_key "${SGLANG_RVV_MODEL:-}")
  case "${SGLANG_RVV_CACHE:-cold}" in
    cold) SGLANG_RVV_IMAGE="${SGLANG_RVV_IMAGE:-$(image_name model "${arch}" "${model}")}" ;;
    warm) SGLANG_RVV_IMAGE="${SGLANG_RVV_IMAGE:-$(image_name cache "${arch}" "${model}")}" ;;
    *) die "SGLANG_RVV_CACHE='${SGLANG_RVV_CACHE}' must be cold or warm" ;;
  esac
  export SGLANG_RVV_IMAGE
  image_exists "${SGLANG_RVV_IMAGE}" || die "image ${SGLANG_RVV_IMAGE} not found: build it first (make image)"
  if ((replicas > 1)); then  # before anything starts
    image_exists "${SGLANG_RVV_GATEWAY_IMAGE:-$(image_name gateway "$(host_arch)")}" \
      || die "gateway image not found: build it first (make image REPLICAS=${replicas})"
  fi
  # One layout at a time (the single appliance and a fleet's gateway both want PORT): a
  # fleet is started afresh; a running single appliance is left to compose.
  if ((replicas > 1)); then down; else down_fleet; fi
  workers=$(start_appliances "${arch}" "${port}" "${replicas}" | paste -sd' ' -)
  ((replicas == 1)) || start_gateway "${workers}"
  cat <<MSG
serving ${model} (${SGLANG_RVV_WEIGHT_DTYPE:-bf16} weights) from ${SGLANG_RVV_IMAGE} on ${SGLANG_RVV_BIND:-127.0.0.1}:${port}$( ((replicas == 1)) || echo " (gateway, ${replicas} replicas)")
  curl http://127.0.0.1:${port}/v1/completions -H 'Content-Type: application/json' \\
    -d '{"prompt": "Hello", "max_tokens": 16, "temperature": 0}'
MSG
}

# gateway_env "URL...": the environment compose/gateway.yaml gives the gateway, one line each.
gateway_env() {
  printf '%s\n' "SGLANG_RVV_GATEWAY_WORKERS=$1" "SGLANG_RVV_GATEWAY_HOST=${SGLANG_RVV_BIND:-127.0.0.1}" \
    "SGLANG_RVV_GATEWAY_PORT=${SGLANG_RVV_PORT:-30000}" "SGLANG_RVV_GATEWAY_POLICY=${SGLANG_RVV_GATEWAY_POLICY:-cache_aware}" \
    "SGLANG_RVV_GATEWAY_METRICS_PORT=${SGLANG_RVV_GATEWAY_METRICS_PORT:-29000}" "SGLANG_RVV_GATEWAY_ARGS=${SGLANG_RVV_GATEWAY_ARGS:-}"
}

# start_gateway "URL...": the gateway in front of these appliances, healthy when every one is.
# A gateway already running from this image with this configuration is kept.
start_gateway() {
  local workers="$1" id
  export SGLANG_RVV_GATEWAY_IMAGE="${SGLANG_RVV_GATEWAY_IMAGE:-$(image_name gateway "$(host_arch)")}"
  image_exists "${SGLANG_RVV_GATEWAY_IMAGE}" \
    || die "gateway image ${SGLANG_RVV_GATEWAY_IMAGE} not found: build it first (make image-gateway)"
  id=$(container_id "${GATEWAY_PROJECT}")
  if [[ -n ${id} && $(container_state "${id}") == running \
    && $(podman inspect --format '{{.Image}}' "${id}") == $(podman image inspect --format '{{.Id}}' "${SGLANG_RVV_GATEWAY_IMAGE}") \
    && -z $(comm -23 <(gateway_env "${workers}" | sort) \
      <(podman inspect --format '{{range .Config.Env}}{{println .}}{{end}}' "${id}" | sort)) ]]; then
    log "gateway: already running in front of ${workers}"
    return
  fi
  log "gateway: ${SGLANG_RVV_BIND:-127.0.0.1}:${SGLANG_RVV_PORT:-30000} -> ${workers} (policy ${SGLANG_RVV_GATEWAY_POLICY:-cache_aware})"
  [[ -z ${id} ]] || compose "${GATEWAY_PROJECT}" gateway.yaml -- down >&2
  SGLANG_RVV_GATEWAY_WORKERS="${workers}" compose "${GATEWAY_PROJECT}" gateway.yaml -- up -d >&2
  wait_healthy "$(container_id "${GATEWAY_PROJECT}")" 120
}

# down_fleet: the gateway and every replica there is.
down_fleet() {
  local project
  while read -r project; do
    case "${project}" in
      "${GATEWAY_PROJECT}") compose "${project}" gateway.yaml -- down >&2 ;;
      "${REPLICA_PROJECT}"*) compose "${project}" compose.yaml replica.yaml -- down >&2 ;;
    esac
  done < <(podman ps -a --format '{{index .Labels "io.podman.compose.project"}}' | sort -u)
}

down() {
  down_fleet
  compose "${PROJECT}" compose.yaml -- down >&2
}

main() {
  need_cmd podman "${COMPOSE_CMD[0]}"
  case "${1:-}" in
    up) shift; up "$@" ;;
    gateway)
      shift
      (($#)) || die "usage: compose.sh gateway URL... (the appliances' URLs)"
      start_gateway "$*"
      ;;
    down) down ;;
    *) die "usage: compose.sh up [ARCH] | gateway URL... | down" ;;
  esac
}

main "$@"
