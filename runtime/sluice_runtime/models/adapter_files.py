"""An adapter's files, read within bounds: whoever wrote the adapter controls them (a claim, a path in an image).

A file is opened only when it resolves to a regular file inside the adapter's own directory: no FIFO (whose
open or read waits forever), no device (`/dev/zero` never ends), no socket, no link to anywhere else (the
credential's mount, `/proc`). Sizes are checked before anything is read, and a safetensors file's header (its
8-byte length, then JSON) is read and checked whole before any tensor byte: a file that declares more than it
holds, or tensors the caller does not expect, is refused at the cost of reading its header.
"""
from __future__ import annotations

import json
import math
import os
import stat
from dataclasses import dataclass
from pathlib import Path
from typing import BinaryIO

import torch

# A safetensors header lists ~150 bytes per tensor: an adapter on every projection of a 100-layer model stays
# near 150 KiB.
MAX_SAFETENSORS_HEADER_BYTES = 4 * 1024 * 1024
# Safetensors' own limits: offsets and dimensions are 64-bit; no weight has more than a few dimensions.
_MAX_DIMENSIONS = 8
_MAX_INTEGER = 2 ** 63 - 1
_DTYPES = {"F64": torch.float64, "F32": torch.float32, "F16": torch.float16, "BF16": torch.bfloat16}
_KINDS = ((stat.S_ISFIFO, "a FIFO"), (stat.S_ISSOCK, "a socket"), (stat.S_ISCHR, "a character device"),
          (stat.S_ISBLK, "a block device"), (stat.S_ISDIR, "a directory"))


class AdapterError(ValueError):
    """An adapter that cannot be served; the message says why, for the person who sent it."""


@dataclass(frozen=True)
class TensorEntry:
    """One tensor as a safetensors header declares it; `begin` and `end` are offsets into the data section."""

    dtype: torch.dtype
    shape: tuple[int, ...]
    begin: int
    end: int


def resolve_directory(path: str | Path) -> Path:
    """The adapter's directory with every link resolved: the one its files must stay inside."""
    try:
        directory = Path(path).resolve(strict=True)
    except (OSError, RuntimeError, ValueError):  # RuntimeError: a loop of links; ValueError: a NUL in the path
        directory = None
    if directory is None or not directory.is_dir():
        raise AdapterError(f"LoRA adapter path {short(str(path))} is not a directory")
    return directory


def open_inside(directory: Path, name: str, shown: Path, missing: str) -> BinaryIO:
    """`directory / name` open for reading, refused unless it is a regular file inside `directory` (resolved);
    `shown` is its path as the caller gave it, for messages, and `missing` what to add when it does not exist."""
    try:
        resolved = (directory / name).resolve(strict=True)
    except FileNotFoundError:
        raise AdapterError(f"{shown} is missing{missing}") from None
    except (OSError, RuntimeError) as exc:
        raise AdapterError(f"{shown} cannot be read: {_why(exc)}") from None
    if not resolved.is_relative_to(directory):
        raise AdapterError(f"{shown} is a link to {resolved}, outside the adapter's directory {directory}")
    try:
        _check_regular(os.stat(resolved).st_mode, shown)
        # Non-blocking, so that a FIFO put in the file's place since the check cannot hold the open; no links,
        # so that no link put there since can lead elsewhere.
        fd = os.open(resolved, os.O_RDONLY | os.O_NONBLOCK | os.O_NOFOLLOW | os.O_CLOEXEC)
    except OSError as exc:
        raise AdapterError(f"{shown} cannot be read: {_why(exc)}") from None
    try:
        _check_regular(os.fstat(fd).st_mode, shown)
    except AdapterError:
        os.close(fd)
        raise
    return os.fdopen(fd, "rb")


def read_bounded(file: BinaryIO, shown: Path, max_bytes: int) -> bytes:
    """The whole file, refused when it is larger than `max_bytes` (as it stands, or as it grows while read)."""
    size = os.fstat(file.fileno()).st_size
    data = file.read(max_bytes + 1) if size <= max_bytes else b""
    if size > max_bytes or len(data) > max_bytes:
        raise AdapterError(f"{shown} is {max(size, len(data))} bytes, more than the {max_bytes} it may have")
    return data


def read_safetensors_header(file: BinaryIO, shown: Path) -> tuple[dict[str, TensorEntry], int]:
    """The tensors a safetensors file declares, checked against the file's own size, and where its data starts."""
    def corrupt(why: str) -> AdapterError:
        return AdapterError(f"{shown} is corrupt: {why}")

    size = os.fstat(file.fileno()).st_size
    prefix = file.read(8)
    if len(prefix) < 8:
        raise corrupt("it is shorter than the 8 bytes that give its header's length")
    length = int.from_bytes(prefix, "little")
    if length > MAX_SAFETENSORS_HEADER_BYTES:
        raise AdapterError(f"{shown} declares a header of {length} bytes, more than the "
                           f"{MAX_SAFETENSORS_HEADER_BYTES} an adapter's may have")
    if 8 + length > size:
        raise corrupt(f"it declares a header of {length} bytes but holds {size - 8} after the length")
    raw = file.read(length)
    try:
        header = json.loads(raw) if len(raw) == length else None
    except (ValueError, RecursionError):
        header = None
    if not isinstance(header, dict):
        raise corrupt("its header is not a JSON object")
    header.pop("__metadata__", None)
    data_size = size - 8 - length
    entries = {name: _entry(name, value, corrupt) for name, value in header.items()}
    for name, entry in entries.items():
        if entry.end > data_size:
            raise corrupt(f"tensor {short(name)} declares bytes {entry.begin} to {entry.end} of the data, which holds "
                          f"{data_size}")
    # The format lays tensors end to end over the whole data section: any other layout declares some bytes
    # twice (tensors that overlap would read the same bytes over and over) or some bytes that are nobody's.
    at = 0
    for name, entry in sorted(entries.items(), key=lambda item: (item[1].begin, item[1].end)):
        if entry.begin != at:
            raise corrupt(f"tensor {short(name)} starts at byte {entry.begin} of the data, where the tensor before it "
                          f"ends at {at}: tensors overlap or leave gaps")
        at = entry.end
    if at != data_size:
        raise corrupt(f"its tensors take {at} bytes but the file holds {data_size} after its header")
    return entries, 8 + length


def read_tensors(file: BinaryIO, shown: Path, entries: dict[str, TensorEntry],
                 data_start: int) -> dict[str, torch.Tensor]:
    """The declared tensors' data, from the file `read_safetensors_header` checked them against."""
    size = max((entry.end for entry in entries.values()), default=0)
    data = bytearray(size)
    view = memoryview(data)
    file.seek(data_start)
    filled = 0
    while filled < size:
        count = file.readinto(view[filled:])
        if not count:
            raise AdapterError(f"{shown} is corrupt: it ended while its tensors were read")
        filled += count
    return {name: torch.frombuffer(data, dtype=entry.dtype, count=math.prod(entry.shape),
                                   offset=entry.begin).reshape(entry.shape)
            for name, entry in entries.items()}


def _entry(name: str, value: object, corrupt) -> TensorEntry:
    if not isinstance(value, dict):
        raise corrupt(f"tensor {short(name)} is declared as {short(value)}, not an object")
    dtype, shape, offsets = value.get("dtype"), value.get("shape"), value.get("data_offsets")
    if dtype not in _DTYPES:
        raise corrupt(f"tensor {short(name)} has dtype {short(dtype)}; adapter weights are one of {', '.join(_DTYPES)}")
    if not isinstance(shape, list) or len(shape) > _MAX_DIMENSIONS or not all(_natural(n) for n in shape):
        raise corrupt(f"tensor {short(name)} has shape {short(shape)}, not a list of at most {_MAX_DIMENSIONS} "
                      "non-negative 64-bit integers")
    if not (isinstance(offsets, list) and len(offsets) == 2 and all(_natural(n) for n in offsets)
            and offsets[0] <= offsets[1]):
        raise corrupt(f"tensor {short(name)} has data_offsets {short(offsets)}, not [begin, end] with begin <= end")
    torch_dtype = _DTYPES[dtype]
    nbytes = math.prod(shape) * torch_dtype.itemsize
    if offsets[1] - offsets[0] != nbytes:
        raise corrupt(f"tensor {short(name)} is {tuple(shape)} of {dtype}, {nbytes} bytes, but its data_offsets "
                      f"span {offsets[1] - offsets[0]}")
    return TensorEntry(torch_dtype, tuple(shape), offsets[0], offsets[1])


def _natural(value: object) -> bool:
    return isinstance(value, int) and not isinstance(value, bool) and 0 <= value <= _MAX_INTEGER


def short(value: object) -> str:
    """A value an adapter's file declares, for a message (repr), cut where a hostile one would fill it."""
    return clipped(repr(value))


def clipped(text: str, limit: int = 80) -> str:
    return text if len(text) <= limit else text[:limit - 3] + "..."


def _check_regular(mode: int, shown: Path) -> None:
    if not stat.S_ISREG(mode):
        kind = next((name for test, name in _KINDS if test(mode)), "not a file")
        raise AdapterError(f"{shown} is {kind}, not a regular file")


def _why(exc: BaseException) -> str:
    return exc.strerror if isinstance(exc, OSError) and exc.strerror else str(exc)
