"""The measured route table: decision, routing, persistence and its stack check. Its warm-ups
compile every key of the tiny Llama with Inductor (minutes on a cold cache), so it sits with the
end-to-end tests and their shared Inductor cache, not in `make check`."""

import argparse
import gc
import json
import logging
import weakref

import pytest
import torch
import torch.nn.functional as F

from sglang_rvv import RvvPolicyConfig, bodies, inductor_cache, install_rvv_policy, route_table, routing, warmup
from sglang_rvv.policy import policy_of
from sglang_rvv.route_table import Entry, RouteTable, Shape
from sglang_rvv.routing import ROUTE_ATTR
from sglang_rvv.srt import flags
from sglang_rvv.warmup import warm_up
from support import assert_bf16_close, packed_keys

TABLE_FIELDS = {"projection", "bucket", "out_features", "in_features", "layout", "group", "packed_us", "row_major_us",
                "eager_us", "route", "source"}
ROUTE_OF = {"packed": routing.Route.PACKED_COMPILED, "eager": routing.Route.PACKED_EAGER,
            "row_major": routing.Route.ROW_MAJOR_MEASURED}


def _id(entry):
    return (entry["projection"], entry["bucket"], entry["out_features"], entry["in_features"], entry["layout"],
            entry["group"])


def _ids(table):
    return set(map(_id, table))


def _fake_timings(losing_buckets, eager_buckets=()):
    """A measurement where packed takes 2x row-major in ``losing_buckets`` and half elsewhere, and
    the eager call beats the compiled one in ``eager_buckets`` only."""
    def measure(key, modules, packed_fn):
        assert key.mode == routing.Mode.EXPLICIT_PACKED and modules and callable(packed_fn)
        packed = 200.0 if key.rows in losing_buckets else 50.0
        return packed, 100.0, (packed * 0.5 if key.rows in eager_buckets else packed * 1.5)
    return measure


@pytest.fixture
def policy(llama):
    install_rvv_policy(llama)
    return policy_of(llama)


def _call(module, rows):
    x = torch.randn(rows, module.weight.shape[1], dtype=torch.bfloat16)
    with torch.no_grad():
        return module(x), F.linear(x, module.weight)


@pytest.mark.parametrize("packed_us,row_major_us,eager_us,route", [
    (50.0, 100.0, 60.0, "packed"),
    (84.9, 100.0, 90.0, "packed"),
    (85.0, 100.0, 90.0, "row_major"),  # within the 15 % margin: a near-tie stays row-major
    (90.0, 100.0, 90.0, "row_major"),
    (100.0, 100.0, 300.0, "row_major"),
    (300.0, 100.0, 300.0, "row_major"),
    (300.0, 100.0, 84.9, "eager"),      # the eager kernel wins where the compiled one lost
    (50.0, 100.0, 49.9, "eager"),       # the faster of the two packed calls, no margin between them
    (50.0, 100.0, 50.0, "packed"),      # a tie stays compiled
    (300.0, 100.0, 85.0, "row_major"),  # the margin holds for the eager call too
])
def test_packed_must_win_by_the_margin_and_the_faster_packed_call_is_taken(packed_us, row_major_us, eager_us, route):
    assert route_table.PACKED_MARGIN == 0.85
    assert route_table.choose(packed_us, row_major_us, eager_us) == route


def test_a_burst_in_one_pass_does_not_decide_a_bucket(policy, tmp_path, monkeypatch):
    """Each side keeps its fastest time over the passes: packed slowed down in the first pass only
    (other work on the CPUs) still wins, and the stored times are the fastest ones."""
    calls = []

    def measure(key, modules, packed_fn):
        calls.append(key)
        first_pass = calls.count(key) == 1
        return (400.0 if first_pass else 50.0), (100.0 if first_pass else 120.0), 80.0

    monkeypatch.setattr(warmup, "measure_key", measure)
    report = warm_up(policy, table_dir=tmp_path)
    assert len(calls) == warmup.MEASURE_PASSES * len(report.route_table) and warmup.MEASURE_PASSES == 2
    assert {(entry["route"], entry["packed_us"], entry["row_major_us"], entry["eager_us"])
            for entry in report.route_table} == {("packed", 50.0, 100.0, 80.0)}


def test_a_losing_bucket_is_served_row_major(policy, llama, tmp_path, monkeypatch):
    monkeypatch.setattr(warmup, "measure_key", _fake_timings({4, 16}))
    report = warm_up(policy, table_dir=tmp_path)

    assert _ids(report.route_table) == packed_keys(policy)
    for entry in report.route_table:
        assert set(entry) == TABLE_FIELDS and entry["source"] == "measured"
        assert entry["route"] == ("row_major" if entry["bucket"] in (4, 16) else "packed")
    assert "route table:" in report.summary() and "row-major" in report.summary()
    assert not policy.counters, "warm-up calls must not show up in the routing counters"

    o_proj = llama.model.layers[0].self_attn.o_proj
    for rows in (1, 3, 8, 9):  # buckets 1, 4, 8, 16
        out, ref = _call(o_proj, rows)
        assert_bf16_close(out, ref)
    assert torch.equal(*_call(o_proj, 3)), "a row-major bucket runs F.linear itself"
    counts = policy.counters
    assert counts[("o_proj", routing.Route.PACKED_COMPILED, "1")] == 1
    assert counts[("o_proj", routing.Route.PACKED_COMPILED, "8")] == 1
    assert counts[("o_proj", routing.Route.ROW_MAJOR_MEASURED, "4")] == 2
    assert counts[("o_proj", routing.Route.ROW_MAJOR_MEASURED, "16")] == 1
    assert routing.Route.ROW_MAJOR_MEASURED == "row_major_measured"  # the label the metrics and reports carry

    with torch.no_grad():  # a whole forward, prefill 3 rows (bucket 4) then decode
        llama(torch.randint(0, 2050, (1, 3)))
        llama(torch.randint(0, 2050, (1, 1)))
    by_route = policy.counters.by_route()
    assert by_route[routing.Route.ROW_MAJOR_MEASURED] > 2 and by_route[routing.Route.PACKED_COMPILED] > 2


def test_a_real_measurement_routes_by_its_table_and_round_trips(policy, llama, tmp_path):
    report = warm_up(policy, table_dir=tmp_path)

    table = report.route_table
    assert _ids(table) == packed_keys(policy)
    assert len(table) == len(_ids(table)), "one entry per compiled key"
    for entry in table:
        assert entry["source"] == "measured" and entry["packed_us"] > 0 and entry["row_major_us"] > 0
        assert entry["eager_us"] > 0
        assert entry["route"] == route_table.choose(entry["packed_us"], entry["row_major_us"], entry["eager_us"])
    assert report.route_table_seconds > 0

    # Routing follows the table, bucket by bucket, and matches F.linear.
    o_proj = llama.model.layers[1].self_attn.o_proj
    for entry in (e for e in table if e["projection"] == "o_proj"):
        policy.counters.clear()
        out, ref = _call(o_proj, entry["bucket"])
        assert_bf16_close(out, ref)
        assert policy.counters == {("o_proj", ROUTE_OF[entry["route"]], str(entry["bucket"])): 1}, entry

    # The file holds the same entries and the stack they were measured on.
    stored = json.loads((tmp_path / inductor_cache.ROUTE_TABLE).read_text())
    assert {k: stored[k] for k in route_table.stack()} == route_table.stack()
    without_source = [{k: v for k, v in e.items() if k != "source"} for e in table]
    assert sorted(stored["entries"], key=_id) == sorted(without_source, key=_id)

    # A warm start loads it instead of measuring.
    row_major = policy.route_table.row_major
    again = warm_up(policy, table_dir=tmp_path)
    assert all(e["source"] == "cache" for e in again.route_table)
    assert [{**e, "source": "cache"} for e in table] == again.route_table
    assert policy.route_table.row_major == row_major


def test_a_cached_route_is_decided_again_from_its_times(policy, tmp_path, monkeypatch):
    """A table written under another margin keeps its times; the route follows this version's margin."""
    measured = warm_up(policy, table_dir=tmp_path).route_table
    stored = json.loads((tmp_path / inductor_cache.ROUTE_TABLE).read_text())
    for entry in stored["entries"]:  # a 5 % win, which an older 0.95 margin called packed
        entry.update(packed_us=95.0, row_major_us=100.0, eager_us=96.0, route="packed")
    (tmp_path / inductor_cache.ROUTE_TABLE).write_text(json.dumps(stored))
    monkeypatch.setattr(warmup, "measure_key", lambda key, modules, packed_fn: pytest.fail(f"{key} measured again"))

    again = warm_up(policy, table_dir=tmp_path)
    assert len(again.route_table) == len(measured)
    assert all(e["source"] == "cache" and e["route"] == "row_major" for e in again.route_table)
    assert policy.route_table.row_major == packed_keys(policy)


@pytest.mark.parametrize("field,value", [("torch_version", "0.0.0"), ("cpu_capability", "VSX"),
                                         ("cpu_model", "another CPU"), ("threads", 64)])
def test_a_table_from_another_stack_is_ignored_and_remeasured(policy, tmp_path, monkeypatch, caplog, field, value):
    monkeypatch.setattr(warmup, "measure_key", _fake_timings(set()))
    foreign = [{"projection": "o_proj", "bucket": 1, "out_features": 1024, "in_features": 1024,
                "packed_us": 1.0, "row_major_us": 0.5, "eager_us": 1.0, "route": "row_major"}]
    stale = {**route_table.stack(), field: value, "entries": foreign}
    (tmp_path / inductor_cache.ROUTE_TABLE).write_text(json.dumps(stale))

    with caplog.at_level(logging.WARNING, logger="sglang_rvv"):
        report = warm_up(policy, table_dir=tmp_path)
    warnings = [r.getMessage() for r in caplog.records if r.levelno == logging.WARNING]
    assert len(warnings) == 1 and "route table ignored" in warnings[0] and f"{field}: cache {value!r}" in warnings[0]
    assert all(e["source"] == "measured" and e["route"] == "packed" for e in report.route_table)
    assert not policy.route_table.row_major
    rewritten = json.loads((tmp_path / inductor_cache.ROUTE_TABLE).read_text())
    assert rewritten[field] == route_table.stack()[field]
    assert len(rewritten["entries"]) == len(report.route_table)


@pytest.mark.parametrize("text", ["{not json", "[]", "an entry lacking its fields"])
def test_an_unreadable_table_is_ignored_and_remeasured(policy, tmp_path, monkeypatch, caplog, text):
    monkeypatch.setattr(warmup, "measure_key", _fake_timings(set()))
    if text == "an entry lacking its fields":  # of this very stack, so the entries are read
        text = json.dumps({**route_table.stack(), "entries": [{"bucket": 1}]})
    (tmp_path / inductor_cache.ROUTE_TABLE).write_text(text)
    with caplog.at_level(logging.WARNING, logger="sglang_rvv"):
        report = warm_up(policy, table_dir=tmp_path)
    assert "is unreadable" in caplog.text
    assert report.route_table and all(e["source"] == "measured" for e in report.route_table)
    table, rejected = RouteTable.load(tmp_path)
    assert rejected is None and len(table) == len(report.route_table)


def test_entries_of_other_shapes_stay_in_the_file(policy, tmp_path, monkeypatch):
    monkeypatch.setattr(warmup, "measure_key", _fake_timings(set()))
    other = {"projection": "down_proj", "bucket": 2, "out_features": 2048, "in_features": 8192,
             "packed_us": 9.0, "row_major_us": 5.0, "eager_us": 9.0, "layout": "int4", "group": 32,
             "route": "row_major"}
    RouteTable([Entry.from_dict(other)]).store(tmp_path)
    report = warm_up(policy, table_dir=tmp_path)
    table, _ = RouteTable.load(tmp_path)
    entries = [entry.to_dict() for entry in table.entries()]
    assert other in entries and len(entries) == len(report.route_table) + 1


def test_measure_routes_off_keeps_every_bucket_packed(llama, tmp_path, monkeypatch):
    monkeypatch.setattr(warmup, "measure_key", _fake_timings({1, 2, 4, 8, 16, 32, 64, 128}))
    install_rvv_policy(llama, RvvPolicyConfig(measure_routes=False))
    policy = policy_of(llama)
    report = warm_up(policy, table_dir=tmp_path)
    assert report.route_table == [] and report.keys
    assert not (tmp_path / inductor_cache.ROUTE_TABLE).exists()
    o_proj = llama.model.layers[0].self_attn.o_proj
    _call(o_proj, 3)
    assert policy.counters == {("o_proj", routing.Route.PACKED_COMPILED, "4"): 1}

    # A table measured earlier is not consulted once the switch is off.
    install_rvv_policy(llama, RvvPolicyConfig())
    warm_up(policy, table_dir=tmp_path)
    install_rvv_policy(llama, RvvPolicyConfig(measure_routes=False))
    assert policy.route_table.row_major
    policy.counters.clear()
    _call(o_proj, 3)
    assert policy.counters == {("o_proj", routing.Route.PACKED_COMPILED, "4"): 1}


def test_the_flag_switches_measurement():
    def config(*argv):
        parser = argparse.ArgumentParser()
        flags.add_arguments(parser)
        return flags.resolve(parser.parse_args(["--enable-cpu-rvv-inductor", *argv])).config

    assert config().measure_routes is True
    assert config("--no-cpu-rvv-measure-routes").measure_routes is False


def test_seeding_copies_the_table_and_keeps_one_already_there(tmp_path):
    warm, cache = tmp_path / "warm", tmp_path / "cache"
    RouteTable().store(warm)
    assert inductor_cache.seed(warm, cache) == 1
    assert (cache / inductor_cache.ROUTE_TABLE).read_text() == (warm / inductor_cache.ROUTE_TABLE).read_text()
    (cache / inductor_cache.ROUTE_TABLE).write_text("measured here")
    assert inductor_cache.seed(warm, cache) == 0
    assert (cache / inductor_cache.ROUTE_TABLE).read_text() == "measured here"


def test_a_memoised_row_major_decision_counts_the_same_and_never_outlives_its_plan(llama, policy, tmp_path,
                                                                                     monkeypatch):
    """The row-major fast path (CallMemo) gives the full decision's label, and a re-plan,
    an invalidation, a table change or a replaced weight sends the call through the full one."""
    monkeypatch.setattr(warmup, "measure_key", _fake_timings({4}))
    warm_up(policy, table_dir=tmp_path)
    o_proj = llama.model.layers[0].self_attn.o_proj
    route = o_proj.__dict__[ROUTE_ATTR]
    measured = ("o_proj", routing.Route.ROW_MAJOR_MEASURED, "4")

    for _ in range(3):
        policy.counters.clear()
        out, ref = _call(o_proj, 3)
        assert torch.equal(out, ref) and policy.counters == {measured: 1}
    assert route.memo is not None and [(c.counter_key, c.fn) for c in route.memo.calls.values()] == [(measured, None)]

    # Invalidation without repack: the memo's status no longer holds, the full path says invalid.
    policy.invalidate(repack=False)
    policy.counters.clear()
    _call(o_proj, 3)
    assert policy.counters == {("o_proj", routing.Route.ROW_MAJOR_INVALID, "4"): 1}

    # A re-plan makes a new source record: the full path decides again, then memoises again.
    policy.reconcile()
    policy.counters.clear()
    _call(o_proj, 3)
    _call(o_proj, 3)
    assert policy.counters == {measured: 2}

    # A new route table (a re-measure that finds packed faster) is not answered from the memo.
    monkeypatch.setattr(warmup, "measure_key", _fake_timings(set()))
    warm_up(policy, table_dir=tmp_path / "fresh")
    policy.counters.clear()
    _call(o_proj, 3)
    assert policy.counters == {("o_proj", routing.Route.PACKED_COMPILED, "4"): 1}

    # A replaced weight re-plans through the full path, and the memo does not keep the old one alive.
    monkeypatch.setattr(warmup, "measure_key", _fake_timings({4}))
    warm_up(policy, table_dir=tmp_path / "again")
    _call(o_proj, 3)
    old = weakref.ref(o_proj.weight)
    o_proj.weight = torch.nn.Parameter(o_proj.weight.detach().clone(), requires_grad=False)
    gc.collect()
    assert old() is None
    out, ref = _call(o_proj, 3)
    assert torch.equal(out, ref)


def test_a_memoised_packed_decision_still_checks_the_source_before_every_use(llama):
    """The packed fast path (CallMemo) gives the full decision's label and the kernel's result;
    a weight bumped in place fails the source check there, so the call takes the full path,
    which re-plans, and never reads the stale buffer."""
    install_rvv_policy(llama, RvvPolicyConfig(regional_compile=False))
    policy = policy_of(llama)
    o_proj = llama.model.layers[0].self_attn.o_proj
    route = o_proj.__dict__[ROUTE_ATTR]
    packed = ("o_proj", routing.Route.PACKED_EAGER, "4")

    def call_and_check():
        x = torch.randn(3, o_proj.weight.shape[1], dtype=torch.bfloat16)
        with torch.no_grad():
            out = o_proj(x)
        assert_bf16_close(out.float(), F.linear(x.double(), o_proj.weight.double()))

    for _ in range(3):
        policy.counters.clear()
        call_and_check()
        assert policy.counters == {packed: 1}
    (call,) = route.memo.calls.values()
    assert call.counter_key == packed and call.bucket == 4
    # The eager route calls the provider's kernel itself, not the traced custom op's body.
    assert call.fn is not None and call.fn not in bodies.PACKED_BODIES.values()
    first_source = route.record.source

    with torch.no_grad():
        o_proj.weight.mul_(2)  # in place: same object, a new version
    policy.counters.clear()
    call_and_check()  # the memo still holds the weight object; the source check sends it the full way
    assert route.record.source is not first_source and route.memo.source is route.record.source
    assert policy.counters == {packed: 1}


def test_a_warm_start_neither_compiles_nor_loads_the_keys_its_table_routes_row_major(llama, policy, tmp_path,
                                                                                       monkeypatch):
    losing = {2, 4, 8, 16}
    monkeypatch.setattr(warmup, "measure_key", _fake_timings(losing))
    first = warm_up(policy, table_dir=tmp_path)
    assert first.skipped_row_major == 0
    row_major_ids = {_id(e) for e in first.route_table if e["route"] == "row_major"}
    assert row_major_ids and {bucket for _, bucket, *_ in row_major_ids} == losing

    # A fresh process: nothing compiled yet, the table in the cache directory.
    monkeypatch.setattr(policy.context, "compiled", routing.CompiledCallables())
    again = warm_up(policy, table_dir=tmp_path)
    assert again.skipped_row_major == len(row_major_ids)
    assert f"{len(row_major_ids)} more keys routed row-major and 0 eager by the cached route table, not loaded" in (
        again.summary())
    assert all(e["source"] == "cache" for e in again.route_table) and _ids(again.route_table) == _ids(first.route_table)
    compiled = {k.shape for k in policy.context.compiled.keys() if k.mode == routing.Mode.EXPLICIT_PACKED}
    assert compiled == _ids(first.route_table) - row_major_ids
    o_proj = llama.model.layers[0].self_attn.o_proj
    for rows, want in ((1, routing.Route.PACKED_COMPILED), (3, routing.Route.ROW_MAJOR_MEASURED)):
        policy.counters.clear()
        out, ref = _call(o_proj, rows)
        assert_bf16_close(out, ref)
        assert policy.counters == {("o_proj", want, str(routing.bucket_rows(rows, small_batch=True,
                                                                             projection="o_proj"))): 1}

    # A table from another stack spares nothing: every key is compiled and measured again.
    path = tmp_path / inductor_cache.ROUTE_TABLE
    path.write_text(json.dumps({**json.loads(path.read_text()), "threads": 64}))
    monkeypatch.setattr(policy.context, "compiled", routing.CompiledCallables())
    foreign = warm_up(policy, table_dir=tmp_path)
    assert foreign.skipped_row_major == 0 and all(e["source"] == "measured" for e in foreign.route_table)
    assert {k.shape for k in policy.context.compiled.keys()
            if k.mode == routing.Mode.EXPLICIT_PACKED} == _ids(first.route_table)


def test_an_entry_from_before_the_layouts_is_a_bf16_one():
    stored = {"projection": "o_proj", "bucket": 4, "out_features": 1024, "in_features": 1024,
              "packed_us": 9.0, "row_major_us": 5.0, "eager_us": 9.0, "route": "row_major"}
    entry = Entry.from_dict(stored)
    assert entry.shape == Shape("o_proj", 4, 1024, 1024, "bf16", 0)
    assert RouteTable([entry]).sends_row_major(entry.shape)
    assert not RouteTable([entry]).sends_row_major(Shape("o_proj", 4, 1024, 1024, "int8", 1024))


def test_a_bucket_whose_eager_call_wins_is_served_eager_and_never_compiled_again(llama, policy, tmp_path, monkeypatch):
    """Where the eager kernel call beat the compiled callable (one opaque kernel: compiling adds
    only its wrapper), the table routes the bucket packed_eager: the same packed buffer, the
    kernel called as it is; a warm start neither compiles nor loads that key."""
    monkeypatch.setattr(warmup, "measure_key", _fake_timings({4}, eager_buckets={1, 4}))
    first = warm_up(policy, table_dir=tmp_path)
    routes = {e["bucket"]: e["route"] for e in first.route_table if e["projection"] == "o_proj"}
    assert routes[1] == "eager" and routes[4] == "row_major" and routes[8] == "packed"
    assert "eager" in first.summary()
    o_proj = llama.model.layers[0].self_attn.o_proj
    for rows, want in ((1, routing.Route.PACKED_EAGER), (3, routing.Route.ROW_MAJOR_MEASURED),
                       (8, routing.Route.PACKED_COMPILED)):
        for _ in range(2):  # the full decision, then the memoised one
            policy.counters.clear()
            out, ref = _call(o_proj, rows)
            assert_bf16_close(out, ref)
            bucket = routing.bucket_rows(rows, small_batch=True, projection="o_proj")
            assert policy.counters == {("o_proj", want, str(bucket)): 1}

    monkeypatch.setattr(policy.context, "compiled", routing.CompiledCallables())
    again = warm_up(policy, table_dir=tmp_path)
    eager_ids = {_id(e) for e in first.route_table if e["route"] == "eager"}
    assert again.skipped_eager == len(eager_ids) and eager_ids
    compiled = {k.shape for k in policy.context.compiled.keys() if k.mode == routing.Mode.EXPLICIT_PACKED}
    row_major_ids = {_id(e) for e in first.route_table if e["route"] == "row_major"}
    assert compiled == _ids(first.route_table) - row_major_ids - eager_ids


def test_a_table_of_the_schema_before_eager_times_is_ignored_and_remeasured(policy, tmp_path, monkeypatch, caplog):
    monkeypatch.setattr(warmup, "measure_key", _fake_timings(set()))
    entries = [{"projection": "o_proj", "bucket": 1, "out_features": 1024, "in_features": 1024,
                "packed_us": 1.0, "row_major_us": 0.5, "route": "row_major"}]
    (tmp_path / inductor_cache.ROUTE_TABLE).write_text(json.dumps({**route_table.stack(), "schema": 1,
                                                                   "entries": entries}))
    with caplog.at_level(logging.WARNING, logger="sglang_rvv"):
        report = warm_up(policy, table_dir=tmp_path)
    assert "measured on another stack: schema: cache 1, running 2" in caplog.text
    assert all(e["source"] == "measured" for e in report.route_table)
