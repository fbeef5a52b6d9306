"""Run ``sglang.benchmark.one_batch`` with SGLang's plugins loaded (it does not load them itself).

``python -m sglang_rvv.bench.run_one_batch [sglang one_batch args...]``

one_batch draws its synthetic prompts (the warm-up's always) from token ids
below 10000, past the embedding of a smaller vocabulary such as the tiny test
models' 2050; for such a model they are drawn below its vocabulary size. Larger
vocabularies get exactly one_batch's own prompts.
"""

import json
import sys
from pathlib import Path

import numpy as np
from sglang.srt.plugins import load_plugins

SYNTHETIC_ID_BOUND = 10000  # one_batch's np.random.randint(0, 10000, ...)


def _vocab_size(argv: list[str]) -> int | None:
    if "--model-path" not in argv:
        return None
    config = Path(argv[argv.index("--model-path") + 1]) / "config.json"
    try:
        return int(json.loads(config.read_text())["vocab_size"])
    except (OSError, ValueError, KeyError, TypeError):  # one_batch reports an unusable model itself
        return None


def _bound_synthetic_ids(one_batch, vocab_size: int) -> None:
    original = one_batch.prepare_synthetic_inputs_for_latency_test

    def bounded(batch_size, input_len, custom_inputs=None):
        if not custom_inputs:
            custom_inputs = np.random.randint(0, vocab_size, (batch_size, input_len), dtype=np.int32).tolist()
        return original(batch_size, input_len, custom_inputs)

    one_batch.prepare_synthetic_inputs_for_latency_test = bounded


if __name__ == "__main__":
    load_plugins()
    from sglang.benchmark import one_batch

    vocab_size = _vocab_size(sys.argv)
    if vocab_size is not None and vocab_size < SYNTHETIC_ID_BOUND:
        _bound_synthetic_ids(one_batch, vocab_size)
    one_batch.cli_main()
