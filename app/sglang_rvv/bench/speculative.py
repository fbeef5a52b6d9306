"""NGRAM speculative decoding on a checkpoint: how many drafted tokens each prompt accepts, and
whether its greedy tokens are the plain server's.

Two flag-on servers of the model, one after the other (they share the CPUs otherwise): plain, then
with ``--speculative-algorithm NGRAM`` (:func:`ngram_args`). Each asks every prompt of ``PROMPTS``
once, in order, for ``--tokens`` new greedy tokens (the NGRAM corpus grows from prompt to prompt,
as on a server).
Per prompt it prints the verify steps, the mean accepted length (new tokens a verify step,
SGLang's ``spec_accept_length``), the drafted tokens each step checks, and whether the tokens
equal the plain server's. Wall times here are this host's, not the board's: a verify step's cost
on the board is counted under qemu (make served-count).
"""

from __future__ import annotations

import argparse
import sys
import time
from pathlib import Path

from ..jsonfile import write_json
from ..launch.process import SGLangServer

FLAG = "--enable-cpu-rvv-inductor"
DRAFT_TOKENS = 12  # SGLang 0.5.21's default for NGRAM (server_args._handle_ngram)
# SGLang's NGRAM corpus takes each request's last max-trie-depth tokens of its prompt (and of
# its answer so far): at SGLang's default, 18, a rewrite's paragraph never reaches it.
TRIE_DEPTH = 128

PARAGRAPH = ("The committee, having deliberated at considerable length upon the matter of the proposed "
             "amendments, resolved to postpone its final determination until such time as further evidence "
             "could be gathered from the regional offices and the independent auditors.")
CODE = ("def mean(values):\n    total = 0\n    for v in values:\n        total = total + v\n"
        "    return total / len(values)\n")
PASSAGE = ("The Banana Pi BPI-F3 is a single-board computer built around the SpacemiT K1, a RISC-V chip with "
           "eight X60 cores that implement the vector extension 1.0 with 256-bit registers. The board has up "
           "to 16 GB of LPDDR4X memory, two gigabit Ethernet ports and an eMMC module.")
# The prompt set (issue "The served token", section 4): the kinds whose answers repeat their input
# (rewrite, summarise, edit, quote), where NGRAM drafts from the text already seen, and two free
# chats, where it has little to draft from.
PROMPTS = {
    "rewrite": f"Rewrite this paragraph in plain words:\n\n{PARAGRAPH}",
    "summarise": f"Summarise this text in one sentence:\n\n{PASSAGE}",
    "edit": f"Add a check for an empty list to this function and return the whole function:\n\n{CODE}",
    "quote": f"{PASSAGE}\n\nQuoting the passage above, how many cores does the K1 have, and what memory does "
             "the board carry?",
    "chat-1": "What should I pack for a weekend of hiking in the mountains?",
    "chat-2": "Tell me a short story about a lighthouse keeper.",
}


def ngram_args(depth: int = TRIE_DEPTH) -> tuple[str, ...]:
    """The NGRAM server's flags."""
    return ("--speculative-algorithm", "NGRAM", "--speculative-ngram-max-trie-depth", str(depth))


def chat_text(model: Path, prompt: str) -> str:
    """The prompt as one user turn in the model's own chat template."""
    from transformers import AutoTokenizer

    tokenizer = AutoTokenizer.from_pretrained(model)
    return tokenizer.apply_chat_template([{"role": "user", "content": prompt}], tokenize=False,
                                         add_generation_prompt=True)


def ask(server: SGLangServer, text: str, tokens: int) -> dict:
    """One greedy request: its tokens with each step's top-5 logprobs, and the server's speculative
    counts (None without NGRAM)."""
    began = time.monotonic()
    reply = server.post("/generate", {"text": text, "return_logprob": True, "top_logprobs_num": 5,
                                      "sampling_params": {"max_new_tokens": tokens, "temperature": 0}},
                        timeout=1800)
    meta = reply["meta_info"]
    return {"output_ids": reply["output_ids"], "completion_tokens": meta["completion_tokens"],
            "top_logprobs": [{str(t): lp for lp, t, _ in top} for top in meta["output_top_logprobs"]],
            "verify_steps": meta.get("spec_verify_ct"), "accept_length": meta.get("spec_accept_length"),
            "host_seconds": round(time.monotonic() - began, 2)}


def serve_prompts(model: Path, texts: dict[str, str], tokens: int, extra=(), log_path=None) -> dict[str, dict]:
    with SGLangServer(model, extra_args=[FLAG, *extra], log_path=log_path) as server:
        return {name: ask(server, text, tokens) for name, text in texts.items()}


def first_difference(got: dict, base: dict) -> dict | None:
    """Where ``got``'s tokens first leave ``base``'s: the step, both picks, and how far the pick
    fell below ``base``'s own in ``base``'s logprobs (None: not in its top 5); None if they agree
    (up to the shorter, where one ended at its EOS)."""
    for step, (ours, theirs) in enumerate(zip(got["output_ids"], base["output_ids"], strict=False)):
        if ours != theirs:
            top = base["top_logprobs"][step]
            gap = top[str(theirs)] - top[str(ours)] if str(ours) in top else None
            return {"step": step, "pick": ours, "base_pick": theirs, "gap_nats": gap}
    if len(got["output_ids"]) != len(base["output_ids"]):
        return {"step": min(len(got["output_ids"]), len(base["output_ids"])), "pick": None, "base_pick": None,
                "gap_nats": None}
    return None


def _agreement(diff: dict | None) -> str:
    if diff is None:
        return "all"
    if diff["pick"] is None:
        return f"all up to {diff['step']}, where one ended"
    below = "not in its top 5" if diff["gap_nats"] is None else f"{diff['gap_nats']:.3f} nats below"
    return f"up to {diff['step']}, then {diff['pick']} for {diff['base_pick']} ({below})"


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("model", type=Path, help="the checkpoint (its own chat template is used)")
    parser.add_argument("--tokens", type=int, default=128, help="new tokens a prompt (default %(default)s)")
    parser.add_argument("--prompts", nargs="+", choices=sorted(PROMPTS), default=list(PROMPTS))
    parser.add_argument("--trie-depth", type=int, default=TRIE_DEPTH,
                        help="--speculative-ngram-max-trie-depth (default %(default)s; SGLang's own: 18)")
    parser.add_argument("--json", type=Path, help="also write the results here")


def run(args: argparse.Namespace) -> int:
    if not (args.model / "config.json").is_file():
        print(f"speculative: no checkpoint at {args.model} (no config.json): give a model directory",
              file=sys.stderr)
        return 2
    texts = {name: chat_text(args.model, PROMPTS[name]) for name in args.prompts}
    print(f"# {args.model}: {len(texts)} prompts, {args.tokens} greedy tokens each, plain then NGRAM "
          f"(max trie depth {args.trie_depth})",
          file=sys.stderr, flush=True)
    plain = serve_prompts(args.model, texts, args.tokens)
    ngram = serve_prompts(args.model, texts, args.tokens, ngram_args(args.trie_depth))
    rows = []
    for name in texts:
        ours, base = ngram[name], plain[name]
        rows.append({"prompt": name, "tokens": ours["completion_tokens"], "verify_steps": ours["verify_steps"],
                     "accept_length": ours["accept_length"], "draft_tokens_checked": DRAFT_TOKENS,
                     "first_difference": first_difference(ours, base),
                     "host_seconds": {"plain": base["host_seconds"], "ngram": ours["host_seconds"]}})
    print(f"{'prompt':<10} {'tokens':>6} {'verifies':>8} {'accepted/verify':>15} {'checked/verify':>14} "
          "tokens as the plain server's")
    for r in rows:
        same = _agreement(r["first_difference"])
        print(f"{r['prompt']:<10} {r['tokens']:>6} {r['verify_steps']:>8} {r['accept_length']:>15.2f} "
              f"{r['draft_tokens_checked']:>14} {same}")
    if args.json:
        write_json(args.json, {"kind": "speculative", "model": str(args.model), "tokens": args.tokens,
                               "trie_depth": args.trie_depth,
                               "rows": rows, "outputs": {"plain": plain, "ngram": ngram}})
    return 0

