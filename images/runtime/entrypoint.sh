#!/usr/bin/env bash
# sglang-rvv container entrypoint.
#
#   (no arguments, or only options)  serve $SGLANG_RVV_MODEL_DIR on 0.0.0.0:$SGLANG_RVV_PORT with
#                                    SGLang's CPU defaults and --enable-cpu-rvv-inductor; the
#                                    options are appended to SGLang's command line
#   COMMAND [ARGS...]                run COMMAND instead (e.g. bash, python)
#
# Environment: SGLANG_RVV_MODEL_DIR (/models/model), SGLANG_RVV_PORT (30000),
# SGLANG_RVV_HOST (0.0.0.0), SGLANG_RVV_MAX_TOTAL_TOKENS (4096), OMP_NUM_THREADS
# (default: the CPUs this container may use, cgroup quota included).
set -euo pipefail

MODEL_DIR="${SGLANG_RVV_MODEL_DIR:-/models/model}"
PORT="${SGLANG_RVV_PORT:-30000}"
HOST="${SGLANG_RVV_HOST:-0.0.0.0}"
MAX_TOTAL_TOKENS="${SGLANG_RVV_MAX_TOTAL_TOKENS:-4096}"

die() { printf 'sglang-rvv entrypoint: error: %s\n' "$*" >&2; exit 64; }
log() { printf 'sglang-rvv entrypoint: %s\n' "$*" >&2; }

# CPUs in our affinity mask, capped by the cgroup CPU quota (v2 cpu.max, v1 cfs quota).
cgroup_cpu_quota() {
  local quota period
  if [[ -r /sys/fs/cgroup/cpu.max ]]; then
    read -r quota period </sys/fs/cgroup/cpu.max
  elif [[ -r /sys/fs/cgroup/cpu/cpu.cfs_quota_us ]]; then
    quota=$(</sys/fs/cgroup/cpu/cpu.cfs_quota_us)
    period=$(</sys/fs/cgroup/cpu/cpu.cfs_period_us)
  fi
  [[ ${quota:-max} =~ ^[0-9]+$ && ${period:-0} -gt 0 ]] || return 1
  echo "$(((quota + period - 1) / period))"
}

usable_cpus() {
  local cpus limit
  cpus=$(nproc)
  if limit=$(cgroup_cpu_quota) && ((limit < cpus)); then
    cpus=${limit}
  fi
  echo "$((cpus > 0 ? cpus : 1))"
}

validate_model_dir() {
  [[ -d ${MODEL_DIR} ]] \
    || die "model directory ${MODEL_DIR} does not exist: mount a checkpoint there (e.g. -v ./tiny-llama:${MODEL_DIR}:ro) or set SGLANG_RVV_MODEL_DIR"
  [[ -r ${MODEL_DIR}/config.json ]] || die "${MODEL_DIR}/config.json is missing or unreadable by uid $(id -u)"
  compgen -G "${MODEL_DIR}/*.safetensors" >/dev/null || die "${MODEL_DIR} has no *.safetensors weights"
  [[ -r ${MODEL_DIR}/tokenizer.json || -r ${MODEL_DIR}/tokenizer_config.json ]] \
    || die "${MODEL_DIR} has no tokenizer (tokenizer.json / tokenizer_config.json)"
}

validate_port() {
  if ! [[ ${PORT} =~ ^[0-9]+$ ]] || ((PORT < 1 || PORT > 65535)); then
    die "SGLANG_RVV_PORT='${PORT}' is not a TCP port"
  fi
}

prepare_writable_dirs() {
  mkdir -p "${HOME}" "${XDG_CACHE_HOME:-${HOME}/.cache}" \
    || die "cannot create ${HOME}: mount a tmpfs on /tmp (read-only root fs)"
  if ! mkdir -p "${TORCHINDUCTOR_CACHE_DIR}" 2>/dev/null || [[ ! -w ${TORCHINDUCTOR_CACHE_DIR} ]]; then
    die "Inductor cache ${TORCHINDUCTOR_CACHE_DIR} is not writable by uid $(id -u): mount a volume owned by it on $(dirname "${TORCHINDUCTOR_CACHE_DIR}")"
  fi
}

# SGLang's CPU arguments, from the app itself (sglang_rvv.server.cpu_server_args).
cpu_server_args() {
  python -c 'import sys; from sglang_rvv.server import cpu_server_args; print("\n".join(cpu_server_args(int(sys.argv[1]))))' \
    "${MAX_TOTAL_TOKENS}"
}

serve() {
  local args
  validate_model_dir
  validate_port
  prepare_writable_dirs
  export OMP_NUM_THREADS="${OMP_NUM_THREADS:-$(usable_cpus)}"
  mapfile -t args < <(cpu_server_args)
  ((${#args[@]})) || die "could not read cpu_server_args from sglang_rvv.server"
  log "serving ${MODEL_DIR} on ${HOST}:${PORT} (OMP_NUM_THREADS=${OMP_NUM_THREADS}, Inductor cache ${TORCHINDUCTOR_CACHE_DIR})"
  exec python -m sglang.launch_server --model-path "${MODEL_DIR}" --host "${HOST}" --port "${PORT}" \
    "${args[@]}" --enable-cpu-rvv-inductor "$@"
}

main() {
  if (($# == 0)) || [[ $1 == -* ]]; then
    serve "$@"
  fi
  exec "$@"
}

main "$@"
