"""llama.cpp measured on the board beside the suite (peer-bench.json, make reproduce's peer step):
llama-bench's records become one row per build, path, format and thread count, the ratios ours /
llama.cpp pair layouts with formats of their width, and a file the report cannot read is one line
while the rest of the report stands. No build, no board: the records are llama-bench's JSON fields."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from sglang_rvv.bench import results
from sglang_rvv.bench.report import peer_bench, write_report
from sglang_rvv.bench.results import WARM, load_run

PROVENANCE = {"host": "bpi-f3", "machine": "riscv64", "cpu_count": 8, "usable_cpus": 8, "omp_num_threads": 4}
MODELS = [{"format": "Q4_0", "file": "qwen3-0.6b-Q4_0.gguf"}, {"format": "Q8_0", "file": "qwen3-0.6b-Q8_0.gguf"}]


def record(model: str, threads: int, repack: bool, prompt: int, gen: int, tok_s: float) -> dict:
    """One llama-bench JSON record, the fields the report reads and a few it ignores."""
    return {"build_commit": "unknown", "backends": "CPU", "model_filename": f"/var/lib/sglang-rvv/peer/gguf/{model}",
            "n_threads": threads, "cpu_mask": "0x0", "repack": repack, "n_prompt": prompt, "n_gen": gen,
            "n_depth": 0, "avg_ns": int(1e9 * max(prompt, gen) / tok_s), "avg_ts": tok_s, "stddev_ts": 0.1,
            "samples_ts": [tok_s]}


def run_entry(build: str, threads: int, cpus: str, tok_s: dict) -> dict:
    """One llama-bench run as the role writes it: {(format, repack): (tg, pp)} tok/s."""
    paths = {"1": "ime"} if build == "ime" else {"1": "repack", "0": "vec_dot"}
    files = {m["format"]: m["file"] for m in MODELS}
    records = []
    for (fmt, repack), (tg, pp) in tok_s.items():
        records += [record(files[fmt], threads, repack, 128, 0, pp), record(files[fmt], threads, repack, 0, 128, tg)]
    return {"build": build, "paths": paths, "threads": threads, "cpus": cpus, "argv": ["llama-bench"],
            "results": records}


def peer_bench_json() -> dict:
    return {"schema": 1, "host": "bpi-f3", "shape": "qwen3-0.6b", "prompt": 128, "gen": 128, "models": MODELS,
            "runs": [run_entry("ime", 4, "0-3", {("Q4_0", True): (11.7, 49.2), ("Q8_0", True): (7.0, 30.0)}),
                     run_entry("rvv", 8, "", {("Q4_0", True): (10.0, 40.0), ("Q4_0", False): (8.0, 12.5),
                                              ("Q8_0", True): (6.0, 20.0), ("Q8_0", False): (5.0, 10.0)})]}


def make_run(root: Path, *, served=(100.0, 12.0), hf_layouts=None, peer=None) -> Path:
    """A run with the served one-batch (flag on, warm: prefill, decode tok/s), HF generate per
    quantized layout ({layout: (prefill, decode)}) and peer-bench.json."""
    run_dir = root / "run"
    results.write_meta(run_dir, {"suite": results.SUITE_COMMAND, "host": "bpi-f3", "started_utc": "run",
                                 "complete": True, "seconds": 1.0, "provenance": PROVENANCE, "settings": {}})
    for index, spread in ((1, -1.0), (2, 0.0), (3, 1.0)):
        result = {"prefill_throughput": served[0] + spread, "median_decode_throughput": served[1] + spread,
                  "overall_throughput": 1.0, "wall_s": 1.0, "peak_rss_mib": 1.0}
        results.write_result(run_dir, "one_batch", f"on-warm{index}", PROVENANCE, WARM, mode="on", run=index,
                             input_len=64, output_len=8, result=result)
    if hf_layouts:
        modes = {"off": {"prefill_s": [1.0], "full_s": [2.0], "output_ids": [1]},
                 **{f"on-{name}": {"prefill_s": [64 / pre], "full_s": [64 / pre + 7 / dec], "output_ids": [1]}
                    for name, (pre, dec) in hf_layouts.items()}}
        results.write_result(run_dir, "hf_generate", "generate", PROVENANCE, None, input_len=64, output_len=8,
                             repetitions=1, modes=modes)
    if peer is not None:
        (run_dir / peer_bench.FILE).write_text(json.dumps(peer))
    return run_dir


def test_one_row_per_build_path_format_and_threads_with_tg_and_pp():
    rows = {(r.engine, r.path, r.fmt, r.threads): (r.decode, r.prefill, r.cpus)
            for r in peer_bench.peer_rows(peer_bench_json())}
    assert rows == {
        ("llama.cpp ime", "ime", "Q4_0", 4): (11.7, 49.2, "0-3"),
        ("llama.cpp ime", "ime", "Q8_0", 4): (7.0, 30.0, "0-3"),
        ("llama.cpp rvv", "repack", "Q4_0", 8): (10.0, 40.0, ""),
        ("llama.cpp rvv", "vec_dot", "Q4_0", 8): (8.0, 12.5, ""),
        ("llama.cpp rvv", "repack", "Q8_0", 8): (6.0, 20.0, ""),
        ("llama.cpp rvv", "vec_dot", "Q8_0", 8): (5.0, 10.0, ""),
    }


@pytest.mark.parametrize(("fmt", "bits"), [("Q4_0", 4), ("Q4_K_M", 4), ("int4_a8", 4), ("int4", 4), ("Q8_0", 8),
                                           ("int8", 8), ("bf16", None), ("F16", None)])
def test_width_of_a_format_or_layout(fmt, bits):
    assert peer_bench.width(fmt) == bits


def test_ratios_pair_each_layout_with_the_formats_of_its_width_and_the_served_path_with_all(tmp_path):
    run = load_run(make_run(tmp_path, hf_layouts={"int4": (80.0, 14.0), "int8": (90.0, 9.0)}))
    ours = peer_bench.our_rows(run)
    assert [(o.path, o.threads, o.prompt) for o in ours] == [
        (peer_bench.SERVED, 4, 64), ("HF generate, int4 packed", 4, 64), ("HF generate, int8 packed", 4, 64)]
    assert ours[0].decode == pytest.approx(12.0) and ours[0].prefill == pytest.approx(100.0)
    pairs = peer_bench.ratio_rows(ours, peer_bench.peer_rows(peer_bench_json()))
    by = {(p["ours"].fmt, p["peer"].path, p["peer"].fmt): (p["decode"], p["prefill"]) for p in pairs}
    assert len(by) == 6 + 3 + 3
    assert by[("bf16", "vec_dot", "Q8_0")] == (pytest.approx(12.0 / 5.0), pytest.approx(100.0 / 10.0))
    assert by[("int4", "ime", "Q4_0")] == (pytest.approx(14.0 / 11.7), pytest.approx(80.0 / 49.2))
    assert by[("int8", "repack", "Q8_0")] == (pytest.approx(9.0 / 6.0), pytest.approx(90.0 / 20.0))
    assert ("int4", "ime", "Q8_0") not in by and ("int8", "vec_dot", "Q4_0") not in by


def test_the_report_prints_the_measured_table_and_ratios_labelled_as_measured(tmp_path):
    run_dir = make_run(tmp_path, peer=peer_bench_json())
    markdown = write_report([load_run(run_dir)], run_dir)
    section = markdown[markdown.index("## llama.cpp on the board"):]
    assert "measured on the board" in section and "modelled" not in section
    assert "| llama.cpp rvv | vec_dot | Q4_0 | 8 | any | 8.00 | 12.50 |" in section
    assert "| llama.cpp ime | ime | Q4_0 | 4 | 0-3 | 11.70 | 49.20 |" in section
    # served decode 12 against ime Q4_0's 11.7, its prefill 100 (at 64 tokens) against pp128 49.2
    assert f"| {peer_bench.SERVED} | 4 | 12.00 | 100.00 (64) | llama.cpp ime ime Q4_0 | 4 | 1.03 | 2.03 |" in section


def test_a_run_without_peer_bench_json_has_no_section(tmp_path):
    assert peer_bench.render(load_run(make_run(tmp_path))) == ""


def test_a_run_without_our_numbers_still_shows_llama_cpp_and_says_why_there_are_no_ratios(tmp_path):
    run_dir = make_run(tmp_path, peer=peer_bench_json())
    for path in (run_dir / "one_batch").iterdir():
        path.unlink()
    section = peer_bench.render(load_run(run_dir))
    assert "| llama.cpp rvv | repack | Q8_0 | 8 | any | 6.00 | 20.00 |" in section
    assert "No ours / llama.cpp ratios" in section


@pytest.mark.parametrize(("break_it", "needle"), [
    (lambda d: d.update(schema=2), "peer-bench.json: schema 2, this report reads 1: "),
    (lambda d: d["runs"][0].pop("results"), "peer-bench.json is not llama-bench's runs as make reproduce writes"),
])
def test_an_unreadable_peer_bench_json_is_one_line_and_the_report_stands(tmp_path, break_it, needle):
    data = peer_bench_json()
    break_it(data)
    run_dir = make_run(tmp_path, peer=data)
    markdown = write_report([load_run(run_dir)], run_dir)
    section = markdown[markdown.index("## llama.cpp on the board"):].strip().splitlines()
    assert len(section) == 3 and section[2].startswith("Not shown: ") and needle in section[2], section
