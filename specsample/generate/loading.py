"""Where a model comes from: a local model directory or a GGUF file, and what was loaded.

:func:`model_source` checks a path before anything slow runs: a directory must hold a
``config.json`` (or, for a tokenizer, a tokenizer file), a file must be a GGUF file (a
``.gguf`` name and the ``GGUF`` magic bytes); anything else is a ``ValueError`` naming the
path and what was expected. :func:`from_pretrained_options` gives the keyword arguments
``transformers`` loads a source with, always from local files only.

A GGUF file is loaded by transformers' own GGUF support (it needs the ``gguf`` and
``accelerate`` packages, both in the ``hf`` extra): quantized tensors (``Q4_1``, ``Q8_0``,
...) are dequantized to a dense model at load time, so the model takes the memory of its
unquantized parameters. :func:`read_gguf_header` reads what a file stores (its tensor types)
without loading it, and :func:`describe_model` says in one line what was loaded.
"""

from __future__ import annotations

import importlib.util
import inspect
import struct
from collections import Counter
from pathlib import Path
from typing import Any, BinaryIO, NamedTuple

GGUF_MAGIC = b"GGUF"
"""The first four bytes of every GGUF file."""

TOKENIZER_FILES = ("tokenizer.json", "tokenizer_config.json", "tokenizer.model", "vocab.json")
"""Files of which a tokenizer directory must hold at least one."""

FLOAT_TYPES = frozenset(("F32", "F16", "BF16", "F64"))
"""GGUF tensor types that are plain floats; every other float type is quantized."""

_SCALAR_BYTES = {0: 1, 1: 1, 2: 2, 3: 2, 4: 4, 5: 4, 6: 4, 7: 1, 10: 8, 11: 8, 12: 8}
"""Size of each fixed-size GGUF metadata value type (8 is a string, 9 an array)."""

_STRING, _ARRAY = 8, 9

_EXPECTED = "a model directory holding config.json, or a .gguf file"


class ModelSource(NamedTuple):
    """A checked place to load a model or tokenizer from.

    Attributes
    ----------
    path : Path
        The path as given.
    directory : Path
        The model directory, or the directory holding the GGUF file.
    gguf_file : str or None
        The GGUF file's absolute path, ``None`` for a model directory.
    """

    path: Path
    directory: Path
    gguf_file: str | None

    @property
    def is_gguf(self) -> bool:
        """Whether the source is a GGUF file."""
        return self.gguf_file is not None


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


def model_source(path: str | Path, *, role: str = "target", part: str = "model") -> ModelSource:
    """Check that ``path`` is a model directory or a GGUF file, and say which.

    Parameters
    ----------
    path : str or Path
        A directory (holding ``config.json`` when ``part`` is ``"model"``, a tokenizer file
        of :data:`TOKENIZER_FILES` when it is ``"tokenizer"``) or a ``.gguf`` file.
    role : str
        ``"target"`` or ``"draft"``, for error messages.
    part : str
        ``"model"`` or ``"tokenizer"``: what will be loaded from the directory.

    Returns
    -------
    ModelSource

    Raises
    ------
    ValueError
        ``path`` does not exist, is a directory without the files ``part`` needs, a file
        without the ``.gguf`` suffix, or a ``.gguf`` file without the GGUF magic bytes; or
        ``part`` is neither ``"model"`` nor ``"tokenizer"``. The message names the path.

    Examples
    --------
    >>> import tempfile
    >>> with tempfile.TemporaryDirectory() as folder:
    ...     try:
    ...         model_source(folder)
    ...     except ValueError as error:
    ...         print(str(error).split(": ", 1)[0])
    target model directory holds no config.json
    """
    if part not in ("model", "tokenizer"):
        raise ValueError(f"part must be 'model' or 'tokenizer', got {part!r}")
    given = Path(path)
    if given.is_dir():
        _check_directory(given, role, part)
        return ModelSource(given, given, None)
    if not given.exists():
        raise ValueError(f"{role} model path does not exist: {given} (expected {_EXPECTED})")
    if given.suffix.lower() != ".gguf":
        raise ValueError(
            f"{role} model path is a file but not a .gguf file: {given} (expected {_EXPECTED})"
        )
    with given.open("rb") as file:
        magic = file.read(len(GGUF_MAGIC))
    if magic != GGUF_MAGIC:
        raise ValueError(
            f"{role} model file is not a GGUF file: {given} (expected a file starting with the "
            f"bytes {GGUF_MAGIC!r})"
        )
    resolved = given.resolve()
    return ModelSource(given, resolved.parent, str(resolved))


def _check_directory(directory: Path, role: str, part: str) -> None:
    """Refuse a directory that lacks what ``part`` needs, naming what is there instead."""
    ggufs = sorted(p.name for p in directory.glob("*.gguf"))
    hint = f"; pass one of its .gguf files instead: {', '.join(ggufs)}" if ggufs else ""
    if part == "model" and not (directory / "config.json").is_file():
        raise ValueError(
            f"{role} model directory holds no config.json: {directory} (expected {_EXPECTED}){hint}"
        )
    if part == "tokenizer" and not any((directory / name).is_file() for name in TOKENIZER_FILES):
        raise ValueError(
            f"{role} tokenizer directory holds no tokenizer file: {directory} (expected one of "
            f"{', '.join(TOKENIZER_FILES)}, or a .gguf file){hint}"
        )


def require_gguf() -> None:
    """Raise an ``ImportError`` saying how to install what loading a GGUF file needs.

    Raises
    ------
    ImportError
        The ``gguf`` or the ``accelerate`` package is not installed.
    """
    missing = [name for name in ("gguf", "accelerate") if importlib.util.find_spec(name) is None]
    if missing:
        raise ImportError(
            f"loading a .gguf file needs the {' and '.join(missing)} package"
            f"{'s' if len(missing) > 1 else ''}; install with: pip install 'specsample[hf]'"
        )


def from_pretrained_options(source: ModelSource, *, model: bool = True) -> dict[str, Any]:
    """Keyword arguments for ``from_pretrained(source.directory, ...)``: local files only.

    A GGUF source adds ``gguf_file``; for a ``model`` (not a tokenizer), where transformers
    can keep GGUF weights packed (``GgufConfig``), also
    ``quantization_config=GgufConfig(dequantize=True)``: the model is always dequantized at
    load time, so no matmul kernel is fetched from a hub.

    Examples
    --------
    >>> from_pretrained_options(ModelSource(Path("m"), Path("m"), None))
    {'local_files_only': True}
    """
    options: dict[str, Any] = {"local_files_only": True}
    if source.gguf_file is None:
        return options
    options["gguf_file"] = source.gguf_file
    if not model:
        return options
    import transformers

    config = getattr(transformers, "GgufConfig", None)
    if config is not None and "dequantize" in inspect.signature(config).parameters:
        options["quantization_config"] = config(dequantize=True)
    return options


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


def model_size(model: Any) -> tuple[int, int]:
    """Parameters of ``model`` and the bytes they take (shared parameters counted once).

    Examples
    --------
    >>> import torch
    >>> model_size(torch.nn.Linear(3, 2))
    (8, 32)
    """
    parameters = list(model.parameters())
    count = sum(p.numel() for p in parameters)
    return count, sum(p.numel() * p.element_size() for p in parameters)


def _megabytes(size: int) -> str:
    return f"{size / 1e6:.1f} MB"


def describe_model(model: Any, source: ModelSource) -> str:
    """One line on a loaded model: architecture, parameters, dtype, memory; for GGUF, the file.

    Examples
    --------
    >>> import torch
    >>> describe_model(torch.nn.Linear(3, 2), ModelSource(Path("m"), Path("m"), None))
    'Linear: 8 parameters in float32 (0.0 MB)'
    """
    config = getattr(model, "config", None)
    text = type(model).__name__
    layers, hidden = (getattr(config, name, None) for name in ("num_hidden_layers", "hidden_size"))
    if layers is not None and hidden is not None:
        text += f", {layers} layers, hidden {hidden}"
    count, size = model_size(model)
    dtype = str(getattr(model, "dtype", None) or next(model.parameters()).dtype)
    dtype = dtype.removeprefix("torch.")
    text += f": {count:,} parameters in {dtype} ({_megabytes(size)})"
    if source.gguf_file is None:
        return text
    header = read_gguf_header(source.gguf_file)
    stored = ", ".join(f"{name} x{n}" for name, n in header.tensor_types.items())
    text += f"; from a GGUF file of {_megabytes(header.file_bytes)} (tensors {stored})"
    if header.quantized:
        text += f", dequantized to {dtype} by transformers"
    return text
