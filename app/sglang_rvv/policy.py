"""``install_rvv_policy(model, config)``: the one entry point.

It resolves the model's adapter, walks its projections in priority order,
applies the static gate, picks each projection's layout (the asked one, or the
next wider one the provider and the shape allow, with the reason), applies the
memory budget to the real bytes of those layouts, gives the chosen modules
their packed buffers, installs the route of every projection, checks that a
tied lm_head stays tied, gives the adapter's norm and MLP modules the fused kernels
(:mod:`fused`), and returns a report. Installing again reconciles:
valid buffers are kept, stale ones rebuilt, and ones the new plan drops are freed.
"""

from __future__ import annotations

import json
import logging
import weakref
from collections import Counter
from dataclasses import asdict, dataclass, field

import torch

from . import budget, exact_pick, fused, host, layout, packed_state, routing
from .adapters import Adapter, resolve_adapter
from .config import RvvPolicyConfig
from .kernels import chosen
from .packed_state import PackedLayout
from .route_table import RouteTable

log = logging.getLogger("sglang_rvv")
POLICY_ATTR = "_sglang_rvv_policy"
MIB = budget.MIB


@dataclass
class PolicyReport:
    """What an install (or a later reconcile) decided."""

    adapter: str | None
    provider: str = field(default_factory=lambda: chosen()[0].NAME)
    provider_reason: str = field(default_factory=lambda: chosen()[1])  # why this provider, not a preferred one
    layout_version: int = layout.LAYOUT_VERSION
    config: dict = field(default_factory=dict)
    weight_dtype: str = "bf16"  # the layout asked for (config.weight_dtype)
    packed: list[str] = field(default_factory=list)
    layouts: dict[str, str] = field(default_factory=dict)      # packed module -> "bf16" | "int8" | "int4"
    group_sizes: dict[str, int] = field(default_factory=dict)  # packed quantized module -> effective G
    layout_fallbacks: dict[str, str] = field(default_factory=dict)  # module -> why a wider layout than asked
    skipped: dict[str, str] = field(default_factory=dict)
    # module -> why a quantized layout was asked of it and its BF16 weight serves (row-major, or
    # a fallback to the bf16 layout): what an accuracy figure of the layout does not cover there
    bf16_weight: dict[str, str] = field(default_factory=dict)
    budget_cut: list[str] = field(default_factory=list)  # the skipped modules past the budget's cut
    module_bytes: dict[str, int] = field(default_factory=dict)  # packed module -> its packed bytes
    packed_bytes: int = 0  # real bytes of every packed tensor, scales included: what a token streams
    budget_bytes: int | None = None
    budget_source: str | None = None
    tied_lm_head: bool = False
    fused_ops: dict[str, int] = field(default_factory=dict)  # kind of fused kernel -> modules given it
    fused_reason: str | None = None  # what runs them, or why none runs
    reason: str | None = None  # why nothing was installed

    def to_json(self, **kwargs) -> str:
        return json.dumps(asdict(self), **kwargs)

    def bytes_by_layout(self) -> dict[str, int]:
        """Packed bytes per layout name (only layouts some module is packed in)."""
        totals: dict[str, int] = {}
        for name, size in self.module_bytes.items():
            totals[self.layouts[name]] = totals.get(self.layouts[name], 0) + size
        return totals

    def summary(self) -> str:
        if self.adapter is None:
            return f"sglang_rvv: model left row-major ({self.reason})"
        budget_text = "none" if self.budget_bytes is None else f"{self.budget_bytes / MIB:.0f} MiB"
        past_cut = set(self.budget_cut)
        reasons = Counter(reason for name, reason in self.skipped.items() if name not in past_cut)
        if past_cut:
            reasons["budget"] = len(past_cut)
        skipped = "; ".join(f"{count}x {reason}" for reason, count in sorted(reasons.items()))
        by_layout = ", ".join(f"{name} {size / MIB:.1f} MiB" for name, size in self.bytes_by_layout().items())
        fallbacks = f" layout_fallbacks={len(self.layout_fallbacks)}" if self.layout_fallbacks else ""
        fallbacks += f" bf16_weight={len(self.bf16_weight)}" if self.bf16_weight else ""
        return (
            f"sglang_rvv: adapter={self.adapter} provider={self.provider} "
            f"packed={len(self.packed)} ({self.packed_bytes / MIB:.1f} MiB{': ' + by_layout if by_layout else ''}) "
            f"weight_dtype={self.weight_dtype}{fallbacks} "
            f"skipped={len(self.skipped)}{f' ({skipped})' if skipped else ''} "
            f"budget={budget_text} ({self.budget_source}) "
            f"fused={','.join(f'{k}:{n}' for k, n in self.fused_ops.items()) or 'none'}"
        )


class RvvPolicy:
    """The policy state of one model. Modules reference it; it references the model weakly."""

    def __init__(self, model: torch.nn.Module, adapter: Adapter, config: RvvPolicyConfig):
        self._model = weakref.ref(model)
        self.adapter = adapter
        # All the routes know of this policy: they never call back into it.
        self.context = routing.RouteContext(config, self.weights_changed)
        self.report = PolicyReport(adapter=adapter.name)

    @property
    def config(self) -> RvvPolicyConfig:
        return self.context.config

    @config.setter
    def config(self, config: RvvPolicyConfig) -> None:
        self.context.config = config

    @property
    def counters(self) -> routing.Counters:
        return self.context.counters

    @property
    def route_table(self) -> RouteTable:
        """The warm-up's measured route table (see RouteContext)."""
        return self.context.table

    def _entries(self):
        model = self._model()
        if model is None:
            raise RuntimeError("the model of this RVV policy has been freed")
        return model, list(self.adapter.projections(model))

    def packed_bytes(self) -> int:
        _, entries = self._entries()
        return sum(packed_state.nbytes(module) for _, module, _ in entries)

    def routes(self) -> list[tuple[torch.nn.Module, routing.ModuleRoute]]:
        """Every projection this policy routes, in model order, with its route."""
        _, entries = self._entries()
        routed = ((module, module.__dict__.get(routing.ROUTE_ATTR)) for _, module, _ in entries)
        return [(module, route) for module, route in routed if route is not None and route.context is self.context]

    def _budget(self, held: int) -> tuple[int, str]:
        if self.config.memory_budget_mib is not None:
            return int(self.config.memory_budget_mib * MIB), "configured"
        # Memory our own current buffers hold is available to the new plan.
        available = host.available_memory()
        reserve_text = f"reserve max({budget.RESERVE_MIN_BYTES // MIB} MiB, {budget.RESERVE_FRACTION:.0%})"
        return budget.auto_budget_bytes(available.bytes + held), f"auto: {available.source}, {reserve_text}"

    def reconcile(self) -> PolicyReport:
        model, entries = self._entries()
        config = self.config
        budget_bytes, budget_source = self._budget(sum(packed_state.nbytes(m) for _, m, _ in entries))

        plan: list[tuple[str, torch.nn.Module, routing.ModuleRoute | None, str | None]] = []
        asked = {name: config.layout_for(kind) for name, _, kind in entries}
        for name, module, kind in entries:
            reason = self.adapter.module_gate(module)
            if reason is not None:  # left exactly as the framework built it
                plan.append((name, module, None, reason))
                continue
            route = module.__dict__.get(routing.ROUTE_ATTR)
            kind_of_route = exact_pick.route_class(kind, config)
            if route is None or route.context is not self.context:
                route = kind_of_route(self.context, kind)
                self.adapter.install_route(module, route)
            elif type(route) is not kind_of_route:
                route.__class__ = kind_of_route  # the same slots: the record and its buffers stay
            reason = routing.static_gate(kind, module.weight, getattr(module, "bias", None))
            if reason is None and config.packed_weight_mode == "off":
                reason = "packed_weight_mode=off"
                route.status = routing.Status.ROW_MAJOR_ONLY if config.regional_compile else routing.Status.GATE
            elif reason is not None:
                route.status = routing.Status.GATE
            plan.append((name, module, route, reason))

        report = PolicyReport(
            adapter=self.adapter.name, config=config.to_dict(), weight_dtype=config.weight_dtype,
            budget_bytes=budget_bytes, budget_source=budget_source,
        )
        eligible = [(n, m, r) for n, m, r, reason in plan if reason is None]
        layouts: dict[str, PackedLayout] = {}
        for name, module, route in eligible:
            layouts[name], fallback = choose_layout(config, route.projection, module.weight)
            if fallback is not None:
                report.layout_fallbacks[name] = fallback
        sizes = [layouts[n].nbytes(*m.weight.shape) for n, m, _ in eligible]
        fit = budget.plan_prefix(sizes, budget_bytes)
        report.skipped = {name: reason for name, _, _, reason in plan if reason is not None}
        if fit < len(eligible):
            cut, used = eligible[fit][0], sum(sizes[:fit])
            for (name, _, route), size in zip(eligible[fit:], sizes[fit:], strict=True):
                route.status = routing.Status.BUDGET
                report.budget_cut.append(name)
                report.skipped[name] = (
                    f"budget: {size / MIB:.1f} MiB past the cut at {cut} "
                    f"({used / MIB:.1f} of {budget_bytes / MIB:.1f} MiB used)"
                )
        # Free everything that will not be (or is no longer) valid before packing
        # anything, so peak memory never holds two packed copies of one weight.
        chosen_names = {name for name, _, _ in eligible[:fit]}
        for name, module, route, _ in plan:
            keep = (name in chosen_names and packed_state.valid_packed(module, module.weight) is not None
                    and route.record.layout == layouts[name])
            if not keep:
                packed_state.release(module)
            if route is not None:  # the plan is made for the weight as it is now
                route.record.source = packed_state.PackedWeightSource.capture(module.weight)
        for name, module, route in eligible[:fit]:
            route.status = routing.Status.PACKED
            if not packed_state.has_packed(module):
                packed_state.pack_into(module, module.weight, layouts[name])
            report.packed.append(name)
            report.layouts[name] = layouts[name].name
            if layouts[name].name != "bf16":
                report.group_sizes[name] = layouts[name].group
            report.module_bytes[name] = packed_state.nbytes(module)
        report.packed_bytes = sum(report.module_bytes.values())
        report.bf16_weight = {name: reason for name, reason in report.skipped.items() if asked[name] != "bf16"}
        report.bf16_weight.update((name, f"layout fallback: {report.layout_fallbacks[name]}")
                                  for name, layout in report.layouts.items()
                                  if layout == "bf16" and asked[name] != "bf16" and name in report.layout_fallbacks)
        report.tied_lm_head = self.adapter.validate_tied_lm_head(model)
        report.fused_ops, report.fused_reason = fused.install(model, self.adapter.fused_modules, config.fused_ops)
        self.report = report
        return report

    def weights_changed(self, module: torch.nn.Module, weight: torch.Tensor) -> None:
        """A routed call found ``module``'s weight changed since the plan (moved, replaced, re-typed)."""
        if self.config.eager_repack:
            log.warning("sglang_rvv: weights changed since the plan; re-planning and repacking")
            self.reconcile()
            return
        route = module.__dict__[routing.ROUTE_ATTR]
        if route.status == routing.Status.PACKED:
            packed_state.release(module)
            route.status = routing.Status.INVALID
        route.record.source = packed_state.PackedWeightSource.capture(weight)

    def invalidate(self, repack: bool | None = None) -> PolicyReport:
        _, entries = self._entries()
        for _, module, _ in entries:
            packed_state.release(module)
        if self.config.eager_repack if repack is None else repack:
            return self.reconcile()
        for _, module, _ in entries:
            route = module.__dict__.get(routing.ROUTE_ATTR)
            if route is not None and route.status == routing.Status.PACKED:
                route.status = routing.Status.INVALID
        return self.report


def choose_layout(config: RvvPolicyConfig, projection: str, weight: torch.Tensor) -> tuple[PackedLayout, str | None]:
    """The layout a projection is packed in, and why it is wider than asked (``None`` if it is not).

    The asked layout (``config.layout_for``) is tried first, then each wider one, down to bf16,
    which the static gate already admitted: a layout the provider lacks, whose group the K
    does not fit, or that cannot quantize the weight (a non-finite value) passes to the next.
    """
    asked = config.layout_for(projection)
    provider = chosen()[0]
    refusals = []
    for name in reversed(layout.WEIGHT_DTYPES[: layout.WEIGHT_DTYPES.index(asked) + 1]):
        why = provider.layout_refusal(name)
        if why is None and name != "bf16":
            try:
                packed_layout = PackedLayout.of(name, config.group_size_for(name), weight.shape[1])
            except layout.LayoutError as error:
                why = str(error)
            else:
                if not bool(torch.isfinite(weight).all()):
                    why = "the weight has non-finite values; it cannot be quantized"
        elif why is None:
            packed_layout = PackedLayout.of(name, 0, weight.shape[1])
        if why is None:
            return packed_layout, (f"{asked} -> {name}: " + "; ".join(refusals)) if refusals else None
        refusals.append(f"{name}: {why}")
    raise AssertionError(f"provider {provider.NAME} refuses bf16: {'; '.join(refusals)}")


def _invalidate_after_load(model: torch.nn.Module, _incompatible_keys) -> None:
    invalidate_rvv_packed_weights(model)


def install_rvv_policy(
    model: torch.nn.Module, config: RvvPolicyConfig | None = None, *, adapter: Adapter | None = None
) -> PolicyReport:
    """Install (or re-plan) the RVV BF16 Linear policy on ``model``; safe to call again.

    ``adapter`` replaces the lookup by model class, e.g. ``adapters.hf_named_adapter()``
    for a plain torch module named like a transformers Llama. A model it does not
    fit is left untouched, as one without an adapter. Once installed, the policy
    keeps its adapter: passing a different one later raises ``ValueError``.
    """
    config = config or RvvPolicyConfig()
    policy: RvvPolicy | None = model.__dict__.get(POLICY_ATTR)
    if policy is None:
        requested = adapter
        if requested is None:
            adapter = resolve_adapter(model)
        else:
            adapter = requested if requested.detect(model) else None
        if adapter is None:
            model_type = getattr(getattr(model, "config", None), "model_type", None)
            reason = (
                f"no adapter for {type(model).__name__} (model_type={model_type!r})" if requested is None
                else f"adapter {requested.name!r} does not fit {type(model).__name__} (model_type={model_type!r})"
            )
            report = PolicyReport(adapter=None, config=config.to_dict(), reason=reason)
            log.warning(report.summary())
            return report
        adapter.validate_tied_lm_head(model)
        policy = RvvPolicy(model, adapter, config)
        model.__dict__[POLICY_ATTR] = policy
        model.register_load_state_dict_post_hook(_invalidate_after_load)
    elif adapter is not None and adapter != policy.adapter:
        raise ValueError(
            f"{type(model).__name__} already has an RVV policy with adapter {policy.adapter.name!r}; "
            f"it cannot switch to {adapter.name!r} (reload the model to change adapters)"
        )
    policy.config = config
    return policy.reconcile()


def policy_of(model: torch.nn.Module) -> RvvPolicy | None:
    return model.__dict__.get(POLICY_ATTR)


def invalidate_rvv_packed_weights(model: torch.nn.Module, repack: bool | None = None) -> PolicyReport | None:
    """Free every packed buffer of ``model`` and (by default) rebuild them from the current weights.

    Call it after changing weights in place (``weight.data.copy_(...)``): such a
    write keeps identity and storage, so the recorded source cannot notice it.
    ``repack`` defaults to the config's ``eager_repack``. Returns the new report,
    or ``None`` when no policy is installed.
    """
    policy = policy_of(model)
    return None if policy is None else policy.invalidate(repack)
