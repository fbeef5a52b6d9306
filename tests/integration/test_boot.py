"""The interpreter-start hooks (sglang_rvv_boot), checked in fresh interpreters like SGLang's processes.

Importing torch dominates each subprocess, so the sgl_kernel checks share one probe interpreter.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest

import sglang_rvv

FALLBACK = Path(sglang_rvv.__file__).resolve().parent / "sgl_kernel_fallback.py"

# Shapes and dtypes as in sglang.srt.mem_cache.allocation.assign_req_to_token_pool_func:
# distinct pool rows, int32 req_to_token, int64 out_cache_loc holding the runs back to back.
PROBE = """
import json
import random

import torch

import sgl_kernel

report = {"file": sgl_kernel.__file__, "fallback": getattr(sgl_kernel, "IS_SGLANG_RVV_FALLBACK", False)}
try:
    sgl_kernel.build_tree_kernel_efficient_cpu()
except NotImplementedError as exc:
    report["not_implemented"] = str(exc)
try:
    sgl_kernel.no_such_kernel_cpu
except AttributeError as exc:
    report["attribute_error"] = str(exc)
try:
    from sgl_kernel import other_missing_cpu  # noqa: F401
except ImportError as exc:
    report["import_error"] = str(exc)


def reference(rows, req_to_token, starts, ends, out_cache_loc):
    expected = req_to_token.clone()
    source = out_cache_loc.tolist()
    for i, row in enumerate(rows.tolist()):
        begin = int((ends[:i] - starts[:i]).sum())  # the i-th run follows the earlier ones
        for j in range(int(ends[i] - starts[i])):
            expected[row, int(starts[i]) + j] = source[begin + j]
    return expected


rng = random.Random(0)
mismatches = []
for case in range(200):
    pool_rows, pool_len = rng.randint(1, 8), rng.randint(1, 64)
    batch = rng.randint(1, pool_rows)
    rows = torch.tensor(rng.sample(range(pool_rows), batch), dtype=torch.int64)
    bounds = [sorted(rng.randint(0, pool_len) for _ in range(2)) for _ in range(batch)]
    starts = torch.tensor([b[0] for b in bounds], dtype=torch.int64)
    ends = torch.tensor([b[1] for b in bounds], dtype=torch.int64)
    out_cache_loc = torch.randint(0, 10_000, (int((ends - starts).sum()),), dtype=torch.int64)
    req_to_token = torch.randint(-5, 0, (pool_rows, pool_len), dtype=torch.int32)
    expected = reference(rows, req_to_token, starts, ends, out_cache_loc)
    sgl_kernel.assign_req_to_token_pool_cpu(rows, req_to_token, starts, ends, out_cache_loc, pool_len)
    if not torch.equal(req_to_token, expected):
        mismatches.append(dict(case=case, rows=rows.tolist(), starts=starts.tolist(), ends=ends.tolist()))
report["assign_cases"] = case + 1
report["assign_mismatches"] = mismatches[:3]
print(json.dumps(report))
"""


def run_python(
    code: str, *, boot: bool = True, pythonpath: Path | None = None
) -> subprocess.CompletedProcess[str]:
    """Run ``code`` in a new interpreter of this venv, environment as for SGLang's CPU engine."""
    env = {**os.environ, "SGLANG_USE_CPU_ENGINE": "1", "SGLANG_RVV_BOOT": "1" if boot else "0"}
    env.pop("PYTHONPATH", None)
    if pythonpath is not None:
        env["PYTHONPATH"] = str(pythonpath)
    return subprocess.run(
        [sys.executable, "-c", textwrap.dedent(code)], env=env, capture_output=True, text=True, timeout=120
    )


def check(code: str, **kw) -> str:
    result = run_python(code, **kw)
    assert result.returncode == 0, f"exit {result.returncode}\n{result.stdout}\n{result.stderr}"
    return result.stdout


@pytest.fixture(scope="module")
def probe() -> dict:
    return json.loads(check(PROBE).splitlines()[-1])


def test_sgl_kernel_resolves_to_the_fallback(probe):
    assert Path(probe["file"]).resolve() == FALLBACK
    assert probe["fallback"] is True


def test_assign_req_to_token_pool_matches_reference(probe):
    assert probe["assign_cases"] == 200
    assert probe["assign_mismatches"] == []


def test_unimplemented_kernel_names_itself(probe):
    assert "sgl_kernel.build_tree_kernel_efficient_cpu is not implemented" in probe["not_implemented"]


def test_unknown_attribute_is_a_clear_error(probe):
    assert "sgl_kernel.no_such_kernel_cpu" in probe["attribute_error"]
    assert "fallback does not provide it" in probe["attribute_error"]
    assert "other_missing_cpu" in probe["import_error"]


def test_a_real_sgl_kernel_wins(tmp_path):
    real = tmp_path / "sgl_kernel"
    real.mkdir()
    (real / "__init__.py").write_text("REAL = True\n")
    out = check("import sgl_kernel; print(sgl_kernel.__file__, sgl_kernel.REAL)", pythonpath=tmp_path)
    assert out.split() == [str(real / "__init__.py"), "True"]


def test_torchvision_imports():
    check("import torchvision, torchvision.transforms; print(torchvision.__version__)")


def test_hooks_off_with_sglang_rvv_boot_0():
    result = run_python("import sgl_kernel", boot=False)
    assert result.returncode != 0
    assert "ModuleNotFoundError: No module named 'sgl_kernel'" in result.stderr



# A fresh interpreter in which xgrammar is absent, as in the riscv64 image: site-packages (where
# this venv has a real xgrammar) leaves sys.path once the boot hook and the app are importable.
STANDIN_PROBE = """
import json, sys
import sglang_rvv_boot, sglang_rvv.standins
sys.path[:] = [p for p in sys.path if not p.endswith("site-packages")]
sglang_rvv_boot.activate()

report = {}
served = {"__name__": "sglang.srt.function_call.kimik3_detector"}
exec("from xgrammar import StructuralTag", served)
report["served"] = repr(served["StructuralTag"])
for importer in ("torch.utils.flop_counter", "sglang.srt.entrypoints.openai.protocol"):
    try:
        exec("from xgrammar import StructuralTag", {"__name__": importer})
        report[importer] = "imported"
    except ImportError as exc:
        report[importer] = f"{type(exc).__name__}: {exc}"
try:
    served["StructuralTag"].model_validate({})
except NotImplementedError as exc:
    report["call"] = str(exc)
print(json.dumps(report))
"""


def test_a_stand_in_serves_only_its_unguarded_importers():
    """The xgrammar stand-in answers the SGLang parsers that import it unguarded; torch's probes and
    SGLang's guarded imports see no package; using it raises; it is announced once."""
    proc = subprocess.run([sys.executable, "-c", STANDIN_PROBE], capture_output=True, text=True, timeout=120)
    assert proc.returncode == 0, proc.stderr
    report = json.loads(proc.stdout)
    assert report["served"] == "<stand-in xgrammar.StructuralTag>", report
    assert report["torch.utils.flop_counter"] == "ModuleNotFoundError: No module named 'xgrammar'", report
    assert report["sglang.srt.entrypoints.openai.protocol"] == "ModuleNotFoundError: No module named 'xgrammar'"
    assert "xgrammar is an import-only stand-in here" in report["call"], report
    assert proc.stderr.count("using an import-only stand-in") == 1, proc.stderr
