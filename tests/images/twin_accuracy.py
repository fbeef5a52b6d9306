"""What int4_a8 costs the default model through the RVV kernels' own arithmetic, run by the host
test (tests/images/test_default_model_accuracy.py) in a process of its own:

    python twin_accuracy.py CHECKPOINT

x86's provider has no int8-activation kernel (int4_a8 falls back to int4 there), so the policy
runs the kernels' scalar twins as the rvv provider (host_kernels.serve_as_rvv_provider): the
board's results bit for bit, at scalar speed. Prints one JSON line: accuracy.measure's result for
int4_a8 (the policy's report with it) and its greedy answer to the capital question.
"""

from __future__ import annotations

import json
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))  # tests/: host_kernels
import host_kernels  # noqa: E402

LAYOUT = "int4_a8"
QUESTION = [{"role": "user", "content": "What is the capital of France?"}]


def main(checkpoint: str) -> None:
    host_kernels.serve_as_rvv_provider()
    import torch
    from transformers import AutoModelForCausalLM, AutoTokenizer

    from sglang_rvv import RvvPolicyConfig, accuracy, install_rvv_policy

    tokenizer = AutoTokenizer.from_pretrained(checkpoint)
    model = AutoModelForCausalLM.from_pretrained(checkpoint, dtype=torch.bfloat16).eval()
    result = accuracy.measure(model, [LAYOUT], prompts=accuracy.PROMPTS[:2], text_windows=1,
                              tokenize=lambda text: tokenizer.encode(text, add_special_tokens=False))[0]
    report = install_rvv_policy(model, RvvPolicyConfig(weight_dtype=LAYOUT, regional_compile=False))
    prompt = tokenizer.apply_chat_template(QUESTION, add_generation_prompt=True, return_tensors="pt",
                                           return_dict=True)
    with torch.inference_mode():
        out = model.generate(**prompt, max_new_tokens=12, do_sample=False)
    answer = tokenizer.decode(out[0, prompt["input_ids"].shape[1]:], skip_special_tokens=True)
    print(json.dumps({"accuracy": result.to_dict(), "layouts": sorted(set(report.layouts.values())),
                      "packed": len(report.packed), "fallbacks": report.layout_fallbacks, "answer": answer}))


if __name__ == "__main__":
    main(sys.argv[1])
