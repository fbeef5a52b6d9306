"""The board model: a predicted time per token on the BPI-F3 from emulated counts, the same for
every engine counted (the appliance, and llama.cpp: ``compare``).

Every constant is here, with its source or the word "assumption". Nothing is fitted. The published
figures it is held to (``PEER_ANCHORS``; ``ANCHORS`` for the appliance's own stack) are set beside
its predictions with their errors, never used to tune it. The first board run's ``perf stat``
instructions and cycles are what should replace the IPC assumptions.

    t(token) = max(weight_bytes / BANDWIDTH,                            the kernel overlaps its stream
                   kernel_cycles / (FREQ x threads))                    and splits over the cores
             + sum over the other components of cycles / FREQ          serial, one thread
    cycles(component) = scalar instructions / IPC[component]
                      + LMUL-weighted vector instructions x VLEN / DLEN   one vector op per DLEN slice

A prefill of n tokens is priced by the same rule on its own counts (``predict_prefill``): the
weights stream once for all n tokens, so its kernel's vector work, not the stream, sets its time.

Counts are not cycles: the IPCs turn one into the other, and they are assumptions. The counts
come from one guest thread (deterministic); on the board the kernel's blocks run on ``threads``
cores at once (KERNEL_THREADS unless a row names its own), everything else stays serial.
"""

from __future__ import annotations

from dataclasses import dataclass

from .counts import COMPONENT_NAMES


@dataclass(frozen=True)
class Constant:
    value: float
    unit: str
    source: str


CONSTANTS = {
    "freq_hz": Constant(1.6e9, "Hz", "SpacemiT X60 clock; LLVM RISCVSchedSpacemitX60.td ("
                        "shared/board.md)"),
    "vlen_bits": Constant(256, "bit", "K1 VLEN (shared/board.md, BPI-F3 /proc/cpuinfo zvl256b)"),
    "dlen_bits": Constant(128, "bit", "K1 DLEN: an LMUL=1 op takes about 2 cycles; LLVM X60 "
                          "scheduling model (shared/board.md)"),
    "bandwidth_bytes_per_s": Constant(4.5e9, "B/s", "assumption: effective LPDDR4X bandwidth that "
                                      "published K1 decoders reach (4-5 GB/s, shared/board.md); "
                                      "one thread alone reaches less (0.25-0.43 GB/s with one "
                                      "line in flight), so this is the multi-thread kernel's "
                                      "stream"),
    "kernel_threads": Constant(4, "threads", "assumption: the kernel's blocks split evenly over one "
                               "cluster of 4 X60 cores (the board's kernel step measures 4 and 8 "
                               "threads; some K1 kernels decode slower at 8 than at 4)"),
    "ipc_kernel": Constant(1.0, "insn/cycle", "assumption: the kernel's scalar instructions "
                           "(loop control, address arithmetic) on the dual-issue in-order X60"),
    "ipc_torch": Constant(0.7, "insn/cycle", "assumption: branchy C++ on an in-order "
                          "dual-issue core"),
    "ipc_interpreter": Constant(0.7, "insn/cycle", "assumption"),
    "ipc_libgomp": Constant(0.7, "insn/cycle", "assumption"),
    "ipc_libc": Constant(0.7, "insn/cycle", "assumption"),
    "ipc_libm": Constant(0.7, "insn/cycle", "assumption"),
    "ipc_other": Constant(0.7, "insn/cycle", "assumption"),
}

# Published board figures for a comparable configuration, shown beside the prediction.
ANCHORS = (
    {"shape": "qwen3-0.6b", "weight_dtype": "bf16", "tok_per_s": 1.02,
     "what": "the seed's fork (Inductor RVV, torch_native attention), warm",
     "source": "the seed's reproduction README (shared/board.md)",
     "comparable": "same model and format; another software stack, thread count not stated"},
)


# llama.cpp's published K1 figures (shared/board.md, "Peer numbers to predict"), each with the
# counted row it is held to (compare.held_to_anchors). A calibration anchor is a plain-RVV run the
# counter can emulate: the model predicts it and reports the error. IME instructions do not run
# under qemu, so IME's figures are bounds only: set beside the best plain path's prediction (the
# repacked gemv, llama.cpp's default at VLEN 256).
PEER_ANCHORS = (
    {"what": "llama.cpp plain RVV, TinyLlama-1.1B-Chat Q4_K_M, 8 threads, BPI-F3", "use": "calibration",
     "model": "tinyllama-1.1b", "format": "Q4_K_M", "threads": 8, "compare_path": "vec_dot",
     "decode_tok_s": 8.29, "prefill_tok_s": 12.46, "prefill_tokens": 512,
     "source": "a public blog, 'Running a Local LLM on RISC-V: Building llama.cpp on a Banana Pi F3, Part 1' "
               "(2026-02-27): GCC 14.2, -march=rv64gc_zfh_v_zvfh_zicbop_zihintpause, before the RVV repack "
               "kernels (shared/board.md)"},
    {"what": "llama.cpp SpacemiT IME1, Qwen3-0.6B Q4_0, 4 threads, K1", "use": "bound",
     "model": "qwen3-0.6b", "format": "Q4_0", "threads": 4, "compare_path": "repack",
     "decode_tok_s": 11.73, "prefill_tok_s": 49.15, "prefill_tokens": 128,
     "source": "llama.cpp docs/build-riscv64-spacemit.md (shared/board.md)"},
    {"what": "llama.cpp SpacemiT IME1, Qwen2.5-0.5B Q4_0, 4 threads, K1", "use": "bound",
     "model": "qwen2.5-0.5b", "format": "Q4_0", "threads": 4, "compare_path": "repack",
     "decode_tok_s": 10.03, "prefill_tok_s": 64.12, "prefill_tokens": 512,
     "source": "llama.cpp PR #15288 (shared/board.md)"},
)


def c(name: str) -> float:
    return CONSTANTS[name].value


def component_cycles(name: str, values: dict) -> float:
    scalar = values["insns"] - values["vec_insns"]
    # A vector op whose vtype came from vsetvl (a register) counts at LMUL 1: the plugin says how many.
    vector = values["vec_lmul"] + values["vec_unknown_lmul"]
    return scalar / c(f"ipc_{name}") + vector * c("vlen_bits") / c("dlen_bits")


def predict(components: dict[str, dict], weight_bytes: int, threads: int | None = None) -> dict:
    """Per-token seconds by component, and tok/s, for one decode step's counts, the kernel's blocks
    over ``threads`` cores (default: the constant kernel_threads)."""
    threads = threads or c("kernel_threads")
    cycles = {name: component_cycles(name, components[name]) for name in COMPONENT_NAMES}
    seconds = {name: cycles[name] / c("freq_hz") / (threads if name == "kernel" else 1)
               for name in COMPONENT_NAMES}
    stream = weight_bytes / c("bandwidth_bytes_per_s")
    kernel_or_stream = max(stream, seconds["kernel"])
    total = kernel_or_stream + sum(v for k, v in seconds.items() if k != "kernel")
    return {"seconds_per_token": total, "tok_per_s": 1 / total if total else None,
            "weight_stream_seconds": stream, "component_seconds": seconds,
            "kernel_or_stream_seconds": kernel_or_stream,
            "bound": "weight stream" if stream >= seconds["kernel"] else "kernel instructions",
            # What a board's perf stat of the same step at one thread compares with (no stream bound).
            "cycles_one_thread": sum(cycles.values())}


def predict_prefill(components: dict[str, dict], weight_bytes: int, shape: dict, counted: int,
                    priced: int | None = None, threads: int | None = None) -> dict:
    """A prefill of ``priced`` tokens (default: ``counted``) in one batch, from the counts of one of
    ``counted`` tokens, by the decode step's rule: the weights stream once for all the tokens, so
    the kernel's vector work, not the stream, bounds it (``bound`` says which did). A longer
    prefill than the one counted grows every component by the ratio of the lengths and the
    kernel by the ratio of the multiply-adds (prefill_macs: the attention grows with the position)."""
    priced = priced or counted
    growth = {name: priced / counted for name in components}
    growth["kernel"] = prefill_macs(shape, priced) / prefill_macs(shape, counted)
    scaled = {name: {k: v * growth[name] for k, v in values.items()} for name, values in components.items()}
    p = predict(scaled, weight_bytes, threads)
    return {**p, "seconds": p["seconds_per_token"], "tokens": priced,
            "tok_per_s": priced / p["seconds_per_token"] if p["seconds_per_token"] else None}


def prefill_macs(shape: dict, tokens: int) -> int:
    """Multiply-adds of a causal prefill of ``tokens`` tokens: the projections per token, the
    attention's scores and values growing with the position, and the logits of the last token
    only (what a server and llama.cpp compute)."""
    h, layers = shape["hidden_size"], shape["num_hidden_layers"]
    q = shape["num_attention_heads"] * shape["head_dim"]
    projections = weight_bytes_bf16({**shape, "vocab_size": 0}) // 2
    attention = layers * 2 * q * tokens * (tokens + 1) // 2
    return projections * tokens + attention + shape["vocab_size"] * h


def weight_bytes_bf16(shape: dict) -> int:
    """Bytes of every projection weight and the logits head, at BF16: what one decode token reads."""
    h, i, layers = shape["hidden_size"], shape["intermediate_size"], shape["num_hidden_layers"]
    q = shape["num_attention_heads"] * shape["head_dim"]
    kv = shape["num_key_value_heads"] * shape["head_dim"]
    per_layer = h * q + 2 * h * kv + q * h + 3 * h * i
    return 2 * (layers * per_layer + shape["vocab_size"] * h)


def streamed_bytes(shape: dict, packed_source_bytes: int, packed_bytes: int) -> int:
    """The weight bytes a token streams from memory: the packed buffers once each (``packed_bytes``,
    the policy's report: qweight and scales for int8/int4), BF16 for the rest (row-major, read by
    torch). ``packed_source_bytes`` are the BF16 bytes of the weights the policy packed (not their
    packed size: an int4 layout replaces 4 BF16 bytes with about 1). The kernel's other vector
    loads re-read what the caches hold (the activation panel once per block, the group sums in its
    scratch), so they are not streamed; the counts keep them beside (kernel loads per packed byte)."""
    return max(0, weight_bytes_bf16(shape) - packed_source_bytes) + packed_bytes


PRICED_THREADS = (4, 8)  # the thread counts a count is priced at: one cluster of the K1, and all 8 cores


def _board_threads(text: str) -> int:
    import argparse

    if not text.isdigit() or not 1 <= int(text) <= 8:
        raise argparse.ArgumentTypeError(f"{text!r}: the K1 has 8 cores; give counts from 1 to 8")
    return int(text)


def add_threads_option(parser) -> None:
    """The pricing commands' ``--threads``: the board thread counts each count is priced at."""
    parser.add_argument("--threads", nargs="+", type=_board_threads, default=list(PRICED_THREADS),
                        help="board thread counts each count is priced at (default: %(default)s)")


def constants_json() -> dict:
    return {name: {"value": k.value, "unit": k.unit, "source": k.source}
            for name, k in CONSTANTS.items()}
