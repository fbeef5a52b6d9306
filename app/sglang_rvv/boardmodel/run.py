"""One counted workload: the guest under the counting qemu in the checked rootfs, its tables
attributed, and per-phase counts (prefill, each decode step) as differences of marks."""

from __future__ import annotations

import json
import os
import subprocess
import time
from dataclasses import asdict, dataclass
from pathlib import Path

from ..kernels import gate
from ..layout import WEIGHT_DTYPES
from . import counts, guest, rootfs
from .tool import CACHE, Tool, ToolError, lock

GUEST = Path(guest.__file__)
# make bench's shapes: the three board models' and the default real model's.
BENCH_SHAPES = ("qwen3-0.6b", "llama-3.2-1b", "deepseek-r1-distill-qwen-1.5b", "smollm2-135m-instruct")
PER_TOKEN = "decode2"  # the second decode step: the first may still pay lazy first-call costs
PREFILL = "prefill128"  # Workload.prefill_len's phase (named for the length the board model prices)


class LayoutMissing(ToolError):
    """The image cannot run the requested layout (its kernel library or policy lacks it)."""


class NotCovered(ToolError):
    """The kernels cover no projection of the requested shape."""


@dataclass(frozen=True)
class Workload:
    name: str                 # a shape name: "tiny" or a [tools.count.shapes] key
    policy: bool
    weight_dtype: str = "bf16"
    lm_head_dtype: str | None = None  # the policy's lm_head_dtype; None: its default (never below int8)
    prompt_len: int = 4
    decode_steps: int = 2
    seed: int = 0
    calls: int = 0            # then this many projection calls, and as many of its bare op (bf16 only)
    prefill_len: int = 0      # last, a prefill of this many tokens from an empty cache (phase PREFILL)

    def __post_init__(self):
        if self.calls and not (self.policy and self.weight_dtype == "bf16"):
            raise ToolError(f"{self.label}: projection calls are counted on the bf16 packed route only "
                            "(policy on, weight_dtype bf16)")
        if self.lm_head_dtype is not None and not self.policy:
            raise ToolError(f"{self.label}: lm_head_dtype={self.lm_head_dtype!r} needs the policy on")

    @property
    def label(self) -> str:
        lm_head = f"-lm_head-{self.lm_head_dtype}" if self.lm_head_dtype else ""
        return f"{self.name}-{self.weight_dtype if self.policy else 'off'}{lm_head}"


def shape(name: str, pinned: dict | None = None) -> dict:
    """The model shape: the tiny model's, or one pinned in images/lock.toml [tools.count.shapes]
    (``pinned``: that table, read from another lock file)."""
    if name == "tiny":
        from ..tiny import TINY_SHAPE

        return {"arch": "llama", **TINY_SHAPE}
    shapes = lock()["tools"]["count"].get("shapes", {}) if pinned is None else pinned
    if name not in shapes:
        raise ToolError(f"no model shape {name!r}: choose tiny or one of images/lock.toml "
                        f"[tools.count.shapes] ({', '.join(sorted(shapes))})")
    return dict(shapes[name])


def environment() -> dict:
    # One thread, and no library thread started at import (libucs), so counts repeat exactly.
    return {"PATH": "/usr/bin:/bin", "HOME": "/tmp", "LANG": "C.UTF-8", "OMP_NUM_THREADS": "1",
            "UCX_VFS_ENABLE": "n", "PYTHONHASHSEED": "0", "TOKENIZERS_PARALLELISM": "false",
            "SGLANG_RVV_OP_PROVIDER": "rvv", "TRANSFORMERS_OFFLINE": "1", "HF_HUB_OFFLINE": "1"}


def spec(work: Workload, result: Path, pinned: dict | None = None, **extra) -> dict:
    """The guest's argument (guest.py): the workload's shape and settings, where to write its
    result, and ``extra`` (the board's counters)."""
    return {"shape": shape(work.name, pinned), "policy": work.policy, "weight_dtype": work.weight_dtype,
            "lm_head_dtype": work.lm_head_dtype, "prompt_len": work.prompt_len, "decode_steps": work.decode_steps,
            "seed": work.seed, "calls": work.calls, "prefill_len": work.prefill_len, "result": str(result), **extra}


def outcome(work: Workload, proc: subprocess.CompletedProcess, result: Path) -> dict:
    """The guest's result, or the error its exit code names (one line, never a silent zero)."""
    last = (proc.stderr.strip().splitlines() or [""])[-1]
    if proc.returncode == guest.EXIT_LAYOUT_MISSING:
        raise LayoutMissing(f"{work.label}: {last}")
    if proc.returncode == guest.EXIT_NOT_COVERED:
        raise NotCovered(f"{work.label}: {last}; choose a shape whose projections have N, K >= "
                         f"{gate.RVV.min_features} (the rvv shape gate, kernels/gate.py)")
    if proc.returncode or not result.is_file():
        raise ToolError(f"{work.label}: the guest failed (exit {proc.returncode}): {last}")
    return json.loads(result.read_text())


def phase_marks(work: Workload) -> dict[str, tuple[str, str]]:
    """Each phase's (first, last) mark: the prefill, each decode step, and the projection calls."""
    phases = {"prefill": ("1", "2")}
    for step in range(work.decode_steps):
        phases[f"decode{step + 1}"] = (str(2 + step), str(3 + step))
    first = 3 + work.decode_steps
    if work.calls:  # work.calls of each, not per call: instruction counts are integers
        phases["projection_calls"] = (str(first), str(first + 1))
        phases["op_calls"] = (str(first + 1), str(first + 2))
        phases["compiled_calls"] = (str(first + 3), str(first + 4))  # after its compile
        first += 5
    if work.prefill_len:
        phases[PREFILL] = (str(first), str(first + 1))
    return phases


def count(tool: Tool, root: Path, work: Workload, scratch: Path, python: Path | None = None,
          env: dict | None = None) -> dict:
    """Run ``work`` once under the counter; returns its phases' counts per component and library.
    ``python`` and ``env`` replace the image's venv interpreter and add to the environment (a
    rootfs without the runtime's venv, with the package from a source tree)."""
    scratch.mkdir(parents=True, exist_ok=True)
    table, result = scratch / f"{work.label}.count", scratch / f"{work.label}.json"
    table.unlink(missing_ok=True)
    result.unlink(missing_ok=True)
    argument = spec(work, result)
    python = python or root / rootfs.VENV / "bin" / "python"
    began = time.monotonic()
    proc = subprocess.run([str(tool.qemu), "-L", str(root), "-cpu", tool.qemu_cpu,
                           "-plugin", f"{tool.plugin},out={table}", str(python), str(GUEST),
                           json.dumps(argument)], env={**environment(), **(env or {})}, capture_output=True, text=True)
    seconds = round(time.monotonic() - began, 1)
    out = outcome(work, proc, result)
    return {"workload": asdict(work), "label": work.label, "shape": argument["shape"],
            "emulated_seconds": seconds, "tokens": out["tokens"], "guest_torch": out["torch"],
            "packed_bytes": (out["report"] or {}).get("packed_bytes", 0),
            "packed_source_bytes": out["packed_source_bytes"],
            "provider": (out["report"] or {}).get("provider"),
            "phases": counted_phases(work, table.read_text(), out["maps"])}


def counted_phases(work, table: str, maps: str) -> dict[str, dict]:
    """Each of ``work``'s phases (phase_marks) from a count table and the guest's maps: its counts
    per component and per library. A mark the table lacks is an error naming it."""
    tables = counts.parse_tables(table, counts.Maps.parse(maps))
    marks = phase_marks(work)
    missing = sorted({m for pair in marks.values() for m in pair if m not in tables}, key=int)
    if missing:
        raise ToolError(f"{work.label}: the count table has no mark {', '.join(missing)}: the plugin "
                        "did not see the guest's marks")
    phases = {name: tables[last].minus(tables[first]) for name, (first, last) in marks.items()}
    return {name: {"components": c.by_component(), "libraries": c.libraries} for name, c in phases.items()}


def workloads(shapes, layouts, lm_head: str | None = None) -> list[Workload]:
    """Each shape with the policy off (F.linear), then on in each layout, its lm_head in ``lm_head``
    (None: the policy's default)."""
    out = []
    for name in shapes:
        out.append(Workload(name, policy=False))
        out.extend(Workload(name, policy=True, weight_dtype=d, lm_head_dtype=lm_head) for d in layouts)
    return out


def add_lm_head_option(parser) -> None:
    """The counting commands' ``--lm-head``: lm_head's layout in every policy-on workload."""
    parser.add_argument("--lm-head", choices=WEIGHT_DTYPES,
                        help="lm_head's layout in every policy-on workload (default: the policy's, the "
                             "layout's but never below int8); its label gains -lm_head-LAYOUT")


def scratch_dir() -> Path:
    return CACHE / "runs" / str(os.getpid())
