"""The one configuration object of the policy."""

from __future__ import annotations

from dataclasses import asdict, dataclass

from . import layout

PACKED_WEIGHT_MODES = ("off", "explicit")


@dataclass(frozen=True)
class RvvPolicyConfig:
    """How the RVV BF16 Linear policy treats a model.

    Args:
        packed_weight_mode: ``"explicit"`` gives each eligible projection a
            module-owned packed copy of its weight; ``"off"`` keeps row-major only.
        small_batch: route M=2..15 through the 2/4/8/16 buckets (zero-pad, then
            slice). Off, those row counts run row-major ``F.linear``.
        regional_compile: compile one callable per shape key with
            ``torch.compile``. Off, the packed op runs eagerly.
        memory_budget_mib: cap on packed bytes, in MiB. ``None`` derives it from
            the memory really available (cgroup limits included) minus a reserve.
        eager_repack: rebuild packed buffers as soon as they are invalidated
            (``invalidate_rvv_packed_weights``, ``load_state_dict``) or a call finds
            its weight changed (``.to()``, a replaced or in-place-bumped weight).
            Off, such projections are freed and run row-major (route
            ``row_major_invalid``) until the next install or repacking invalidate.
        measure_routes: at warm-up, time each compiled bucket's packed callable
            against row-major ``F.linear`` and send the buckets where packed
            loses row-major (route ``row_major_measured``); the table is kept
            in the Inductor cache directory. Off, every bucket takes the packed
            route, as without a warm-up.
    """

    packed_weight_mode: str = "explicit"
    small_batch: bool = True
    regional_compile: bool = True
    memory_budget_mib: float | None = None
    eager_repack: bool = True
    measure_routes: bool = True
    # STAND-IN (wip-knob): the weight-dtype fields of the core's config, so that the flags,
    # the entrypoint and the manifest can be tested; the integrator takes the core's config.py.
    weight_dtype: str = "bf16"
    group_size: int | None = None
    lm_head_dtype: str | None = None

    def __post_init__(self) -> None:
        for name in ("weight_dtype", "lm_head_dtype"):
            value = getattr(self, name)
            if value is not None and value not in layout.WEIGHT_DTYPES:
                raise ValueError(f"{name}={value!r} is not one of {layout.WEIGHT_DTYPES}")
        if self.group_size is not None:
            if self.weight_dtype not in layout.QUANTIZED:
                raise ValueError(f"group_size={self.group_size} applies to int8 and int4 only, "
                                 f"not weight_dtype={self.weight_dtype!r}")
            choices = layout.QUANTIZED[self.weight_dtype].group_sizes
            if self.group_size not in choices:
                raise ValueError(f"group_size={self.group_size} is not one of {choices} for {self.weight_dtype} "
                                 "(0 = one scale per output channel)")
        if self.packed_weight_mode not in PACKED_WEIGHT_MODES:
            raise ValueError(
                f"packed_weight_mode={self.packed_weight_mode!r} is not one of "
                f"{PACKED_WEIGHT_MODES}"
            )
        if self.memory_budget_mib is not None and not self.memory_budget_mib >= 0:
            raise ValueError(
                f"memory_budget_mib={self.memory_budget_mib!r} must be >= 0 MiB, "
                "or None for the automatic budget"
            )

    def to_dict(self) -> dict:
        return asdict(self)
