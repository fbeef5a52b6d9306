"""Process memory: packed buffers cost what the report says, once."""

import json
import os
import subprocess
import sys
import textwrap
from pathlib import Path

SCRIPT = textwrap.dedent(
    """
    import json, torch
    from support import rss_bytes
    from sglang_rvv import RvvPolicyConfig, install_rvv_policy, invalidate_rvv_packed_weights, tiny
    model = tiny.build_model("llama", hidden_size=2048, intermediate_size=5632, num_hidden_layers=2,
                             num_attention_heads=16, vocab_size=8000)
    ids = torch.tensor([[1, 2, 3]])
    with torch.no_grad():
        model(ids)
    base = rss_bytes()
    report = install_rvv_policy(model, RvvPolicyConfig(regional_compile=False))
    installed = rss_bytes()
    invalidate_rvv_packed_weights(model)
    repacked = rss_bytes()
    print(json.dumps(dict(base=base, installed=installed, repacked=repacked, packed=report.packed_bytes)))
    """
)


def test_rss_growth_matches_packed_bytes():
    # A fresh process, so nothing else this suite allocated blurs the measurement.
    # A fixed mmap threshold makes glibc return every freed buffer to the OS at
    # once; its default dynamic threshold may park one freed buffer in the heap,
    # which shows up as RSS without being a live copy.
    # PYTHONPATH: support.py, and this tree's app ahead of whichever one the venv has installed.
    tests = Path(__file__).parents[1]
    env = dict(os.environ, PYTHONPATH=os.pathsep.join([str(tests), str(tests.parent / "app")]),
               MALLOC_MMAP_THRESHOLD_="1048576")
    out = subprocess.run([sys.executable, "-c", SCRIPT], capture_output=True, text=True, check=True, env=env)
    m = json.loads(out.stdout.strip().splitlines()[-1])
    print(m)
    assert m["packed"] > 150 * 2**20
    growth = m["installed"] - m["base"]
    assert abs(growth - m["packed"]) <= 0.10 * m["packed"], m
    # invalidate frees before it repacks: no second copy stays resident
    assert m["repacked"] - m["installed"] <= 0.10 * m["packed"], m
