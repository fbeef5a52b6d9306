"""The /metrics byte gauges follow the policy through a re-plan (prometheus multiprocess mode, as in SGLang)."""

import json
import os
import subprocess
import sys
import textwrap
from pathlib import Path

SCRIPT = textwrap.dedent(
    """
    import json
    from prometheus_client import CollectorRegistry, multiprocess
    from sglang_rvv import RvvPolicyConfig, install_rvv_policy, tiny
    from sglang_rvv.policy import policy_of
    from sglang_rvv.srt.metrics import MetricsExporter

    def gauges():
        # What SGLang's /metrics serves: every process's files, aggregated.
        registry = CollectorRegistry()
        multiprocess.MultiProcessCollector(registry)
        return {(s.name, tuple(sorted(s.labels.items()))): s.value
                for family in registry.collect() for s in family.samples if s.name.endswith("_bytes")}

    model = tiny.build_model("llama", hidden_size=1024, intermediate_size=2048, num_hidden_layers=1,
                             num_attention_heads=8, vocab_size=2048)
    full = install_rvv_policy(model, RvvPolicyConfig(regional_compile=False))
    policy = policy_of(model)
    exporter = MetricsExporter(policy, model, provider="generic", cache_state="none")
    before = gauges()
    # One byte short: the plan cuts the last projection in its order, which stays row-major.
    cut = install_rvv_policy(model, RvvPolicyConfig(regional_compile=False,
                                                     memory_budget_mib=(full.packed_bytes - 1) / 2**20))
    exporter.flush()  # once per forward batch in the server
    after = gauges()
    print(json.dumps(dict(full=full.packed_bytes, cut=cut.packed_bytes, now=policy.packed_bytes(),
                          before=[[k[0], dict(k[1]), v] for k, v in before.items()],
                          after=[[k[0], dict(k[1]), v] for k, v in after.items()])))
    """
)


def _run(tmp_path: Path) -> dict:
    tests = Path(__file__).parents[1]
    env = dict(os.environ, PYTHONPATH=os.pathsep.join([str(tests), str(tests.parent / "app")]),
               PROMETHEUS_MULTIPROC_DIR=str(tmp_path))
    out = subprocess.run([sys.executable, "-c", SCRIPT], capture_output=True, text=True, check=True, env=env)
    return json.loads(out.stdout.strip().splitlines()[-1])


def _by_label(rows, layout):
    return {labels["projection"]: value for name, labels, value in rows
            if name == "sglang_rvv_projection_bytes" and labels["layout"] == layout and value}


def test_the_byte_gauges_follow_a_replan(tmp_path):
    m = _run(tmp_path)
    total = {name: value for name, labels, value in m["after"] if name == "sglang_rvv_packed_bytes"}
    start = {name: value for name, labels, value in m["before"] if name == "sglang_rvv_packed_bytes"}
    assert 0 < m["cut"] < m["full"] and m["now"] == m["cut"]
    assert start == {"sglang_rvv_packed_bytes": m["full"]}
    assert total == {"sglang_rvv_packed_bytes": m["cut"]}  # was stale: set once at start
    # Per projection: the bf16 rows add up to the packed total, before and after; lm_head (last
    # in the plan's order) is past the cut and streams row-major. (k/v_proj, N=512, are below
    # the gate's minimum and stream row-major throughout.)
    assert sum(_by_label(m["before"], "bf16").values()) == m["full"]
    assert sum(_by_label(m["after"], "bf16").values()) == m["cut"]
    assert "lm_head" not in _by_label(m["before"], "row_major")
    assert _by_label(m["after"], "row_major")["lm_head"] == 2048 * 1024 * 2
    assert "lm_head" not in _by_label(m["after"], "bf16")  # the old label set is zeroed, not left behind
