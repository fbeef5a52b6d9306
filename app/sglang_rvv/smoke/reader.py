"""Every tensor of a ``.safetensors`` file, read with torch alone (no safetensors package)."""

from __future__ import annotations

import math
from pathlib import Path

import torch

from ..safetensors_format import HeaderError, read_header

_DTYPES = {"BF16": torch.bfloat16, "F16": torch.float16, "F32": torch.float32, "F64": torch.float64}


class SmokeError(Exception):
    """The model directory cannot be smoke-tested (missing files, unsupported config)."""


def read_safetensors(path: Path) -> dict[str, torch.Tensor]:
    """Every tensor of one ``.safetensors`` file, each checked against the file by its header."""
    try:
        header, start_of_data = read_header(path)
    except HeaderError as exc:
        raise SmokeError(f"{path}: {exc}") from None
    for name, entry in header.items():
        if entry["dtype"] not in _DTYPES:
            raise SmokeError(f"{path}: {name} has dtype {entry['dtype']}, not one of {sorted(_DTYPES)}")
    data = bytearray(path.stat().st_size)  # writable: torch.frombuffer warns on read-only buffers
    with open(path, "rb") as f:
        if f.readinto(data) != len(data):
            raise SmokeError(f"{path}: short read")
    tensors = {}
    for name, entry in header.items():
        dtype, shape = _DTYPES[entry["dtype"]], tuple(entry["shape"])
        numel = math.prod(shape)
        if numel == 0:
            tensors[name] = torch.empty(shape, dtype=dtype)
        else:
            # clone(): own, aligned memory, so the file's buffer can go
            view = torch.frombuffer(data, dtype=dtype, count=numel, offset=start_of_data + entry["data_offsets"][0])
            tensors[name] = view.reshape(shape).clone()
    return tensors
