"""The microbenchmarks at several thread counts: each count in a fresh process, pinned to as many
CPUs (bench/threads.py), as `make reproduce` runs them on the K1 at 4 (one cluster) and 8."""

import json
import os
import subprocess
import sys

from sglang_rvv.bench import threads


def test_a_count_is_pinned_to_the_first_cpus_of_the_mask_and_a_larger_one_is_not():
    mask = sorted(os.sched_getaffinity(0))
    assert threads.first_cpus(1) == mask[:1]
    assert threads.first_cpus(len(mask)) == mask
    assert threads.first_cpus(len(mask) + 1) is None
    assert threads.span([0, 1, 2, 3]) == "0-3" and threads.span([4]) == "4" and threads.span([0, 2]) == "0,2"


def test_layouts_at_two_counts_runs_each_pinned_in_a_process_of_its_own(tmp_path):
    mask = sorted(os.sched_getaffinity(0))
    out = tmp_path / "layouts.json"
    # One small cell (bf16 o_proj, 2048 x 2048; about 30 s a process here), at 1 thread, then at one
    # more thread than the mask has CPUs: the second is not pinned.
    counts = [1, len(mask) + 1]
    proc = subprocess.run([sys.executable, "-m", "sglang_rvv.bench", "layouts", "--weight-dtypes", "bf16",
                           "--projections", "o_proj", "--rows", "1", "--min-time", "0.01",
                           "--threads", ",".join(map(str, counts)), "--json", str(out)],
                          capture_output=True, text=True, timeout=900)
    assert proc.returncode == 0, proc.stderr[-3000:]
    runs = json.loads(out.read_text())["runs"]
    assert [(r["threads"], r["cpus"]) for r in runs] == [(1, mask[:1]), (len(mask) + 1, mask)]
    for run in runs:
        assert [(r["weight_dtype"], r["rows"]) for r in run["results"]] == [("bf16", 1)]
        assert run["results"][0]["packed_us"] > 0
    assert f"# threads=1, in a process of its own (CPUs {mask[0]})" in proc.stdout
    assert f"unpinned: the mask has only {len(mask)} CPUs" in proc.stdout


def test_a_failing_count_names_itself():
    proc = subprocess.run([sys.executable, "-m", "sglang_rvv.bench", "layouts", "--projections", "o_proj",
                           "--rows", "x", "--threads", "1,2"], capture_output=True, text=True, timeout=300)
    assert proc.returncode != 0
    assert "the layouts run at threads=1 failed with exit code" in proc.stderr
