"""The kernel library's scalar twins built for this host, for the fast tier's kernel tests.

The image build (images/scripts/build-kernels.sh) cross-compiles every file of
app/sglang_rvv/kernels/csrc for riscv64. Here the host's g++ compiles the same files without the
``*_rvv.cpp`` ones (register.cpp compiles them out off riscv64) against the venv's torch, into
.cache/kernels/host/libsglang_rvv_kernels.so, with the lock's flags, and csrc/entry into the
eager route's CPython entry beside it (libsglang_rvv_entry.so). ``build.json`` beside it
records the inputs (compiler, flags, source digest, torch); while they are unchanged the library
is kept. It lives with the tests because nothing but the tests runs the twins on x86: the
generic provider serves x86 with torch's own kernels.
"""

from __future__ import annotations

import json
import shutil
import subprocess
import sys
import sysconfig
import tempfile
import tomllib
from pathlib import Path

import pytest
import torch
import torch.utils.cpp_extension

from sglang_rvv import layout

REPO = Path(__file__).resolve().parents[1]
CSRC = REPO / "app" / "sglang_rvv" / "kernels" / "csrc"
OUT_DIR = REPO / ".cache" / "kernels" / "host"
LIB_NAME = "libsglang_rvv_kernels.so"
ENTRY_NAME = "libsglang_rvv_entry.so"  # sglang_rvv.kernels.entry.ENTRY_NAME
COMPILER = "g++"

sys.path.insert(0, str(REPO / "images" / "scripts"))
from lock import kernels_source_sha256  # noqa: E402 - images/scripts is not a package


def _flags() -> list[str]:
    """The image build's flags (images/lock.toml), so the twins compile as they do for the board."""
    lock = tomllib.loads((REPO / "images" / "lock.toml").read_text())
    return list(lock["arch"]["riscv64"]["kernels"]["flags"])


def _inputs() -> dict:
    version = subprocess.run([COMPILER, "--version"], capture_output=True, text=True, check=True).stdout
    return {"compiler": COMPILER, "compiler_version": version.splitlines()[0], "flags": _flags(),
            "source_sha256": kernels_source_sha256(CSRC), "torch_version": torch.__version__}


def build(out_dir: Path = OUT_DIR) -> Path:
    """The host library, built now unless build.json already records exactly these inputs."""
    if shutil.which(COMPILER) is None:
        raise RuntimeError(f"{COMPILER} not found: the host build of the kernel twins needs it (apt-get install g++)")
    want = json.dumps(_inputs(), indent=1, sort_keys=True)
    lib, manifest = out_dir / LIB_NAME, out_dir / "build.json"
    if lib.is_file() and (out_dir / ENTRY_NAME).is_file() and manifest.is_file() and manifest.read_text() == want:
        return lib
    out_dir.mkdir(parents=True, exist_ok=True)
    includes = [f"-I{p}" for p in torch.utils.cpp_extension.include_paths()]
    lib_dirs = torch.utils.cpp_extension.library_paths()
    sources = sorted(p for p in CSRC.glob("*.cpp") if not p.name.endswith("_rvv.cpp"))
    with tempfile.TemporaryDirectory(dir=out_dir, prefix=".build-") as tmp:
        objects = [Path(tmp) / f"{src.stem}.o" for src in sources]
        jobs = [subprocess.Popen([COMPILER, *_flags(), *includes, "-c", str(src), "-o", str(obj)],
                                 stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
                for src, obj in zip(sources, objects, strict=True)]
        outputs = [job.communicate()[0] for job in jobs]  # read to the end: a full pipe would block the compiler
        failures = [f"{src.name}:\n{out}"
                    for src, job, out in zip(sources, jobs, outputs, strict=True) if job.returncode]
        if failures:
            raise RuntimeError("compiling the kernel twins for the host failed:\n" + "\n".join(failures))
        staged = Path(tmp) / LIB_NAME
        link = subprocess.run([COMPILER, "-shared", "-Wl,-z,defs", "-o", str(staged), *map(str, objects),
                               *(f"-L{d}" for d in lib_dirs), *(f"-Wl,-rpath,{d}" for d in lib_dirs),
                               "-lc10", "-ltorch_cpu"], capture_output=True, text=True)
        if link.returncode:
            raise RuntimeError(f"linking the host kernel twins failed:\n{link.stdout}{link.stderr}")
        # The eager route's CPython entry, as build-kernels.sh builds it: an extension module, so
        # the interpreter's symbols stay undefined (no -z defs).
        staged_entry = Path(tmp) / ENTRY_NAME
        entry = subprocess.run([COMPILER, *_flags(), *includes, f"-I{sysconfig.get_paths()['include']}", "-shared",
                                "-o", str(staged_entry), *map(str, sorted((CSRC / "entry").glob("*.cpp"))),
                                *(f"-L{d}" for d in lib_dirs), *(f"-Wl,-rpath,{d}" for d in lib_dirs),
                                "-ltorch_python", "-ltorch_cpu", "-lc10"], capture_output=True, text=True)
        if entry.returncode:
            raise RuntimeError(f"building the host kernel entry failed:\n{entry.stdout}{entry.stderr}")
        manifest.unlink(missing_ok=True)
        staged.replace(lib)
        staged_entry.replace(out_dir / ENTRY_NAME)
        manifest.write_text(want)
    return lib


def ops():
    """``torch.ops.sglang_rvv_native`` with this host's library loaded (once a process)."""
    if not hasattr(torch.ops.sglang_rvv_native, "kernel_isa"):
        torch.ops.load_library(str(build()))
    return torch.ops.sglang_rvv_native


def bf16_randn(*shape: int, seed: int) -> torch.Tensor:
    """Seeded normal values, rounded to bfloat16: the kernel tests' inputs."""
    return torch.randn(*shape, generator=torch.Generator().manual_seed(seed)).to(torch.bfloat16)


def bf16_zeros(*shape: int) -> torch.Tensor:
    """A bfloat16 tensor whose values do not matter: a refusal's input."""
    return torch.zeros(*shape, dtype=torch.bfloat16)


def serve_as_rvv_provider() -> Path:
    """Make this fresh process's policy run the twins as the ``rvv`` provider: the RVV kernels'
    results bit for bit (the twin contract), on x86. Call it before anything asks for a provider
    (sglang_rvv.kernels.chosen is asked once per process); the native entry beside the library is
    the host build's too. Returns the library."""
    import os

    lib = build()
    os.environ["SGLANG_RVV_KERNELS_LIB"] = str(lib)
    torch.ops.load_library(str(lib))
    from sglang_rvv.kernels import chosen, rvv

    rvv.status = lambda: (True, f"the kernels' scalar twins, built for this host: {lib}")
    rvv._register_fakes()
    provider, why = chosen()
    if provider is not rvv:
        raise RuntimeError(f"the twins were not chosen as the rvv provider: {why}")
    return lib


# The cases the twins' tests share (tests/integration/test_kernel_twins.py, test_native_entry.py):
# the packed layout's version the ops are called with, a weight shape with a 4-column tail block
# and a K off every group size, and the quantized layouts with their group sizes.
VERSION = layout.LAYOUT_VERSION
N, K = 100, 70
QUANT = [pytest.param(layout.INT8, 32, id="int8-g32"), pytest.param(layout.INT8, 0, id="int8-per-channel"),
         pytest.param(layout.INT4, 32, id="int4-g32"), pytest.param(layout.INT4, 64, id="int4-g64")]
# The layouts the eager route calls: int4_a8 beside the weight-only ones.
ROUTED = [pytest.param(None, 0, id="bf16"), *QUANT, pytest.param(layout.INT4_A8, 32, id="int4_a8-g32")]


def bits(t: torch.Tensor) -> torch.Tensor:
    """A BF16 tensor's bit patterns, for comparing results bit for bit."""
    return t.view(torch.int16)


def pack(native, quant: layout.QuantLayout, weight: torch.Tensor, group_size: int):
    """The native pack of ``quant``, at the group size the layout makes of ``group_size``."""
    group = layout.effective_group_size(quant, group_size, weight.shape[1])
    return getattr(native, f"pack_{quant.name}_weight")(weight, group, VERSION)


def linear(native, quant: layout.QuantLayout, x: torch.Tensor, packed, n: int, k: int) -> torch.Tensor:
    return getattr(native, f"packed_{quant.name}_linear")(x, *packed, n, k, VERSION)
