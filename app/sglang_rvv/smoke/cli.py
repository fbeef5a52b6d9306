"""Policy smoke test that needs nothing but torch: ``python -m sglang_rvv.smoke MODEL_DIR``.

The run (:func:`run_smoke`), what the policy must show (:func:`policy_failures`), the report
and the command line; see :mod:`sglang_rvv.smoke` for what is compared.
"""

from __future__ import annotations

import argparse
import copy
import json
import math
import platform
import sys
import time
from dataclasses import asdict, dataclass
from pathlib import Path

import torch
from torch import nn

from .. import RvvPolicyConfig, install_rvv_policy
from ..adapters import hf_named_adapter
from ..layout import WEIGHT_DTYPES
from ..ops import PROVIDER_NAME
from ..policy import PolicyReport, policy_of
from ..routing import Route, compile_packed
from .comparison import FLOORS, compare
from .decoder import load_model
from .reader import SmokeError


@dataclass
class SmokeResult:
    model_dir: str
    model_type: str
    layers: int
    tied_lm_head: bool
    machine: str
    python: str
    torch: str
    provider: str
    regional_compile: bool
    weight_dtype: str
    floor: dict
    policy: dict
    routes: dict[str, dict[str, int]]  # route -> {bucket: calls}
    comparison: dict
    seconds: dict[str, float]
    failures: list[str]

    @property
    def passed(self) -> bool:
        return not self.failures

    def to_json(self, **kwargs) -> str:
        """Strict JSON: an infinite SQNR (bit-identical logits) becomes the string "inf"."""
        return json.dumps(_finite({**asdict(self), "passed": self.passed}), allow_nan=False, **kwargs)


def _finite(value):
    if isinstance(value, float) and not math.isfinite(value):
        return str(value)
    if isinstance(value, dict):
        return {key: _finite(item) for key, item in value.items()}
    if isinstance(value, list | tuple):
        return [_finite(item) for item in value]
    return value


def _routes(model: nn.Module) -> dict[str, dict[str, int]]:
    routes: dict[str, dict[str, int]] = {}
    policy = policy_of(model)
    if policy is not None:
        for (_, route, bucket), count in policy.counters.items():
            buckets = routes.setdefault(route, {})
            buckets[bucket] = buckets.get(bucket, 0) + count
    return routes


def policy_failures(report: PolicyReport, routes: dict[str, dict[str, int]], regional_compile: bool,
                    weight_dtype: str = "bf16") -> list[str]:
    """What the install and the routes hit must show for the smoke to mean anything."""
    if report.adapter is None:
        return [f"the policy was not installed: {report.reason}"]
    if not report.packed:
        return [f"nothing was packed: {sorted(set(report.skipped.values()))}"]
    # A quantized run that quietly packed bf16 would pass the bf16-close floor: refuse it.
    taken = set((asdict(report).get("layouts") or {}).values())
    if weight_dtype != "bf16" and weight_dtype not in taken:
        return [f"no projection took the {weight_dtype} layout (layouts: {sorted(taken) or 'none reported'}; "
                f"skipped: {sorted(set(report.skipped.values()))}): this build cannot check --weight-dtype "
                f"{weight_dtype}"]
    # The rvv provider's packed calls are native ops, never compiled (routing.compile_packed).
    route = Route.PACKED_COMPILED if regional_compile and compile_packed() else Route.PACKED_EAGER
    hit = routes.get(route, {})
    missing = [bucket for bucket in ("1", "4") if not hit.get(bucket)]
    if missing:
        return [f"route {route} was not taken with bucket(s) {', '.join(missing)} (routes hit: {routes})"]
    return []


def run_smoke(model_dir: Path, config: RvvPolicyConfig) -> SmokeResult:
    """Load ``model_dir`` twice, install the policy on one copy, compare with the other at the
    layout's floor (:data:`~.comparison.FLOORS`)."""
    regional_compile, weight_dtype = config.regional_compile, config.weight_dtype
    seconds = {}
    start = time.perf_counter()
    reference = load_model(model_dir)
    candidate = copy.deepcopy(reference)
    seconds["load"] = time.perf_counter() - start

    start = time.perf_counter()
    report = install_rvv_policy(candidate, config, adapter=hf_named_adapter())
    seconds["install"] = time.perf_counter() - start

    start = time.perf_counter()
    floor = FLOORS[weight_dtype]
    comparison = compare(reference, candidate, floor=floor)
    seconds["compare"] = time.perf_counter() - start

    routes = _routes(candidate)
    config = reference.config
    return SmokeResult(
        model_dir=str(model_dir), model_type=config.model_type, layers=config.num_hidden_layers,
        tied_lm_head=config.tie_word_embeddings, machine=platform.machine(),
        python=platform.python_version(), torch=torch.__version__, provider=PROVIDER_NAME,
        regional_compile=regional_compile, weight_dtype=weight_dtype, floor=asdict(floor), policy=asdict(report),
        routes=routes, comparison={**asdict(comparison), "passed": comparison.passed}, seconds=seconds,
        failures=policy_failures(report, routes, regional_compile, weight_dtype) + comparison.failures,
    )


def format_report(result: SmokeResult) -> str:
    policy, comparison, floor = result.policy, result.comparison, result.floor
    reasons: dict[str, int] = {}
    for reason in policy["skipped"].values():
        reasons[reason] = reasons.get(reason, 0) + 1
    skipped = "; ".join(f"{n}x {reason}" for reason, n in sorted(reasons.items()))
    routes = ", ".join(
        f"{route} {sum(buckets.values())} (buckets {', '.join(sorted(buckets, key=_bucket_order))})"
        for route, buckets in sorted(result.routes.items())
    )
    prefill = ", ".join(f"{db:.1f} dB ({label})" for label, db in comparison["prefill_sqnr_db"].items())
    decode = ", ".join(f"{db:.1f} dB ({label})" for label, db in comparison["decode_min_sqnr_db"].items())
    lines = [
        f"sglang_rvv smoke: {'PASSED' if result.passed else 'FAILED'}",
        f"  model     {result.model_dir}: {result.model_type}, {result.layers} layers, "
        f"lm_head {'tied' if result.tied_lm_head else 'untied'}",
        f"  platform  machine {result.machine}, Python {result.python}, torch {result.torch}, "
        f"provider {result.provider}",
        f"  policy    adapter {policy['adapter']}, packed {len(policy['packed'])} "
        f"({policy['packed_bytes'] / 2**20:.1f} MiB), skipped {len(policy['skipped'])}"
        f"{f' ({skipped})' if skipped else ''}, regional_compile {'on' if result.regional_compile else 'off'}, "
        f"weights {result.weight_dtype}",
        f"  routes    {routes or 'none'}",
        f"  prefill   logits SQNR {prefill or 'n/a'} (min {floor['min_sqnr_db']:.0f} dB for {result.weight_dtype})",
        f"  decode    {comparison['equal_picks']}/{comparison['picks']} greedy picks equal "
        f"({len(comparison['near_ties'])} near ties{'' if floor['judge_picks'] else ', picks not judged'}), "
        f"{comparison['decode_steps']} steps at M=1 and M=3 (bucket 4); min step SQNR {decode or 'n/a'}",
        "  seconds   " + ", ".join(f"{k} {v:.1f}" for k, v in result.seconds.items()),
    ]
    lines += [f"  near tie  {tie}" for tie in comparison["near_ties"]]
    lines += [f"  FAILURE   {failure}" for failure in result.failures]
    return "\n".join(lines)


def _bucket_order(bucket: str) -> tuple[int, str]:
    return (int(bucket), "") if bucket.isdigit() else (1 << 30, bucket)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m sglang_rvv.smoke", description=__doc__.splitlines()[0])
    parser.add_argument("model_dir", type=Path, help="checkpoint directory: config.json + *.safetensors")
    parser.add_argument("--compile", action="store_true", help="regional compile on (slow: Inductor per key)")
    parser.add_argument("--json", action="store_true", help="print the result as JSON instead of text")
    parser.add_argument("--weight-dtype", choices=WEIGHT_DTYPES, default="bf16",
                        help="the packed layout to check (int8/int4: quantized at load; each has its floor)")
    parser.add_argument("--group-size", type=int, default=None, metavar="N",
                        help="int8/int4 weights per scale along K (0 = per output channel); default the layout's")
    args = parser.parse_args(argv)
    try:
        config = RvvPolicyConfig(regional_compile=args.compile, weight_dtype=args.weight_dtype,
                                 group_size=args.group_size)
    except ValueError as error:  # the choices passed argparse: a group size the layout lacks
        parser.error(f"argument --group-size: {error}")
    try:
        result = run_smoke(args.model_dir, config)
    except SmokeError as exc:
        print(f"sglang_rvv smoke: error: {exc}", file=sys.stderr)
        return 2
    print(result.to_json(indent=1) if args.json else format_report(result))
    if not result.passed:
        print(f"sglang_rvv smoke: FAILED: {result.failures[0]}"
              f"{f' (and {len(result.failures) - 1} more)' if len(result.failures) > 1 else ''}", file=sys.stderr)
        return 1
    return 0

