"""What a GGUF file says about itself: its metadata and tensor table, without its tensor data.

:func:`read_gguf` parses the start of a GGUF file: the format version, every metadata value
and, for each tensor, its name, shape, type and where its data lies (:class:`GgufFile`).
:func:`read_gguf_header` sums it up: architecture and how many tensors the file stores in
each type; :attr:`GgufHeader.quantized` tells whether any is quantized (``Q4_1``, ``Q8_0``,
...) rather than a plain float. The tensor data is read by
:mod:`specsample.adapter.gguf_load`, decoded by :mod:`specsample.adapter.gguf_quants`.
"""

from __future__ import annotations

import mmap
import struct
from collections import Counter
from pathlib import Path
from typing import Any, NamedTuple

GGUF_MAGIC = b"GGUF"
"""The first four bytes of every GGUF file."""

FLOAT_TYPES = frozenset(("F32", "F16", "BF16", "F64"))
"""GGUF tensor types that are plain floats; every other float type is quantized."""

GGML_TYPES = {
    0: "F32", 1: "F16", 2: "Q4_0", 3: "Q4_1", 6: "Q5_0", 7: "Q5_1", 8: "Q8_0", 9: "Q8_1",
    10: "Q2_K", 11: "Q3_K", 12: "Q4_K", 13: "Q5_K", 14: "Q6_K", 15: "Q8_K", 16: "IQ2_XXS",
    17: "IQ2_XS", 18: "IQ3_XXS", 19: "IQ1_S", 20: "IQ4_NL", 21: "IQ3_S", 22: "IQ2_S",
    23: "IQ4_XS", 24: "I8", 25: "I16", 26: "I32", 27: "I64", 28: "F64", 29: "IQ1_M",
    30: "BF16", 34: "TQ1_0", 35: "TQ2_0", 39: "MXFP4",
}  # fmt: skip
"""The name of each GGML tensor type, by the number a GGUF file stores it under."""

_SCALARS = {
    0: "B", 1: "b", 2: "H", 3: "h", 4: "I", 5: "i", 6: "f", 7: "?", 10: "Q", 11: "q", 12: "d"
}  # fmt: skip
"""The :mod:`struct` code of each fixed-size metadata value type (8 is a string, 9 an array)."""

_STRING, _ARRAY = 8, 9
_U64 = struct.Struct("<Q")
_DEFAULT_ALIGNMENT = 32
"""Where the tensor data starts, and each tensor in it, unless ``general.alignment`` says."""


class GgufTensor(NamedTuple):
    """One tensor of a GGUF file (:attr:`GgufFile.tensors`).

    Attributes
    ----------
    name : str
        The tensor's GGUF name (``"blk.0.attn_q.weight"``).
    shape : tuple of int
        Outermost dimension first, as torch orders it (GGUF stores them the other way round).
    kind : str
        Its type's name (:data:`GGML_TYPES`): ``"F32"``, ``"Q4_1"``, ...
    offset : int
        Where its data starts, in bytes from the start of the file.
    """

    name: str
    shape: tuple[int, ...]
    kind: str
    offset: int


class GgufFile(NamedTuple):
    """What a GGUF file holds apart from its tensor data (:func:`read_gguf`).

    Attributes
    ----------
    path : Path
        The file.
    version : int
        The format version (2 or 3).
    metadata : dict of str to object
        Every metadata value by key: an int, float, bool or str, or a list of them.
    tensors : tuple of GgufTensor
        The tensor table, in file order.
    file_bytes : int
        Size of the file.
    """

    path: Path
    version: int
    metadata: dict[str, Any]
    tensors: tuple[GgufTensor, ...]
    file_bytes: int

    @property
    def architecture(self) -> str | None:
        """``general.architecture`` (``"llama"``, ...), ``None`` when the file does not say."""
        value = self.metadata.get("general.architecture")
        return value if isinstance(value, str) else None


class GgufHeader(NamedTuple):
    """What a GGUF file says about itself (:func:`read_gguf_header`).

    Attributes
    ----------
    version : int
        The format version (2 or 3).
    architecture : str or None
        ``general.architecture`` (``"llama"``, ...).
    tensor_types : dict of str to int
        How many tensors the file stores in each type (``{"Q4_1": 210, "F32": 61}``).
    file_bytes : int
        Size of the file.
    """

    version: int
    architecture: str | None
    tensor_types: dict[str, int]
    file_bytes: int

    @property
    def quantized(self) -> bool:
        """Whether any tensor is stored in a type other than a plain float."""
        return any(name not in FLOAT_TYPES for name in self.tensor_types)


class _Parser:
    """Little-endian reads from the start of a GGUF file, refusing one that ends early."""

    def __init__(self, data: bytes | mmap.mmap, path: Path) -> None:
        self.data = data
        self.path = path
        self.pos = 0

    def _cut(self) -> ValueError:
        return ValueError(f"GGUF file ends inside its header: {self.path}")

    def unpack(self, fmt: str) -> tuple[Any, ...]:
        try:
            values = struct.unpack_from(fmt, self.data, self.pos)
        except struct.error:
            raise self._cut() from None
        self.pos += struct.calcsize(fmt)
        return values

    def bytes(self, size: int) -> bytes:
        end = self.pos + size
        if end > len(self.data):
            raise self._cut()
        data = self.data[self.pos : end]
        self.pos = end
        return bytes(data)

    def string(self) -> str:
        return self.bytes(self.unpack("<Q")[0]).decode("utf-8", errors="replace")

    def strings(self, count: int) -> list[str]:
        """``count`` strings in a row: the loop a vocabulary of many thousand tokens takes."""
        data, pos, size, unpack = self.data, self.pos, len(self.data), _U64.unpack_from
        values = []
        try:
            for _ in range(count):
                end = pos + 8 + unpack(data, pos)[0]
                values.append(data[pos + 8 : end].decode("utf-8", errors="replace"))
                pos = end
        except struct.error:
            raise self._cut() from None
        if pos > size:
            raise self._cut()
        self.pos = pos
        return values

    def value(self, kind: int) -> Any:
        if kind in _SCALARS:
            return self.unpack("<" + _SCALARS[kind])[0]
        if kind == _STRING:
            return self.string()
        if kind != _ARRAY:
            raise ValueError(f"GGUF file holds a value of unknown type {kind}: {self.path}")
        item, count = self.unpack("<IQ")
        if item in _SCALARS:
            return list(self.unpack(f"<{count}{_SCALARS[item]}"))
        if item == _STRING:
            return self.strings(count)
        return [self.value(item) for _ in range(count)]

    def tensor(self) -> tuple[str, tuple[int, ...], str, int]:
        name = self.string()
        dims = self.unpack(f"<{self.unpack('<I')[0]}Q")
        code, offset = self.unpack("<IQ")
        return name, tuple(reversed(dims)), GGML_TYPES.get(code, f"type {code}"), offset


def read_gguf(path: str | Path) -> GgufFile:
    """Read a GGUF file's version, metadata and tensor table, without its tensor data.

    Parameters
    ----------
    path : str or Path
        The ``.gguf`` file.

    Returns
    -------
    GgufFile

    Raises
    ------
    ValueError
        The file is not a GGUF file of version 2 or 3, or its header is cut short.
    OSError
        The file cannot be read.
    """
    path = Path(path)
    with path.open("rb") as file:
        size = path.stat().st_size
        data = mmap.mmap(file.fileno(), 0, access=mmap.ACCESS_READ) if size else b""
        try:
            return _parse(_Parser(data, path), size)
        finally:
            if isinstance(data, mmap.mmap):
                data.close()


def _parse(parser: _Parser, size: int) -> GgufFile:
    """The :class:`GgufFile` the parser's file holds."""
    path = parser.path
    if parser.bytes(4) != GGUF_MAGIC:
        raise ValueError(f"not a GGUF file: {path}")
    version = parser.unpack("<I")[0]
    if version not in (2, 3):
        raise ValueError(f"GGUF file of unsupported version {version}: {path}")
    count, entries = parser.unpack("<QQ")
    metadata = {}
    for _ in range(entries):
        key = parser.string()
        metadata[key] = parser.value(parser.unpack("<I")[0])
    table = [parser.tensor() for _ in range(count)]
    alignment = metadata.get("general.alignment", _DEFAULT_ALIGNMENT)
    start = -(-parser.pos // alignment) * alignment
    tensors = tuple(
        GgufTensor(name, shape, kind, start + offset) for name, shape, kind, offset in table
    )
    return GgufFile(path, version, metadata, tensors, size)


def read_gguf_header(path: str | Path) -> GgufHeader:
    """Read a GGUF file's version, architecture and tensor types, without its tensors.

    The file is read by :func:`read_gguf`, which raises what it raises.
    """
    file = read_gguf(path)
    types = Counter(tensor.kind for tensor in file.tensors)
    return GgufHeader(file.version, file.architecture, dict(types.most_common()), file.file_bytes)
