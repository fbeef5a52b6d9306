"""``install_rvv_policy(model, config)``: the one entry point.

It resolves the model's adapter, walks its projections in priority order,
applies the static gate and the memory budget, gives the chosen modules a
packed buffer, installs the route of every projection, checks that a tied
lm_head stays tied, and returns a report. Installing again reconciles: valid
buffers are kept, stale ones rebuilt, and ones the new plan drops are freed.
"""

from __future__ import annotations

import json
import logging
import weakref
from collections import Counter
from dataclasses import asdict, dataclass, field

import torch

from . import budget, host, layout, packed_state, routing
from .adapters import Adapter, resolve_adapter
from .config import RvvPolicyConfig
from .ops import PROVIDER_NAME, PROVIDER_REASON
from .route_table import RouteTable

log = logging.getLogger("sglang_rvv")
POLICY_ATTR = "_sglang_rvv_policy"
MIB = budget.MIB


@dataclass
class PolicyReport:
    """What an install (or a later reconcile) decided."""

    adapter: str | None
    provider: str = PROVIDER_NAME
    provider_reason: str = PROVIDER_REASON  # why this provider (and not a preferred one)
    layout_version: int = layout.LAYOUT_VERSION
    config: dict = field(default_factory=dict)
    packed: list[str] = field(default_factory=list)
    skipped: dict[str, str] = field(default_factory=dict)
    packed_bytes: int = 0
    budget_bytes: int | None = None
    budget_source: str | None = None
    tied_lm_head: bool = False
    reason: str | None = None  # why nothing was installed

    def to_json(self, **kwargs) -> str:
        return json.dumps(asdict(self), **kwargs)

    def summary(self) -> str:
        if self.adapter is None:
            return f"sglang_rvv: model left row-major ({self.reason})"
        budget_text = "none" if self.budget_bytes is None else f"{self.budget_bytes / MIB:.0f} MiB"
        reasons = Counter(reason.split(" past the cut")[0] for reason in self.skipped.values())
        skipped = "; ".join(f"{count}x {reason}" for reason, count in sorted(reasons.items()))
        return (
            f"sglang_rvv: adapter={self.adapter} provider={self.provider} "
            f"packed={len(self.packed)} ({self.packed_bytes / MIB:.1f} MiB) "
            f"skipped={len(self.skipped)}{f' ({skipped})' if skipped else ''} "
            f"budget={budget_text} ({self.budget_source})"
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
        return sum(_buffer_bytes(module) for _, module, _ in entries)

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
        budget_bytes, budget_source = self._budget(sum(_buffer_bytes(m) for _, m, _ in entries))

        plan: list[tuple[str, torch.nn.Module, routing.ModuleRoute | None, str | None]] = []
        for name, module, kind in entries:
            reason = self.adapter.module_gate(module)
            if reason is not None:  # left exactly as the framework built it
                plan.append((name, module, None, reason))
                continue
            route = module.__dict__.get(routing.ROUTE_ATTR)
            if route is None or route.context is not self.context:
                route = routing.ModuleRoute(self.context, kind)
                self.adapter.install_route(module, route)
            route.source = packed_state.PackedWeightSource.capture(module.weight)
            reason = routing.static_gate(kind, module.weight, getattr(module, "bias", None))
            if reason is None and config.packed_weight_mode == "off":
                reason = "packed_weight_mode=off"
                route.status = routing.Status.ROW_MAJOR_ONLY if config.regional_compile else routing.Status.GATE
            elif reason is not None:
                route.status = routing.Status.GATE
            plan.append((name, module, route, reason))

        eligible = [(n, m, r) for n, m, r, reason in plan if reason is None]
        sizes = [layout.packed_bytes(*m.weight.shape, m.weight.element_size()) for _, m, _ in eligible]
        fit = budget.plan_prefix(sizes, budget_bytes)
        report = PolicyReport(
            adapter=self.adapter.name, config=config.to_dict(),
            budget_bytes=budget_bytes, budget_source=budget_source,
        )
        report.skipped = {name: reason for name, _, _, reason in plan if reason is not None}
        if fit < len(eligible):
            cut, used = eligible[fit][0], sum(sizes[:fit])
            for (name, _, route), size in zip(eligible[fit:], sizes[fit:], strict=True):
                route.status = routing.Status.BUDGET
                report.skipped[name] = (
                    f"budget: {size / MIB:.1f} MiB past the cut at {cut} "
                    f"({used / MIB:.1f} of {budget_bytes / MIB:.1f} MiB used)"
                )
        # Free everything that will not be (or is no longer) valid before packing
        # anything, so peak memory never holds two packed copies of one weight.
        chosen = eligible[:fit]
        chosen_names = {name for name, _, _ in chosen}
        for name, module, _, _ in plan:
            if name not in chosen_names or packed_state.valid_packed(module, module.weight) is None:
                packed_state.release(module)
        for name, module, route in chosen:
            route.status = routing.Status.PACKED
            if not packed_state.has_packed(module):
                packed_state.pack_into(module, module.weight)
            report.packed.append(name)
            report.packed_bytes += _buffer_bytes(module)
        report.tied_lm_head = self.adapter.validate_tied_lm_head(model)
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
        route.source = packed_state.PackedWeightSource.capture(weight)

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


def _buffer_bytes(module: torch.nn.Module) -> int:
    packed = module._buffers.get(packed_state.BUFFER)
    return 0 if packed is None else packed.numel() * packed.element_size()


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
