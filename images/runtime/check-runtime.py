#!/usr/bin/env python3
"""Build-time check: the installed runtime is exactly what images/lock.toml pins.

    check-runtime.py LOCK_JSON      (the arch's pins, from `lock.py export ARCH`)

Prints one line per mismatch naming the lock key, and exits 1 if there is any.
"""

import importlib.metadata as md
import json
import sys
import sysconfig
from pathlib import Path


def problems(lock: dict) -> list[str]:
    found = []
    python = f"{sys.version_info.major}.{sys.version_info.minor}"
    if python != lock["python"]:
        found.append(f"arch.{lock['arch']}.python: lock {lock['python']}, image has {python}")
    import torch

    torch_pin = lock["torch"]
    if torch_pin["source"] == "wheel":
        ok = torch.__version__ == torch_pin["version"]
    else:
        ok = torch.__version__.startswith(torch_pin["version"])
    if not ok:
        found.append(f"arch.{lock['arch']}.torch.version: lock {torch_pin['version']}, image has {torch.__version__}")
    for key, dist in (("sglang.version", "sglang"), ("app.version", "sglang-rvv")):
        want = lock[key.split(".")[0]]["version"]
        try:
            have = md.version(dist)
        except md.PackageNotFoundError:
            have = "not installed"
        if have != want:
            found.append(f"{key}: lock {want}, image has {dist} {have}")
    plugins = {ep.name for ep in md.entry_points(group="sglang.srt.plugins")}
    if "sglang_rvv" not in plugins:
        found.append(f"sglang-rvv plugin entry point missing (sglang.srt.plugins: {sorted(plugins)})")
    if not (Path(sysconfig.get_paths()["purelib"]) / "sglang_rvv_boot.pth").is_file():
        found.append("sglang_rvv_boot.pth missing (python -m sglang_rvv_boot not run)")
    return found


def main() -> int:
    lock = json.loads(Path(sys.argv[1]).read_text())
    found = problems(lock)
    for problem in found:
        print(f"check-runtime: {problem}", file=sys.stderr)
    if not found:
        import torch

        print(f"check-runtime: ok: python {sys.version.split()[0]}, torch {torch.__version__}, "
              f"sglang {md.version('sglang')}, sglang-rvv {md.version('sglang-rvv')}")
    return 1 if found else 0


if __name__ == "__main__":
    sys.exit(main())
