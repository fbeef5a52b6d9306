"""The board model's workloads run natively with this process's own counters
(``python -m sglang_rvv.boardmodel.counters``, what ``make reproduce`` runs on a BPI-F3): the same
guest and phases as the counts under qemu, each phase's counters and clock, and every counter
this machine cannot read named with the reason, never a zero. This host has no hardware PMU (a
VM), so its software task clock stands in for the board's instructions and cycles."""

from __future__ import annotations

import json
import subprocess
import sys

import pytest

from sglang_rvv.boardmodel import guest, perfcounters, run


def counters(tmp_path, *args):
    proc = subprocess.run([sys.executable, "-m", "sglang_rvv.boardmodel.counters", "--shapes", "tiny", "--layouts",
                           "--run-dir", str(tmp_path), *args], capture_output=True, text=True, timeout=600)
    return proc, (json.loads((tmp_path / "board-counters.json").read_text())
                  if (tmp_path / "board-counters.json").is_file() else None)


def test_each_phase_gets_its_counters_and_clock_between_the_guests_marks(tmp_path):
    proc, data = counters(tmp_path, "--events", "task_clock_ns")
    assert proc.returncode == 0, proc.stderr[-3000:]
    assert proc.stdout.strip() == str(tmp_path)
    assert data["unavailable"] is None and data["events"] == ["task_clock_ns"]
    (work,) = data["workloads"]
    assert work["label"] == "tiny-off" and len(work["tokens"]) == 2
    assert list(work["phases"]) == ["prefill", "decode1", "decode2"]
    for name, phase in work["phases"].items():
        # The task clock counts this process's CPU time: a phase's share of its wall time, at most
        # all of it on one thread (plus the clock reads' own jitter).
        assert 0 < phase["task_clock_ns"] <= phase["seconds"] * 1e9 * 1.05 + 1e6, (name, phase)
    assert work["per_token"] == work["phases"][run.PER_TOKEN]


def test_a_counter_this_machine_cannot_read_is_named_with_the_fix_not_counted_as_zero(tmp_path):
    proc, data = counters(tmp_path)  # the default: the hardware's instructions and cycles
    assert proc.returncode == 0, proc.stderr[-3000:]
    try:
        perfcounters.Counters(list(perfcounters.HARDWARE)).close()
    except perfcounters.Unavailable as why:
        reason = str(why)
    else:
        pytest.fail("this host exposes hardware counters: the refusal cannot be shown here")
    assert data["unavailable"] == reason and reason.startswith("perf_event_open(instructions): ")
    assert f"no counts, the clock only: {reason}" in proc.stderr
    step = data["workloads"][0]["per_token"]
    assert "instructions" not in step and "cycles" not in step and step["seconds"] > 0


def test_an_unknown_counter_or_a_missing_lock_is_refused_by_name(tmp_path):
    proc, _ = counters(tmp_path, "--events", "instructions,branches")
    assert proc.returncode == 2 and "--events instructions,branches: choose from instructions, cycles" in proc.stderr
    proc, data = counters(tmp_path, "--lock", str(tmp_path / "lock.toml"))
    assert proc.returncode == 2 and data is None
    assert f"--lock {tmp_path / 'lock.toml'}: no such file; pass the project's images/lock.toml" in proc.stderr
    with pytest.raises(ValueError, match="unknown counter branches: choose from instructions"):
        perfcounters.Counters(["branches"])


def test_a_shape_the_kernels_do_not_cover_is_refused_naming_the_gate(tmp_path):
    """The policy packs nothing at a shape below the shape gate: the guest exits with its code and
    the run names the gate, rather than counting an F.linear model as the kernels'."""
    work = run.Workload("tiny", policy=True)
    argument = run.spec(work, tmp_path / "result.json")
    argument["shape"].update(hidden_size=64, intermediate_size=128, num_attention_heads=2, num_key_value_heads=1,
                             head_dim=32)
    # This host's provider (the generic one: rvv cannot load on x86) gates the same way.
    env = {k: v for k, v in run.environment().items() if k != "SGLANG_RVV_OP_PROVIDER"}
    proc = subprocess.run([sys.executable, str(run.GUEST), json.dumps(argument)], env=env,
                          capture_output=True, text=True, timeout=600)
    assert proc.returncode == guest.EXIT_NOT_COVERED, proc.stderr[-3000:]
    with pytest.raises(run.NotCovered, match=r"tiny-bf16: the policy packed no projection at this shape .*; "
                                             r"choose a shape whose projections have N, K >= \d+ \(the rvv shape gate"):
        run.outcome(work, proc, tmp_path / "result.json")
