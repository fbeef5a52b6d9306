"""The measured route table: which route serves each packed shape key fastest.

The warm-up times each packed key three ways on the module's own weights
(:mod:`sglang_rvv.warmup`): its compiled callable, the eager packed call (the
provider's kernel called as it is, no compiled wrapper), and ``F.linear``; it
hands the times here. An :class:`Entry` keeps the times of one shape; its route
follows from them and :data:`PACKED_MARGIN`, so a table read from disk is decided
again under this version's margin. :class:`RouteTable` holds the entries, answers
routing's questions (:meth:`RouteTable.sends_row_major`, :meth:`RouteTable.sends_eager`)
and loads and stores itself.

Eager beats compiled where the packed callable is one opaque kernel that Inductor
keeps as an extern call, so compiling adds only its wrapper's per-call cost: on the
2-core x86 CI VM, a Llama-3.2-1B-shaped HF decode ran int8 at 8.28 tok/s compiled and
9.35 eager, int4 at 11.12 and 13.23 (bf16 packed 7.27 compiled, 6.39 eager: there
Inductor generates the kernel). Group-wise int8 and large M go the other way, hence
a measurement per key rather than a rule per layout.

Timings belong to one machine, so the file (:data:`inductor_cache.ROUTE_TABLE`,
next to the Inductor artifacts, so it ships and seeds with them) carries the
stack it was measured on: the CPU model, op provider and thread count on top
of torch and the ISA. It is checked each time it is read: a table measured
elsewhere (or by another schema: one without eager times) is ignored and
measured again, never trusted.
"""

from __future__ import annotations

import enum
import os
from collections.abc import Iterable
from pathlib import Path
from typing import NamedTuple

import torch

from . import host, inductor_cache
from .jsonfile import write_json
from .kernels import chosen

SCHEMA = 2  # 2: eager times and the eager route
# Packed keeps a bucket only when at least 15 % faster; anything closer goes to
# F.linear, the framework's own path, which needs no padding. The table is
# measured in one process, at its start, and the generic packed kernel's speed
# varied more than that between processes on the 2-core CI VM (gate_up at M=2,
# identical inputs: 2.8 ms in one process, 4.1 ms in another, F.linear 3.2-3.4
# ms); with a 5 % margin such a near-tie was kept packed at a server start and
# then made that server's M=2 decode steps slower. Between the two packed routes
# (the same kernel, the same bytes) the faster is taken.
PACKED_MARGIN = 0.85


class Choice(enum.StrEnum):
    """What the table chose for a shape key."""

    PACKED = "packed"    # the compiled packed callable
    EAGER = "eager"      # the packed kernel called eagerly
    ROW_MAJOR = "row_major"


def choose(packed_us: float, row_major_us: float, eager_us: float) -> Choice:
    fastest = min(packed_us, eager_us)
    if fastest >= row_major_us * PACKED_MARGIN:
        return Choice.ROW_MAJOR
    return Choice.EAGER if eager_us < packed_us else Choice.PACKED


class Shape(NamedTuple):
    """What a table entry is measured for: a packed key without what the gate already fixes
    (a bfloat16 CPU input, the explicit packed mode). Layouts never share an entry."""

    projection: str
    bucket: int
    out_features: int
    in_features: int
    layout: str = "bf16"
    group: int = 0  # the effective group along K; 0 for bf16


class Entry(NamedTuple):
    projection: str
    bucket: int
    out_features: int
    in_features: int
    packed_us: float
    row_major_us: float
    eager_us: float
    layout: str = "bf16"
    group: int = 0

    @classmethod
    def measured(cls, shape: Shape, packed_us: float, row_major_us: float, eager_us: float) -> Entry:
        # Rounded before the route is decided on them, so the stored entry shows its own reason.
        return cls(*shape[:4], round(packed_us, 1), round(row_major_us, 1), round(eager_us, 1), shape.layout,
                   shape.group)

    @property
    def shape(self) -> Shape:
        return Shape(*self[:4], self.layout, self.group)

    @property
    def route(self) -> Choice:
        return choose(self.packed_us, self.row_major_us, self.eager_us)

    def to_dict(self) -> dict:
        """The entry as stored: its fields and the route this version chose."""
        return {**self._asdict(), "route": self.route}

    @classmethod
    def from_dict(cls, item) -> Entry:
        """An entry as stored; raises ValueError when it is not one. The stored route is only
        checked: it is what the margin of the writing version made of the times. An entry without
        a layout was measured before there were others: it is bf16's."""
        fields = (*(name for name in cls._fields if name not in cls._field_defaults), "route")
        if not isinstance(item, dict) or not set(fields) <= item.keys():
            raise ValueError(f"an entry lacks one of {fields}: {item!r}")
        if item["route"] not in tuple(Choice):
            raise ValueError(f"an entry's route is {item['route']!r}, not one of {tuple(Choice)}")
        return cls(*(item.get(name, cls._field_defaults.get(name)) for name in cls._fields))


def stack() -> dict:
    """What a route table must have been measured on to be used here."""
    return {
        "schema": SCHEMA,
        **inductor_cache.torch_stack(),
        "cpu_model": host.cpu_model(),
        "provider": chosen()[0].NAME,
        "threads": torch.get_num_threads(),
    }


class RouteTable:
    """Entries by shape, in the order given (a later entry of the same shape replaces an earlier one).

    A routed call holds on to the table it was decided with (see routing.RowMajorMemo), so a
    table never changes: a new measurement is a new table.
    """

    __slots__ = ("_entries", "row_major", "eager")

    def __init__(self, entries: Iterable[Entry] = ()):
        self._entries = {entry.shape: entry for entry in entries}
        self.row_major = frozenset(shape for shape, entry in self._entries.items() if entry.route == Choice.ROW_MAJOR)
        self.eager = frozenset(shape for shape, entry in self._entries.items() if entry.route == Choice.EAGER)

    def __len__(self) -> int:
        return len(self._entries)

    def __contains__(self, shape: Shape) -> bool:
        return shape in self._entries

    def entries(self) -> list[Entry]:
        return list(self._entries.values())

    def sends_row_major(self, shape: Shape) -> bool:
        return shape in self.row_major

    def sends_eager(self, shape: Shape) -> bool:
        return shape in self.eager

    def updated(self, entries: Iterable[Entry]) -> RouteTable:
        """This table with ``entries`` added, replacing those of the same shape."""
        return RouteTable([*self._entries.values(), *entries])

    def only(self, shapes: Iterable[Shape]) -> RouteTable:
        """The entries of ``shapes``, in that order; every one must be in this table."""
        return RouteTable(self._entries[shape] for shape in shapes)

    @classmethod
    def load(cls, cache_dir: str | os.PathLike) -> tuple[RouteTable, str | None]:
        """The table in ``cache_dir``, and why it was rejected (``None`` if not).

        An absent table is an empty one and no rejection; an unreadable one, or one
        measured on another stack, is an empty one and the reason.
        """
        path = Path(cache_dir) / inductor_cache.ROUTE_TABLE
        if not path.exists():
            return cls(), None
        try:
            table = inductor_cache.read_object(path)
        except (OSError, ValueError) as error:
            return cls(), f"{path} is unreadable ({error})"
        # The stack first: another schema's entries have other fields.
        differ = inductor_cache.differences(table, stack())
        if differ:
            return cls(), f"{path} was measured on another stack: " + "; ".join(differ)
        try:
            items = table.get("entries")
            if not isinstance(items, list):
                raise ValueError("'entries' is not a list")
            entries = [Entry.from_dict(item) for item in items]
        except ValueError as error:
            return cls(), f"{path} is unreadable ({error})"
        return cls(entries), None

    def store(self, cache_dir: str | os.PathLike) -> Path:
        path = Path(cache_dir) / inductor_cache.ROUTE_TABLE
        path.parent.mkdir(parents=True, exist_ok=True)
        write_json(path, {**stack(), "entries": [entry.to_dict() for entry in self.entries()]}, sort_keys=True)
        return path
