"""Loading models and tokenizers: a local model directory or a GGUF file, never a hub.

:func:`model_source` checks a path before anything slow runs: a directory must hold a
``config.json`` (or, for a tokenizer, a tokenizer file), a file must be a GGUF file (a
``.gguf`` name and the ``GGUF`` magic bytes); anything else is a ``ValueError`` naming the
path and what was expected. :func:`from_pretrained_options` gives the keyword arguments
``transformers`` loads a source with, always from local files only; :func:`load_model` and
:func:`load_tokenizer` load one, :func:`check_same_tokenizer` checks that a target and a
draft tokenize alike, and :func:`default_pair` finds the shipped default pair.

A GGUF file (it needs the ``gguf`` and ``accelerate`` packages, both in the ``hf`` extra)
is loaded by :mod:`specsample.adapter.gguf_load` when it is of an architecture that module
knows (``llama``) with tensors of types it decodes, else by transformers' own GGUF support:
quantized tensors (``Q4_1``, ``Q8_0``, ...) are dequantized to a dense float32 model at
load time, so the model takes the memory of its unquantized parameters, unless
:func:`load_model` is asked to keep them quantized (``quantize``,
:mod:`specsample.adapter.quantize`). Loading is quiet:
transformers' progress bars are off while it runs. :func:`describe_model` says in one line
what was loaded (for a GGUF file, what it stores:
:func:`specsample.adapter.gguf.read_gguf_header`).
"""

from __future__ import annotations

import importlib.util
import inspect
from collections.abc import Iterator, Sequence
from contextlib import contextmanager
from pathlib import Path
from typing import Any, NamedTuple

from specsample import models
from specsample.adapter.gguf import GGUF_MAGIC, GgufFile, read_gguf, read_gguf_header
from specsample.adapter.quantize import (
    FORMATS,
    MODES,
    quantize_model,
    quantized_bytes,
    quantized_layers,
)
from specsample.extras import install_command

TOKENIZER_FILES = ("tokenizer.json", "tokenizer_config.json", "tokenizer.model", "vocab.json")
"""Files of which a tokenizer directory must hold at least one."""

_EXPECTED = "a model directory holding config.json, or a .gguf file"

_TOKENIZER_PROBES = (
    "Hello, world!",
    "The quick brown fox jumps over the lazy dog.",
    "  indented\n\tlines, digits 0123456789 and symbols {}[]<>#@",
    "Ünïcödé: naïve café, 東京, emoji 🙂",
)


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
            f"{'s' if len(missing) > 1 else ''}; install with: {install_command('hf')}"
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


def load_model(path: str | Path, *, role: str = "target", quantize: str = "none") -> Any:
    """Load a causal LM from a local model directory or GGUF file (never from a hub), in eval mode.

    With ``quantize="none"`` a ``.gguf`` file's quantized tensors are dequantized to a dense
    float32 model, by :func:`specsample.adapter.gguf_load.load_gguf_model` where it loads
    the file, else by transformers' GGUF support. Otherwise the linear layers are kept in a
    weight-only format (:mod:`specsample.adapter.quantize`): ``"auto"`` keeps a GGUF file's
    own quantization where :mod:`~specsample.adapter.gguf_load` loads it (4-bit types as
    int4 from the file's own integers, other quantized types as bfloat16) and the float
    weights of anything else; ``"int4"``, ``"int8"`` or ``"bfloat16"`` put every linear
    layer that fits in that format.

    Parameters
    ----------
    path : str or Path
        A directory holding ``config.json`` and the weights, or a ``.gguf`` file.
    role : str
        ``"target"`` or ``"draft"``, for error messages.
    quantize : str
        One of :data:`specsample.adapter.quantize.MODES`.

    Raises
    ------
    ValueError
        ``quantize`` is not one of :data:`~specsample.adapter.quantize.MODES`; ``path`` is
        neither a directory holding a ``config.json`` nor a GGUF file (the message names it
        and what was expected); or its ``.safetensors`` weights cannot be read (a truncated
        or corrupted file: the message names the model, ``role``, and the file).
    ImportError
        ``path`` is a GGUF file and the ``gguf`` or ``accelerate`` package is missing.
    """
    if quantize not in MODES:
        raise ValueError(f"quantize must be one of {', '.join(MODES)}, got {quantize!r}")
    source = model_source(path, role=role)
    file = _own_gguf(source)
    with _quiet_progress():
        if file is not None:
            from specsample.adapter.gguf_load import load_gguf_model

            return load_gguf_model(file, quantize)
        from safetensors import SafetensorError
        from transformers import AutoModelForCausalLM

        options = from_pretrained_options(source)
        try:
            model = AutoModelForCausalLM.from_pretrained(source.directory, **options)
        except SafetensorError as error:
            raise unreadable_weights(source.directory, role, error) from error
    if quantize in FORMATS:
        quantize_model(model, quantize)
    return model.eval()


def unreadable_weights(directory: Path, role: str, error: Exception) -> ValueError:
    """The error for weights safetensors cannot read: it names the model and the file(s).

    Every ``.safetensors`` file of ``directory`` whose header does not read is named (all of
    them when none is found at fault).

    Examples
    --------
    >>> import tempfile
    >>> with tempfile.TemporaryDirectory() as folder:
    ...     _ = (Path(folder) / "model.safetensors").write_bytes(b"cut")
    ...     print(unreadable_weights(Path(folder), "draft", OSError("header too small")))
    ... # doctest: +ELLIPSIS
    the draft model's weights cannot be read: .../model.safetensors is truncated or corrupted ...
    """
    from safetensors import SafetensorError, safe_open

    files = sorted(directory.glob("*.safetensors"))
    broken = []
    for file in files:
        try:
            with safe_open(str(file), "pt"):
                pass
        except SafetensorError:
            broken.append(file)
    named = ", ".join(str(file) for file in broken or files) or f"the weights in {directory}"
    return ValueError(
        f"the {role} model's weights cannot be read: {named} "
        f"{'is' if len(broken or files) == 1 else 'are'} truncated or corrupted ({error}); "
        "copy or download the file again"
    )


def load_tokenizer(path: str | Path, *, role: str = "target") -> Any:
    """Load the tokenizer of a local model directory or GGUF file (never from a hub).

    Parameters
    ----------
    path : str or Path
        A directory holding a tokenizer file (``tokenizer.json``, ...), or a ``.gguf`` file.
    role : str
        ``"target"`` or ``"draft"``, for error messages.

    Raises
    ------
    ValueError
        ``path`` is neither a directory holding a tokenizer file nor a GGUF file (the
        message names it and what was expected).
    ImportError
        ``path`` is a GGUF file and the ``gguf`` or ``accelerate`` package is missing.
    """
    source = model_source(path, role=role, part="tokenizer")
    file = _own_gguf(source)
    with _quiet_progress():
        if file is not None:
            from specsample.adapter.gguf_load import load_gguf_tokenizer

            return load_gguf_tokenizer(file)
        from transformers import AutoTokenizer

        options = from_pretrained_options(source, model=False)
        return AutoTokenizer.from_pretrained(source.directory, **options)


def _own_gguf(source: ModelSource) -> GgufFile | None:
    """The parsed GGUF file when :mod:`~specsample.adapter.gguf_load` loads it, else ``None``
    (a model directory, or a file left to transformers' GGUF loader)."""
    if source.gguf_file is None:
        return None
    require_gguf()
    from specsample.adapter.gguf_load import loads_itself

    file = read_gguf(source.gguf_file)
    return file if loads_itself(file) else None


@contextmanager
def _quiet_progress() -> Iterator[None]:
    """transformers' progress bars off while loading, back as they were after."""
    from transformers.utils import logging as hf_logging

    shown = hf_logging.is_progress_bar_enabled()
    hf_logging.disable_progress_bar()
    try:
        yield
    finally:
        if shown:
            hf_logging.enable_progress_bar()


def check_same_tokenizer(
    target: Any, draft: Any, probes: Sequence[str] = _TOKENIZER_PROBES
) -> None:
    """Check that two tokenizers agree: same vocabulary, same encodings of a few strings.

    Raises
    ------
    ValueError
        Naming the first difference found.
    """
    target_vocab, draft_vocab = target.get_vocab(), draft.get_vocab()
    if target_vocab != draft_vocab:
        only_target = len(set(target_vocab.items()) - set(draft_vocab.items()))
        only_draft = len(set(draft_vocab.items()) - set(target_vocab.items()))
        raise ValueError(
            "the target and draft tokenizers differ: vocabularies of "
            f"{len(target_vocab)} and {len(draft_vocab)} tokens, {only_target} entries only in "
            f"the target's and {only_draft} only in the draft's"
        )
    for text in probes:
        a = target.encode(text, add_special_tokens=True)
        b = draft.encode(text, add_special_tokens=True)
        if a != b:
            raise ValueError(
                f"the target and draft tokenizers encode {text!r} differently: {a} vs {b}"
            )


def default_pair() -> tuple[Path, Path] | None:
    """The installed default ``(target, draft)`` directories, or ``None`` when there is none.

    They live under :data:`specsample.models.DEFAULT_DIR`; a model directory counts as
    installed when it holds a ``config.json``.

    Examples
    --------
    >>> pair = default_pair()
    >>> pair is None or [p.name for p in pair] == ["target", "draft"]
    True
    """
    target, draft = models.DEFAULT_DIR / "target", models.DEFAULT_DIR / "draft"
    if (target / "config.json").is_file() and (draft / "config.json").is_file():
        return target, draft
    return None


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
    layers = quantized_layers(model)
    if layers:
        kept = ", ".join(f"{name} x{n}" for name, n in sorted(layers.items()))
        text += f" and linear layers in {kept} ({_megabytes(quantized_bytes(model))})"
    if source.gguf_file is None:
        return text
    header = read_gguf_header(source.gguf_file)
    stored = ", ".join(f"{name} x{n}" for name, n in header.tensor_types.items())
    text += f"; from a GGUF file of {_megabytes(header.file_bytes)} (tensors {stored})"
    if header.quantized and not layers:
        text += f", dequantized to {dtype} at load"
    return text
