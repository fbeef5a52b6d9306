#!/usr/bin/env python3
"""Build-time check: the installed runtime is exactly what images/lock.toml pins.

    check-runtime.py LOCK_JSON      (the arch's pins, from `lock.py export ARCH`)

What is expected follows the arch's torch source:

* ``wheel``: torch == the pinned version, SGLang == the pinned version, the boot .pth;
* ``debian``: torch from the suite's python3-torch (/usr/lib/python3/dist-packages)
  with the pinned version prefix, and no SGLang (the image cannot serve).

Both: the pinned Python, sglang-rvv == the app version with its plugin entry
point, ``import sglang_rvv`` works on this torch, and Inductor finds what its C++
backend needs (setuptools, torch's headers). Prints one line per mismatch naming
the lock key, and exits 1 if there is any.
"""

import importlib
import importlib.metadata as md
import json
import sys
import sysconfig
from pathlib import Path

DEBIAN_DIST_PACKAGES = Path("/usr/lib/python3/dist-packages")


def _version(dist: str) -> str | None:
    try:
        return md.version(dist)
    except md.PackageNotFoundError:
        return None


def problems(lock: dict) -> list[str]:
    found = []
    arch = lock["arch"]
    python = f"{sys.version_info.major}.{sys.version_info.minor}"
    if python != lock["python"]:
        found.append(f"arch.{arch}.python: lock {lock['python']}, image has {python}")
    import torch

    torch_pin = lock["torch"]
    source = torch_pin["source"]
    if source == "wheel":
        ok = torch.__version__ == torch_pin["version"]
    else:
        ok = torch.__version__ == torch_pin["version"] or torch.__version__.startswith(torch_pin["version"] + ".")
        location = Path(torch.__file__).resolve().parent.parent
        if location != DEBIAN_DIST_PACKAGES:
            found.append(f"arch.{arch}.torch.source: lock {source} ({torch_pin.get('debian_package')} in "
                         f"{DEBIAN_DIST_PACKAGES}), image imports torch from {location}")
    if not ok:
        found.append(f"arch.{arch}.torch.version: lock {torch_pin['version']}, image has {torch.__version__}")

    sglang = _version("sglang")
    if source == "wheel" and sglang != lock["sglang"]["version"]:
        found.append(f"sglang.version: lock {lock['sglang']['version']}, image has sglang {sglang or 'not installed'}")
    elif source != "wheel" and sglang is not None:
        found.append(f"arch.{arch}.torch.source: lock {source} installs no SGLang, image has sglang {sglang}")
    app = _version("sglang-rvv")
    if app != lock["app"]["version"]:
        found.append(f"app.version: lock {lock['app']['version']}, image has sglang-rvv {app or 'not installed'}")
    plugins = {ep.name for ep in md.entry_points(group="sglang.srt.plugins")}
    if "sglang_rvv" not in plugins:
        found.append(f"sglang-rvv plugin entry point missing (sglang.srt.plugins: {sorted(plugins)})")
    if source == "wheel" and not (Path(sysconfig.get_paths()["purelib"]) / "sglang_rvv_boot.pth").is_file():
        found.append("sglang_rvv_boot.pth missing (python -m sglang_rvv_boot not run)")
    try:  # registers the custom ops: fails on a torch too old for them
        importlib.import_module("sglang_rvv.ops")
    except Exception as exc:  # any failure to import is the finding
        found.append(f"import sglang_rvv failed on torch {torch.__version__}: {type(exc).__name__}: {exc}")
    found += inductor_problems(torch, source, arch)
    return found


def inductor_problems(torch, source: str, arch: str) -> list[str]:
    """What Inductor's C++ backend (regional compile) needs besides a compiler."""
    found = []
    try:  # imports setuptools
        importlib.import_module("torch.utils.cpp_extension")
    except Exception as exc:
        found.append(f"Inductor cannot build kernels: torch.utils.cpp_extension: {type(exc).__name__}: {exc}")
    header = Path("ATen") / "NumericUtils.h"
    places = [Path(torch.__file__).parent / "include", Path("/usr/include")]
    if not any((place / header).is_file() for place in places):
        fix = (f"arch.{arch}.packages needs libtorch-dev" if source == "debian"
               else f"the arch.{arch}.torch wheel ships no include/")
        found.append(f"Inductor cannot build kernels: no torch C++ headers ({header} in "
                     f"{' or '.join(map(str, places))}): {fix}")
    return found


def main() -> int:
    lock = json.loads(Path(sys.argv[1]).read_text())
    found = problems(lock)
    for problem in found:
        print(f"check-runtime: {problem}", file=sys.stderr)
    if not found:
        import torch

        import sglang_rvv.ops

        sglang = md.version("sglang") if lock["torch"]["source"] == "wheel" else "not installed (serving unavailable)"
        print(f"check-runtime: ok: python {sys.version.split()[0]}, torch {torch.__version__} "
              f"({lock['torch']['source']}), sglang {sglang}, sglang-rvv {md.version('sglang-rvv')} "
              f"(provider {sglang_rvv.ops.PROVIDER_NAME})")
    return 1 if found else 0


if __name__ == "__main__":
    sys.exit(main())
