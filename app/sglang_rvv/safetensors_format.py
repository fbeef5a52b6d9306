"""The ``.safetensors`` layout, read with the standard library alone.

A file is an 8-byte little-endian header length, a JSON header that names each tensor's dtype,
shape and byte range in the data section, then the data section. Two readers parse it here:
images/scripts/checkpoint.py on the build host, before anything is installed (no torch there),
and the smoke test's tensor reader (smoke/reader.py).
"""

from __future__ import annotations

import json
import math
import struct
from pathlib import Path

DTYPE_BYTES = {"BF16": 2, "F16": 2, "F32": 4, "F64": 8, "I8": 1, "U8": 1, "I16": 2, "U16": 2, "I32": 4,
               "U32": 4, "I64": 8, "U64": 8, "BOOL": 1, "F8_E4M3": 1, "F8_E5M2": 1}


class HeaderError(ValueError):
    """What is wrong with a file's header, without the file's name (the caller names it)."""


def read_header(path: Path) -> tuple[dict[str, dict], int]:
    """(tensor name -> its header entry, the data section's offset in the file).

    Every tensor is checked to lie inside the data section with the size its dtype and shape
    give, so a truncated or hand-edited file fails here, not when its bytes are read.
    """
    size = path.stat().st_size
    with open(path, "rb") as f:
        head = f.read(8)
        if len(head) < 8:
            raise HeaderError(f"truncated ({size} bytes, no safetensors header)")
        length = struct.unpack("<Q", head)[0]
        if length > size - 8:
            raise HeaderError(f"truncated (header of {length} bytes, file of {size})")
        try:
            header = json.loads(f.read(length))
        except (UnicodeDecodeError, ValueError) as exc:
            raise HeaderError(f"unreadable safetensors header ({exc})") from None
    if not isinstance(header, dict):
        raise HeaderError("unreadable safetensors header (not a JSON object)")
    header.pop("__metadata__", None)
    data = size - 8 - length
    for name, info in header.items():
        try:
            begin, end = info["data_offsets"]
            need = math.prod(info["shape"]) * DTYPE_BYTES[info["dtype"]]
        except (KeyError, TypeError, ValueError):
            raise HeaderError(f"tensor {name}: malformed header entry {info}") from None
        if not 0 <= begin <= end:
            raise HeaderError(f"tensor {name}: data_offsets {info['data_offsets']} are not an ascending range")
        if end - begin != need:
            raise HeaderError(f"tensor {name}: {end - begin} bytes for {info['dtype']} {info['shape']} (needs {need})")
        if end > data:
            raise HeaderError(f"truncated: tensor {name} ends at byte {end} of a {data}-byte data section")
    return header, 8 + length
