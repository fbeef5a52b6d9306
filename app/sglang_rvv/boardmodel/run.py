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
from . import counts, guest, rootfs
from .tool import CACHE, Tool, ToolError, lock

GUEST = Path(guest.__file__)
SHAPES_LOCK = "boardmodel"  # images/lock.toml [tools.count.shapes.*]


class LayoutMissing(ToolError):
    """The image cannot run the requested layout (its kernel library or policy lacks it)."""


class NotCovered(ToolError):
    """The kernels cover no projection of the requested shape."""


@dataclass(frozen=True)
class Workload:
    name: str                 # a shape name: "tiny" or a [tools.count.shapes] key
    policy: bool
    weight_dtype: str = "bf16"
    prompt_len: int = 4
    decode_steps: int = 2
    seed: int = 0
    calls: int = 0            # then this many projection calls, and as many of its bare op (bf16 only)

    def __post_init__(self):
        if self.calls and not (self.policy and self.weight_dtype == "bf16"):
            raise ToolError(f"{self.label}: projection calls are counted on the bf16 packed route only "
                            "(policy on, weight_dtype bf16)")

    @property
    def label(self) -> str:
        return f"{self.name}-{self.weight_dtype if self.policy else 'off'}"


def shape(name: str) -> dict:
    """The model shape: the tiny model's, or one pinned in images/lock.toml [tools.count.shapes]."""
    if name == "tiny":
        from ..tiny import TINY_SHAPE

        return {"arch": "llama", **TINY_SHAPE}
    shapes = lock()["tools"]["count"].get("shapes", {})
    if name not in shapes:
        raise ToolError(f"no model shape {name!r}: choose tiny or one of images/lock.toml "
                        f"[tools.count.shapes] ({', '.join(sorted(shapes))})")
    return dict(shapes[name])


def environment() -> dict:
    # One thread, and no library thread started at import (libucs), so counts repeat exactly.
    return {"PATH": "/usr/bin:/bin", "HOME": "/tmp", "LANG": "C.UTF-8", "OMP_NUM_THREADS": "1",
            "UCX_VFS_ENABLE": "n", "PYTHONHASHSEED": "0", "TOKENIZERS_PARALLELISM": "false",
            "SGLANG_RVV_OP_PROVIDER": "rvv", "TRANSFORMERS_OFFLINE": "1", "HF_HUB_OFFLINE": "1"}


def count(tool: Tool, root: Path, work: Workload, scratch: Path, python: Path | None = None,
          env: dict | None = None) -> dict:
    """Run ``work`` once under the counter; returns its phases' counts per component and library.
    ``python`` and ``env`` replace the image's venv interpreter and add to the environment (a
    rootfs without the runtime's venv, with the package from a source tree)."""
    scratch.mkdir(parents=True, exist_ok=True)
    table, result = scratch / f"{work.label}.count", scratch / f"{work.label}.json"
    table.unlink(missing_ok=True)
    result.unlink(missing_ok=True)
    spec = {"shape": shape(work.name), "policy": work.policy, "weight_dtype": work.weight_dtype,
            "prompt_len": work.prompt_len, "decode_steps": work.decode_steps, "seed": work.seed,
            "calls": work.calls, "result": str(result)}
    python = python or root / rootfs.VENV / "bin" / "python"
    began = time.monotonic()
    proc = subprocess.run([str(tool.qemu), "-L", str(root), "-cpu", tool.qemu_cpu,
                           "-plugin", f"{tool.plugin},out={table}", str(python), str(GUEST),
                           json.dumps(spec)], env={**environment(), **(env or {})}, capture_output=True, text=True)
    seconds = round(time.monotonic() - began, 1)
    last = (proc.stderr.strip().splitlines() or [""])[-1]
    if proc.returncode == guest.EXIT_LAYOUT_MISSING:
        raise LayoutMissing(f"{work.label}: {last}")
    if proc.returncode == guest.EXIT_NOT_COVERED:
        raise NotCovered(f"{work.label}: {last}; choose a shape whose projections have N, K >= "
                         f"{gate.RVV.min_features} (the rvv shape gate, kernels/gate.py)")
    if proc.returncode or not result.is_file():
        raise ToolError(f"{work.label}: the counted guest failed (exit {proc.returncode}): {last}")
    out = json.loads(result.read_text())
    tables = counts.parse_tables(table.read_text(), counts.Maps.parse(out["maps"]))
    last_mark = 2 + work.decode_steps + (3 if work.calls else 0)
    marks = [str(n) for n in range(1, last_mark + 1)]
    missing = [m for m in marks if m not in tables]
    if missing:
        raise ToolError(f"{work.label}: the count table has no mark {', '.join(missing)}: the plugin "
                        "did not see the guest's marks")
    phases = {"prefill": tables["2"].minus(tables["1"])}
    for step in range(work.decode_steps):
        phases[f"decode{step + 1}"] = tables[str(3 + step)].minus(tables[str(2 + step)])
    if work.calls:  # work.calls of each, not per call: instruction counts are integers
        first = 3 + work.decode_steps
        phases["projection_calls"] = tables[str(first + 1)].minus(tables[str(first)])
        phases["op_calls"] = tables[str(first + 2)].minus(tables[str(first + 1)])
    return {"workload": asdict(work), "label": work.label, "shape": spec["shape"],
            "emulated_seconds": seconds, "tokens": out["tokens"], "guest_torch": out["torch"],
            "packed_bytes": (out["report"] or {}).get("packed_bytes", 0),
            "packed_source_bytes": out["packed_source_bytes"],
            "provider": (out["report"] or {}).get("provider"),
            "phases": {name: {"components": c.by_component(), "libraries": c.libraries}
                       for name, c in phases.items()}}


def scratch_dir() -> Path:
    return CACHE / "runs" / str(os.getpid())
