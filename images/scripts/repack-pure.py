#!/usr/bin/env python3
"""Repack a platform wheel as ``py3-none-any`` without its native extensions.

    repack-pure.py WHEEL OUTDIR      prints the path of the repacked wheel

SGLang publishes x86_64/aarch64 wheels only, and their only native files are
optional Rust extensions that the CPU serving path never loads (the radix tree
core falls back to Python). Without them the wheel is pure Python, and pip
installs it on riscv64. The output is byte-for-byte deterministic (sorted
entries, fixed timestamps and modes, a regenerated RECORD), so the lock can pin
its sha256 and a changed input or repack shows up as a stale pin.

Standard library only: it runs on the host before any venv exists.
"""

from __future__ import annotations

import base64
import csv
import hashlib
import io
import re
import sys
import zipfile
from pathlib import Path

NATIVE_SUFFIXES = (".so", ".pyd", ".dylib")
TAG = "py3-none-any"
ZIP_DATE = (1980, 1, 1, 0, 0, 0)  # the zip format's epoch: no build time leaks into the file
# Stored, not deflated: deflate's output depends on the zlib build, and the board repacks too.


class RepackError(Exception):
    pass


def _record_hash(data: bytes) -> str:
    return "sha256=" + base64.urlsafe_b64encode(hashlib.sha256(data).digest()).rstrip(b"=").decode()


def repack(wheel: Path, outdir: Path) -> Path:
    match = re.fullmatch(r"([^-]+)-([^-]+)-.+\.whl", wheel.name)
    if match is None:
        raise RepackError(f"{wheel.name}: not a wheel file name (NAME-VERSION-...-TAG.whl)")
    name, version = match.groups()
    dist_info = f"{name}-{version}.dist-info"
    with zipfile.ZipFile(wheel) as source:
        members = {info.filename: source.read(info) for info in source.infolist() if not info.is_dir()}
    if f"{dist_info}/WHEEL" not in members:
        raise RepackError(f"{wheel.name}: no {dist_info}/WHEEL")
    dropped = sorted(path for path in members if path.endswith(NATIVE_SUFFIXES))
    for path in dropped:
        del members[path]
    wheel_meta = [line for line in members[f"{dist_info}/WHEEL"].decode().splitlines()
                  if not line.startswith(("Tag:", "Root-Is-Purelib:"))]
    members[f"{dist_info}/WHEEL"] = "\n".join([*wheel_meta, "Root-Is-Purelib: true", f"Tag: {TAG}", ""]).encode()
    record_path = f"{dist_info}/RECORD"
    members.pop(record_path, None)
    record = io.StringIO()
    writer = csv.writer(record, lineterminator="\n")
    for path in sorted(members):
        writer.writerow([path, _record_hash(members[path]), len(members[path])])
    writer.writerow([record_path, "", ""])
    members[record_path] = record.getvalue().encode()

    outdir.mkdir(parents=True, exist_ok=True)
    target = outdir / f"{name}-{version}-{TAG}.whl"
    partial = target.with_name(f".{target.name}.partial")
    with zipfile.ZipFile(partial, "w", compression=zipfile.ZIP_STORED) as out:
        for path in sorted(members):
            info = zipfile.ZipInfo(path, date_time=ZIP_DATE)
            info.external_attr = 0o644 << 16
            out.writestr(info, members[path])
    partial.replace(target)
    print(f"repack-pure: {wheel.name} -> {target.name} ({len(dropped)} native files dropped: "
          f"{', '.join(Path(p).name for p in dropped) or 'none'})", file=sys.stderr)
    return target


def main(argv: list[str]) -> int:
    if len(argv) != 2:
        print(__doc__.strip().splitlines()[2].strip(), file=sys.stderr)
        return 2
    try:
        print(repack(Path(argv[0]), Path(argv[1])))
    except (RepackError, OSError, zipfile.BadZipFile) as error:
        print(f"repack-pure: error: {error}", file=sys.stderr)
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
