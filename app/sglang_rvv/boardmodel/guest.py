"""The counted workload: runs inside the riscv64 rootfs under the counting qemu, as a script file
(the image's sglang_rvv does not contain this package). Standard library, torch, transformers and
the image's sglang_rvv only.

It builds a transformers causal LM with seeded random BF16 weights at the requested shape, installs
the policy (or not), runs a prefill and then greedy decode steps at M=1, and writes a mark between
phases (a write(2) to count.c's MARK_FD, whose length is the mark number): mark 1 before the prefill,
2 after it, then one after every decode step. With ``prefill_len``, last, two marks around a prefill
of that many tokens from an empty cache. With ``calls`` (policy on, bf16) it then calls one
packed projection (the first o_proj, M=1) that many times through the module, as the model does,
and then its native op as many times with the same operands, a mark after each loop: what a
projection call costs around its kernel. Last, the same op call compiled by torch.compile with
the eager backend, called as many times after its compile (a mark before and after): Dynamo's
guards and frame on the way to the op, what a compiled route adds before any Inductor code. It
then writes a JSON result with the guest's /proc/self/maps, which attributes the counts.

On a board (``counters`` in the spec, :mod:`.counters`) it runs natively instead, and each mark
also reads this process's hardware counters (perf_event_open) and the clock: the same phases,
measured. The counted (qemu) path leaves ``mark`` as it is.

Argument: one JSON object (run.spec).
"""

import json
import os
import sys
import time

MARK_FD = 0x434F554E  # == count.c MARK_FD
EXIT_LAYOUT_MISSING = 3  # the image cannot run the requested layout (run.LayoutMissing)
EXIT_NOT_COVERED = 4     # the policy packed nothing at this shape (run.NotCovered)
EXIT_NO_KERNELS = 5      # the rvv provider cannot run: an error, never a count of another kernel


def mark(n):
    try:
        os.write(MARK_FD, b"x" * n)
    except OSError:  # EBADF: the descriptor is never open; the plugin saw the call
        pass


def reading_marks(names, readings):
    """A ``mark`` that records the counters and the clock at each mark, or the reason the counters
    cannot be read here (then only the clock)."""
    from sglang_rvv.boardmodel.perfcounters import Counters, Unavailable

    try:
        counters = Counters(names)
    except Unavailable as why:
        counters, readings["error"] = None, str(why)
    marks = readings.setdefault("marks", {})

    def read_mark(n):
        marks[str(n)] = {"seconds": time.perf_counter(), **(counters.read() if counters else {})}

    return read_mark


def answer_find_library_from_rootfs():
    """qemu does not remap execve, so ctypes.util.find_library's ldconfig/gcc subprocesses would
    run the host's tools and name host libraries; answer it from the guest's own library dirs."""
    import ctypes.util
    import glob

    dirs = ("/usr/lib/riscv64-linux-gnu", "/lib/riscv64-linux-gnu", "/usr/lib", "/lib")

    def find_library(name):
        for d in dirs:
            hits = sorted(glob.glob(f"{d}/lib{name}.so*"))
            if hits:
                return os.path.basename(hits[0])
        return None

    ctypes.util.find_library = find_library


def call_projection(model, report, calls, first_mark, generator):
    """Marks first_mark, +1 after ``calls`` module calls of the first packed o_proj at M=1, +2
    after as many calls of its native bf16 op on the module's own packed buffer, +3 once that op
    call is compiled (torch.compile, eager backend) and +4 after as many calls of it."""
    import torch

    from sglang_rvv.packed_state import BUFFER

    name = next(n for n in report.packed if n.endswith("o_proj"))
    module = model.get_submodule(name)
    x = torch.randn(1, 1, module.in_features, generator=generator).to(torch.bfloat16)
    packed, out_features = module._buffers[BUFFER], module.out_features
    op = torch.ops.sglang_rvv_native.packed_bf16_linear
    with torch.inference_mode():
        module(x)  # the first call decides the route and memoises it, as a model's first token does
        op(x, packed, out_features, 1)
        mark(first_mark)
        for _ in range(calls):
            module(x)
        mark(first_mark + 1)
        for _ in range(calls):
            op(x, packed, out_features, 1)
        mark(first_mark + 2)
        compiled = torch.compile(lambda x: op(x, packed, out_features, 1), backend="eager", dynamic=False,
                                 fullgraph=True)
        compiled(x)
        mark(first_mark + 3)
        for _ in range(calls):
            compiled(x)
        mark(first_mark + 4)


def main(spec):
    global mark
    answer_find_library_from_rootfs()
    import torch

    torch.set_num_threads(1)
    from sglang_rvv import RvvPolicyConfig, fused, install_rvv_policy, tiny

    overrides = dict(spec["shape"])
    arch = overrides.pop("arch")
    model = tiny.build_model(arch, seed=spec["seed"], **overrides)
    report = None
    if spec["policy"]:
        fields = getattr(RvvPolicyConfig, "__dataclass_fields__", {})
        options = dict(regional_compile=False, measure_routes=False)
        if spec["weight_dtype"] != "bf16":
            if "weight_dtype" not in fields:
                print(f"layout {spec['weight_dtype']}: the image's RvvPolicyConfig has no "
                      "weight_dtype", file=sys.stderr)
                return EXIT_LAYOUT_MISSING
            options["weight_dtype"] = spec["weight_dtype"]
        if spec.get("lm_head_dtype"):
            if "lm_head_dtype" not in fields:
                print(f"lm_head {spec['lm_head_dtype']}: the image's RvvPolicyConfig has no lm_head_dtype",
                      file=sys.stderr)
                return EXIT_LAYOUT_MISSING
            options["lm_head_dtype"] = spec["lm_head_dtype"]
        report = install_rvv_policy(model, RvvPolicyConfig(**options))
        if not report.packed:
            print(f"the policy packed no projection at this shape ({report.skipped}); the kernels "
                  "do not cover it", file=sys.stderr)
            return EXIT_NOT_COVERED
        if report.provider != "rvv":
            print(f"provider {report.provider} ({report.provider_reason}), not rvv", file=sys.stderr)
            return EXIT_NO_KERNELS
    # Each token is picked as greedy sampling picks it: the top-1 kernel where the policy gave the
    # model's sampling that kernel (as transformers' generate and SGLang's sampler call it), else
    # torch's argmax.
    top1 = fused.argmax if report is not None and report.fused_ops.get("top1") else torch.argmax
    readings = {}
    if spec.get("counters"):
        mark = reading_marks(spec["counters"], readings)
    generator = torch.Generator().manual_seed(spec["seed"])
    prompt = torch.randint(0, overrides["vocab_size"], (1, spec["prompt_len"]), generator=generator)
    tokens = []
    with torch.inference_mode():
        mark(1)
        out = model(prompt, use_cache=True)
        mark(2)
        cache = out.past_key_values
        token = top1(out.logits[:, -1], -1).unsqueeze(-1)
        for step in range(spec["decode_steps"]):
            out = model(token, past_key_values=cache, use_cache=True)
            cache = out.past_key_values
            token = top1(out.logits[:, -1], -1).unsqueeze(-1)
            tokens.append(int(token))
            mark(3 + step)
    next_mark = 3 + spec["decode_steps"]
    if spec.get("calls") and report is not None:
        call_projection(model, report, spec["calls"], next_mark, generator)
        next_mark += 5
    if spec.get("prefill_len"):
        # A long prompt from an empty cache, after everything else: a chat turn's first wait. Only
        # its last token's logits, as generate, a server and llama.cpp compute them.
        long_prompt = torch.randint(0, overrides["vocab_size"], (1, spec["prefill_len"]), generator=generator)
        with torch.inference_mode():
            mark(next_mark)
            model(long_prompt, use_cache=True, logits_to_keep=1)
            mark(next_mark + 1)
    with open("/proc/self/maps") as f:
        maps = f.read()
    # The BF16 bytes the packed projections replaced: what the model subtracts from a row-major
    # token's stream before it adds the kernel's own loads (any layout).
    packed = set(report.packed) if report is not None else set()
    source = {id(m.weight): m.weight.numel() * m.weight.element_size()
              for name, m in model.named_modules(remove_duplicate=False) if name in packed}
    result = {"maps": maps, "tokens": tokens, "readings": readings, "torch": torch.__version__,
              "packed_source_bytes": sum(source.values()),
              "report": json.loads(report.to_json()) if report is not None else None}
    with open(spec["result"], "w") as f:
        json.dump(result, f)
    return 0


if __name__ == "__main__":
    sys.exit(main(json.loads(sys.argv[1])))
