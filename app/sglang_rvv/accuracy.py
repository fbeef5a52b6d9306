"""What a quantized layout costs a model: its logits, greedy picks and perplexity against BF16.

:func:`measure` runs the same model twice, once as it is (BF16, row-major: the reference) and
once with the policy at a ``weight_dtype``, on a fixed prompt set and a fixed text:

- ``logits_sqnr_db``: SQNR of every logit of the prompts (teacher-forced) against the reference;
- ``greedy_agreement``: the fraction of positions where the argmax matches the reference's,
  both reading the reference's own greedy continuation of each prompt (teacher-forced, so one
  flip does not decide every later position);
- ``perplexity`` and ``reference_perplexity`` over the text (``TEXT_WINDOWS`` windows of
  ``TEXT_WINDOW`` tokens, each read on its own), predicted token by token.

:func:`lm_head_candidates` asks what an exact greedy pick from a quantized lm_head needs: where
the BF16 lm_head's argmax ranks among the quantized logits, so that rescoring that many
candidates from the BF16 rows finds it (``python -m sglang_rvv.accuracy MODEL_DIR``).

The bench report and the accuracy test share :func:`measure`; the tiny models are random
weights, whose near-flat logits say little about what int4 costs a trained checkpoint: run it on
a real one (``tokenize`` then its tokenizer) before quoting a cost.
"""

from __future__ import annotations

import copy
import math
from collections.abc import Callable, Sequence
from dataclasses import asdict, dataclass
from importlib import resources

import torch

from . import exact_pick, layout
from .config import RvvPolicyConfig
from .policy import install_rvv_policy
from .smoke.comparison import sqnr_db

PROMPTS = ("The board has eight cores and", "Once upon a time there was", "Tokens per second on RISC-V",
           "The quick brown fox jumps over")
NEW_TOKENS = 8
# The text is read in windows of the largest prefill bucket (routing.PREFILL_BUCKETS): a longer
# call runs row-major F.linear, whatever the layout, and would hide its cost.
TEXT_WINDOW = 128
TEXT_WINDOWS = 2


@dataclass(frozen=True)
class Accuracy:
    weight_dtype: str
    logits_sqnr_db: float
    greedy_agreement: float
    perplexity: float
    reference_perplexity: float

    def to_dict(self) -> dict:
        return asdict(self)

    def summary(self) -> str:
        return (f"{self.weight_dtype}: logits SQNR {self.logits_sqnr_db:.1f} dB, greedy agreement "
                f"{self.greedy_agreement:.1%}, perplexity {self.perplexity:.3f} (bf16 {self.reference_perplexity:.3f})")


def byte_tokens(text: str, vocab_size: int) -> list[int]:
    """A tokenizer-free encoding for models without one (the tiny models): UTF-8 bytes."""
    if vocab_size < 256:
        raise ValueError(f"byte tokens need a vocabulary of at least 256, this model has {vocab_size}")
    return list(text.encode())


def corpus_text() -> str:
    return resources.files("sglang_rvv.data").joinpath("corpus.txt").read_text()


def _logits(model: torch.nn.Module, ids: Sequence[int]) -> torch.Tensor:
    with torch.no_grad():
        return model(torch.tensor([list(ids)])).logits[0].float()


def _greedy(model: torch.nn.Module, ids: Sequence[int], steps: int) -> list[int]:
    ids = list(ids)
    for _ in range(steps):
        ids.append(int(_logits(model, ids)[-1].argmax()))
    return ids


def _perplexity(model: torch.nn.Module, windows: Sequence[Sequence[int]]) -> float:
    nll = [torch.nn.functional.cross_entropy(_logits(model, ids)[:-1].double(), torch.tensor(list(ids[1:])),
                                             reduction="sum") for ids in windows]
    return math.exp(float(sum(nll)) / sum(len(ids) - 1 for ids in windows))


def measure(model: torch.nn.Module, weight_dtypes: Sequence[str], *, tokenize: Callable[[str], list[int]],
            config: RvvPolicyConfig | None = None, prompts: Sequence[str] = PROMPTS,
            new_tokens: int = NEW_TOKENS, text_windows: int = TEXT_WINDOWS) -> list[Accuracy]:
    """Each of ``weight_dtypes`` against BF16 row-major on ``model`` (left as it is; the policy
    runs on a copy per layout; the reference runs once).

    ``config`` sets the policy's other fields (its ``weight_dtype`` is replaced); eager, without
    regional compile, by default: accuracy depends on the layout, not on the route.
    """
    base = config or RvvPolicyConfig(regional_compile=False)
    continuations = [_greedy(model, tokenize(prompt), new_tokens) for prompt in prompts]
    # The picks after the last prompt token and after each generated one but the last.
    picks = [slice(len(ids) - new_tokens - 1, len(ids) - 1) for ids in continuations]
    want = [_logits(model, ids) for ids in continuations]
    text = tokenize(corpus_text())
    windows = [text[i * TEXT_WINDOW:(i + 1) * TEXT_WINDOW] for i in range(text_windows)]
    if len(windows[-1]) < TEXT_WINDOW:
        raise ValueError(f"the corpus is {len(text)} tokens, fewer than {text_windows} x {TEXT_WINDOW}")
    reference_perplexity = _perplexity(model, windows)
    results = []
    for weight_dtype in weight_dtypes:
        quantized = copy.deepcopy(model)
        install_rvv_policy(quantized, RvvPolicyConfig(**{**base.to_dict(), "weight_dtype": weight_dtype}))
        got = [_logits(quantized, ids) for ids in continuations]
        agree = sum(int((ref[p].argmax(-1) == out[p].argmax(-1)).sum()) for ref, out, p in zip(want, got, picks,
                                                                                                strict=True))
        results.append(Accuracy(
            weight_dtype=weight_dtype,
            logits_sqnr_db=sqnr_db(torch.cat(got), torch.cat(want)),
            greedy_agreement=agree / (new_tokens * len(prompts)),
            perplexity=_perplexity(quantized, windows),
            reference_perplexity=reference_perplexity,
        ))
    return results


CANDIDATES = (1, 2, 4, 8, 16, 32)


def _bf16_logits(hidden: torch.Tensor, weight: torch.Tensor) -> torch.Tensor:
    """What a kernel returns: the fp32 dot products rounded once to BF16 (widened back for ranking)."""
    return (hidden.float() @ weight.float().T).to(torch.bfloat16).float()


def _kl(reference: torch.Tensor, logits: torch.Tensor) -> float:
    """Mean KL(softmax(reference) || softmax(logits)) per position, in nats: temperature 1."""
    p, q = torch.log_softmax(reference.double(), -1), torch.log_softmax(logits.double(), -1)
    return float((p.exp() * (p - q)).sum(-1).mean())


def lm_head_candidates(model: torch.nn.Module, weight_dtypes: Sequence[str], *,
                       tokenize: Callable[[str], list[int]], prompts: Sequence[str] = PROMPTS,
                       new_tokens: int = 64, group_size: int | None = None,
                       candidates: Sequence[int] = CANDIDATES) -> dict:
    """For each layout, where the BF16 lm_head's greedy pick ranks among the layout's logits, over
    the model's own greedy continuation of ``prompts`` (teacher-forced, every generated position).

    Per layout: ``within[k]``, the share of positions whose BF16 argmax is among the quantized
    logits' top k (rescoring k candidates from the BF16 rows then picks it exactly);
    ``worst_rank`` (0 = the quantized argmax itself); the plain ``greedy_agreement`` and, at
    temperature 1, ``kl_plain``, the KL from the BF16 distribution; and ``rescored[k]``, both for
    the logits with the k candidates exact and every other capped just below the least of them
    (:func:`exact_pick.rescore`: the pick is always a candidate). The quantized weight is the
    layout's reference bits (``layout.quantize_reference``), the kernels' weights; the products
    are fp32 rounded to BF16, as the kernels return them.
    """
    head = model.get_output_embeddings().weight.detach()
    hidden = []
    with torch.no_grad():
        for prompt in prompts:
            ids = model.generate(torch.tensor([tokenize(prompt)]), max_new_tokens=new_tokens, min_new_tokens=new_tokens,
                                 do_sample=False)[0].tolist()
            states = model(torch.tensor([ids]), output_hidden_states=True).hidden_states[-1][0]
            hidden.append(states[len(ids) - new_tokens - 1:len(ids) - 1])
    hidden = torch.cat(hidden).to(torch.bfloat16)
    exact = _bf16_logits(hidden, head)
    truth = exact.argmax(-1)
    out = {"positions": int(hidden.shape[0]), "vocab": int(head.shape[0]), "layouts": {}}
    for weight_dtype in weight_dtypes:
        kind = layout.quant_layout(weight_dtype)
        if kind.activations != "bf16":
            raise ValueError(f"lm_head_candidates: {weight_dtype} quantizes the activations too; it measures "
                             "weight-only layouts (int8, int4)")
        group = kind.default_group_size if group_size is None else group_size
        qweight, scales = layout.quantize_reference(head, kind, group)
        approx = _bf16_logits(hidden, layout.dequantize_reference(qweight, scales, kind, *head.shape).float())
        # The BF16 pick's place in the quantized logits, ties broken by index as argmax breaks them.
        score = approx.gather(-1, truth[:, None])
        index = torch.arange(approx.shape[-1])
        rank = ((approx > score) | ((approx == score) & (index < truth[:, None]))).sum(-1)
        within, rescored = {}, {}
        for k in candidates:
            top = approx.topk(k, -1).indices
            within[k] = float((top == truth[:, None]).any(-1).float().mean())
            logits = exact_pick.rescore(approx.to(torch.bfloat16), hidden, head, k).float()
            rescored[k] = {"greedy_agreement": float((logits.argmax(-1) == truth).float().mean()),
                           "kl": _kl(exact, logits)}
        out["layouts"][weight_dtype] = {
            "group_size": group,
            "within": within,
            "worst_rank": int(rank.max()),
            "greedy_agreement": float((approx.argmax(-1) == truth).float().mean()),
            "kl_plain": _kl(exact, approx),
            "rescored": rescored,
        }
    return out


# Chat turns like the served ones: rewrite, summarise, edit code, answer from a passage, free chat.
CHAT_PROMPTS = (
    "Rewrite this sentence in plain words: The committee deferred its decision pending further review.",
    "Summarise: The Banana Pi BPI-F3 is a single-board computer with a SpacemiT K1 processor, eight RISC-V "
    "cores and 16 GB of memory.",
    "Fix the bug in this Python code: def add(a, b): return a - b",
    "According to the passage 'Paris is the capital and largest city of France', what is the capital of France?",
    "Tell me a short story about a robot who learns to paint.",
    "What are three good habits for staying healthy?",
)


def main(argv: Sequence[str] | None = None) -> int:
    import argparse
    import json

    parser = argparse.ArgumentParser(prog="python -m sglang_rvv.accuracy",
                                     description="Where a quantized lm_head's logits rank the BF16 greedy pick "
                                                 "(lm_head_candidates), on a checkpoint and its tokenizer.")
    parser.add_argument("model_dir")
    parser.add_argument("--layouts", nargs="+", default=["int4", "int8"])
    parser.add_argument("--new-tokens", type=int, default=64)
    args = parser.parse_args(argv)
    from transformers import AutoModelForCausalLM, AutoTokenizer

    tokenizer = AutoTokenizer.from_pretrained(args.model_dir)
    model = AutoModelForCausalLM.from_pretrained(args.model_dir, dtype=torch.bfloat16).eval()

    def tokenize(text: str) -> list[int]:
        return tokenizer.apply_chat_template([{"role": "user", "content": text}], add_generation_prompt=True,
                                             tokenize=True, return_dict=False)

    print(json.dumps(lm_head_candidates(model, args.layouts, tokenize=tokenize, prompts=CHAT_PROMPTS,
                                        new_tokens=args.new_tokens), indent=1))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
