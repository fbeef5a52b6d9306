"""Benchmark suite: one-batch, serving, kernel, HF generate and fleet into one run directory.

One run directory per model (``results/<host>/<UTC timestamp>/`` by default; see
:mod:`sglang_rvv.bench.results` for its layout), then ``sglang-rvv report DIR``:

* one-batch: ``sglang.benchmark.one_batch`` (batch 1, input 64, output 8) per mode,
  once artifact-cold (a fresh empty Inductor cache), then ``--runs`` times
  artifact-warm, each a fresh process sharing the now-filled cache;
* serving: per mode a server on a fresh empty cache (artifact-cold) and then one on
  the filled cache (artifact-warm), each timed from process start to the first
  token of its first request; the warm one then serves concurrency 1 and 2
  (``--requests`` measured requests each, after one warm-up request), streamed,
  with the policy's Prometheus call counters scraped around each level. Flag on,
  both servers warm up at load (``--cpu-rvv-warmup``), as the warm image does: the
  cold one compiles every shape key, the warm one loads the keys its cached route
  table keeps packed (the others run F.linear), so no measured request compiles;
* kernel: the Linear microbenchmark (``python -m sglang_rvv.bench linear``): GB/s of
  weights streamed per cell, at 4 threads pinned to the first 4 CPUs (one K1 cluster) and at
  8, on a machine with 8 or more usable CPUs (see :data:`KERNEL_THREADS` and
  :mod:`.threads`), else at the suite's one thread count; it records
  the kernel provider, the native kernels' ISA and VLEN, and /proc/cpuinfo's ``isa``;
* layouts: the Linear microbenchmark per weight layout (``python -m sglang_rvv.bench layouts``):
  bf16, int8 and int4 packed side by side, GB/s of the bytes each really streams (scales
  included), their ratios to bf16 packed and to F.linear, M=1 against a same-rounds read; a
  layout this build cannot pack is recorded as not available, with the reason; at the kernel
  step's thread counts, pinned the same way;
* hf-generate: Hugging Face ``generate`` (input 64, 8 new tokens, greedy) row-major, then
  with the policy installed and warmed up, bf16 and then each quantized layout (not with
  --quick), on one model in one process (:mod:`sglang_rvv.bench.hf_generate`): prefill and
  decode tok/s, median over 3 repetitions, whether row-major and bf16 packed generate the same
  ids, and each quantized layout's decode ratio to bf16 packed;
* fleet: flag on, one server on every usable CPU, then two on halves of them behind SGLang's
  gateway (smg), at concurrency 1, 2, 4 and 8 (:mod:`sglang_rvv.bench.fleet`); left out, and
  named in meta.json's ``left_out``, where smg is not installed.

Progress goes to stderr; each run directory's path is printed on stdout.
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import tempfile
from pathlib import Path

from ..host import affinity, usable_cpus
from ..inductor_cache import STATE_ENV
from ..launch.process import SGLangServer
from ..layout import WEIGHT_DTYPES
from ..tiny import REAL_SHAPES
from . import client, fleet, hf_generate, one_batch, results, serving
from .meta import provenance
from .progress import Progress
from .report.stats import fmt
from .results import COLD, WARM, log_path, m1_gbs, policy_report_path, thread_counts, write_result

STEPS = ("one-batch", "serving", "kernel", "layouts", "hf-generate", "fleet")
CONCURRENCY = (1, 2)
FULL = {"runs": 3, "requests": 4, "repetitions": hf_generate.REPETITIONS, "weight_dtypes": WEIGHT_DTYPES}
QUICK = {"runs": 1, "requests": 2, "repetitions": 1, "weight_dtypes": ("bf16",)}
# --quick: one cheap projection at decode (M=1), for tests.
KERNEL_QUICK = ["--projections", "o_proj", "--rows", "1", "--min-time", "0.05"]
LAYOUTS_QUICK = KERNEL_QUICK
# The kernel step's thread counts on a machine with at least max(KERNEL_THREADS) usable CPUs: on
# the K1 (8 cores, two clusters of 4 sharing one memory controller) one cluster, then both; some
# K1 kernels decode slower at 8 than at 4. A smaller machine (CI's 2 cores, qemu on them) keeps
# the one thread count of every other step, as fast as before.
KERNEL_THREADS = (4, 8)
# A flag-on cold start compiles every shape key; minutes for a 1B model on 2 cores.
STARTUP_TIMEOUT = 3600.0


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--out", type=Path, help="run directory (default: results/<host>/<UTC timestamp>; "
                                                 "with several --shape, one subdirectory per shape)")
    parser.add_argument("--shape", action="append", choices=sorted(REAL_SHAPES),
                        help="generated model with this real model's shapes (repeatable; default llama-3.2-1b)")
    parser.add_argument("--model", type=Path, help="checkpoint directory instead of a generated --shape model")
    parser.add_argument("--models-dir", type=Path, default=Path(".cache/models"), help="where --shape models live")
    parser.add_argument("--quick", action="store_true",
                        help=f"shrink for tests: {QUICK['runs']} warm run, {QUICK['requests']} requests per level, "
                             f"one kernel shape, {QUICK['repetitions']} generate repetition")
    parser.add_argument("--runs", type=int, help=f"artifact-warm one-batch processes per mode (default {FULL['runs']})")
    parser.add_argument("--requests", type=int,
                        help=f"measured requests per concurrency level (default {FULL['requests']})")
    parser.add_argument("--skip", action="append", choices=STEPS, default=[], help="leave a step out (repeatable)")
    parser.add_argument("--seed", type=int, default=0, help="of the prompts' random token ids")
    parser.add_argument("--kernel-threads", type=thread_counts,
                        help="comma-separated thread counts of the kernel and layouts steps, each pinned to as "
                             "many CPUs (default: "
                             f"{','.join(map(str, KERNEL_THREADS))} with at least {max(KERNEL_THREADS)} usable CPUs, "
                             "else the suite's OMP_NUM_THREADS)")


def _relative(path: Path, run_dir: Path) -> str | None:
    return str(path.relative_to(run_dir)) if path.is_file() else None


def _cache_env(cache_dir: str, state: str) -> dict[str, str]:
    # STATE_ENV is what the container entrypoint sets; the plugin copies it into the policy report.
    return {"TORCHINDUCTOR_CACHE_DIR": cache_dir, STATE_ENV: state}


def run_one_batch(model: Path, run_dir: Path, prov: dict, runs: int, progress: Progress) -> None:
    for mode in one_batch.MODES:
        with tempfile.TemporaryDirectory(prefix=f"sglang-rvv-bench-inductor-{mode}-") as cache:
            for state, index in [(COLD, 0), *[(WARM, i) for i in range(1, runs + 1)]]:
                name = f"{mode}-cold" if state == COLD else f"{mode}-warm{index}"
                report = policy_report_path(run_dir, f"one_batch-{name}")
                with progress.step(f"one-batch {name}"):
                    result = one_batch.run_once(model, mode, env=_cache_env(cache, state), report_path=report,
                                                log_path=log_path(run_dir, f"one_batch-{name}"))
                progress.say(f"  prefill {result['prefill_throughput']:.1f} tok/s, decode "
                             f"{result['median_decode_throughput']:.1f} tok/s, "
                             f"peak RSS {result['peak_rss_mib']:.0f} MiB "
                             f"({result['after_load_peak_mib']:.0f} MiB after load)")
                write_result(run_dir, "one_batch", name, prov, state, mode=mode, run=index, batch_size=1,
                             input_len=client.INPUT_LEN, output_len=client.OUTPUT_LEN, result=result,
                             policy_report=_relative(report, run_dir))


def run_serving(model: Path, run_dir: Path, prov: dict, requests: int, seed: int, progress: Progress) -> None:
    per_level = 1 + requests  # one unmeasured warm-up request, then the measured ones
    prompts = serving.prompt_ids(model, 1 + per_level * len(CONCURRENCY), seed)
    for mode, flags in one_batch.MODES.items():
        with tempfile.TemporaryDirectory(prefix=f"sglang-rvv-bench-inductor-serving-{mode}-") as cache:
            for state in (COLD, WARM):
                name = f"{mode}-{state.removeprefix('artifact-')}"
                report = policy_report_path(run_dir, f"serving-{name}")
                extra = [*flags, "--enable-metrics"]
                if flags:
                    extra += ["--cpu-rvv-warmup", "--cpu-rvv-report-path", str(report)]
                server = SGLangServer(model, extra_args=extra, env=_cache_env(cache, state),
                                      log_path=log_path(run_dir, f"server-{name}"), startup_timeout=STARTUP_TIMEOUT)
                try:
                    with progress.step(f"serving {name}: process start to first token"):
                        start = serving.start_to_first_token(server, prompts[0])
                    progress.say(f"  ready {start['ready_s']:.1f} s, first token {start['ttft_after_start_s']:.1f} s")
                    write_result(run_dir, "start", name, prov, state, mode=mode, warmup_at_load=bool(flags),
                                 policy_report=_relative(report, run_dir), memory=serving.tree_memory(server.pid),
                                 **start)
                    if state == WARM:
                        for level, concurrency in enumerate(CONCURRENCY):
                            chunk = prompts[1 + level * per_level:1 + (level + 1) * per_level]
                            with progress.step(f"serving {name}: concurrency {concurrency}, {requests} requests"):
                                client.generate(server.base_url, chunk[0])
                                before = serving.linear_calls(server)
                                timed, wall = client.run_level(server.base_url, chunk[1:], concurrency)
                                calls = serving.delta(before, serving.linear_calls(server))
                            write_result(run_dir, "serving", f"{mode}-c{concurrency}", prov, state, mode=mode,
                                         concurrency=concurrency, wall_s=wall, requests=timed,
                                         warmup_prompt_ids=chunk[0], linear_calls=calls,
                                         policy_report=_relative(report, run_dir),
                                         memory=serving.tree_memory(server.pid))
                finally:
                    server.stop()


def run_fleet(model: Path, run_dir: Path, prov: dict, requests: int, seed: int, progress: Progress) -> str | None:
    """1 replica, then 2 behind the gateway, flag on, at each of fleet.CONCURRENCY; why it was
    left out, or None."""
    if fleet.smg_command() is None:
        reason = "smg (SGLang's gateway) is not installed here: it comes with the development venv, on the controller"
        progress.say(f"fleet: left out: {reason}")
        return reason
    with tempfile.TemporaryDirectory(prefix="sglang-rvv-bench-inductor-fleet-") as cache:
        for name, shares in fleet.layouts(affinity()).items():
            split = " | ".join(",".join(map(str, share)) for share in shares)
            servers = [SGLangServer(model, extra_args=[*one_batch.MODES["on"], "--cpu-rvv-warmup"],
                                    env={"TORCHINDUCTOR_CACHE_DIR": cache}, cpus=share,
                                    log_path=log_path(run_dir, f"fleet-{name}-{i}"), startup_timeout=STARTUP_TIMEOUT)
                       for i, share in enumerate(shares)]
            gateway = None if len(servers) == 1 else fleet.Gateway(
                [s.base_url for s in servers], log_path=log_path(run_dir, f"fleet-{name}-gateway"))
            try:
                with progress.step(f"fleet {name}: start (CPUs {split})"):
                    for server in servers:  # side by side, each on its own CPUs
                        server.launch()
                    for server in servers:
                        server.wait_ready()
                    if gateway:
                        gateway.start()
                # The same seed and tokenizer give every layout the same prompts.
                prompts = client.server_prompt_ids(servers[0].base_url, fleet.prompt_count(requests), seed + 1)
                fleet.measure(run_dir, prov, name, (gateway or servers[0]).base_url, prompts, requests, progress,
                              replicas=len(servers), cpus=shares, gateway=bool(gateway))
            finally:
                if gateway:
                    gateway.stop()
                for server in servers:
                    server.stop()
    return None


def _run_json_step(run_dir: Path, log_name: str, command: list[str], env: dict[str, str] | None = None) -> dict:
    """A step's own process (its torch and compiles stay out of the suite's), its output logged; its --json."""
    log = log_path(run_dir, log_name)
    with tempfile.TemporaryDirectory(prefix=f"sglang-rvv-bench-{log_name}-") as tmp:
        out = Path(tmp) / "result.json"
        log.parent.mkdir(parents=True, exist_ok=True)
        with open(log, "w") as output:
            code = subprocess.run([sys.executable, "-m", *command, "--json", str(out)], stdout=output,
                                  stderr=subprocess.STDOUT, env={**os.environ, **(env or {})}).returncode
        if code != 0 or not out.exists():
            tail = "".join(log.read_text().splitlines(keepends=True)[-30:])
            raise RuntimeError(f"{log_name} failed with exit code {code} (log {log}):\n{tail}")
        return json.loads(out.read_text())


def kernel_threads(requested: list[int] | None) -> list[int] | None:
    """The kernel step's thread counts: as requested, else KERNEL_THREADS on a machine that has them;
    ``None``: the step's torch default, the suite's OMP_NUM_THREADS."""
    return requested or (list(KERNEL_THREADS) if usable_cpus() >= max(KERNEL_THREADS) else None)


def run_kernel(run_dir: Path, prov: dict, quick: bool, threads: list[int] | None, progress: Progress) -> None:
    command = ["sglang_rvv.bench", "linear", *(KERNEL_QUICK if quick else []),
               *(["--threads", ",".join(map(str, threads))] if threads else [])]
    with progress.step("kernel: linear"):
        result = _run_json_step(run_dir, "kernel-linear", command)
    m1 = [(r["threads"], m1_gbs(r["results"])["compiled"]) for r in result["runs"]]
    progress.say(f"  provider {result['provider']}, native kernels {result['kernel_isa'] or 'not loaded'}; M=1 packed "
                 + ", ".join(f"{gbs:.2f} GB/s at {t} threads" for t, gbs in m1 if gbs is not None))
    # Compiles happen before timing, so the Inductor cache state does not apply.
    write_result(run_dir, "kernel", "linear", prov, None, command=command, **result)


def run_layouts(run_dir: Path, prov: dict, quick: bool, threads: list[int] | None, progress: Progress) -> None:
    command = ["sglang_rvv.bench", "layouts", *(LAYOUTS_QUICK if quick else []),
               *(["--threads", ",".join(map(str, threads))] if threads else [])]
    with progress.step("layouts: the Linear microbenchmark per weight layout"):
        result = _run_json_step(run_dir, "kernel-layouts", command)
    cells = [r for entry in result["runs"] for r in entry["results"]]
    missing = sorted({r["weight_dtype"] for r in cells if "not_available" in r})
    progress.say(f"  {len(cells)} cells at {', '.join(str(entry['threads']) for entry in result['runs'])} threads"
                 + (f"; not available: {', '.join(missing)}" if missing else ""))
    write_result(run_dir, "layouts", "linear", prov, None, command=command, **result)


def run_hf_generate(model: Path, run_dir: Path, prov: dict, repetitions: int, seed: int,
                    progress: Progress, weight_dtypes: tuple[str, ...] = ("bf16",)) -> None:
    report = policy_report_path(run_dir, "hf_generate")
    command = ["sglang_rvv.bench.hf_generate", str(model), "--repetitions", str(repetitions), "--seed", str(seed),
               "--report-path", str(report), "--weight-dtypes", ",".join(weight_dtypes)]
    # A fresh cache, as the other steps' flag-on processes start from: no earlier run's route table applies.
    with tempfile.TemporaryDirectory(prefix="sglang-rvv-bench-inductor-hf-") as cache, \
            progress.step(f"hf-generate: off then on ({', '.join(weight_dtypes)}), {repetitions} repetitions"):
        result = _run_json_step(run_dir, "hf_generate", command, _cache_env(cache, COLD))
    summary = hf_generate.summarize(result)
    progress.say(f"  decode {fmt(summary['off']['decode_tok_s'])} -> {fmt(summary['on']['decode_tok_s'])} tok/s "
                 f"({fmt(summary['ratio']['decode_tok_s'], 2)}x), outputs equal: {summary['outputs_equal']}"
                 + "".join(f"; {name} {fmt(v['decode_tok_s'])} tok/s ({fmt(v['vs_bf16'], 2)}x bf16)"
                           for name, v in summary["layouts"].items()))
    # Compiles happen before timing (an untimed generate per mode), so the cache state does not apply.
    write_result(run_dir, "hf_generate", "generate", prov, None, command=command,
                 policy_report=_relative(report, run_dir), **result)


def run_suite(model: Path, shape: str | None, run_dir: Path, args: argparse.Namespace, progress: Progress) -> None:
    runs = args.runs or (QUICK if args.quick else FULL)["runs"]
    requests = args.requests or (QUICK if args.quick else FULL)["requests"]
    repetitions = (QUICK if args.quick else FULL)["repetitions"]
    weight_dtypes = (QUICK if args.quick else FULL)["weight_dtypes"]
    threads = kernel_threads(args.kernel_threads)
    prov = provenance(model, shape)
    meta = {
        "suite": results.SUITE_COMMAND, "host": prov["host"],
        "settings": {"shape": shape, "quick": args.quick, "runs": runs, "requests": requests, "seed": args.seed,
                     "concurrency": list(CONCURRENCY), "input_len": client.INPUT_LEN,
                     "output_len": client.OUTPUT_LEN, "hf_repetitions": repetitions, "skip": args.skip,
                     "kernel_threads": threads},
        "provenance": prov,
    }
    with results.recording(run_dir, meta, progress):
        progress.say(f"run directory {run_dir} (model {model})")
        if "one-batch" not in args.skip:
            run_one_batch(model, run_dir, prov, runs, progress)
        if "serving" not in args.skip:
            run_serving(model, run_dir, prov, requests, args.seed, progress)
        if "kernel" not in args.skip:
            run_kernel(run_dir, prov, args.quick, threads, progress)
        if "layouts" not in args.skip:
            run_layouts(run_dir, prov, args.quick, threads, progress)
        if "hf-generate" not in args.skip:
            run_hf_generate(model, run_dir, prov, repetitions, args.seed, progress, weight_dtypes)
        if "fleet" not in args.skip:
            left_out = run_fleet(model, run_dir, prov, requests, args.seed, progress)
            if left_out:
                meta["left_out"] = {"fleet": left_out}


def run(args: argparse.Namespace) -> int:
    if args.model and args.shape:
        sys.exit("--model and --shape exclude each other: --model benchmarks that checkpoint, --shape a generated one")
    if args.model and not (args.model / "config.json").is_file():
        sys.exit(f"--model {args.model}: no config.json there; pass a checkpoint directory")
    # One thread count for every process, recorded in the provenance (the entrypoint's default too).
    os.environ.setdefault("OMP_NUM_THREADS", str(usable_cpus()))
    progress = Progress()
    shapes = [None] if args.model else (args.shape or ["llama-3.2-1b"])
    base = args.out or results.default_run_dir()
    for shape in shapes:
        run_dir = base / shape if len(shapes) > 1 else base
        model = args.model or one_batch.shaped_model(args.models_dir, shape)
        run_suite(model, shape, run_dir, args, progress)
        progress.say(f"done: {run_dir}; `sglang-rvv report {run_dir}` renders it")
        print(run_dir, flush=True)
    return 0
