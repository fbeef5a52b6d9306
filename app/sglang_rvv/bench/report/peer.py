"""The peer compare's section of the report: ``peer-compare.json`` (``make peer-compare``) as a table
of both engines, the ours / llama.cpp ratios against the product's targets, and each published
anchor with the model's error or, for a bound, its ratio. Labelled as modelled from emulated counts.

Reads the JSON only; the arithmetic lives in ``sglang_rvv.boardmodel.model`` and ``.compare``.
"""

from __future__ import annotations

from pathlib import Path

from .board import load
from .markdown import _table

FILE = "peer-compare.json"


def _tok(value) -> str:
    return "n/a" if value is None else f"{value:.2f}"


def _pct(value) -> str:
    return "n/a" if value is None else f"{value * 100:+.0f} %"


def section(data: dict) -> str:
    head = ["engine", "path", "model", "format", "threads", "decode (M insns)", "outside the kernel (M insns)",
            "weight MB/token", "decode tok/s", "decode bound", "prefill (M insns)", "pp128 tok/s", "published",
            "error"]
    rows = []
    for r in data["peers"]:
        tokens = r.get("prefill_tokens")  # None: a served row, whose prefill is not counted
        published = r.get("published_tok_s")
        rows.append([r["engine"], r["path"], r["model"], r["format"], r["threads"],
                     f"{r['decode_instructions'] / 1e6:.1f}", f"{r['decode_outside_kernel_instructions'] / 1e6:.2f}",
                     f"{r['bytes_per_token'] / 1e6:.1f}", _tok(r["modelled_decode_tok_s"]), r["decode_bound"],
                     "not counted" if tokens is None
                     else f"{r[f'prefill{tokens}_instructions'] / 1e6:.0f} (pp{tokens} counted)",
                     _tok(r["modelled_prefill_tok_s"]),
                     "" if not published else f"tg {published['decode']}, {published['prefill_test']} "
                                              f"{published['prefill']}",
                     "" if not r.get("error") else f"tg {_pct(r['error']['decode'])}, "
                                                   f"{published['prefill_test']} {_pct(r['error']['prefill'])}"])
    ratio_rows = [[r["what"], r["model"], r["threads"], r["ours"], r["peer"], f"{r['ratio']:.2f}",
                   f"≥ {r['target']}", "met" if r["met"] else "not met"] for r in data["ratios"]]
    anchors = []
    for a in data["anchors"]:
        if a.get("comparable") is None:
            anchors.append(f"- {a['what']} ({a['use']}): no comparable count in this run")
            continue
        m = a["modelled_tok_s"]
        anchors.append(f"- {a['what']} ({a['use']}; {a['source']}): published tg {a['decode_tok_s']}, "
                       f"pp{a['prefill_tokens']} {a['prefill_tok_s']}; modelled for {a['comparable']}: tg "
                       f"{_tok(m['decode'])} ({_pct(a['error']['decode'])}), pp{a['prefill_tokens']} "
                       f"{_tok(m['prefill'])} ({_pct(a['error']['prefill'])})")
    constants = [f"- `{name}` = {c['value']:g} {c['unit']}: {c['source']}" for name, c in data["constants"].items()]
    return "\n\n".join([
        f"*{data['label']}.* Each engine's model counted once under qemu (one guest thread), and priced at each "
        "thread count by the same board model and constants: a decode token at M=1 (the second step), and a "
        "128-token prefill in one batch, priced from the counted one.", _table(head, rows),
        "Ours / llama.cpp, against the product's targets:", _table(
            ["what", "model", "threads", "ours", "llama.cpp", "ratio", "target", ""], ratio_rows),
        "Published anchors (a calibration anchor's error; IME only bounds: qemu cannot run its instructions):",
        "\n".join(anchors), "Constants:", "\n".join(constants)])


def render(run_dir: Path) -> str:
    data = load(run_dir, FILE)
    return "" if data is None else f"\n## Side by side with llama.cpp\n\n{section(data)}\n"
