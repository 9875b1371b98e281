"""Loading models and tokenizers (:mod:`specsample.adapter.loading`) and reading GGUF headers
(:mod:`specsample.adapter.gguf`), without loading any weights.

Paths are checked before anything slow runs, with messages naming the path and what was
expected; a GGUF header is read from a small file written here; two tokenizers are compared
by vocabulary and encodings. Loading a real GGUF model is covered by ``test_gguf_chat.py``.
"""

from __future__ import annotations

import struct
from pathlib import Path
from types import SimpleNamespace
from typing import Any

import pytest
import torch

from specsample import adapter
from specsample.adapter import gguf, loading


def _string(text: str) -> bytes:
    data = text.encode()
    return struct.pack("<Q", len(data)) + data


def _write_gguf(path: Path, types: list[int], architecture: str = "llama") -> Path:
    """A GGUF v3 header: ``general.architecture``, an array entry, one tensor per type."""
    header = gguf.GGUF_MAGIC + struct.pack("<IQQ", 3, len(types), 2)
    header += _string("general.architecture") + struct.pack("<I", 8) + _string(architecture)
    header += _string("tokens") + struct.pack("<IIQ", 9, 8, 2) + _string("a") + _string("bc")
    for index, kind in enumerate(types):
        header += _string(f"t{index}") + struct.pack("<IQQIQ", 2, 4, 4, kind, 0)
    path.write_bytes(header + bytes(16))
    return path


def test_a_model_directory_is_a_source(tmp_path: Path) -> None:
    (tmp_path / "config.json").write_text("{}")
    source = adapter.model_source(tmp_path)
    assert source == adapter.ModelSource(tmp_path, tmp_path, None) and not source.is_gguf
    assert loading.from_pretrained_options(source) == {"local_files_only": True}


def test_a_gguf_file_is_a_source(tmp_path: Path) -> None:
    path = _write_gguf(tmp_path / "model.gguf", [0])
    source = adapter.model_source(path, part="tokenizer")
    assert source.is_gguf and source.gguf_file == str(path.resolve())
    assert source.directory == path.resolve().parent
    options = loading.from_pretrained_options(source, model=False)
    assert options == {"local_files_only": True, "gguf_file": str(path.resolve())}


@pytest.mark.parametrize(
    ("kind", "part", "message"),
    [
        ("empty directory", "model", "model directory holds no config.json"),
        ("empty directory", "tokenizer", "tokenizer directory holds no tokenizer file"),
        ("missing path", "model", "does not exist"),
        ("other file", "model", "not a .gguf file"),
        ("bad magic", "model", "is not a GGUF file"),
    ],
)
def test_paths_that_hold_no_model_are_refused_naming_them(
    tmp_path: Path, kind: str, part: str, message: str
) -> None:
    path = {
        "empty directory": tmp_path,
        "missing path": tmp_path / "missing",
        "other file": tmp_path / "config.json",
        "bad magic": tmp_path / "model.gguf",
    }[kind]
    if kind == "other file":
        path.write_text("{}")
    if kind == "bad magic":
        path.write_bytes(b"GGML" + bytes(20))
    with pytest.raises(ValueError, match=message) as caught:
        adapter.model_source(path, role="draft", part=part)
    assert str(path) in str(caught.value)
    if part == "model":
        with pytest.raises(ValueError, match=message):
            adapter.load_model(path, role="draft")


def test_an_unknown_part_is_refused() -> None:
    with pytest.raises(ValueError, match="part must be 'model' or 'tokenizer'"):
        adapter.model_source(".", part="weights")


def test_a_directory_holding_gguf_files_suggests_them(tmp_path: Path) -> None:
    _write_gguf(tmp_path / "m.gguf", [0])
    with pytest.raises(ValueError, match=r"pass one of its \.gguf files instead: m\.gguf"):
        adapter.model_source(tmp_path)


def test_the_gguf_header_counts_tensor_types(tmp_path: Path) -> None:
    path = _write_gguf(tmp_path / "model.gguf", [0, 8, 8])
    header = adapter.read_gguf_header(path)
    assert header.version == 3 and header.architecture == "llama"
    assert sorted(header.tensor_types.values()) == [1, 2]
    assert header.file_bytes == path.stat().st_size
    assert header.quantized


def test_a_cut_header_is_refused(tmp_path: Path) -> None:
    path = tmp_path / "model.gguf"
    path.write_bytes(_write_gguf(path, [0]).read_bytes()[:30])
    with pytest.raises(ValueError, match="ends inside its header"):
        adapter.read_gguf_header(path)


def test_describe_model_says_what_a_gguf_file_stored(tmp_path: Path) -> None:
    path = _write_gguf(tmp_path / "model.gguf", [8])
    model = torch.nn.Linear(3, 2)
    model.config = SimpleNamespace(num_hidden_layers=2, hidden_size=3)  # type: ignore[assignment]
    text = adapter.describe_model(model, adapter.model_source(path))
    assert text.startswith("Linear, 2 layers, hidden 3: 8 parameters in float32")
    assert "from a GGUF file" in text and "dequantized to float32" in text


class _Tokenizer:
    def __init__(self, vocab: dict[str, int], shift: int = 0) -> None:
        self.vocab = vocab
        self.shift = shift

    def get_vocab(self) -> dict[str, int]:
        return self.vocab

    def encode(self, text: str, add_special_tokens: bool = True) -> list[int]:
        return [ord(c) + self.shift for c in text[:3]]


def test_check_same_tokenizer_names_the_first_difference() -> None:
    vocab: dict[str, Any] = {"a": 0, "b": 1}
    adapter.check_same_tokenizer(_Tokenizer(vocab), _Tokenizer(dict(vocab)))
    with pytest.raises(ValueError, match="vocabularies of 2 and 3 tokens"):
        adapter.check_same_tokenizer(_Tokenizer(vocab), _Tokenizer({**vocab, "c": 2}))
    with pytest.raises(ValueError, match="encode 'Hello, world!' differently"):
        adapter.check_same_tokenizer(_Tokenizer(vocab), _Tokenizer(vocab, shift=1))


@pytest.mark.parametrize("role", ["target", "draft"])
def test_truncated_weights_name_the_model_and_the_file(tmp_path: Path, role: str) -> None:
    """A cut ``model.safetensors`` is reported for its model and file, not as a raw
    ``SafetensorError`` traceback."""
    pytest.importorskip("transformers")
    import shutil

    from specsample.models import default_model_dir

    directory = tmp_path / role
    shutil.copytree(default_model_dir("draft"), directory)
    weights = directory / "model.safetensors"
    weights.write_bytes(weights.read_bytes()[: weights.stat().st_size // 2])
    with pytest.raises(ValueError) as error:
        loading.load_model(directory, role=role)
    message = str(error.value)
    assert message.startswith(f"the {role} model's weights cannot be read: {weights} is ")
    assert "truncated or corrupted" in message


def test_a_missing_gguf_package_says_how_to_install_it_from_the_checkout(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    real = loading.importlib.util.find_spec
    monkeypatch.setattr(
        loading.importlib.util, "find_spec", lambda name: None if name == "gguf" else real(name)
    )
    with pytest.raises(ImportError, match=r"needs the gguf package; install with: pip install -e"):
        loading.require_gguf()
