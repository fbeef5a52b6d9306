"""What a quantized layout costs a model: its logits, greedy picks and perplexity against BF16.

:func:`measure` runs the same model twice, once as it is (BF16, row-major: the reference) and
once with the policy at a ``weight_dtype``, on a fixed prompt set and a fixed text:

- ``logits_sqnr_db``: SQNR of every logit of the prompts (teacher-forced) against the reference;
- ``greedy_agreement``: the fraction of positions where the argmax matches the reference's,
  both reading the reference's own greedy continuation of each prompt (teacher-forced, so one
  flip does not decide every later position);
- ``perplexity`` and ``reference_perplexity`` over the text (``TEXT_WINDOWS`` windows of
  ``TEXT_WINDOW`` tokens, each read on its own), predicted token by token.

The bench report and the accuracy test share it; the tiny models are random weights, whose
near-flat logits say little about what int4 costs a trained checkpoint: run it on a real one
(``tokenize`` then its tokenizer) before quoting a cost.
"""

from __future__ import annotations

import copy
import math
from collections.abc import Callable, Sequence
from dataclasses import asdict, dataclass
from importlib import resources

import torch

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
