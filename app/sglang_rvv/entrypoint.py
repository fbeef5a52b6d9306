"""The container entrypoint: check the inputs, pick thread and cache defaults, exec SGLang.

::

    python -m sglang_rvv.entrypoint [SGLANG OPTIONS...]   serve (options are appended to SGLang's)
    python -m sglang_rvv.entrypoint COMMAND [ARGS...]     run COMMAND instead (bash, python, ...)

Serving checks the model directory, the port and the writable directories;
sets ``OMP_NUM_THREADS`` to the CPUs this container may use (affinity and
cgroup quota) unless it is set; checks the image's prewarmed Inductor cache
against the running stack (:mod:`sglang_rvv.inductor_cache`) and copies it
into the writable cache when it matches; then replaces itself with
``python -m sglang.launch_server ... --enable-metrics --enable-cpu-rvv-inductor``
(``/metrics`` carries the policy's route counters). Every refusal is one line on
stderr and exit status 64.

Environment (defaults in brackets): ``SGLANG_RVV_MODEL_DIR`` [/models/model],
``SGLANG_RVV_MODEL_NAME`` [set by the model image: the name clients ask for; unset: the path],
``SGLANG_RVV_HOST`` [0.0.0.0], ``SGLANG_RVV_PORT`` [30000],
``SGLANG_RVV_MAX_TOTAL_TOKENS`` [4096], ``SGLANG_RVV_WARM_CACHE`` [the image's
prewarmed cache directory], ``SGLANG_RVV_WARMUP`` [1: compile every shape key
and measure the route table at load (with a warm cache this only loads artifacts);
0: compile at first use, every bucket packed], ``SGLANG_RVV_POLICY`` [on; off serves
without --enable-cpu-rvv-inductor, the baseline for an A/B run],
``SGLANG_RVV_SERVER_WARMUP`` [1: SGLang's own 8-token warm-up request before it reports ready;
0: --skip-server-warmup, the first request pays instead (compose.sh sets 0 for an arch emulated
by qemu-user, where those 8 tokens took minutes)], ``SGLANG_RVV_HEALTH_TIMEOUT`` [5: the
container healthcheck's limit in seconds; SGLang's own wait inside /health,
``SGLANG_HEALTH_CHECK_TIMEOUT`` (20 s), is raised to match a longer one],
``SGLANG_RVV_WATCHDOG_TIMEOUT`` [empty: SGLang's 300 s; seconds one forward step may take before
SGLang kills the server: --watchdog-timeout (compose.sh gives an emulated arch 1800 s, where a
chat prompt's prefill took longer than 300 s)],
``SGLANG_RVV_WEIGHT_DTYPE`` [bf16; int8 or int4 quantize the packed weights at load:
--cpu-rvv-weight-dtype], ``SGLANG_RVV_GROUP_SIZE`` [the layout's default:
--cpu-rvv-group-size], ``SGLANG_RVV_LM_HEAD_DTYPE`` [the policy's rule:
--cpu-rvv-lm-head-dtype] (empty, as compose passes an unset variable, means the default),
``TORCHINDUCTOR_CACHE_DIR`` (writable; set by the image), ``OMP_NUM_THREADS``.
"""

from __future__ import annotations

import importlib.util
import json
import os
import sys
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path

from .host import usable_cpus

EXIT_USAGE = 64
IMAGE_LOCK = Path("/usr/share/sglang-rvv/lock.json")
WARM_CACHE = "/usr/share/sglang-rvv/inductor-warm"
PROG = "sglang-rvv entrypoint"
# The environment knobs of the packed layout and the RvvPolicyConfig field each sets.
LAYOUT_ENV = {"SGLANG_RVV_WEIGHT_DTYPE": "weight_dtype", "SGLANG_RVV_GROUP_SIZE": "group_size",
              "SGLANG_RVV_LM_HEAD_DTYPE": "lm_head_dtype"}


class Refusal(Exception):
    """One line that says what is wrong and what to do."""


@dataclass
class Plan:
    command: list[str]
    env: dict[str, str]
    notes: list[str] = field(default_factory=list)  # startup lines, in order


def validate_model_dir(model_dir: Path) -> str:
    """The model's architecture name; raises Refusal naming what is missing."""
    if not model_dir.is_dir():
        raise Refusal(f"model directory {model_dir} does not exist: mount a checkpoint there "
                      f"(-v ./my-model:{model_dir}:ro) or set SGLANG_RVV_MODEL_DIR")
    config_path = model_dir / "config.json"
    try:
        config = json.loads(config_path.read_text())
    except OSError as error:
        raise Refusal(f"{config_path} is missing or unreadable by uid {os.getuid()} ({error.strerror})") from None
    except ValueError as error:
        raise Refusal(f"{config_path} is not valid JSON ({error}): the checkpoint is damaged") from None
    architectures = config.get("architectures") if isinstance(config, dict) else None
    if not architectures:
        raise Refusal(f"{config_path} names no 'architectures': not a transformers checkpoint config")
    if not any(model_dir.glob("*.safetensors")):
        raise Refusal(f"{model_dir} has no *.safetensors weights")
    if not any((model_dir / name).is_file() for name in ("tokenizer.json", "tokenizer_config.json")):
        raise Refusal(f"{model_dir} has no tokenizer (tokenizer.json or tokenizer_config.json)")
    return architectures[0]


def _port(text: str) -> int:
    if not text.isdigit() or not 1 <= int(text) <= 65535:
        raise Refusal(f"SGLANG_RVV_PORT={text!r} is not a TCP port (1-65535)")
    return int(text)


def _omp_threads(text: str) -> str:
    """OMP_NUM_THREADS as given, or the usable CPUs when unset or empty (compose passes '')."""
    if not text:
        return str(usable_cpus())
    if not text.isdigit() or int(text) < 1:
        raise Refusal(f"OMP_NUM_THREADS={text!r} must be a positive thread count, or unset for every usable CPU")
    return text


def _max_total_tokens(text: str) -> int:
    if not text.isdigit() or int(text) < 1:
        raise Refusal(f"SGLANG_RVV_MAX_TOTAL_TOKENS={text!r} must be a positive number of tokens")
    return int(text)


def _writable_dir(path: Path, hint: str) -> None:
    try:
        path.mkdir(parents=True, exist_ok=True)
    except OSError as error:
        raise Refusal(f"cannot create {path} ({error.strerror}): {hint}") from None
    if not os.access(path, os.W_OK):
        raise Refusal(f"{path} is not writable by uid {os.getuid()}: {hint}")


def stack_settings(lock_path: Path | None = None) -> tuple[dict[str, str], list[str]]:
    """The environment and SGLang arguments this image's stack needs (the lock's
    ``sglang_env``/``sglang_args`` for the arch; none outside an image)."""
    try:
        pins = json.loads((lock_path or IMAGE_LOCK).read_text())
    except (OSError, ValueError):
        return {}, []
    return dict(pins.get("sglang_env", {})), list(pins.get("sglang_args", []))


def policy_config(env: Mapping[str, str]):
    """The RvvPolicyConfig of the layout variables; raises Refusal naming the variable."""
    from .config import RvvPolicyConfig
    from .layout import WEIGHT_DTYPES

    values = {}
    for variable, field_name in LAYOUT_ENV.items():
        text = env.get(variable, "")
        if field_name == "group_size":
            if text and not text.isdigit():
                raise Refusal(f"{variable}={text!r} must be a whole number (0 = one scale per output channel), "
                              "or unset for the layout's default")
            values[field_name] = int(text) if text else None
        elif text and text not in WEIGHT_DTYPES:
            raise Refusal(f"{variable}={text!r} must be one of {', '.join(WEIGHT_DTYPES)}")
        else:
            values[field_name] = text or None
    try:
        return RvvPolicyConfig(**{**values, "weight_dtype": values["weight_dtype"] or "bf16"})
    except ValueError as error:  # a combination: a group size the dtype does not offer
        raise Refusal(f"SGLANG_RVV_GROUP_SIZE with SGLANG_RVV_WEIGHT_DTYPE: {error}") from None


def _policy_args(policy: str, warmup: str, config) -> list[str]:
    if policy not in ("on", "off"):
        raise Refusal(f"SGLANG_RVV_POLICY={policy!r} must be on (the default) or off (serve without the flag)")
    if warmup not in ("1", "0"):
        raise Refusal(f"SGLANG_RVV_WARMUP={warmup!r} must be 1 (warm up at load, the default) or 0")
    if policy == "off":
        if config != type(config)():
            raise Refusal("SGLANG_RVV_WEIGHT_DTYPE, _GROUP_SIZE and _LM_HEAD_DTYPE choose the policy's packed layout: "
                          "unset them with SGLANG_RVV_POLICY=off")
        return []
    from .srt.flags import layout_flags

    return ["--enable-cpu-rvv-inductor", *layout_flags(config)] + ([] if warmup == "1" else ["--no-cpu-rvv-warmup"])


def _server_args(warmup: str, watchdog: str) -> list[str]:
    if warmup not in ("1", "0"):
        raise Refusal(f"SGLANG_RVV_SERVER_WARMUP={warmup!r} must be 1 (SGLang's warm-up request, the default) or 0")
    args = [] if warmup == "1" else ["--skip-server-warmup"]
    if watchdog:
        if not watchdog.isdigit() or int(watchdog) <= 0:
            raise Refusal(f"SGLANG_RVV_WATCHDOG_TIMEOUT={watchdog!r} must be a positive whole number of seconds "
                          "(or empty: SGLang's own 300 s)")
        args += ["--watchdog-timeout", watchdog]
    return args


def _health_timeout(text: str) -> float:
    try:
        seconds = float(text)
    except ValueError:
        seconds = 0.0
    if seconds <= 0:
        raise Refusal(f"SGLANG_RVV_HEALTH_TIMEOUT={text!r} must be a positive number of seconds")
    return seconds


def plan(argv: Sequence[str], environ: Mapping[str, str]) -> Plan:
    """What to exec, with which environment; raises Refusal. Seeds the Inductor cache as a side effect."""
    env = dict(environ)
    if argv and not argv[0].startswith("-"):
        return Plan(list(argv), env)
    if importlib.util.find_spec("sglang") is None:
        raise Refusal("SGLang is not installed in this environment; `python -m sglang_rvv.smoke MODEL_DIR` "
                      "checks the policy without it")
    model_dir = Path(env.get("SGLANG_RVV_MODEL_DIR", "/models/model"))
    architecture = validate_model_dir(model_dir)
    port = _port(env.get("SGLANG_RVV_PORT", "30000"))
    max_total_tokens = _max_total_tokens(env.get("SGLANG_RVV_MAX_TOTAL_TOKENS", "4096"))
    env["OMP_NUM_THREADS"] = _omp_threads(env.get("OMP_NUM_THREADS", ""))
    home = Path(env.get("HOME", "/tmp/home"))
    _writable_dir(home, "mount a tmpfs on /tmp (the root filesystem may be read-only)")
    cache_dir = Path(env.get("TORCHINDUCTOR_CACHE_DIR") or home / ".cache" / "torchinductor")
    env["TORCHINDUCTOR_CACHE_DIR"] = str(cache_dir)
    _writable_dir(cache_dir, f"mount a volume writable by uid {os.getuid()} on {cache_dir.parent}")

    from . import inductor_cache
    from .launch.args import cpu_server_args

    stack_env, stack_args = stack_settings()
    for name, value in stack_env.items():
        env.setdefault(name, value)
    notes = [f"stack settings: {' '.join(f'{k}={env[k]}' for k in stack_env)} {' '.join(stack_args)}"
             ] if stack_env or stack_args else []
    config = policy_config(env)
    policy_args = _policy_args(env.get("SGLANG_RVV_POLICY", "on"), env.get("SGLANG_RVV_WARMUP", "1"), config)
    server_args = _server_args(env.get("SGLANG_RVV_SERVER_WARMUP", "1"), env.get("SGLANG_RVV_WATCHDOG_TIMEOUT", ""))
    # SGLang's /health generates one token and gives up after SGLANG_HEALTH_CHECK_TIMEOUT (20 s):
    # a healthcheck allowed longer (an emulated arch's 60 s, where a token can take 20 s and
    # more) would otherwise see 503 from a server that is only slow. A second less, so SGLang
    # answers before the check's own limit.
    health = _health_timeout(env.get("SGLANG_RVV_HEALTH_TIMEOUT", "5"))
    if health - 1 > 20:
        env.setdefault("SGLANG_HEALTH_CHECK_TIMEOUT", str(int(health - 1)))
    warm_dir = Path(env.get("SGLANG_RVV_WARM_CACHE", WARM_CACHE))
    state = inductor_cache.check(warm_dir, model_dir, inductor_cache.layout_of(config))
    if state.warm:
        copied = inductor_cache.seed(warm_dir, cache_dir)
        notes.append(f"Inductor cache: {state}; {copied} files copied into {cache_dir}")
    elif warm_dir.exists():
        notes.append(f"warning: Inductor cache: {state}; starting without it")
    else:
        notes.append(f"Inductor cache: {state}")
    env[inductor_cache.STATE_ENV] = "artifact-warm" if state.warm else "artifact-cold"
    # The image names its model (the lock's key or the checkpoint directory's name); a caller's
    # --served-model-name wins. Without either, SGLang would answer to the path /models/model.
    name = env.get("SGLANG_RVV_MODEL_NAME", "")
    served = ["--served-model-name", name] if name and "--served-model-name" not in argv else []
    notes.append(f"serving {model_dir} ({architecture}){f' as {name}' if served else ''} on "
                 f"{env.get('SGLANG_RVV_HOST', '0.0.0.0')}:{port} with OMP_NUM_THREADS={env['OMP_NUM_THREADS']}")
    command = [
        sys.executable, "-m", "sglang.launch_server", "--model-path", str(model_dir), *served,
        "--host", env.get("SGLANG_RVV_HOST", "0.0.0.0"), "--port", str(port),
        *cpu_server_args(max_total_tokens), *stack_args, "--enable-metrics", *policy_args, *server_args, *argv,
    ]
    return Plan(command, env, notes)


def main(argv: Sequence[str] | None = None) -> int:
    argv = list(sys.argv[1:] if argv is None else argv)
    try:
        result = plan(argv, os.environ)
    except Refusal as refusal:
        print(f"{PROG}: error: {refusal}", file=sys.stderr)
        return EXIT_USAGE
    for note in result.notes:
        print(f"{PROG}: {note}", file=sys.stderr, flush=True)
    try:
        os.execvpe(result.command[0], result.command, result.env)
    except OSError as error:
        print(f"{PROG}: error: cannot run {result.command[0]!r}: {error.strerror}", file=sys.stderr)
        return 127


if __name__ == "__main__":
    sys.exit(main())
