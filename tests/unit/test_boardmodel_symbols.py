"""The board model's count by function (sglang_rvv.boardmodel.symbols), on a library the host's gcc
builds here: one exported function, named by the symbol table, and one static function that the
stripped library names only by its start in the unwind index, as Debian's libtorch_cpu does its
CPU kernels."""

from __future__ import annotations

import re
import shutil
import subprocess
from pathlib import Path

import pytest

from sglang_rvv.boardmodel import counts, symbols

SOURCE = """
static __attribute__((noinline)) int cold(int x) { for (int i = 0; i < x; ++i) x ^= i * 7; return x; }
int hot(int x) { return cold(x) + 1; }
"""
BASE = 0x4000000000


@pytest.fixture(scope="module")
def library(tmp_path_factory) -> tuple[Path, dict[str, int]]:
    """A stripped shared library and the ELF addresses of its two functions (read before the strip)."""
    for tool in ("gcc", "nm", "strip"):
        if shutil.which(tool) is None:
            pytest.fail(f"{tool} is not installed: apt-get install gcc binutils")
    work = tmp_path_factory.mktemp("symbols")
    (work / "lib.c").write_text(SOURCE)
    lib = work / "libhot.so"
    subprocess.run(["gcc", "-shared", "-fPIC", "-O1", "-fasynchronous-unwind-tables", "-o", str(lib),
                    str(work / "lib.c")], check=True)
    table = subprocess.run(["nm", str(lib)], check=True, capture_output=True, text=True).stdout
    at = {name: int(addr, 16) for addr, name in re.findall(r"^([0-9a-f]+) [tT] (hot|cold)$", table, re.M)}
    assert set(at) == {"hot", "cold"}, table
    subprocess.run(["strip", "--strip-all", str(lib)], check=True)
    return lib, at


def _guest(lib: Path, elf_address: int) -> int:
    """The guest address of an ELF address, with the whole file mapped at BASE from offset 0."""
    for p_offset, size, p_vaddr in symbols._segments(str(lib))[0]:
        if p_vaddr <= elf_address < p_vaddr + size:
            return BASE + elf_address - p_vaddr + p_offset
    raise AssertionError(f"{elf_address:#x} is in no segment")


def _table(marks: dict[str, dict[int, tuple[int, int]]]) -> str:
    """A count table: mark -> {block address: (instructions, executions)}."""
    lines = [counts.FORMAT]
    for mark, blocks in marks.items():
        lines += [f"mark {mark}", *(f"{a:x} {n} 0 0 {e} 0 0 0" for a, (n, e) in blocks.items()), "end"]
    return "\n".join(lines) + "\n"


def test_blocks_are_named_by_symbol_or_by_their_function_start(library):
    lib, at = library
    maps = counts.Maps.parse(f"{BASE:x}-{BASE + 0x100000:x} r-xp 00000000 fe:00 1 {lib}\n"
                             f"7f0000000000-7f0000001000 r-xp 00000000 00:00 0 [vdso]\n")
    hot, cold = _guest(lib, at["hot"]), _guest(lib, at["cold"] + 4)  # a block inside cold
    table = _table({"1": {hot: (5, 10)}, "2": {hot: (5, 30), cold: (4, 7)}, "3": {hot: (5, 31), cold: (4, 9)},
                    "4": {hot: (5, 41), cold: (4, 19), 0x7F0000000010: (3, 100)}})
    # Marks 1 -> 2: hot ran 20 more times (100 instructions), cold 7 (28); the vDSO is no file.
    found = symbols.by_symbol(table, maps, ("1", "2"))
    assert found == {"hot": 100, f"libhot.so+{at['cold']:#x}": 28}
    # A long window less a short one: (3 -> 4) less (2 -> 3), per function.
    assert symbols.by_symbol(table, maps, ("3", "4"), less=("2", "3")) == {
        "hot": 50 - 5, f"libhot.so+{at['cold']:#x}": 40 - 8}
    assert symbols.by_symbol(table, maps, ("1", "2"), library="^libc\\.") == {}


def test_a_missing_mark_or_a_cut_table_is_refused(library):
    lib, _ = library
    maps = counts.Maps.parse(f"{BASE:x}-{BASE + 0x100000:x} r-xp 00000000 fe:00 1 {lib}\n")
    table = _table({"1": {}, "2": {}})
    with pytest.raises(counts.CountError, match="no mark 3 .it has 1, 2."):
        symbols.by_symbol(table, maps, ("2", "3"))
    with pytest.raises(counts.CountError, match="cut short"):
        symbols.by_symbol(table.rsplit("end", 1)[0], maps, ("1", "2"))
    with pytest.raises(counts.CountError, match="not a count table"):
        symbols.by_symbol("mark 1\n", maps, ("1", "2"))
