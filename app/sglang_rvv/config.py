"""The one configuration object of the policy."""

from __future__ import annotations

from dataclasses import asdict, dataclass

from .layout import QUANTIZED, WEIGHT_DTYPES

PACKED_WEIGHT_MODES = ("off", "explicit")
# lm_head's layout when none is asked: the model's, but never below int8 (the logits of every
# token go through it, and int4 costs them most).
LM_HEAD_NARROWEST = "int8"


@dataclass(frozen=True)
class RvvPolicyConfig:
    """How the RVV Linear policy treats a model.

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
            against the eager packed call and row-major ``F.linear``; send the
            buckets where packed loses row-major (route ``row_major_measured``)
            and those where the eager call beat the compiled one eager (route
            ``packed_eager``); the table is kept in the Inductor cache
            directory. Off, every bucket takes the compiled packed route, as
            without a warm-up.
        weight_dtype: the packed layout of the projections: ``"bf16"`` (the weight
            as it is), or ``"int8"`` / ``"int4"``, quantized at pack time from the
            BF16 weight, which stays the source of truth (see :mod:`layout`);
            ``"int4_a8"``: int4 whose linear also quantizes its input to int8 (the
            rvv provider's; elsewhere it falls back to int4).
        group_size: the quantized layout's group along K; ``None`` takes the
            layout's default (int8: 0 = one scale per output channel; int4: 32).
            Only for int8/int4.
        lm_head_dtype: lm_head's layout; ``None`` takes ``weight_dtype`` but never
            below int8 (int4 -> int8). The embedding is never packed.
        lm_head_exact_candidates: 0, or k > 0 with a quantized lm_head: each row's top k
            logits are recomputed from the BF16 rows and the rest capped below them
            (:mod:`sglang_rvv.exact_pick`), so the greedy pick is the BF16 head's whenever
            it is among the k (``accuracy.lm_head_candidates`` measures how often).
        fused_ops: give the model's RMSNorm and SiLU-gated MLP modules the RVV kernel
            library's fused kernels where they run (:mod:`sglang_rvv.fused`; the
            environment's ``SGLANG_RVV_FUSED_OPS=0`` also turns them off).
    """

    packed_weight_mode: str = "explicit"
    small_batch: bool = True
    regional_compile: bool = True
    memory_budget_mib: float | None = None
    eager_repack: bool = True
    measure_routes: bool = True
    weight_dtype: str = "bf16"
    group_size: int | None = None
    lm_head_dtype: str | None = None
    lm_head_exact_candidates: int = 0
    fused_ops: bool = True

    def __post_init__(self) -> None:
        for field_name in ("weight_dtype", "lm_head_dtype"):
            value = getattr(self, field_name)
            if not (value in WEIGHT_DTYPES or (value is None and field_name == "lm_head_dtype")):
                raise ValueError(f"{field_name}={value!r} is not one of {WEIGHT_DTYPES}")
        if self.group_size is not None:
            if self.weight_dtype not in QUANTIZED:
                raise ValueError(f"group_size={self.group_size!r} applies to int8/int4 only, not "
                                 f"weight_dtype={self.weight_dtype!r}; leave it None")
            choices = QUANTIZED[self.weight_dtype].group_sizes
            if self.group_size not in choices:
                raise ValueError(f"group_size={self.group_size!r} is not one of {self.weight_dtype}'s {choices} "
                                 "(a power of two; 0 = one scale per output channel)")
        candidates = self.lm_head_exact_candidates
        if not isinstance(candidates, int) or isinstance(candidates, bool) or candidates < 0:
            raise ValueError(f"lm_head_exact_candidates={candidates!r} must be a whole number >= 0 (0: off)")
        if candidates and self.layout_for("lm_head") not in QUANTIZED:
            raise ValueError(f"lm_head_exact_candidates={candidates} rescores a quantized lm_head, and lm_head's "
                             f"layout here is {self.layout_for('lm_head')}: set lm_head_dtype (or weight_dtype) to "
                             "int8 or int4, or leave it 0")
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

    def layout_for(self, projection: str) -> str:
        """The layout asked for a projection kind (routing.PROJECTIONS)."""
        if projection != "lm_head":
            return self.weight_dtype
        if self.lm_head_dtype is not None:
            return self.lm_head_dtype
        narrowest = WEIGHT_DTYPES.index(LM_HEAD_NARROWEST)
        return WEIGHT_DTYPES[min(WEIGHT_DTYPES.index(self.weight_dtype), narrowest)]

    def group_size_for(self, layout_name: str) -> int:
        """The API group size (0 = per channel) a quantized layout packs with."""
        if layout_name == self.weight_dtype and self.group_size is not None:
            return self.group_size
        return QUANTIZED[layout_name].default_group_size

    def to_dict(self) -> dict:
        return asdict(self)
