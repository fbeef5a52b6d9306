"""The project's RVV kernels: cross-built for the riscv64 image's torch, checked under qemu-user.

images/scripts/build-kernels.sh compiles app/sglang_rvv/kernels/csrc against the riscv64 base
image's rootfs (``podman image mount``) into .cache/kernels/riscv64 (kept while its inputs are
unchanged). rvv_kernel_check.py then runs inside that image once per QEMU CPU model, two
containers at a time: VLEN 256 (the K1; everything), without V (the provider falls back to
generic, and the library, loaded anyway, runs its scalar twins; every numeric case), and 128, 512
and 1024 (VLEN-agnostic), which share the numeric cases out: each runs every third, so each case
runs at one of them, and the whole matrix costs about one run instead of three. Each line it
prints is one test here, so a failure names the run and the shape; and every numeric result must
be the same bits in every run that has it, twins included. qemu's timings say nothing about
speed and are printed only as the test's cost.
"""

from __future__ import annotations

import json
import subprocess
import time
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import pytest
import rvv_kernel_check as check
from image_support import REPO, emulation_missing, lock_get, run

SCRIPTS = REPO / "images" / "scripts"
KERNELS_DIR = REPO / ".cache" / "kernels" / "riscv64"
CHECK_SCRIPT = Path(__file__).with_name("rvv_kernel_check.py")
MIN_SQNR_DB = 35.0
A8_MIN_SQNR_DB = 38.0  # int8 activations: the twins measured 44-47 dB where the weight-only kernel has 55
RUNS = {  # name: (check mode, QEMU_CPU, the share of the numeric cases: "I/N", or "" for all)
    "vlen256": ("full", "rv64,v=true,vlen=256,vext_spec=v1.0", ""),
    "vlen128": ("numeric", "rv64,v=true,vlen=128,vext_spec=v1.0", "0/3"),
    "vlen512": ("numeric", "rv64,v=true,vlen=512,vext_spec=v1.0", "1/3"),
    "vlen1024": ("numeric", "rv64,v=true,vlen=1024,vext_spec=v1.0", "2/3"),  # SpacemiT's K3 (A100 cores) width
    "no-v": ("no-vector", "rv64,v=false", ""),
}
RUN_TIMEOUT = 900
PARALLEL_RUNS = 2  # this machine's cores; each run is mostly one busy qemu thread


@pytest.fixture(scope="module")
def base_image(podman, build_logs) -> str:
    reason = emulation_missing("riscv64")
    if reason:
        pytest.skip(reason)
    run([str(SCRIPTS / "build-base.sh"), "riscv64"], timeout=3600, log=build_logs / "riscv64-build-base.sh.log")
    return f"localhost/sglang-rvv-base:{lock_get('arch.riscv64.debian_suite')}-riscv64"


@pytest.fixture(scope="module")
def kernels_dir(base_image, build_logs) -> Path:
    sysroot = subprocess.run(["podman", "image", "mount", base_image], check=True, capture_output=True,
                             text=True).stdout.strip()
    try:
        run([str(SCRIPTS / "build-kernels.sh"), sysroot, str(KERNELS_DIR)], timeout=1800,
            log=build_logs / "build-kernels.log")
    finally:
        subprocess.run(["podman", "image", "unmount", base_image], capture_output=True)
    return KERNELS_DIR


def _check_run(image: str, kernels_dir: Path, name: str) -> dict[str, dict]:
    """One container: {case: record}, plus "__run__" with its exit code, time and stderr tail."""
    mode, qemu_cpu, share = RUNS[name]
    began = time.monotonic()
    proc = subprocess.run([
        "podman", "run", "--rm", "--init", "--network=none", "-e", f"QEMU_CPU={qemu_cpu}",
        "-e", "PYTHONPATH=/src/app", "-e", "SGLANG_RVV_KERNELS_LIB=/kernels/libsglang_rvv_kernels.so",
        "-v", f"{REPO / 'app'}:/src/app:ro", "-v", f"{kernels_dir}:/kernels:ro",
        "-v", f"{CHECK_SCRIPT}:/check/rvv_kernel_check.py:ro",
        image, "python3", "/check/rvv_kernel_check.py", mode, *([share] if share else []),
    ], capture_output=True, text=True, timeout=RUN_TIMEOUT)
    records = {r["case"]: r for r in (json.loads(line) for line in proc.stdout.splitlines() if line.startswith("{"))}
    seconds = time.monotonic() - began
    lowest = {key: min((r[key] for r in records.values() if key in r), default=None)
              for key in ("sqnr_db", "generic_sqnr_db")}
    print(f"{name} ({mode}): {len(records)} lines in {seconds:.0f} s under qemu, exit {proc.returncode}"
          + (f"; lowest SQNR against fp64 {lowest['sqnr_db']} dB, against the generic provider "
             f"{lowest['generic_sqnr_db']} dB" if lowest["sqnr_db"] is not None else ""))
    records["__run__"] = {"exit": proc.returncode, "seconds": seconds, "stderr": proc.stderr[-3000:]}
    return records


@pytest.fixture(scope="module")
def results(request, base_image, kernels_dir):
    """results(run) -> {case: record}. Every run a selected test needs starts at first use."""
    wanted = set()
    for item in request.session.items:
        if "results" in getattr(item, "fixturenames", ()):
            run_name = item.callspec.params.get("run_name") if hasattr(item, "callspec") else None
            wanted |= {run_name} if run_name else set(RUNS)
    with ThreadPoolExecutor(PARALLEL_RUNS) as pool:
        futures = {name: pool.submit(_check_run, base_image, kernels_dir, name) for name in RUNS if name in wanted}
        yield lambda name: futures[name].result()


def _vlen(run_name: str) -> int:
    return int(RUNS[run_name][1].split("vlen=")[1].split(",")[0])


def _expect(case: str, r: dict, run_name: str, kernels: dict) -> None:
    vector, full = RUNS[run_name][0] != "no-vector", RUNS[run_name][0] == "full"
    if case == "env":
        assert r["torch"] == kernels["torch_version"], (r["torch"], kernels)
        assert r["cxx11_abi"] is True  # what -D_GLIBCXX_USE_CXX11_ABI=1 in the lock assumes
    elif case == "selection":
        if vector:
            assert (r["provider"], r["warnings"]) == ("rvv", []), r
            assert f"rvv vlen={_vlen(run_name)}" in r["reason"], r
        else:
            assert r["provider"] == "generic", r
            assert len(r["warnings"]) == 1 and "no V (vector) extension" in r["warnings"][0], r["warnings"]
    elif case == "kernel isa":
        assert r["isa"] == (f"rvv vlen={_vlen(run_name)}" if vector else "generic"), r
    elif case == "forced rvv":
        if vector:
            assert r.get("provider") == "rvv", r
        else:
            assert r.get("raised") == "RuntimeError", r
            assert "SGLANG_RVV_OP_PROVIDER='rvv' was requested" in r["message"], r
            assert "no V (vector) extension" in r["message"], r
    elif case == "torch mismatch":
        assert r["provider"] == "generic" and len(r["warnings"]) == 1, r
        assert r["built_torch"] in r["warnings"][0] and r["running_torch"] in r["warnings"][0], r["warnings"]
    elif case == "load failure":
        assert r["provider"] == "generic" and len(r["warnings"]) == 1, r
        assert "loading /tmp/" in r["warnings"][0] and "failed: " in r["warnings"][0], r["warnings"]
    elif case == "second library":
        assert r["provider"] == "generic" and len(r["warnings"]) == 1, r
        assert "another kernel library already registered" in r["warnings"][0], r["warnings"]
    elif case == "ops dispatch":
        assert r["pack_equal"] and r["bits_equal"] and r["shape"] == [2, 3, 5, 70], r
    elif case == "compile":
        assert r["fake_shapes"] == [[4, 64, 32], [3, 100]], r
        assert r["extern_call"] and r["compiled_bits_equal"], r
    elif case.startswith("pack "):
        assert r["equal_reference"] and r["round_trip"], r
    elif case.startswith("qpack "):
        assert r["equal_reference"], r
    elif case.startswith("qexact "):
        assert r["bits_equal"], r
    elif case.startswith("qlinear "):
        n, k, m = (int(part.split("=")[1]) for part in case.split()[3:])
        assert r["shape"] == [m, n] and r["dtype"] == "torch.bfloat16", r
        if full:  # against the dequantized weight: the kernel itself is exact up to FP32 accumulation
            assert r["sqnr_db"] >= MIN_SQNR_DB, f"SQNR {r['sqnr_db']} dB against fp64 of the dequantized weight"
    elif case.startswith("a8linear "):
        n, k, m = (int(part.split("=")[1]) for part in case.split()[2:])
        assert r["shape"] == [m, n] and r["dtype"] == "torch.bfloat16", r
        if full:
            assert r["sqnr_db"] >= A8_MIN_SQNR_DB, f"SQNR {r['sqnr_db']} dB against fp64 of the dequantized weight"
    elif case == "a8 special rows":
        if full:  # the other runs must give the same bits (test_same_bits_in_every_run)
            assert r["bits_equal"] and r["nan_rows"] == [0, 1] and r["zero_row"], r
    elif case == "layout refusal":
        names = ("bf16", "int8", "int4", "int4_a8")
        assert {name: r.get(name, "missing") for name in names} == dict.fromkeys(names), r  # it refuses no layout
    elif case == "compile quantized":
        assert r["int8_fake_shapes"] == [[4, 64, 32], "torch.int8", [4, 1, 32], [3, 100]], r
        assert r["int4_fake_shapes"] == [[4, 32, 32], "torch.uint8", [4, 2, 32], [3, 100]], r
        assert r["extern_call"] and r["compiled_bits_equal"], r
    elif case.startswith("linear "):
        n, _, m = (int(part.split("=")[1]) for part in case.split()[1:])
        assert r["shape"] == [m, n] and r["dtype"] == "torch.bfloat16", r
        if full:  # the other runs must give the same bits (test_same_bits_in_every_run)
            assert r["sqnr_db"] >= MIN_SQNR_DB, f"SQNR {r['sqnr_db']} dB against fp64"
            assert r["generic_sqnr_db"] >= MIN_SQNR_DB, f"SQNR {r['generic_sqnr_db']} dB against the generic provider"
    elif case.startswith("bucket "):
        if full:
            assert r["sqnr_db"] >= MIN_SQNR_DB, r
            assert r["bucket"] is None or r["bucket_bits_equal"], r
    elif case in ("threads", "rounding"):
        assert r.get("equal", r.get("bits_equal")), r
    elif case == "special values":
        assert r["nan_equal"] and r["inf_equal"] and r["nan_bits"] == ["0x7fc0"], r
        assert r["finite_sqnr_db"] >= MIN_SQNR_DB, r
    elif case.startswith(("norm ", "silu_mul ")):
        d, rows = (int(part.split("=")[1]) for part in case.split()[1:])
        assert r["shape"] == [rows, d], r
        assert r.get("same_as_contiguous", True), r  # strided halves read as the contiguous copies
        assert r.get("whole_equal", True), r  # silu_and_mul of the unsliced rows: silu_mul's bits
        assert r.get("qk_equal", True), r  # qk_rmsnorm of split heads in place: rmsnorm's bits
        if full:
            assert r["sqnr_db"] >= check.FUSED_MIN_SQNR_DB, r
    elif case.startswith("addnorm "):
        assert r["sum_equal"] and r["norm_equal"], r
        if full:
            assert r["sqnr_db"] >= check.FUSED_MIN_SQNR_DB, r
    elif case.startswith("rotary "):
        batch, q_heads, kv_heads, seq, d, _ = (int(v) for v in case.split()[1].split("x"))
        assert r["shapes"] == [[batch, q_heads, seq, d], [batch, kv_heads, seq, d]], r
        assert r["same_as_contiguous"], r  # a transposed q reads as its contiguous copy
        assert r["at_positions_equal"], r  # SGLang's layout, the cache rows at positions: the same bits
        if full:
            assert r["sqnr_db"] >= check.FUSED_MIN_SQNR_DB, r
    elif case.startswith("attention "):
        batch, q_heads, _, _, d = (int(v) for v in case.split()[1].split("x"))
        assert r["shape"] == [batch, 1, q_heads, d] and r["same_as_contiguous"], r
        if full:
            assert r["sqnr_db"] >= check.FUSED_MIN_SQNR_DB, r
    elif case.startswith("paged attention "):
        assert r["same_as_gathered"] and all(r["same_as_gathered"]), r
    elif case.startswith(("top1 ", "widen ", "residual_add ")):
        # torch.argmax's index, .float()'s and BF16 add's bits; the same in every run (test_same_bits_in_every_run)
        assert r["equal"], r
    elif case == "fused special values":
        assert r["silu"][:4] == ["nan", "inf", "0.0", "-0.0"] and r["silu"][6] == "100.0", r
        assert r["nan_row_all_nan"] and r["finite_row_finite"], r
    elif case == "fused hf":
        # The tiny Llama: 2 layers.
        assert r["fused_ops"] == {"attention": 2, "kv_cache": 2, "layer_list": 1, "layer_step": 2, "residual_add": 2,
                                  "rmsnorm": 2 * 2 + 1, "rotary": 2, "silu_mul": 2, "top1": 1}, r
        assert r["off_fused"] == {} and "rvv kernel library" in r["fused_reason"], r
        assert r["logits_sqnr_db"] >= 30.0, r
        # Three decode steps of 2 layers by the one-frame step: the modules' bits.
        assert r["layer_step_bits_equal"] and r["layer_steps_taken"] == 3 * 2, r
    elif case == "native entry":
        # Every memoised packed call of the tiny Llama goes through the entry, and a weight
        # updated in place is re-planned.
        assert r["memoised"] > 0 and r["planned"] == r["memoised"] and r["o_proj_planned"], r
        assert r["c_methods"] == ["method_descriptor", "method_descriptor"], r
        assert r["bits_equal"] and r["stale_refused"] and r["replanned_bits_equal"], r
    elif case.startswith("error "):
        expected = "LayoutError" if case.startswith("error ops ") else "RuntimeError"
        assert r["raised"] == expected, r
        if expected == "RuntimeError":
            assert r["message"].startswith("sglang_rvv_native::"), r
    else:
        raise AssertionError(f"no expectation for case {case!r}")


PLANNED = {name: [case for case, _ in check.plan(mode, share)] for name, (mode, _, share) in RUNS.items()}
CASES = [pytest.param(name, case, id=f"{name}: {case}") for name, cases in PLANNED.items() for case in cases]
NUMERIC = [case for case in PLANNED["no-v"] if case.startswith(check.NUMERIC_PREFIXES)]


@pytest.mark.parametrize("run_name,case", CASES)
def test_check(results, kernels_dir, run_name, case):
    records = results(run_name)
    record = records.get(case)
    assert record is not None, (f"{run_name}: no line for {case!r} (exit {records['__run__']['exit']})\n"
                                f"{records['__run__']['stderr']}")
    assert "exception" not in record, f"{run_name}: {case}: {record['exception']}"
    _expect(case, record, run_name, json.loads((kernels_dir / "kernels.json").read_text()))


def test_every_numeric_case_runs_at_vlen_256_without_v_and_at_one_further_vlen():
    sampled = [name for name, (_, _, share) in RUNS.items() if share]
    assert NUMERIC and set(NUMERIC) <= set(PLANNED["vlen256"])
    for case in NUMERIC:
        assert sum(case in PLANNED[name] for name in sampled) == 1, case
    for name in sampled:  # the cases that are not numeric (the selection, the errors) run everywhere
        assert [c for c in PLANNED[name] if c not in NUMERIC] == [c for c in PLANNED["no-v"] if c not in NUMERIC]


@pytest.mark.parametrize("case", NUMERIC)
def test_same_bits_in_every_run(results, case):
    """VLEN 256, the further VLEN that ran the case (128, 512 or 1024) and the scalar twin give the
    same bits (one FMA chain per output, in k order)."""
    digests = {name: results(name).get(case, {}).get("digest") for name in RUNS if case in PLANNED[name]}
    assert len(digests) == 3 and None not in digests.values() and len(set(digests.values())) == 1, digests
