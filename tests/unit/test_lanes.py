"""tests/lanes.py: the split of make test's files into two lanes by the last run's times."""

from __future__ import annotations

import json

import lanes
import pytest


def test_every_test_file_of_make_test_is_in_one_lane_and_only_one():
    files = lanes.test_files()
    assert {"tests/unit/test_lanes.py", "tests/ansible/test_deploy_riscv64.py", "tests/peer/test_peer.py"} <= set(files)
    assert not [f for f in files if f.startswith(("tests/infra/", "tests/peer_tools/"))]
    (first, second), _ = lanes.split(files, lanes.load_times()[0])
    assert sorted(first + second) == files and not set(first) & set(second)


def test_the_longest_file_left_goes_to_the_lane_with_less_time():
    times = {"a": 100.0, "b": 70.0, "c": 40.0, "d": 35.0, "e": 1.0}
    (first, second), totals = lanes.split(list(times), times)
    assert (first, second) == (["a", "d"], ["b", "c", "e"])
    assert totals == [135.0, 111.0]


def test_each_lane_starts_from_its_preludes_time():
    host, riscv64 = (name for name, _ in lanes.PRELUDES)
    times = {host: 100.0, riscv64: 0.0, "a": 50.0, "b": 40.0, "c": 20.0}
    assert lanes.split(["a", "b", "c"], times) == ([[], ["a", "b", "c"]], [100.0, 110.0])


def test_a_file_no_run_has_timed_counts_as_the_default():
    (first, second), totals = lanes.split(["new", "old"], {"old": lanes.DEFAULT_SECONDS + 1})
    assert (first, second) == (["old"], ["new"]) and totals == [lanes.DEFAULT_SECONDS + 1, lanes.DEFAULT_SECONDS]


@pytest.fixture
def state(tmp_path, monkeypatch):
    monkeypatch.setattr(lanes, "LAST_TIMES", tmp_path / "cache" / "times.json")
    monkeypatch.setattr(lanes, "KEPT_TIMES", tmp_path / "kept.json")
    (tmp_path / "cache").mkdir()
    return tmp_path


def test_the_last_run_here_comes_before_the_kept_times(state):
    assert lanes.load_times() == ({}, None)
    lanes.KEPT_TIMES.write_text(json.dumps({"a": 1}))
    assert lanes.load_times() == ({"a": 1.0}, lanes.KEPT_TIMES)
    lanes.LAST_TIMES.write_text(json.dumps({"a": 2}))
    assert lanes.load_times() == ({"a": 2.0}, lanes.LAST_TIMES)


def test_a_run_keeps_the_times_of_files_it_did_not_run_and_drops_deleted_files(state):
    written = state / "lane.json"
    written.write_text(json.dumps({"a": 5.0}))
    prelude = lanes.PRELUDES[1][0]
    lanes._merge_times({"a": 1.0, "b": 2.0, "gone": 3.0, prelude: 9.0}, ["a", "b"],
                       [written, state / "a lane that failed.json"], {lanes.PRELUDES[0][0]: 7.0})
    assert json.loads(lanes.LAST_TIMES.read_text()) == {"a": 5.0, "b": 2.0, prelude: 9.0, lanes.PRELUDES[0][0]: 7.0}


def test_no_two_test_files_share_a_name():
    # pytest imports each test file as a top-level module of its basename (rootdir, no packages):
    # a second file of the same name stops its lane's collection.
    names = [f.rsplit("/", 1)[1] for f in lanes.test_files()]
    assert len(names) == len(set(names)), sorted({n for n in names if names.count(n) > 1})


def test_the_kept_times_name_files_that_exist():
    kept = json.loads(lanes.KEPT_TIMES.read_text())
    known = {*lanes.test_files(), *(name for name, _ in lanes.PRELUDES)}
    assert set(kept) <= known, sorted(set(kept) - known)
