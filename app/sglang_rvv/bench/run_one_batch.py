"""Run ``sglang.benchmark.one_batch`` with SGLang's plugins loaded (it does not load them itself).

``python -m sglang_rvv.bench.run_one_batch --memory-file PATH [sglang one_batch args...]``

``--memory-file`` receives the process's peak RSS in two parts, as JSON: up to
the end of SGLang's weight loading (``load_peak_mib``), and from there to the
end (``after_load_peak_mib``, the kernel's high-water mark reset at that
point). The policy packs after loading, so the second is where its cost shows:
the loader's own transient (file pages plus tensors) can hide a packed copy
under the whole-process peak.

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
from sglang.srt.plugins.hook_registry import HookRegistry, HookType

from ..host import peak_rss_bytes, reset_peak_rss
from ..srt.plugin import RUNNER

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


def _peak_rss_mib() -> float:
    return peak_rss_bytes() / 2**20


class _MemoryMarks:
    """Peak RSS up to the end of weight loading, then the high-water mark reset (``clear_refs`` 5)."""

    def __init__(self) -> None:
        self.load_peak_mib: float | None = None

    def after_load_model(self, result, *args, **kwargs):
        self.load_peak_mib = _peak_rss_mib()
        reset_peak_rss()
        return result

    def write(self, path: Path) -> None:
        if self.load_peak_mib is None:
            raise SystemExit("run_one_batch: the model was never loaded, so there is no memory to report")
        path.write_text(json.dumps({"load_peak_mib": self.load_peak_mib, "after_load_peak_mib": _peak_rss_mib()}))


def _pop_option(argv: list[str], name: str) -> str:
    if name not in argv[:-1]:
        raise SystemExit(f"run_one_batch: {name} PATH is required")
    index = argv.index(name)
    value = argv[index + 1]
    del argv[index:index + 2]
    return value


if __name__ == "__main__":
    memory_file = Path(_pop_option(sys.argv, "--memory-file"))
    marks = _MemoryMarks()
    # Registered before the plugins load, so it wraps load_model first and runs before the
    # policy's own AFTER hook packs anything.
    HookRegistry.register(f"{RUNNER}.load_model", marks.after_load_model, HookType.AFTER)
    load_plugins()
    from sglang.benchmark import one_batch

    vocab_size = _vocab_size(sys.argv)
    if vocab_size is not None and vocab_size < SYNTHETIC_ID_BOUND:
        _bound_synthetic_ids(one_batch, vocab_size)
    one_batch.cli_main()  # tp_size 1: the model runs in this process
    marks.write(memory_file)
