"""What a GGUF file says about itself, read from its header without loading its tensors.

:func:`read_gguf_header` gives a file's format version, architecture and how many tensors
it stores in each type; :attr:`GgufHeader.quantized` tells whether any is quantized
(``Q4_1``, ``Q8_0``, ...) rather than a plain float.
"""

from __future__ import annotations

import struct
from collections import Counter
from pathlib import Path
from typing import BinaryIO, NamedTuple

GGUF_MAGIC = b"GGUF"
"""The first four bytes of every GGUF file."""

FLOAT_TYPES = frozenset(("F32", "F16", "BF16", "F64"))
"""GGUF tensor types that are plain floats; every other float type is quantized."""

_SCALAR_BYTES = {0: 1, 1: 1, 2: 2, 3: 2, 4: 4, 5: 4, 6: 4, 7: 1, 10: 8, 11: 8, 12: 8}
"""Size of each fixed-size GGUF metadata value type (8 is a string, 9 an array)."""

_STRING, _ARRAY = 8, 9


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


class _Reader:
    """Sequential little-endian reads from a GGUF file, refusing one that ends early."""

    def __init__(self, file: BinaryIO, path: Path) -> None:
        self.file = file
        self.path = path

    def bytes(self, size: int) -> bytes:
        data = self.file.read(size)
        if len(data) != size:
            raise ValueError(f"GGUF file ends inside its header: {self.path}")
        return data

    def u32(self) -> int:
        return int(struct.unpack("<I", self.bytes(4))[0])

    def u64(self) -> int:
        return int(struct.unpack("<Q", self.bytes(8))[0])

    def string(self) -> str:
        return self.bytes(self.u64()).decode("utf-8", errors="replace")

    def skip_value(self, kind: int) -> None:
        if kind == _STRING:
            self.file.seek(self.u64(), 1)
        elif kind == _ARRAY:
            item, count = self.u32(), self.u64()
            if item in _SCALAR_BYTES:
                self.file.seek(count * _SCALAR_BYTES[item], 1)
            else:
                for _ in range(count):
                    self.skip_value(item)
        elif kind in _SCALAR_BYTES:
            self.file.seek(_SCALAR_BYTES[kind], 1)
        else:
            raise ValueError(f"GGUF file holds a value of unknown type {kind}: {self.path}")


def _type_name(code: int) -> str:
    """The name of a GGML tensor type (``"Q4_1"``), from the ``gguf`` package when installed."""
    try:
        from gguf import GGMLQuantizationType

        return str(GGMLQuantizationType(code).name)
    except (ImportError, ValueError):
        return f"type {code}"


def read_gguf_header(path: str | Path) -> GgufHeader:
    """Read a GGUF file's version, architecture and tensor types, without its tensors.

    Parameters
    ----------
    path : str or Path
        The ``.gguf`` file.

    Returns
    -------
    GgufHeader

    Raises
    ------
    ValueError
        The file is not a GGUF file of version 2 or 3, or its header is cut short.
    OSError
        The file cannot be read.
    """
    path = Path(path)
    with path.open("rb") as file:
        reader = _Reader(file, path)
        if reader.bytes(4) != GGUF_MAGIC:
            raise ValueError(f"not a GGUF file: {path}")
        version = reader.u32()
        if version not in (2, 3):
            raise ValueError(f"GGUF file of unsupported version {version}: {path}")
        tensors, entries = reader.u64(), reader.u64()
        architecture = None
        for _ in range(entries):
            key, kind = reader.string(), reader.u32()
            if key == "general.architecture" and kind == _STRING:
                architecture = reader.string()
            else:
                reader.skip_value(kind)
        types: Counter[str] = Counter()
        for _ in range(tensors):
            reader.string()
            dims = reader.u32()
            reader.bytes(8 * dims)
            types[_type_name(reader.u32())] += 1
            reader.u64()
    return GgufHeader(version, architecture, dict(types.most_common()), path.stat().st_size)
