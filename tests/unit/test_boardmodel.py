"""The board model's host half: attribution of count tables by maps, mark differences, the model's
arithmetic, the rootfs symlink rewrite and the pinned-input refusals (no qemu needed)."""

from __future__ import annotations

import os
from dataclasses import asdict

import pytest

from sglang_rvv.boardmodel import counts, model, rootfs, run, tool
from sglang_rvv.tiny import REAL_SHAPES

MAPS = """\
00010000-00020000 r-xp 00000000 08:01 1 /R/usr/bin/python3.14
00020000-00030000 rw-p 00000000 08:01 1 /R/usr/bin/python3.14
40000000-40100000 r-xp 00000000 08:01 2 /R/opt/venv/sglang_rvv/kernels/lib/libsglang_rvv_kernels.so
50000000-50100000 r-xp 00000000 08:01 3 /R/usr/lib/riscv64-linux-gnu/libtorch_cpu.so.2.14
60000000-60100000 r-xp 00000000 08:01 4 /R/usr/lib/riscv64-linux-gnu/libc.so.6
70000000-70001000 r-xp 00000000 00:00 0 [vdso]
"""


def table(*marks: tuple[str, list[str]]) -> str:
    body = [counts.FORMAT]
    for name, rows in marks:
        body += [f"mark {name}", *rows, "end"]
    return "\n".join(body) + "\n"


def test_blocks_are_attributed_by_the_guests_executable_mappings():
    maps = counts.Maps.parse(MAPS)
    assert maps.library_of(0x10004) == "python3.14"
    assert maps.library_of(0x20004) == "[unmapped]"  # a data mapping attributes nothing
    assert maps.library_of(0x400ffff) == "[unmapped]"
    assert maps.library_of(0x40000000) == "libsglang_rvv_kernels.so"
    assert maps.library_of(0x70000010) == "[vdso]"
    assert [counts.component_of(n) for n in ("libsglang_rvv_kernels.so", "libtorch_cpu.so.2.14",
                                             "libc10.so", "python3.14", "libpython3.14.so.1.0",
                                             "libgomp.so.1", "libc.so.6", "libm.so.6", "libcrypt.so.1")] \
        == ["kernel", "torch", "torch", "interpreter", "interpreter", "libgomp", "libc", "libm", "other"]


def test_a_step_is_the_difference_of_two_marks_per_library_and_component():
    # vaddr n_insns n_vec n_vload execs vec_lmul8 vec_unknown vload_bytes
    text = table(("1", ["10000 5 0 0 10 0 0 0", "40000000 8 4 2 1 64 0 128"]),
                 ("2", ["10000 5 0 0 30 0 0 0", "40000000 8 4 2 4 260 1 512", "60000000 3 0 0 7 0 0 0"]))
    tables = counts.parse_tables(text, counts.Maps.parse(MAPS))
    step = tables["2"].minus(tables["1"])
    assert step.libraries["python3.14"]["insns"] == 100
    kernel = step.libraries["libsglang_rvv_kernels.so"]
    assert kernel == {"insns": 24, "vec_insns": 12, "vec_lmul": 24.5, "vec_unknown_lmul": 1,
                      "vec_loads": 6, "vec_load_bytes": 384}
    by = step.by_component()
    assert by["libc"]["insns"] == 21 and by["torch"]["insns"] == 0
    assert set(by) == set(counts.COMPONENT_NAMES)
    assert step.total("insns") == 145


def test_a_table_of_another_format_or_cut_short_is_refused_by_name():
    maps = counts.Maps.parse(MAPS)
    with pytest.raises(counts.CountError, match="not a count table of format"):
        counts.parse_tables("count-table 0\n", maps)
    with pytest.raises(counts.CountError, match="mark 3 is cut short"):
        counts.parse_tables(counts.FORMAT + "\nmark 3\n10000 1 0 0 1 0 0 0\n", maps)
    with pytest.raises(counts.CountError, match="no executable mapping"):
        counts.Maps.parse("00010000-00020000 rw-p 00000000 08:01 1 /x\n")


def zero(**values):
    return {**dict.fromkeys(counts.FIELDS, 0), **values}


def test_the_model_overlaps_the_kernel_with_its_stream_and_adds_the_rest_serially():
    f = model.c("freq_hz")
    step = {name: zero() for name in counts.COMPONENT_NAMES}
    step["kernel"] = zero(insns=1_000_000, vec_insns=800_000, vec_lmul=800_000)
    step["interpreter"] = zero(insns=7_000_000)
    weight = 45_000_000  # 10 ms at 4.5 GB/s
    p = model.predict(step, weight)
    kernel_s = (200_000 / model.c("ipc_kernel") + 800_000 * 2) / f / model.c("kernel_threads")
    assert p["component_seconds"]["kernel"] == pytest.approx(kernel_s)
    assert p["weight_stream_seconds"] == pytest.approx(0.01)
    assert p["bound"] == "weight stream"
    assert p["seconds_per_token"] == pytest.approx(0.01 + 7_000_000 / 0.7 / f)
    assert p["tok_per_s"] == pytest.approx(1 / p["seconds_per_token"])


def test_every_constant_names_its_source_or_says_assumption():
    for name, constant in model.CONSTANTS.items():
        assert constant.source and constant.unit, name
    for name in counts.COMPONENT_NAMES:
        assert f"ipc_{name}" in model.CONSTANTS
    assert all("assumption" in model.CONSTANTS[n].source for n in model.CONSTANTS if n.startswith("ipc_"))


def test_weight_bytes_of_qwen3_0_6b_are_its_projections_and_head_at_bf16():
    # The packed_bytes the policy reports for Qwen3-0.6B (1,191,968,768 B) is exactly these bytes:
    # every projection (k/v's N=1024 passes the gate too, so all of them), plus lm_head.
    assert model.weight_bytes_bf16(run.shape("qwen3-0.6b")) == 1_191_968_768


def test_a_quantized_layout_streams_its_packed_bytes_not_its_bf16_source_again():
    # int4 Qwen3-0.6B, every projection packed (lm_head int8): the 1.19 GB of BF16 they replaced
    # leave the stream, and the packed buffers the report counts (0.40 GB, scales included) take
    # their place; the kernel's loads of what the caches hold (its activation panel, its group
    # sums: 0.50 GB of loads in all) are not streamed.
    shape = run.shape("qwen3-0.6b")
    bf16 = model.weight_bytes_bf16(shape)
    assert model.streamed_bytes(shape, bf16, 403_612_416) == 403_612_416
    # A layout that packed only part of the model streams the rest at BF16.
    assert model.streamed_bytes(shape, bf16 - 1000, 403_612_416) == 403_612_416 + 1000


def test_the_locked_shapes_are_the_ones_the_package_knows():
    for name, shape in REAL_SHAPES.items():
        assert run.shape(name) == shape
    assert run.shape("tiny")["hidden_size"] == 1024
    with pytest.raises(tool.ToolError, match="no model shape 'gpt-9'"):
        run.shape("gpt-9")


def test_absolute_symlinks_become_relative_inside_the_copy(tmp_path):
    (tmp_path / "usr/lib").mkdir(parents=True)
    (tmp_path / "etc/alternatives").mkdir(parents=True)
    (tmp_path / "usr/lib/libblas.so.3.real").write_text("blas")
    (tmp_path / "etc/alternatives/libblas.so.3").symlink_to("/usr/lib/libblas.so.3.real")
    (tmp_path / "usr/lib/libblas.so.3").symlink_to("/etc/alternatives/libblas.so.3")
    (tmp_path / "usr/lib/rel").symlink_to("libblas.so.3.real")
    assert rootfs.relativize_symlinks(tmp_path) == 2
    assert os.readlink(tmp_path / "usr/lib/libblas.so.3") == "../../etc/alternatives/libblas.so.3"
    assert os.readlink(tmp_path / "usr/lib/rel") == "libblas.so.3.real"
    assert (tmp_path / "usr/lib/libblas.so.3").read_text() == "blas"


def test_a_changed_plugin_source_or_another_qemu_package_is_refused_by_name(monkeypatch):
    pins = dict(tool.pins())
    assert tool.check_source(pins) == tool.sha256(tool.SOURCE)
    with pytest.raises(tool.ToolError, match=r"count\.c has sha256 .* pins 0{64}"):
        tool.check_source({**pins, "plugin_source_sha256": "0" * 64})
    monkeypatch.setattr(tool, "installed_version", lambda package: "1:8.0")
    with pytest.raises(tool.ToolError, match=r"qemu-user 1:8\.0 is installed, .* pins 1:7\.2"):
        tool.check_qemu(pins)
    monkeypatch.setattr(tool, "installed_version", lambda package: None)
    with pytest.raises(tool.ToolError, match="qemu-user is not installed: apt-get install qemu-user="):
        tool.check_qemu(pins)


def test_a_plugin_built_for_another_qemu_is_refused(tmp_path):
    stamp = tmp_path / tool.STAMP
    stamp.write_text('{"qemu_package_version": "1:7.1"}')
    tool.check_stamp(stamp, "1:7.1")
    with pytest.raises(tool.ToolError, match=r"built for qemu-user 1:7\.1, the installed one is 1:7\.2"):
        tool.check_stamp(stamp, "1:7.2")


def test_the_report_section_labels_the_model_and_stacks_its_groups(tmp_path):
    from sglang_rvv.bench.report import board
    from sglang_rvv.jsonfile import write_json

    step = {name: zero() for name in counts.COMPONENT_NAMES}
    step["kernel"] = zero(insns=157_000_000, vec_insns=150_000_000, vec_lmul=150_000_000,
                          vec_loads=18_624_512, vec_load_bytes=1_191_968_768)
    step["torch"], step["interpreter"] = zero(insns=56_000_000), zero(insns=35_000_000)
    step["libc"] = zero(insns=33_000_000)
    weight = model.streamed_bytes(run.shape("qwen3-0.6b"), 1_191_968_768, 1_191_968_768)
    work = {"workload": {"name": "qwen3-0.6b", "policy": True, "weight_dtype": "bf16"}, "per_token": step,
            "weight_bytes": weight, "prediction": model.predict(step, weight)}
    write_json(tmp_path / board.FILE, {"workloads": [work], "anchors": list(model.ANCHORS), "skipped": {},
                                       "constants": model.constants_json(), "per_token_phase": "decode2",
                                       "tool": {"qemu_cpu": "rv64,v=true,vlen=256"}})
    text = board.render(tmp_path, tmp_path)
    assert board.LABEL in text and "1.02 tok/s" in text and "assumption" in text
    row = next(line for line in text.splitlines() if line.startswith("| qwen3-0.6b"))
    # kernel / torch ops / interpreter / other (libc), then the kernel's loads and bytes
    assert "| 157.0 | 56.0 | 35.0 | 33.0 | 18.62 | 1192.0 | 1192.0 |" in row
    assert board.grouped_seconds(work["prediction"])["kernel"] == pytest.approx(weight / 4.5e9)
    assert (tmp_path / "plots" / "board-model.png").stat().st_size > 1000
    assert board.render(tmp_path / "plots", tmp_path) == ""  # no board-model.json: no section


def test_a_boards_counters_sit_beside_the_models_figures_for_the_same_workload(tmp_path):
    from sglang_rvv.bench.report import board
    from sglang_rvv.jsonfile import write_json

    step = {name: zero() for name in counts.COMPONENT_NAMES}
    step["kernel"] = zero(insns=100_000_000, vec_insns=90_000_000, vec_lmul=90_000_000)
    step["interpreter"] = zero(insns=50_000_000)
    prediction = model.predict(step, 1_000_000)
    # kernel: 10 M scalar at IPC 1 + 90 M LMUL-1 vector ops at VLEN/DLEN 2; interpreter at 0.7
    modelled = 10e6 + 180e6 + 50e6 / 0.7
    assert prediction["cycles_one_thread"] == pytest.approx(modelled)
    work = {"workload": {"name": "qwen3-0.6b", "policy": True, "weight_dtype": "int4"}, "label": "qwen3-0.6b-int4",
            "per_token": step, "weight_bytes": 1_000_000, "prediction": prediction}
    measured = {"label": "measured on this machine", "host": "k1", "machine": "riscv64", "isa": "rv64imafdcv",
                "per_token_phase": "decode2", "unavailable": None, "skipped": {},
                "workloads": [{"workload": work["workload"], "label": "qwen3-0.6b-int4",
                               "per_token": {"seconds": 0.25, "instructions": 165_000_000,
                                             "cycles": 2 * modelled}}]}
    write_json(tmp_path / board.COUNTERS_FILE, measured)
    alone = board.render(tmp_path, tmp_path)
    assert "## Board counters" in alone and "## Board model\n" not in alone
    assert "make board-model RUN=<this run directory>" in alone
    row = next(line for line in alone.splitlines() if line.startswith("| qwen3-0.6b"))
    assert "| 250.0 | 165.0 | 522.9 | 0.32 | not counted | n/a |" in row
    write_json(tmp_path / board.FILE, {"workloads": [work], "anchors": [], "skipped": {}, "constants": {},
                                       "per_token_phase": "decode2", "tool": {"qemu_cpu": "rv64"}})
    both = board.render(tmp_path, tmp_path)
    row = next(line for line in both.splitlines() if line.startswith("| qwen3-0.6b") and "| 250.0 |" in line)
    # board / emulated instructions 1.10; board / modelled cycles 2.00; the model's IPC 150 M / 261.4 M
    assert row.endswith("| 150.0 | 1.10 | 261.4 | 2.00 | 0.57 |")
    clock_only = {**measured["workloads"][0], "per_token": {"seconds": 0.25}}
    write_json(tmp_path / board.COUNTERS_FILE, {**measured, "unavailable": "perf_event_open(instructions): refused",
                                                "workloads": [clock_only]})
    refused = board.render(tmp_path, tmp_path)
    assert "No counts: perf_event_open(instructions): refused." in refused
    assert "| 250.0 | not counted | not counted | n/a | 150.0 | n/a | 261.4 | n/a | 0.57 |" in refused


def fake_rootfs(root, torch_version, source_sha256):
    arch = tool.lock()["arch"]["riscv64"]
    (root / "usr/bin").mkdir(parents=True)
    (root / f"usr/bin/python{arch['python']}").write_text("")
    (root / "usr/lib/python3/dist-packages/torch").mkdir(parents=True)
    (root / "usr/lib/python3/dist-packages/torch/version.py").write_text(f"__version__ = '{torch_version}'\n")
    lib = rootfs.site_packages(root) / "sglang_rvv" / "kernels" / "lib"
    lib.mkdir(parents=True)
    (lib / "kernels.json").write_text(f'{{"source_sha256": "{source_sha256}", "compiler": "clang-19"}}')


def test_a_rootfs_whose_torch_or_kernel_library_differs_from_the_lock_is_refused(tmp_path):
    arch = tool.lock()["arch"]["riscv64"]
    good = tmp_path / "good"
    fake_rootfs(good, arch["torch"]["version"] + "+debian", arch["kernels"]["source_sha256"])
    assert rootfs.check(good)["kernels"]["compiler"] == "clang-19"
    old_torch = tmp_path / "old-torch"
    fake_rootfs(old_torch, "2.6.0", arch["kernels"]["source_sha256"])
    with pytest.raises(tool.ToolError, match=r"torch 2\.6\.0 does not match images/lock\.toml"):
        rootfs.check(old_torch)
    other_kernels = tmp_path / "other-kernels"
    fake_rootfs(other_kernels, arch["torch"]["version"], "f" * 64)
    with pytest.raises(tool.ToolError, match="kernel sources f{64} differ from"):
        rootfs.check(other_kernels)


def test_the_empty_proc_and_sys_of_the_copy_go_so_the_guest_sees_the_hosts(tmp_path):
    for name in ("proc", "sys", "dev"):
        (tmp_path / name).mkdir()
    (tmp_path / "dev" / "null").write_text("")
    rootfs.use_host_pseudo_filesystems(tmp_path)
    assert sorted(p.name for p in tmp_path.iterdir()) == ["dev"]
    rootfs.use_host_pseudo_filesystems(tmp_path)  # again: nothing left to do


def test_a_served_token_is_the_long_request_less_the_short_one_and_the_idle_rate(tmp_path):
    from sglang_rvv.boardmodel import serving
    from sglang_rvv.jsonfile import write_json

    # One process (the scheduler; the other two roles copy it): cumulative python instructions at
    # marks 1..4: idle 60 s runs 6 M (100 k/s); the short request (4 tokens, 10 s) 50 M; the long
    # one (12 tokens, 30 s) 130 M: (130 - 50 - 0.1 x 20) / 8 = 9.75 M a token.
    cumulative = [1_000_000, 7_000_000, 57_000_000, 187_000_000]
    text = table(*((str(n + 1), [f"10000 1 0 0 {value} 0 0 0"]) for n, value in enumerate(cumulative)))
    for pid, role in ((11, "scheduler"), (12, "http"), (13, "detokenizer")):
        (tmp_path / f"{pid}.count").write_text(text)
        (tmp_path / f"{pid}.maps").write_text(MAPS)
        write_json(tmp_path / f"{pid}.json", {"pid": pid, "role": role, "marks": serving.MARKS})
    out = serving._attribute(tmp_path, 4, 12, {"idle": 60.0, "request1": 10.0, "request2": 30.0})
    assert sorted(out) == sorted(serving.ROLES)
    scheduler = out["scheduler"]
    assert scheduler["idle_per_second"]["interpreter"]["insns"] == pytest.approx(100_000)
    assert scheduler["per_token"]["interpreter"]["insns"] == pytest.approx(9_750_000)
    assert scheduler["per_token_raw"]["interpreter"]["insns"] == pytest.approx(10_000_000)
    assert scheduler["per_token"]["kernel"]["insns"] == 0
    (tmp_path / "13.json").write_text('{"pid": 13, "role": "detokenizer", "marks": 3}')
    with pytest.raises(tool.ToolError, match="no counts of the server's detokenizer"):
        serving._attribute(tmp_path, 4, 12, {"idle": 60.0, "request1": 10.0, "request2": 30.0})


def test_the_report_shows_the_served_token_per_process(tmp_path):
    from sglang_rvv.bench.report import board
    from sglang_rvv.boardmodel.__main__ import priced_serving

    step = {name: zero() for name in counts.COMPONENT_NAMES}
    step["kernel"], step["torch"], step["interpreter"] = zero(insns=7_500_000), zero(insns=3_600_000), \
        zero(insns=2_900_000)
    http = {**step, "kernel": zero(), "torch": zero()}
    served = priced_serving({"model": "tiny-llama", "short": 4, "long": 12, "processes": {
        "scheduler": {"per_token": step, "per_token_raw": {**step, "interpreter": zero(insns=3_900_000)},
                      "thread_estimate": 14_500_000},
        "http": {"per_token": http, "per_token_raw": http}}})
    assert served["processes"]["scheduler"]["outside_kernel_insns"] == 6_500_000
    # 6.5 M instructions at IPC 0.7 and 1.6 GHz: 5.8 ms on one core
    assert served["processes"]["scheduler"]["rest_seconds"] == pytest.approx(6.5e6 / 0.7 / 1.6e9)
    # The threads' 14.5 M less the kernel's 7.5 M: 7 M, 6.2 ms.
    assert served["processes"]["scheduler"]["thread_outside_kernel_insns"] == 7_000_000
    text = board.serving_section(served)
    assert "| scheduler | 7.50 | 3.60 | 2.90 | 0.00 | 6.50 | 7.50 | 5.8 | 7.00 | 6.2 |" in text
    assert "| http | 0.00 | 0.00 | 2.90 | 0.00 | 2.90 | 2.90 | 2.6 | not counted | not counted |" in text


def test_a_served_token_is_the_main_threads_count_and_the_others_less_their_polling(tmp_path):
    from sglang_rvv.boardmodel import serving
    from sglang_rvv.jsonfile import write_json

    # threads=1 rows at marks 1..4 (cumulative). vCPU 0, the main thread: idle 60 s runs 0.6 M
    # (10 k/s), the short request (4 tokens) 50 M, the long one (12) 130 M: 80 M / 8 tokens = 10 M
    # a token, all of it the token's. vCPU 3 polls: 6 M idle (100 k/s), then 1 M and 4 M: 0.375 M
    # a token, less its idle rate x 2.5 s a token (0.25 M): 0.125 M. vCPU 5 ran less than its
    # polling would: 0.
    thread_rows = {0: [0, 600_000, 50_600_000, 180_600_000], 3: [0, 6_000_000, 7_000_000, 11_000_000],
                   5: [0, 6_000_000, 6_000_001, 6_000_002]}
    marks = [(str(n + 1), ["10000 1 0 0 1 0 0 0", *(f"thread {v} {rows[n]}" for v, rows in thread_rows.items())])
             for n in range(4)]
    (tmp_path / "11.count").write_text(table(*marks))
    for pid, role in ((11, "scheduler"), (12, "http"), (13, "detokenizer")):
        if pid != 11:
            (tmp_path / f"{pid}.count").write_text(table(*((str(n + 1), ["10000 1 0 0 1 0 0 0"]) for n in range(4))))
        (tmp_path / f"{pid}.maps").write_text(MAPS)
        write_json(tmp_path / f"{pid}.json", {"pid": pid, "role": role, "marks": serving.MARKS})
    out = serving._attribute(tmp_path, 4, 12, {"idle": 60.0, "request1": 10.0, "request2": 30.0})
    threads = out["scheduler"]["threads"]
    assert threads[0]["per_token"] == threads[0]["per_token_raw"] == pytest.approx(10_000_000)
    assert threads[3]["per_token_raw"] == pytest.approx(375_000) and threads[3]["per_token"] == pytest.approx(125_000)
    assert threads[5]["per_token"] == 0
    assert out["scheduler"]["thread_estimate"] == pytest.approx(10_125_000)
    assert "threads" not in out["http"]  # a table without thread rows (a plugin without threads=1)


def test_an_lm_head_layout_names_the_workload_and_needs_the_policy():
    from sglang_rvv.bench.report import board

    off, int4 = run.workloads(["tiny"], ["int4"], "int4")
    assert (off.label, int4.label) == ("tiny-off", "tiny-int4-lm_head-int4")
    assert run.spec(int4, "result.json")["lm_head_dtype"] == "int4"
    assert run.workloads(["tiny"], ["int4"])[1].label == "tiny-int4"
    assert board.layout(asdict(int4)) == "int4, lm_head int4" and board.layout(asdict(off)) == "off (F.linear)"
    with pytest.raises(run.ToolError, match=r"tiny-off-lm_head-int4: lm_head_dtype='int4' needs the policy on"):
        run.Workload("tiny", policy=False, lm_head_dtype="int4")
