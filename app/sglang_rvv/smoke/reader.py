"""Every tensor of a ``.safetensors`` file, read with torch alone (no safetensors package)."""

from __future__ import annotations

import json
import math
import struct
from pathlib import Path

import torch

_DTYPES = {"BF16": torch.bfloat16, "F16": torch.float16, "F32": torch.float32, "F64": torch.float64}


class SmokeError(Exception):
    """The model directory cannot be smoke-tested (missing files, unsupported config)."""


def read_safetensors(path: Path) -> dict[str, torch.Tensor]:
    """Every tensor of one ``.safetensors`` file (little-endian u64 header size, JSON header, data)."""
    data = bytearray(path.stat().st_size)  # writable: torch.frombuffer warns on read-only buffers
    with open(path, "rb") as f:
        if f.readinto(data) != len(data):
            raise SmokeError(f"{path}: short read")
    if len(data) < 8:
        raise SmokeError(f"{path}: not a safetensors file ({len(data)} bytes)")
    (header_size,) = struct.unpack_from("<Q", data, 0)
    if 8 + header_size > len(data):
        raise SmokeError(f"{path}: header size {header_size} exceeds the file")
    try:
        header = json.loads(bytes(data[8 : 8 + header_size]))
    except ValueError as exc:
        raise SmokeError(f"{path}: unreadable safetensors header ({exc})") from None
    start_of_data = 8 + header_size
    tensors = {}
    for name, entry in header.items():
        if name == "__metadata__":
            continue
        try:
            kind, shape, (begin, end) = entry["dtype"], tuple(entry["shape"]), entry["data_offsets"]
        except (KeyError, TypeError, ValueError):
            raise SmokeError(f"{path}: malformed header entry for {name}: {entry!r}") from None
        dtype = _DTYPES.get(kind)
        if dtype is None:
            raise SmokeError(f"{path}: {name} has dtype {kind}, not one of {sorted(_DTYPES)}")
        numel = math.prod(shape)
        if end - begin != numel * dtype.itemsize or start_of_data + end > len(data):
            raise SmokeError(f"{path}: {name} {kind}{list(shape)} does not match its byte range")
        if numel == 0:
            tensors[name] = torch.empty(shape, dtype=dtype)
        else:
            # clone(): own, aligned memory, so the file's buffer can go
            view = torch.frombuffer(data, dtype=dtype, count=numel, offset=start_of_data + begin)
            tensors[name] = view.reshape(shape).clone()
    return tensors
