"""llama.cpp on the board model's instrument: ``peer-count`` (peer/driver) runs the phases the
appliance's guest runs, on a GGUF file of the same shape and seeded weights, under the same
counting qemu and plugin, one guest thread; its tables are attributed as ours are (ggml's kernels,
libggml-cpu, are the ``kernel`` component; llama and ggml-base fall in ``other``).

Phases: ``prefill`` (the 4-token prompt), ``decode1``..``decodeN`` (greedy steps at M=1; the board
model prices ``run.PER_TOKEN``, the second step, as it does ours), and ``prefill128`` (a
128-token prompt in one batch, after the memory is cleared): the marks the appliance's guest
writes, so ``run.counted_phases`` reads both.
"""

from __future__ import annotations

import json
import subprocess
import time
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import ClassVar

from . import peer_build, peer_models
from .run import counted_phases, shape
from .tool import Tool, ToolError


@dataclass(frozen=True)
class PeerWork:
    name: str                  # a [tools.count.shapes] key
    fmt: str                   # a llama-quantize type
    repack: bool = False       # llama.cpp's repacked gemv (VLEN 256), else vec_dot (the anchor's path)
    prompt_len: int = 4
    decode_steps: int = 2
    prefill_len: int = 128
    calls: ClassVar[int] = 0   # the appliance's projection-call phases have no peer (run.phase_marks)

    @property
    def path(self) -> str:
        return "repack" if self.repack else "vec_dot"

    @property
    def label(self) -> str:
        return f"llama.cpp-{self.name}-{self.fmt}-{self.path}"


def count(tool: Tool, build: peer_build.Build, work: PeerWork, scratch: Path, log=None) -> dict:
    """Run ``work`` once under the counter; its phases' counts per component and library."""
    model_shape = shape(work.name)
    model = peer_models.model_file(work.name, model_shape, work.fmt, log=log)
    scratch.mkdir(parents=True, exist_ok=True)
    table, maps = scratch / f"{work.label}.count", scratch / f"{work.label}.maps"
    table.unlink(missing_ok=True)
    maps.unlink(missing_ok=True)
    argv = [str(tool.qemu), "-L", str(build.sysroot), "-cpu", peer_build.qemu_cpu(tool.qemu_cpu),
            "-plugin", f"{tool.plugin},out={table}",
            str(build.binary("peer-count")), str(model), "--threads", "1", "--prompt", str(work.prompt_len),
            "--steps", str(work.decode_steps), "--prefill", str(work.prefill_len), "--maps", str(maps)]
    if not work.repack:
        argv.append("--no-repack")
    began = time.monotonic()
    proc = subprocess.run(argv, env={"PATH": "/usr/bin:/bin", "LANG": "C.UTF-8"}, capture_output=True, text=True)
    seconds = round(time.monotonic() - began, 1)
    if proc.returncode or not maps.is_file() or not table.is_file():
        last = (proc.stderr.strip().splitlines() or ["no output"])[-1]
        raise ToolError(f"{work.label}: llama.cpp's peer-count failed (exit {proc.returncode}) on {model.name}: {last}")
    out = json.loads(proc.stdout.strip().splitlines()[-1])
    weights = peer_models.bytes_per_token(model)
    return {"workload": asdict(work), "label": work.label, "engine": "llama.cpp", "shape": model_shape,
            "emulated_seconds": seconds, "tokens": out["tokens"], "gguf": model.name,
            "build": {k: build.manifest[k] for k in ("variant", "compiler", "compiler_version", "sdist_sha256")},
            **weights,
            "phases": counted_phases(work, table.read_text(), maps.read_text())}
