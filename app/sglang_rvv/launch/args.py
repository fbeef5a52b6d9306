"""The SGLang command line and environment for bf16 serving on CPU."""

from __future__ import annotations

# The KV cache budget in tokens. SGLang's default sizes it from free memory
# (~14 GB on a 24 GiB machine); a small fixed pool keeps startup and RSS small.
DEFAULT_MAX_TOTAL_TOKENS = 4096
CPU_ENV = {"SGLANG_USE_CPU_ENGINE": "1"}


def cpu_server_args(max_total_tokens: int = DEFAULT_MAX_TOTAL_TOKENS) -> list[str]:
    """SGLang arguments for bf16 serving on CPU (add ``--model-path``, ``--host``, ``--port``).

    ``--sleep-on-idle``: without it an idle scheduler busy-polls a whole core
    (measured here: ~94 %), which the model's own threads then lose.
    """
    return [
        "--device", "cpu",
        "--dtype", "bfloat16",
        "--attention-backend", "torch_native",
        "--max-total-tokens", str(max_total_tokens),
        "--sleep-on-idle",
    ]
