"""The serving-loop counter's process control, on this host without qemu: a real SGLang server of
the tiny model started through a wrapper executable (as the board model starts it through the
counting qemu), every process of it re-executed through that wrapper by multiprocessing's spawn,
each naming its role and answering every mark, and the server stopped at the end. The counts
themselves need the counting qemu: `make board-model` (boardmodel/serving.py)."""

from __future__ import annotations

import json
import os
import sys

from sglang_rvv.boardmodel import counts, serving
from sglang_rvv.launch.process import free_port


def test_every_process_of_the_server_runs_through_the_wrapper_names_its_role_and_marks(tiny_checkpoints, tmp_path):
    scratch = tmp_path / "serving"
    scratch.mkdir()
    executable = tmp_path / "python-wrapped"
    calls = tmp_path / "wrapper-calls"
    # The wrapper logs each start, so the test sees that spawn's children came through it too.
    executable.write_text(f"#!/bin/sh\necho $$ >> '{calls}'\nexec '{sys.executable}' \"$@\"\n")
    executable.chmod(0o755)
    phases = serving.serve_and_mark(executable, tiny_checkpoints["llama"], scratch, free_port(), (2, 3),
                                    env={"SGLANG_RVV_OP_PROVIDER": "generic"}, idle_seconds=1.0)
    registered = {int(path.stem): json.loads(path.read_text()) for path in scratch.glob("*.json")}
    assert sorted(info["role"] for info in registered.values()) == sorted(serving.ROLES), registered
    assert all(info["marks"] == serving.MARKS for info in registered.values()), registered
    for pid, info in registered.items():
        maps = counts.Maps.parse((scratch / f"{pid}.maps").read_text())  # its own /proc/self/maps, at the mark
        if info["role"] == "scheduler":  # the process that runs the model
            assert any(name.startswith("libtorch_cpu") for _, _, name in maps.ranges)
        assert not os.path.exists(f"/proc/{pid}"), f"process {pid} outlived the server's stop"
    started = {int(line) for line in calls.read_text().split()}
    assert set(registered) <= started, (registered, started)
    assert list(phases) == ["idle", "request1", "request2"] and phases["idle"] >= 1.0
