"""The command-line flags, added to SGLang's own parser, and what they resolve to.

``--enable-cpu-rvv-inductor`` is the umbrella: regional compile, explicit packed
BF16 weights and the M=2..15 buckets, with the full CPU graph left off. Every
sub-flag given explicitly overrides the umbrella's value for that setting.
"""

from __future__ import annotations

import argparse
from dataclasses import dataclass

from ..config import PACKED_WEIGHT_MODES, RvvPolicyConfig
from ..layout import QUANTIZED, WEIGHT_DTYPES

COMPILE_MODES = ("off", "regional")
UMBRELLA = "--enable-cpu-rvv-inductor"
# SGLang 0.5.21's CPU graph (--enable-torch-compile on a CPU) calls the attention backend's
# init_cpu_graph_state, which only these define (besides the linear-attention ones of hybrid
# models): with torch_native, the appliance's, the scheduler died with an AttributeError.
CPU_GRAPH_BACKENDS = ("intel_amx",)
# The umbrella's tested values.
UMBRELLA_VALUES = dict(cpu_compile_mode="regional", cpu_rvv_packed_weight_mode="explicit", cpu_rvv_small_batch=True)
REPORT_NAME = "sglang_rvv_report.json"


def _non_negative_mib(text: str) -> float:
    try:
        value = float(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"{text!r} is not a number of MiB") from None
    if not value >= 0:
        raise argparse.ArgumentTypeError(f"{text!r} must be >= 0 (MiB of packed weights)")
    return value


def _group_size(text: str) -> int:
    if not text.isdigit():
        raise argparse.ArgumentTypeError(f"{text!r} is not a whole number (0 = one scale per output channel)")
    return int(text)


def _candidates(text: str) -> int:
    if not text.isdigit():
        raise argparse.ArgumentTypeError(f"{text!r} is not a whole number of candidates (0: off)")
    return int(text)


def _group_size_choices() -> str:
    return "; ".join(f"{name}: {', '.join(map(str, layout.group_sizes))} (default {layout.default_group_size})"
                     for name, layout in QUANTIZED.items())


def add_arguments(parser: argparse.ArgumentParser) -> None:
    group = parser.add_argument_group("sglang-rvv (RISC-V Vector BF16 Linear policy)")
    group.add_argument(UMBRELLA, action="store_true", default=False,
                       help="Turn on the RVV CPU policy: regional compile, explicit packed BF16 "
                            "weights and M=2..15 buckets. Needs --device cpu.")
    group.add_argument("--cpu-compile-mode", choices=COMPILE_MODES, default=None,
                       help="Compile one callable per projection shape key (regional) or none. "
                            "Default: regional with the umbrella flag, else off.")
    group.add_argument("--cpu-rvv-packed-weight-mode", choices=PACKED_WEIGHT_MODES, default=None,
                       help="Give eligible projections a module-owned packed [N/32, K, 32] copy. "
                            "Default: explicit with the umbrella flag, else off.")
    group.add_argument("--cpu-rvv-small-batch", action=argparse.BooleanOptionalAction, default=None,
                       help="Route M=2..15 through the 2/4/8/16 buckets (pad, then slice). "
                            "Default: on with the umbrella flag, else off.")
    group.add_argument("--cpu-rvv-memory-budget-mib", type=_non_negative_mib, default=None, metavar="N",
                       help="Cap packed weights at N MiB; projections past it stay row-major. "
                            "Default: available memory (cgroup limits included) minus a reserve.")
    group.add_argument("--cpu-rvv-weight-dtype", choices=WEIGHT_DTYPES, default="bf16",
                       help="The packed weights' layout, quantized at load from the BF16 checkpoint "
                            "(weight-only: activations stay BF16; int4_a8 also quantizes them to int8 "
                            "per call, on the rvv kernels only). Default: bf16.")
    group.add_argument("--cpu-rvv-group-size", type=_group_size, default=None, metavar="N",
                       help="Weights per scale along K for int8/int4 (0 = one scale per output channel). "
                            f"Choices: {_group_size_choices()}.")
    group.add_argument("--cpu-rvv-lm-head-dtype", choices=WEIGHT_DTYPES, default=None,
                       help="The lm_head's layout. Default: the weight dtype, but never below int8.")
    group.add_argument("--cpu-rvv-lm-head-candidates", type=_candidates, default=0, metavar="K",
                       help="With a quantized lm_head: rescore each row's top K logits from the BF16 rows, "
                            "so the greedy pick is the BF16 head's whenever it is among them (sampling at "
                            "a temperature sees the rest capped below them). Default: 0, off.")
    group.add_argument("--cpu-rvv-warmup", action=argparse.BooleanOptionalAction, default=True,
                       help="Compile every shape key (projection x bucket) at load, before the first "
                            "request, and build the route table; with a warm Inductor cache this only "
                            "loads artifacts. Off: keys compile at their first call and every bucket "
                            "takes the packed route. Default: on.")
    group.add_argument("--cpu-rvv-measure-routes", action=argparse.BooleanOptionalAction, default=True,
                       help="At the warm-up, time each bucket's compiled packed route against the eager "
                            "packed call and row-major F.linear, and serve each bucket the fastest way (packed "
                            "must beat F.linear by 15 %%); the table is kept in the Inductor cache directory. "
                            "Default: on.")
    group.add_argument("--cpu-rvv-report-path", default=None, metavar="PATH",
                       help=f"Where to write the JSON policy report. Default: {REPORT_NAME} in the "
                            "Inductor cache directory (TORCHINDUCTOR_CACHE_DIR).")


@dataclass(frozen=True)
class RvvSettings:
    """What the flags resolved to; travels to the scheduler processes on ServerArgs."""

    config: RvvPolicyConfig
    report_path: str | None
    warmup: bool
    enabled_by: str  # the flag that turned the policy on, for messages

    @property
    def active(self) -> bool:
        return self.config.regional_compile or self.config.packed_weight_mode == "explicit"


def _config(values: dict, args: argparse.Namespace) -> RvvPolicyConfig:
    try:
        return RvvPolicyConfig(
            packed_weight_mode=values["cpu_rvv_packed_weight_mode"] or "off",
            small_batch=bool(values["cpu_rvv_small_batch"]),
            regional_compile=values["cpu_compile_mode"] == "regional",
            memory_budget_mib=getattr(args, "cpu_rvv_memory_budget_mib", None),
            measure_routes=bool(getattr(args, "cpu_rvv_measure_routes", True)),
            weight_dtype=args.cpu_rvv_weight_dtype,
            group_size=args.cpu_rvv_group_size,
            lm_head_dtype=args.cpu_rvv_lm_head_dtype,
            lm_head_exact_candidates=getattr(args, "cpu_rvv_lm_head_candidates", 0),
        )
    except ValueError as error:
        # argparse already checked each value alone; what is left is how they combine.
        flag = ("--cpu-rvv-lm-head-candidates" if "lm_head_exact_candidates" in str(error) else
                "--cpu-rvv-group-size" if args.cpu_rvv_group_size is not None else "--cpu-rvv-weight-dtype")
        raise ValueError(f"argument {flag}: {error}") from None


def resolve(args: argparse.Namespace) -> RvvSettings:
    """Turn parsed arguments into settings; raises ValueError naming the flag on a bad combination."""
    umbrella = bool(getattr(args, "enable_cpu_rvv_inductor", False))
    values = {}
    for name, umbrella_value in UMBRELLA_VALUES.items():
        given = getattr(args, name, None)
        values[name] = given if given is not None else (umbrella_value if umbrella else None)
    settings = RvvSettings(
        config=_config(values, args),
        report_path=getattr(args, "cpu_rvv_report_path", None),
        warmup=bool(getattr(args, "cpu_rvv_warmup", True)),
        enabled_by=UMBRELLA if umbrella else (
            "--cpu-rvv-packed-weight-mode" if values["cpu_rvv_packed_weight_mode"] == "explicit"
            else "--cpu-compile-mode"),
    )
    quantized = [flag for flag, value in (("--cpu-rvv-weight-dtype", settings.config.weight_dtype),
                                          ("--cpu-rvv-lm-head-dtype", settings.config.lm_head_dtype))
                 if value not in (None, "bf16")]
    if quantized and settings.config.packed_weight_mode != "explicit":
        raise ValueError(f"argument {quantized[0]}: quantized layouts are packed weights; add {UMBRELLA} "
                         "(or --cpu-rvv-packed-weight-mode explicit)")
    device = getattr(args, "device", None)
    if settings.active and device not in (None, "cpu"):
        raise ValueError(f"argument {settings.enabled_by}: the RVV policy runs on --device cpu, got "
                         f"--device {device}; drop the flag or serve on the CPU")
    backend = getattr(args, "attention_backend", None)
    if (settings.active and device == "cpu" and getattr(args, "enable_torch_compile", False)
            and backend not in (None, *CPU_GRAPH_BACKENDS)):
        raise ValueError(f"argument --enable-torch-compile: SGLang's CPU graph needs --attention-backend "
                         f"{' or '.join(CPU_GRAPH_BACKENDS)}, and with {backend} its scheduler stops at the start; "
                         f"drop --enable-torch-compile ({settings.enabled_by} compiles the projections itself)")
    return settings


def layout_flags(config: RvvPolicyConfig) -> list[str]:
    """The flags that give a server ``config``'s packed layout (for the entrypoint and cache builds)."""
    argv = ["--cpu-rvv-weight-dtype", config.weight_dtype]
    if config.group_size is not None:
        argv += ["--cpu-rvv-group-size", str(config.group_size)]
    if config.lm_head_dtype is not None:
        argv += ["--cpu-rvv-lm-head-dtype", config.lm_head_dtype]
    return argv
