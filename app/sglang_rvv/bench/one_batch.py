"""One-batch benchmark: ``sglang.benchmark.one_batch`` with the flag off and on, fresh processes.

Batch 1, input 64, output 8 by default, on a generated model with Llama-3.2-1B's
shapes (random weights, so the numbers mean something for that model size).
Prints prefill, decode and total tok/s, peak RSS and the on/off ratios.
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import tempfile
import time
from pathlib import Path

from ..checkpoint import write_tiny_checkpoint
from ..launch.args import CPU_ENV, cpu_server_args
from ..tiny import REAL_SHAPES
from .client import INPUT_LEN, OUTPUT_LEN

MODES = {"off": [], "on": ["--enable-cpu-rvv-inductor"]}
METRICS = (("prefill_throughput", "prefill tok/s"), ("median_decode_throughput", "decode tok/s"),
           ("overall_throughput", "total tok/s"))


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--model", type=Path, help="checkpoint dir (default: a generated --shape model)")
    parser.add_argument("--shape", choices=sorted(REAL_SHAPES), default="llama-3.2-1b")
    parser.add_argument("--models-dir", type=Path, default=Path(".cache/models"))
    parser.add_argument("--batch-size", type=int, default=1)
    parser.add_argument("--input-len", type=int, default=INPUT_LEN)
    parser.add_argument("--output-len", type=int, default=OUTPUT_LEN)
    parser.add_argument("--runs", type=int, default=1, help="fresh processes per mode")
    parser.add_argument("--json", type=Path, help="also write the results here")


def shaped_model(models_dir: Path, shape: str) -> Path:
    """The generated checkpoint for ``shape``, written once (seeded, so always the same)."""
    path = models_dir / f"{shape}-random"
    if not (path / "config.json").exists():
        spec = dict(REAL_SHAPES[shape])
        print(f"# generating {path} (random weights with {shape}'s shapes)...", file=sys.stderr, flush=True)
        write_tiny_checkpoint(path, spec.pop("arch"), seed=0, **spec)
    return path


def run_once(model: Path, mode: str, *, batch_size: int = 1, input_len: int = INPUT_LEN,
             output_len: int = OUTPUT_LEN, env: dict[str, str] | None = None, report_path: Path | None = None,
             log_path: Path | None = None) -> dict:
    """One fresh ``one_batch`` process; its results, wall time and peak RSS.

    ``peak_rss_mib`` is the whole process's; ``after_load_peak_mib`` the peak from the
    end of weight loading on, where packing happens (see ``run_one_batch``).

    ``env`` is added to the environment (e.g. a ``TORCHINDUCTOR_CACHE_DIR``);
    ``report_path`` receives the plugin's policy report (flag on only);
    ``log_path`` keeps the process's output.
    """
    extra = MODES[mode] + (["--cpu-rvv-report-path", str(report_path)] if report_path and MODES[mode] else [])
    with tempfile.TemporaryDirectory() as tmp:
        result_file, memory_file = Path(tmp) / "result.jsonl", Path(tmp) / "memory.json"
        command = [
            sys.executable, "-m", "sglang_rvv.bench.run_one_batch", "--memory-file", str(memory_file),
            "--model-path", str(model),
            *cpu_server_args(), "--batch-size", str(batch_size), "--input-len", str(input_len),
            "--output-len", str(output_len), "--result-filename", str(result_file), *extra,
        ]
        started = time.monotonic()
        process = subprocess.Popen(command, env={**os.environ, **CPU_ENV, **(env or {})}, stdout=subprocess.PIPE,
                                   stderr=subprocess.STDOUT, text=True)
        output = process.stdout.read()
        process.wait()
        if log_path:
            log_path.parent.mkdir(parents=True, exist_ok=True)
            log_path.write_text(output)
        if process.returncode != 0 or not result_file.exists() or not memory_file.exists():
            tail = "\n".join(output.splitlines()[-30:])
            raise RuntimeError(f"one_batch ({mode}) failed with exit code {process.returncode}:\n{tail}")
        result = json.loads(result_file.read_text().splitlines()[-1])
        memory = json.loads(memory_file.read_text())
    # ru_maxrss cannot serve: the reset high-water mark lowers it too.
    result.update(mode=mode, wall_s=time.monotonic() - started,
                  peak_rss_mib=max(memory["load_peak_mib"], memory["after_load_peak_mib"]),
                  after_load_peak_mib=memory["after_load_peak_mib"])
    return result


def run(args: argparse.Namespace) -> int:
    model = args.model or shaped_model(args.models_dir, args.shape)
    results = []
    for mode in MODES:
        for index in range(args.runs):
            print(f"# {mode} run {index + 1}/{args.runs}...", file=sys.stderr, flush=True)
            results.append(run_once(model, mode, batch_size=args.batch_size, input_len=args.input_len,
                                    output_len=args.output_len))
    header = ["mode", *[label for _, label in METRICS], "peak RSS MiB", "after load MiB", "wall s"]
    print(f"# model {model}, batch {args.batch_size}, input {args.input_len}, output {args.output_len}, "
          f"threads {os.environ.get('OMP_NUM_THREADS', os.cpu_count())}")
    print("| " + " | ".join(header) + " |")
    print("|" + "---|" * len(header))
    for r in results:
        cells = [r["mode"], *[f"{r[key]:.1f}" for key, _ in METRICS], f"{r['peak_rss_mib']:.0f}",
                 f"{r['after_load_peak_mib']:.0f}", f"{r['wall_s']:.0f}"]
        print("| " + " | ".join(cells) + " |")
    by_mode = {mode: [r for r in results if r["mode"] == mode] for mode in MODES}
    ratios = []
    for key, label in METRICS:
        on = sorted(r[key] for r in by_mode["on"])[len(by_mode["on"]) // 2]
        off = sorted(r[key] for r in by_mode["off"])[len(by_mode["off"]) // 2]
        ratios.append(f"{label} {on / off:.2f}x")
    def increase(key):
        return max(r[key] for r in by_mode["on"]) - max(r[key] for r in by_mode["off"])

    print(f"# on/off: {', '.join(ratios)}; peak RSS {increase('peak_rss_mib'):+.0f} MiB "
          f"(after load {increase('after_load_peak_mib'):+.0f} MiB)")
    if args.json:
        args.json.write_text(json.dumps(results, indent=1))
    return 0
