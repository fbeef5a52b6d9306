"""make reproduce's peer step run for real, with the board emulated: the reproduce
role's own task files (peer.yml, rundir.yml, peer_bench.yml, peer_verdict.yml) through
ansible-playbook against this host, with the plain RVV build and the generated tiny shape at
Q4_0, a tiny count (-p 8 -n 4, one repetition, one thread pinned to CPU 0). The board's command
lines run unchanged: each is the build's own riscv64 loader, which this host's binfmt_misc hands
to qemu-riscv64 (QEMU_CPU: the peer's K1 CPU, as tests/peer/test_peer.py runs it). The JSON
llama-bench writes must parse into the report's table; a missing build, a model that cannot be
made and a failing llama-bench are each one line, with nothing half-written in the run directory.
"""

from __future__ import annotations

import json
import os
import re
import subprocess
import sys
from pathlib import Path

import pytest
import yaml
from image_support import lock_get, run

from sglang_rvv.bench import results
from sglang_rvv.bench.report import peer_bench as report
from sglang_rvv.bench.results import load_run
from sglang_rvv.boardmodel import peer_build

REPO = Path(__file__).resolve().parents[2]
ANSIBLE_DIR = REPO / "ansible"
BINFMT = Path("/proc/sys/fs/binfmt_misc/qemu-riscv64")
BIN = Path(sys.executable).parent
ROLE_FILES = ("peer.yml", "rundir.yml", "peer_bench.yml", "peer_verdict.yml")


@pytest.fixture(scope="module")
def rvv() -> peer_build.Build:
    if not BINFMT.is_file() or "enabled" not in BINFMT.read_text():
        pytest.fail("no qemu-riscv64 in binfmt_misc: install qemu-user-static (Debian registers it)")
    run([str(REPO / "peer" / "build.sh"), "rvv", "host"], timeout=5400)
    return peer_build.require("rvv")


def play(tmp_path: Path, name: str, peer_dir: Path | None = None,
         **overrides) -> tuple[subprocess.CompletedProcess, Path]:
    """The role's peer task files against this host; the result and the run's work directory."""
    work = tmp_path / name / "results"
    variables = {"sglang_rvv_reproduce_peer_shape": "tiny", "sglang_rvv_reproduce_peer_formats": ["Q4_0"],
                 "sglang_rvv_reproduce_peer_builds": ["rvv"], "sglang_rvv_reproduce_peer_threads": ["1:0"],
                 "sglang_rvv_reproduce_peer_prompt": 8, "sglang_rvv_reproduce_peer_gen": 4,
                 "sglang_rvv_reproduce_peer_args": "-r 1", "sglang_rvv_reproduce_peer_dir": str(tmp_path / "board"),
                 "sglang_rvv_reproduce_work_dir": str(work), "sglang_rvv_reproduce_timeout_s": 900, **overrides}
    tasks = [{"name": f"The role's {f}", "ansible.builtin.include_role": {"name": "sglang_rvv_reproduce",
                                                                           "tasks_from": f}} for f in ROLE_FILES]
    book = tmp_path / f"{name}.yml"
    book.write_text(yaml.safe_dump([{"hosts": "localhost", "connection": "local", "gather_facts": False,
                                     "vars": {"ansible_python_interpreter": sys.executable, **variables},
                                     "tasks": tasks}]))
    env = {**os.environ, "ANSIBLE_CONFIG": str(ANSIBLE_DIR / "ansible.cfg"), "ANSIBLE_NOCOLOR": "1",
           "ANSIBLE_ROLES_PATH": str(ANSIBLE_DIR / "roles"), "PATH": f"{BIN}:{os.environ['PATH']}",
           "QEMU_CPU": peer_build.qemu_cpu(lock_get("tools.count.qemu_cpu"))}
    if peer_dir is not None:
        env["SGLANG_RVV_PEER_DIR"] = str(peer_dir)
    result = subprocess.run([BIN / "ansible-playbook", "-i", "localhost,", str(book)],
                            cwd=ANSIBLE_DIR, env=env, capture_output=True, text=True, timeout=1800)
    print(f"$ ansible-playbook {name}: exit {result.returncode}\n{result.stdout[-4000:]}{result.stderr[-2000:]}")
    return result, work


def changed(output: str) -> int:
    return int(re.search(r"^localhost\s+: ok=\d+\s+changed=(\d+)", output, re.M).group(1))


def failure(output: str) -> str:
    """The failed task's message, its wrapping undone: Ansible wraps long messages."""
    found = re.search(r"FAILED! =>.*?msg: (.*?)(?:\n\S|\nPLAY RECAP)", output, re.S)
    assert found, output[-3000:]
    return " ".join(found.group(1).strip().strip("'\"").split())


def runs_in(work: Path) -> list[Path]:
    return sorted(work.iterdir()) if work.is_dir() else []


def test_the_role_runs_llama_bench_on_the_tiny_model_and_the_report_reads_its_json(rvv, tmp_path):
    result, work = play(tmp_path, "first")
    assert result.returncode == 0, result.stdout[-3000:]
    (run_dir,) = runs_in(work)
    data = json.loads((run_dir / report.FILE).read_text())
    (one,) = data["runs"]
    assert one["build"] == "rvv" and one["argv"][:3] == ["taskset", "-c", "0"] and one["argv"][-2:] == ["-o", "json"]
    rows = {(r.engine, r.path, r.fmt, r.threads): r for r in report.peer_rows(data)}
    assert set(rows) == {("llama.cpp rvv", "repack", "Q4_0", 1), ("llama.cpp rvv", "vec_dot", "Q4_0", 1)}
    assert all(r.decode > 0 and r.prefill > 0 and r.prompt == 8 for r in rows.values())
    # The report's section, from this JSON: the run directory becomes a run as the suite writes one.
    results.write_meta(run_dir, {"suite": results.SUITE_COMMAND, "host": "localhost", "started_utc": run_dir.name,
                                 "complete": True, "seconds": 1.0, "provenance": {}, "settings": {}})
    section = report.render(load_run(run_dir))
    assert "| llama.cpp rvv | vec_dot | Q4_0 | 1 | 0 |" in section and "tg4 tok/s | pp8 tok/s" in section
    # Again: the shipped build and model are kept; only the new run's directory and its JSON are written.
    again, _ = play(tmp_path, "first")
    assert again.returncode == 0 and changed(again.stdout) == 2, again.stdout[-3000:]
    assert len(runs_in(work)) == 2


def test_a_failing_llama_bench_is_one_line_and_leaves_no_peer_bench_json(rvv, tmp_path):
    result, work = play(tmp_path, "failing", sglang_rvv_reproduce_peer_args="--no-such-flag")
    assert result.returncode != 0
    line = failure(result.stdout)
    assert line.startswith("sglang_rvv_reproduce: llama-bench failed on localhost (rvv build, 1 threads, exit 1), "
                           "so the run has no peer-bench.json: "), line
    assert "--no-such-flag" in line, line
    (run_dir,) = runs_in(work)
    assert list(run_dir.iterdir()) == []


def test_a_missing_build_is_one_line_naming_the_build_before_anything_is_shipped(tmp_path):
    result, work = play(tmp_path, "no-build", peer_dir=tmp_path / "empty")
    assert result.returncode != 0
    line = failure(result.stdout)
    assert re.fullmatch(r"sglang_rvv_reproduce: peer-bench: error: missing peer build: \S+/llama.cpp-rvv has no "
                        r"peer.json; build it with peer/build.sh rvv \(make peer-build\)", line), line
    assert not (tmp_path / "board").exists() and not work.exists()


def test_a_model_that_cannot_be_made_is_one_line_naming_the_build_that_makes_it(rvv, tmp_path):
    # The rvv build is there, the host llama-quantize that makes the GGUF files is not.
    peer_dir = tmp_path / "peer"
    peer_dir.mkdir()
    (peer_dir / rvv.path.name).symlink_to(rvv.path)
    result, work = play(tmp_path, "no-model", peer_dir=peer_dir)
    assert result.returncode != 0
    line = failure(result.stdout)
    assert re.fullmatch(r"sglang_rvv_reproduce: peer-bench: error: missing peer build: \S+/llama.cpp-host has no "
                        r"peer.json; build it with peer/build.sh host \(make peer-build\)", line), line
    assert not (peer_dir / "gguf" / "tiny-Q4_0.gguf").exists()
    assert not (tmp_path / "board").exists() and not work.exists()
