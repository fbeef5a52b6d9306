"""Greedy tokens of a checkpoint with the RVV policy on (eager route), through transformers, as JSON.

    python greedy_hf.py MODEL_DIR TOKENS PROMPT [PROMPT ...]

Run by tests/images/test_riscv64.py twice on the same checkpoint: inside the riscv64 runtime
image under qemu (the project's RVV kernels) and on this host (the amd64 stack). Per prompt and
step, the picked token, its log-probability and the top 5 as ``{token: logprob}``: the form
support.assert_same_greedy judges. Standard library, torch, transformers and sglang_rvv only.
"""

import json
import sys

import torch
from transformers import AutoModelForCausalLM, AutoTokenizer

from sglang_rvv import RvvPolicyConfig, install_rvv_policy


def main(model_dir: str, tokens: int, prompts: list[str]) -> dict:
    tokenizer = AutoTokenizer.from_pretrained(model_dir)
    model = AutoModelForCausalLM.from_pretrained(model_dir, dtype=torch.bfloat16).eval()
    # No compile: under qemu an Inductor compile per key takes minutes; the eager route runs the same kernels.
    report = install_rvv_policy(model, RvvPolicyConfig(regional_compile=False))
    results = []
    with torch.inference_mode():
        for prompt in prompts:
            ids = torch.tensor([tokenizer.encode(prompt)])
            out = model.generate(ids, attention_mask=torch.ones_like(ids), max_new_tokens=tokens,
                                 min_new_tokens=tokens, do_sample=False, output_scores=True,
                                 return_dict_in_generate=True)
            steps = []
            for token, scores in zip(out.sequences[0, ids.shape[1]:].tolist(), out.scores, strict=True):
                logprobs = torch.log_softmax(scores[0].float(), -1)
                top = torch.topk(logprobs, 5)
                steps.append([token, float(logprobs[token]),
                              {int(t): float(v) for v, t in zip(top.values, top.indices, strict=True)}])
            text = tokenizer.decode(out.sequences[0, ids.shape[1]:])
            results.append({"prompt": prompt, "steps": steps, "text": text})
    return {"provider": report.provider, "packed": sorted(report.packed), "results": results}


if __name__ == "__main__":
    print(json.dumps(main(sys.argv[1], int(sys.argv[2]), sys.argv[3:])))
