#!/usr/bin/env python3
"""Build-time check: the installed runtime is exactly what images/lock.toml pins.

    check-runtime.py LOCK_JSON      (the arch's pins, from `lock.py export ARCH`)

What is expected follows the arch's torch source:

* ``wheel``: torch == the pinned version;
* ``debian``: torch from the suite's python3-torch (/usr/lib/python3/dist-packages)
  with the pinned version prefix.

Both: the pinned Python; SGLang == the pinned version where the image serves
(``serving``), absent where not; the boot .pth; sglang-rvv == the app version
with its plugin entry point; ``import sglang_rvv`` works on this torch; where the
lock pins RVV kernels, the ``rvv`` provider runs them, built from those pins; Inductor
finds what its C++ backend needs (setuptools, torch's headers). Prints one line
per mismatch naming the lock key, and exits 1 if there is any.
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
        # Debian's is "2.14.1+debian": the pin is a version prefix, before any local label
        release = torch.__version__.split("+")[0]
        ok = release == torch_pin["version"] or release.startswith(torch_pin["version"] + ".")
        location = Path(torch.__file__).resolve().parent.parent
        if location != DEBIAN_DIST_PACKAGES:
            found.append(f"arch.{arch}.torch.source: lock {source} ({torch_pin.get('debian_package')} in "
                         f"{DEBIAN_DIST_PACKAGES}), image imports torch from {location}")
    if not ok:
        found.append(f"arch.{arch}.torch.version: lock {torch_pin['version']}, image has {torch.__version__}")

    sglang = _version("sglang")
    if lock["serving"] == "sglang" and sglang != lock["sglang"]["version"]:
        found.append(f"sglang.version: lock {lock['sglang']['version']}, image has sglang {sglang or 'not installed'}")
    elif lock["serving"] != "sglang" and sglang is not None:
        found.append(f"arch.{arch}: the lock installs no SGLang here, image has sglang {sglang}")
    app = _version("sglang-rvv")
    if app != lock["app"]["version"]:
        found.append(f"app.version: lock {lock['app']['version']}, image has sglang-rvv {app or 'not installed'}")
    plugins = {ep.name for ep in md.entry_points(group="sglang.srt.plugins")}
    if "sglang_rvv" not in plugins:
        found.append(f"sglang-rvv plugin entry point missing (sglang.srt.plugins: {sorted(plugins)})")
    if not (Path(sysconfig.get_paths()["purelib"]) / "sglang_rvv_boot.pth").is_file():
        found.append("sglang_rvv_boot.pth missing (python -m sglang_rvv_boot not run)")
    try:  # registers the custom ops: fails on a torch too old for them
        importlib.import_module("sglang_rvv.ops")
    except Exception as exc:  # any failure to import is the finding
        found.append(f"import sglang_rvv failed on torch {torch.__version__}: {type(exc).__name__}: {exc}")
        return found
    found += kernel_problems(lock)
    found += inductor_problems(torch, source, arch)
    return found


def kernel_problems(lock: dict) -> list[str]:
    """Where the lock pins RVV kernels, they are what runs: built from the pinned sources
    for this torch, and picked as the provider (on this CPU model: V is there)."""
    pins = lock.get("kernels")
    if not pins:
        return []
    import sglang_rvv.ops
    from sglang_rvv.kernels import rvv

    found = []
    if sglang_rvv.ops.PROVIDER_NAME != rvv.NAME:
        found.append(f"arch.{lock['arch']}.kernels: provider {sglang_rvv.ops.PROVIDER_NAME}, not {rvv.NAME}: "
                     f"{sglang_rvv.ops.PROVIDER_REASON}")
    manifest = rvv.library_path().with_name("kernels.json")
    try:
        built = json.loads(manifest.read_text())
    except (OSError, ValueError) as exc:
        return [*found, f"arch.{lock['arch']}.kernels: cannot read {manifest} ({exc}): the kernel build did not "
                        "reach the image"]
    for key in ("source_sha256", "compiler_version"):
        if built.get(key) != pins[key]:
            found.append(f"arch.{lock['arch']}.kernels.{key}: lock {pins[key]}, the library was built with "
                         f"{built.get(key)}")
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

        sglang = md.version("sglang") if lock["serving"] == "sglang" else "not installed (serving unavailable)"
        print(f"check-runtime: ok: python {sys.version.split()[0]}, torch {torch.__version__} "
              f"({lock['torch']['source']}), sglang {sglang}, sglang-rvv {md.version('sglang-rvv')} "
              f"(provider {sglang_rvv.ops.PROVIDER_NAME})")
    return 1 if found else 0


if __name__ == "__main__":
    sys.exit(main())
