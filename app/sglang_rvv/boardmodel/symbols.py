"""Where a library's instructions go, function by function: the count table's blocks, placed in
their file by the guest's maps and named by the file's symbol table.

``python -m sglang_rvv.boardmodel.symbols PID.count [--maps PID.maps] --window 3 4 [--less 2 3]
[--per 4] [--library REGEX]`` prints the functions of the matching libraries, the most
instructions first: the blocks' counts between two marks, less those of another window (the long
request less the short one of a serving count), divided by ``--per`` (the extra tokens). It is how
the serving count's torch share was split into SGLang's ops (README, "A token through SGLang's
serving loop").

Names come from ``nm`` (binutils reads a riscv64 ELF on any host): the static symbol table where
the file has one, else the dynamic one. Debian's libtorch_cpu is stripped to its dynamic symbols,
and its CPU kernels sit in anonymous namespaces. A block outside every symbol is named by its
file and the start of its function (``libtorch_cpu.so.2.14.1+0x3b61e40``), from the unwind
tables' index of functions (``.eh_frame_hdr``), which every C++ library keeps;
``llvm-objdump -d --start-address`` disassembles it.
"""

from __future__ import annotations

import argparse
import bisect
import functools
import re
import struct
import subprocess
import sys
from pathlib import Path

from . import counts

_NM_LINE = re.compile(r"^([0-9a-f]+) ([0-9a-f]+) [tTwWiI] (.+)$")
_PT_LOAD, _PT_GNU_EH_FRAME = 1, 0x6474E550
# .eh_frame_hdr's encodings that GNU ld and lld write: the .eh_frame pointer pc-relative sdata4,
# the count udata4, the table's (function start, FDE) pairs sdata4 relative to the header.
_EH_HDR = (1, 0x1B, 0x03, 0x3B)


@functools.cache
def _segments(path: str) -> tuple[list[tuple[int, int, int]], list[int]]:
    """A 64-bit ELF's PT_LOAD segments as (file offset, size in the file, ELF address), and the
    sorted ELF addresses where its functions start (empty without a readable .eh_frame_hdr)."""
    with open(path, "rb") as elf:
        header = elf.read(64)
        if header[:4] != b"\x7fELF" or header[4] != 2:
            raise counts.CountError(f"{path} is not a 64-bit ELF file")
        endian = "<" if header[5] == 1 else ">"
        phoff, = struct.unpack_from(endian + "Q", header, 0x20)
        phentsize, phnum = struct.unpack_from(endian + "HH", header, 0x36)
        elf.seek(phoff)
        table = elf.read(phentsize * phnum)
        loads, starts = [], []
        for i in range(phnum):
            p_type, _, p_offset, p_vaddr, _, p_filesz = struct.unpack_from(endian + "IIQQQQ", table, i * phentsize)
            if p_type == _PT_LOAD:
                loads.append((p_offset, p_filesz, p_vaddr))
            elif p_type == _PT_GNU_EH_FRAME:
                elf.seek(p_offset)
                hdr = elf.read(p_filesz)
                if tuple(hdr[:4]) == _EH_HDR:
                    count, = struct.unpack_from(endian + "I", hdr, 8)
                    pairs = struct.unpack_from(f"{endian}{2 * count}i", hdr, 12)
                    starts = sorted(p_vaddr + pairs[j] for j in range(0, 2 * count, 2))
    return loads, starts


def elf_address(path: str, offset: int) -> int | None:
    """The ELF (link-time) address of file offset ``offset``, or None outside every loaded segment."""
    for p_offset, size, p_vaddr in _segments(path)[0]:
        if p_offset <= offset < p_offset + size:
            return offset - p_offset + p_vaddr
    return None


@functools.cache
def _symbols(path: str) -> tuple[list[int], list[tuple[int, str]]]:
    """Sorted function starts and (size, demangled name) of ``path``'s symbol table."""
    rows = []
    for dynamic in ([], ["-D"]):
        result = subprocess.run(["nm", "-C", "--defined-only", "-S", *dynamic, path], capture_output=True, text=True)
        rows = [(int(m[1], 16), int(m[2], 16), m[3]) for m in map(_NM_LINE.match, result.stdout.splitlines()) if m]
        if rows:
            break
    rows.sort()
    return [r[0] for r in rows], [(r[1], r[2]) for r in rows]


def symbol_at(path: str, address: int) -> str:
    starts, rest = _symbols(path)
    i = bisect.bisect_right(starts, address) - 1
    if i >= 0 and address < starts[i] + max(rest[i][0], 1):
        return rest[i][1]
    functions = _segments(path)[1]
    j = bisect.bisect_right(functions, address) - 1
    return f"{Path(path).name}+{functions[j] if j >= 0 else address:#x}"


def by_symbol(table: str, maps: counts.Maps, window: tuple[str, str], less: tuple[str, str] | None = None,
              library: str = ".") -> dict[str, int]:
    """{function: instructions} in the files whose base name matches ``library``: between the
    window's two marks, less the ``less`` window's; the largest first."""
    blocks = counts.instructions_by_block(table)
    for mark in (*window, *(less or ())):
        if mark not in blocks:
            raise counts.CountError(f"the count table has no mark {mark} (it has {', '.join(blocks)})")
    signed = [(window, 1)] + ([(less, -1)] if less else [])
    pattern = re.compile(library)
    out: dict[str, int] = {}
    for (first, second), sign in signed:
        before = blocks[first]
        for address, insns in blocks[second].items():
            delta = insns - before.get(address, 0)
            located = maps.file_offset(address) if delta else None
            if located is None or not pattern.search(Path(located[0]).name):
                continue
            at = elf_address(*located)
            name = symbol_at(located[0], at) if at is not None else f"{Path(located[0]).name}@{located[1]:#x}"
            out[name] = out.get(name, 0) + sign * delta
    return dict(sorted(out.items(), key=lambda item: -item[1]))


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m sglang_rvv.boardmodel.symbols",
                                     description=__doc__.splitlines()[0])
    parser.add_argument("table", type=Path, help="a count table (a serving count's PID.count)")
    parser.add_argument("--maps", type=Path, help="the guest's maps (default: the table's PID.maps beside it)")
    parser.add_argument("--window", nargs=2, required=True, metavar=("FROM", "TO"), help="two marks")
    parser.add_argument("--less", nargs=2, metavar=("FROM", "TO"), help="a window to subtract")
    parser.add_argument("--per", type=float, default=1.0, help="divide by this (tokens)")
    parser.add_argument("--library", default=".", help="a regex on the mapped file's base name")
    parser.add_argument("--top", type=int, default=40)
    args = parser.parse_args(argv)
    maps_path = args.maps or args.table.with_suffix(".maps")
    try:
        maps = counts.Maps.parse(maps_path.read_text())
        found = by_symbol(args.table.read_text(), maps, tuple(args.window), tuple(args.less) if args.less else None,
                          args.library)
    except (OSError, counts.CountError) as error:
        parser.error(str(error))
    total = sum(found.values())
    print(f"{total / args.per / 1e6:10.3f} M  in all ({args.library!r}, per {args.per:g})")
    for name, insns in list(found.items())[:args.top]:
        print(f"{insns / args.per / 1e6:10.3f} M  {name}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
