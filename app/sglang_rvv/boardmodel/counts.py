"""The plugin's tables, attributed to shared objects by the guest's own ``/proc/self/maps``.

A table is cumulative from the process start, one row per executed translation block; the
difference of two marks is what ran between them (one decode step). Components are what the board
model prices separately: the project's kernel library, torch's libraries, the interpreter, libgomp,
libc, libm, and the rest.
"""

from __future__ import annotations

import bisect
import re
from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path

FORMAT = "count-table 1"  # == count.c FORMAT
FIELDS = ("insns", "vec_insns", "vec_lmul", "vec_unknown_lmul", "vec_loads", "vec_load_bytes")

# Component of a mapped file, by its base name; the first pattern that matches wins. The kernel
# library is the appliance's, or ggml's CPU backend where llama.cpp is counted (boardmodel.peer).
COMPONENTS = (
    ("kernel", re.compile(r"^(libsglang_rvv_kernels|libggml-cpu)\.so")),
    ("torch", re.compile(r"^(libtorch|libc10|libshm|_C\.cpython|libtorch_python|libcaffe2)")),
    ("interpreter", re.compile(r"^(python3(\.\d+)?|libpython3)")),
    ("libgomp", re.compile(r"^libgomp\.so")),
    ("libc", re.compile(r"^libc\.so")),
    ("libm", re.compile(r"^libm\.so")),
)
OTHER = "other"
COMPONENT_NAMES = tuple(name for name, _ in COMPONENTS) + (OTHER,)


class CountError(Exception):
    """A table or maps file that cannot be attributed; the message names the problem."""


def component_of(library: str) -> str:
    for name, pattern in COMPONENTS:
        if pattern.match(library):
            return name
    return OTHER


@dataclass
class Maps:
    """Executable mappings of the guest: sorted (start, end, library base name), and for each the
    mapped file's path and the file offset at ``start`` (``files``, in the same order)."""

    ranges: list[tuple[int, int, str]]
    files: list[tuple[str, int]] = field(default_factory=list)

    @classmethod
    def parse(cls, text: str) -> Maps:
        mappings = []
        for line in text.splitlines():
            parts = line.split(None, 5)
            if len(parts) < 5 or "x" not in parts[1]:
                continue
            start, end = (int(v, 16) for v in parts[0].split("-"))
            path = parts[5].strip() if len(parts) == 6 else ""
            mappings.append((start, end, Path(path).name if path.startswith("/") else path or "[anon]",
                             path, int(parts[2], 16)))
        if not mappings:
            raise CountError("the guest's maps file has no executable mapping; the workload must "
                             "dump /proc/self/maps before it exits")
        mappings.sort()
        return cls([m[:3] for m in mappings], [m[3:] for m in mappings])

    def _index(self, address: int) -> int | None:
        i = bisect.bisect_right(self.ranges, (address, float("inf"), "")) - 1
        return i if i >= 0 and self.ranges[i][0] <= address < self.ranges[i][1] else None

    def library_of(self, address: int) -> str:
        i = self._index(address)
        return "[unmapped]" if i is None else self.ranges[i][2]

    def file_offset(self, address: int) -> tuple[str, int] | None:
        """(the mapped file's path, the offset of ``address`` in it), or None outside every file."""
        i = self._index(address)
        if i is None or not self.files[i][0].startswith("/"):
            return None
        path, offset = self.files[i]
        return path, address - self.ranges[i][0] + offset


@dataclass
class Counts:
    """Totals per library: {library: {field: int}}."""

    libraries: dict[str, dict[str, int]] = field(default_factory=dict)

    def add(self, library: str, values: dict[str, int]) -> None:
        slot = self.libraries.setdefault(library, dict.fromkeys(FIELDS, 0))
        for key, value in values.items():
            slot[key] += value

    def minus(self, other: Counts) -> Counts:
        out = Counts()
        for library in set(self.libraries) | set(other.libraries):
            mine = self.libraries.get(library, dict.fromkeys(FIELDS, 0))
            theirs = other.libraries.get(library, dict.fromkeys(FIELDS, 0))
            diff = {k: mine[k] - theirs[k] for k in FIELDS}
            if any(diff.values()):
                out.libraries[library] = diff
        return out

    def by_component(self) -> dict[str, dict[str, int]]:
        out = {name: dict.fromkeys(FIELDS, 0) for name in COMPONENT_NAMES}
        for library, values in self.libraries.items():
            slot = out[component_of(library)]
            for key in FIELDS:
                slot[key] += values[key]
        return out

    def total(self, key: str) -> int:
        return sum(values[key] for values in self.libraries.values())


def _marks(text: str) -> Iterator[tuple[str, list[list[str]], list[list[str]]]]:
    """Each table of a plugin output file, in order: (mark, block rows, thread rows), each row split
    into its fields ("thread" rows only with the plugin's threads=1)."""
    lines = text.splitlines()
    if not lines or lines[0] != FORMAT:
        raise CountError(f"not a count table of format {FORMAT!r} (first line {lines[:1]}); "
                         "rebuild the plugin from app/sglang_rvv/boardmodel/plugin/count.c")
    mark, blocks, threads = None, [], []
    for line in lines[1:]:
        if line.startswith("mark "):
            mark, blocks, threads = line[5:], [], []
        elif line == "end" and mark is not None:
            yield mark, blocks, threads
            mark = None
        elif mark is not None:
            fields = line.split()
            (threads if fields[0] == "thread" else blocks).append(fields)
    if mark is not None:
        raise CountError(f"the count table of mark {mark} is cut short: the guest was killed "
                         "before the plugin finished writing it")


def instructions_by_block(text: str) -> dict[str, dict[int, int]]:
    """{mark: {block address: instructions executed}} of a plugin output file (cumulative)."""
    tables: dict[str, dict[int, int]] = {}
    for mark, blocks, _ in _marks(text):
        table = tables[mark] = {}
        for vaddr, n, _, _, execs, *_ in blocks:
            address = int(vaddr, 16)
            table[address] = table.get(address, 0) + int(n) * int(execs)
    return tables


def instructions_by_thread(text: str) -> dict[str, dict[int, int]]:
    """{mark: {vCPU: instructions executed}} of a table written with the plugin's threads=1
    (cumulative; vCPU 0 is the main thread); empty dicts without it."""
    return {mark: {int(vcpu): int(insns) for _, vcpu, insns in threads} for mark, _, threads in _marks(text)}


def parse_tables(text: str, maps: Maps) -> dict[str, Counts]:
    """{mark: Counts} of a plugin output file; vec_lmul is in units of LMUL 1 (LMUL 1/8 = 0.125,
    kept exact by counting eighths until the end)."""
    tables: dict[str, Counts] = {}
    for mark, blocks, _ in _marks(text):
        counts, eighths = Counts(), {}
        for vaddr, n, n_vec, n_vload, execs, lmul8, unknown, vbytes in blocks:
            execs = int(execs)
            library = maps.library_of(int(vaddr, 16))
            counts.add(library, {"insns": int(n) * execs, "vec_insns": int(n_vec) * execs,
                                 "vec_unknown_lmul": int(unknown), "vec_loads": int(n_vload) * execs,
                                 "vec_load_bytes": int(vbytes)})
            eighths[library] = eighths.get(library, 0) + int(lmul8) / 8
        for library, value in eighths.items():
            counts.libraries[library]["vec_lmul"] = value  # exact multiples of 1/8
        tables[mark] = counts
    return tables
