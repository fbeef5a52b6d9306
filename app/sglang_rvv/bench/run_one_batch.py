"""Run ``sglang.benchmark.one_batch`` with SGLang's plugins loaded (it does not load them itself).

``python -m sglang_rvv.bench.run_one_batch [sglang one_batch args...]``
"""

import runpy

from sglang.srt.plugins import load_plugins

if __name__ == "__main__":
    load_plugins()
    runpy.run_module("sglang.benchmark.one_batch", run_name="__main__", alter_sys=True)
