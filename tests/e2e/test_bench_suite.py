"""``python -m sglang_rvv.bench suite --quick`` on the tiny model (real SGLang processes, HF generate), then the report.

One suite run (about 5-6 minutes on 2 cores) feeds every test of this module.
"""

from __future__ import annotations

import json
import os
import platform
import re
import subprocess
import sys
from pathlib import Path

import pytest

from sglang_rvv.bench.results import COLD, WARM, load_run
from sglang_rvv.bench.suite import kernel_threads

SGLANG_RVV = Path(sys.executable).with_name("sglang-rvv")
PROJECTIONS = ("qkv_proj", "o_proj", "gate_up_proj", "down_proj", "lm_head")


@pytest.fixture(scope="module")
def run_dir(tiny_checkpoints, tmp_path_factory) -> Path:
    out = tmp_path_factory.mktemp("bench") / "run"
    progress = out.with_name("suite.stderr")
    with open(progress, "w") as stderr:
        result = subprocess.run(
            [sys.executable, "-m", "sglang_rvv.bench", "suite", "--quick", "--model", str(tiny_checkpoints["llama"]),
             "--out", str(out)], stdout=subprocess.PIPE, stderr=stderr, text=True, timeout=1200)
    assert result.returncode == 0, progress.read_text()[-6000:]
    assert result.stdout.strip() == str(out)  # the run directory, for `sglang-rvv report`
    assert re.search(r"^\[ +\d+\.\d s\] serving on-cold: process start to first token: ", progress.read_text(), re.M)
    return out


def test_every_result_and_its_provenance(run_dir, tiny_checkpoints):
    expected = {
        "one_batch": {"off-cold", "off-warm1", "on-cold", "on-warm1"},
        "start": {"off-cold", "off-warm", "on-cold", "on-warm"},
        "serving": {"off-c1", "off-c2", "on-c1", "on-c2"},
        "kernel": {"linear"},
        "layouts": {"linear"},
        "hf_generate": {"generate"},
        "fleet": {f"{layout}-c{c}" for layout in ("1-replica", "2-replicas-gateway") for c in (1, 2, 4, 8)},
    }
    run = load_run(run_dir)
    assert {kind: set(records) for kind, records in run.results.items()} == expected
    assert run.meta["complete"] is True and run.meta["settings"]["quick"] is True
    prov = run.meta["provenance"]
    assert re.fullmatch(r"[0-9a-f]{40}", prov["source"]["commit"]) and isinstance(prov["source"]["dirty"], bool)
    assert prov["image_id"] is None  # SGLANG_RVV_IMAGE_ID is not set here
    assert any(path.endswith("requirements/lock.txt") for path in prov["lock_sha256"])
    assert prov["model"]["path"] == str(tiny_checkpoints["llama"].resolve())
    assert re.fullmatch(r"[0-9a-f]{64}", prov["model"]["config_sha256"])
    assert prov["cpu_model"] and prov["cpu_count"] >= 1 and prov["omp_num_threads"] >= 1
    assert prov["torch"].startswith("2.") and prov["sglang"]
    for records in run.results.values():
        for record in records.values():
            assert record["provenance"] == prov and len(record["load_average"]) == 3
    assert {r["cache_state"] for r in run.of("one_batch").values()} == {COLD, WARM}
    kernel = run.of("kernel")["linear"]
    # 4 and 8 threads with at least 8 usable CPUs, else every step's one count (OMP_NUM_THREADS)
    threads = kernel_threads(None)
    assert run.meta["settings"]["kernel_threads"] == threads
    assert [entry["threads"] for entry in kernel["runs"]] == (threads or [prov["omp_num_threads"]])
    assert all(entry["results"][0]["rows"] == 1 for entry in kernel["runs"])
    assert kernel["provider"] in ("generic", "rvv", "rvv_prims") and kernel["provider_reason"]
    if platform.machine() != "riscv64":  # no native kernels and no cpuinfo isa line here
        assert kernel["provider"] == "generic"
        assert (kernel["kernel_isa"], kernel["vlen"], kernel["isa"]) == (None, None, None)
    # Every layout has its M=1 cell (--quick: o_proj), measured or named as not available, at the
    # kernel step's thread counts (here the one count every step runs at).
    layout_runs = run.of("layouts")["linear"]["runs"]
    assert [entry["threads"] for entry in layout_runs] == (threads or [prov["omp_num_threads"]])
    assert all(entry["cpus"] for entry in layout_runs)
    cells = layout_runs[0]["results"]
    assert [(c["projection"], c["weight_dtype"], c["rows"]) for c in cells] == [
        ("o_proj", dtype, 1) for dtype in ("bf16", "int8", "int4", "int4_a8")]
    if kernel["provider"] == "generic":  # int4_a8 falls back to int4 there, so its cell says why, untimed
        assert "generic has no kernel that quantizes activations" in cells[3]["not_available"], cells[3]
    assert cells[0]["bytes_per_call"] == 2048 * 2048 * 2 and cells[0]["packed_gbs"] > 0
    assert all("packed_us" in c or c["not_available"] for c in cells)
    assert all(c["eager_us"] > 0 for c in cells if "packed_us" in c)  # the eager call, timed beside the compiled
    generate = run.of("hf_generate")["generate"]
    assert generate["repetitions"] == 1 and generate["input_len"] == 64  # --quick
    assert all(len(generate["modes"][mode]["output_ids"]) == 8 for mode in ("off", "on"))
    assert run.policy_report(generate)["warmup"]["keys"]  # flag on was installed and warmed up


def test_cold_compiles_and_warm_loads_from_the_cache(run_dir):
    run = load_run(run_dir)
    cold, warm = (run.policy_report(run.of("start")[f"on-{state}"]) for state in ("cold", "warm"))
    assert cold["cache_state"] == COLD and warm["cache_state"] == WARM  # the plugin saw the suite's state
    assert cold["warmup"]["compiled"] > 0
    assert warm["warmup"]["compiled"] == 0 and warm["warmup"]["cache_hits"] == len(warm["warmup"]["keys"])
    one_batch_report = run.policy_report(run.of("one_batch")["on-warm1"])
    assert one_batch_report["packed_bytes"] > 0 and one_batch_report["cache_state"] == WARM
    assert run.of("one_batch")["off-cold"]["policy_report"] is None  # flag off: no policy, no report


def test_serving_requests_are_exact_and_counted(run_dir):
    run = load_run(run_dir)
    for name, record in run.of("serving").items():
        assert len(record["requests"]) == 2, name
        for request in record["requests"]:
            assert request["output_tokens"] == len(request["output_ids"]) == 8, name
            assert request["prompt_tokens"] == len(request["prompt_ids"]) == 64 and request["cached_tokens"] == 0
            assert len(request["token_times_s"]) == 8 and request["token_times_s"][0] == request["ttft_s"]
    assert run.of("serving")["off-c1"]["linear_calls"] == {}  # flag off: no policy counters
    for concurrency, bucket in ((1, "1"), (2, "2")):
        calls = run.of("serving")[f"on-c{concurrency}"]["linear_calls"]
        for projection in PROJECTIONS:
            hits = {key: n for key, n in calls.items()
                    if key.startswith(f"{projection}/") and key.endswith(f"/{bucket}")}
            assert hits and all(n > 0 for n in hits.values()), (concurrency, projection, calls)


def test_the_fleet_step_serves_one_url_per_layout_on_split_cpus(run_dir):
    run = load_run(run_dir)
    cpus = sorted(os.sched_getaffinity(0))
    for name, record in run.of("fleet").items():
        assert len(record["requests"]) == max(2, record["concurrency"]), name  # --quick: 2 requests, at least c
        assert all(r["output_tokens"] == 8 and r["cached_tokens"] == 0 for r in record["requests"]), name
        if name.startswith("1-replica"):
            assert (record["replicas"], record["gateway"], record["cpus"]) == (1, False, [cpus])
        else:  # two replicas behind the gateway, each on its own half of the CPUs
            assert (record["replicas"], record["gateway"]) == (2, True)
            assert sorted(record["cpus"][0] + record["cpus"][1]) == cpus and not set(record["cpus"][0]) & set(
                record["cpus"][1])


def test_report_renders_the_run(run_dir):
    result = subprocess.run([str(SGLANG_RVV), "report", str(run_dir)], capture_output=True, text=True, timeout=300)
    assert result.returncode == 0, result.stderr
    markdown = (run_dir / "report.md").read_text()
    assert result.stdout == markdown
    assert "| packed (flag on) | 2 | 2 | 8 |" in markdown  # serving: concurrency 2, 2 requests, 8 tokens each
    # Every judged target has data: the five one-batch/serving/kernel/start/fleet targets, and the
    # layouts step's M=1 read-bandwidth target for each of bf16, int8 and int4.
    assert markdown.count("**met**") + markdown.count("**NOT met**") == 5 + 3
    if platform.machine() != "riscv64":
        assert markdown.count("**not judged: needs a BPI-F3**") == 2
    assert re.search(r"^\| o_proj \| 2048x2048 \| 1 \| [\d.]+ \| [\d.]+ \|", markdown, re.M)  # GB/s per cell
    assert len((run_dir / "metrics.csv").read_text().splitlines()) > 50
    assert re.search(r"^\| 2-replicas-gateway \| [\d,]+ / [\d,]+ \| 8 \| 8 \| [\d.]+ \| [\d.]+ \|", markdown, re.M)
    assert sorted(p.name for p in (run_dir / "plots").glob("*.png")) == [
        "rss.png", "serving_latency.png", "start.png", "tok_s.png"]
    assert json.loads((run_dir / "meta.json").read_text())["schema"] == 1
