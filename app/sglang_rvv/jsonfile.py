"""JSON files written atomically: a reader, a crash, or another rank writing the same file
never sees half of one. Standard library only, for the runtime and the benchmarks alike."""

from __future__ import annotations

import json
import os
from pathlib import Path


def write_json(path: Path, payload, *, sort_keys: bool = False) -> Path:
    """``payload`` as indented JSON at ``path`` (its directory created), through a temporary
    file of this process beside it and a rename."""
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = path.with_name(f".{path.name}.{os.getpid()}.tmp")
    tmp.write_text(json.dumps(payload, indent=1, sort_keys=sort_keys) + "\n")
    os.replace(tmp, path)
    return path
