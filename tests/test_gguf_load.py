"""Loading a model and tokenizer from a GGUF file (:mod:`specsample.adapter.gguf_load`).

The tiny random Llama of ``tests/gguf_files.py`` is written twice: with its feed-forward
weights in ``Q8_0`` (as ``test_gguf_chat.py`` writes it), and tied, with its tensors in
``Q4_0``, ``Q4_1``, ``Q5_0``, ``Q5_1``, ``Q8_0``, ``F16``, ``BF16`` and ``F32``. Either
loads to what transformers' own GGUF loader gives: the same model class, config and
generation config, float32 weights equal bit for bit, the same tokenizer (vocabulary,
encodings, special tokens, chat template). Loading prints nothing and leaves transformers'
progress-bar setting as it was; a file this module does not load (another architecture, a
tensor type it does not decode) goes to transformers' loader, which gives the same; a file
cut inside its tensor data, or without a tensor the model needs, is refused with a message
naming what is wrong.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest
import torch

transformers = pytest.importorskip("transformers")
gguf = pytest.importorskip("gguf", reason="writing a GGUF file needs the gguf package")
pytest.importorskip("accelerate", reason="loading a GGUF file needs accelerate")

from transformers.utils import logging as hf_logging  # noqa: E402

from specsample import adapter  # noqa: E402
from specsample.adapter import gguf_load  # noqa: E402
from specsample.adapter.gguf import read_gguf  # noqa: E402
from specsample.adapter.gguf_load import loads_itself  # noqa: E402
from tests.gguf_files import default_tokenizer_dir, tiny_llama, write_gguf  # noqa: E402

Q = gguf.GGMLQuantizationType
MIXED = {
    "token_embd": Q.F16,
    "attn_q": Q.Q4_0,
    "attn_k": Q.Q4_1,
    "attn_v": Q.Q5_0,
    "attn_output": Q.Q5_1,
    "ffn_gate": Q.Q8_0,
    "ffn_up": Q.BF16,
}
"""The type of each tensor of the tied file, by GGUF name; the others are ``F32``."""

TEXTS = ("Hello, world!", "  two spaces\n\tand a tab", "Ünïcödé 東京 🙂", "<|endoftext|>def f():")


def _mixed(name: str) -> Any:
    return MIXED.get(name.split(".")[-2])


@pytest.fixture(scope="module")
def files(tmp_path_factory: pytest.TempPathFactory) -> dict[str, Path]:
    folder, tokenizer_dir = tmp_path_factory.mktemp("gguf"), default_tokenizer_dir()
    return {
        "q8_0": write_gguf(folder / "q8_0.gguf", tiny_llama(), tokenizer_dir),
        "mixed": write_gguf(folder / "mixed.gguf", tiny_llama(tied=True), tokenizer_dir, _mixed),
    }


def _transformers_load(path: Path) -> tuple[Any, Any]:
    """Model and tokenizer as transformers' own GGUF loader gives them."""
    options = {"gguf_file": str(path), "local_files_only": True}
    quantization = transformers.GgufConfig(dequantize=True)
    model = transformers.AutoModelForCausalLM.from_pretrained(
        path.parent, quantization_config=quantization, **options
    )
    return model.eval(), transformers.AutoTokenizer.from_pretrained(path.parent, **options)


def _bits(tensor: torch.Tensor) -> torch.Tensor:
    return tensor.view(torch.int32) if tensor.dtype == torch.float32 else tensor


def _assert_same_tokenizer(got: Any, want: Any) -> None:
    assert type(got) is type(want)
    assert got.get_vocab() == want.get_vocab()
    assert got.backend_tokenizer.to_str() == want.backend_tokenizer.to_str()
    for text in TEXTS:
        for special in (True, False):
            ids = want.encode(text, add_special_tokens=special)
            assert got.encode(text, add_special_tokens=special) == ids
        assert got.decode(ids) == want.decode(ids)
    names = ("chat_template", "all_special_tokens", "bos_token", "eos_token", "name_or_path")
    assert [getattr(got, name) for name in names] == [getattr(want, name) for name in names]


@pytest.mark.parametrize("kind", ["q8_0", "mixed"])
def test_model_and_tokenizer_are_transformers_own(files: dict[str, Path], kind: str) -> None:
    path = files[kind]
    assert loads_itself(read_gguf(path))
    model, tokenizer = adapter.load_model(path), adapter.load_tokenizer(path)
    want_model, want_tokenizer = _transformers_load(path)
    assert type(model) is type(want_model) and not model.training
    assert model.config.to_dict() == want_model.config.to_dict()
    assert model.generation_config.to_dict() == want_model.generation_config.to_dict()
    got, want = model.state_dict(), want_model.state_dict()
    assert list(got) == list(want)
    for name, tensor in want.items():
        assert got[name].dtype == tensor.dtype == torch.float32, name
        assert torch.equal(_bits(got[name]), _bits(tensor)), name
    tied = model.lm_head.weight.data_ptr() == model.model.embed_tokens.weight.data_ptr()
    assert tied == (kind == "mixed")
    _assert_same_tokenizer(tokenizer, want_tokenizer)


@pytest.mark.parametrize("shown", [True, False])
def test_loading_is_quiet(
    files: dict[str, Path], capfd: pytest.CaptureFixture[str], shown: bool
) -> None:
    before = hf_logging.is_progress_bar_enabled()
    (hf_logging.enable_progress_bar if shown else hf_logging.disable_progress_bar)()
    try:
        adapter.load_tokenizer(files["q8_0"])
        adapter.load_model(files["q8_0"])
        assert capfd.readouterr().err == ""
        assert hf_logging.is_progress_bar_enabled() == shown
    finally:
        (hf_logging.enable_progress_bar if before else hf_logging.disable_progress_bar)()


def test_other_files_go_to_transformers(
    files: dict[str, Path], monkeypatch: pytest.MonkeyPatch
) -> None:
    file = read_gguf(files["q8_0"])
    assert not loads_itself(file._replace(metadata={"general.architecture": "qwen2"}))
    other_type = file.tensors[-1]._replace(kind="IQ2_XS")
    assert not loads_itself(file._replace(tensors=(*file.tensors[:-1], other_type)))
    ours = adapter.load_model(files["q8_0"]).state_dict()
    ours_tokenizer = adapter.load_tokenizer(files["q8_0"])
    monkeypatch.setattr(gguf_load, "loads_itself", lambda file: False)
    theirs = adapter.load_model(files["q8_0"]).state_dict()
    assert list(ours) == list(theirs)
    assert all(torch.equal(_bits(ours[name]), _bits(theirs[name])) for name in ours)
    _assert_same_tokenizer(adapter.load_tokenizer(files["q8_0"]), ours_tokenizer)


def test_a_cut_or_incomplete_file_is_refused(files: dict[str, Path], tmp_path: Path) -> None:
    cut = tmp_path / "cut.gguf"
    cut.write_bytes(files["q8_0"].read_bytes()[:-100])
    with pytest.raises(
        ValueError, match=r"GGUF file ends inside tensor blk\.1\.\w+\.weight: .*cut"
    ):
        adapter.load_model(cut)
    short = write_gguf(
        tmp_path / "short.gguf",
        tiny_llama(),
        default_tokenizer_dir(),
        skip=frozenset(["blk.1.ffn_up.weight"]),
    )
    with pytest.raises(
        ValueError, match=r"lacks the tensors of model\.layers\.1\.mlp\.up_proj\.weight"
    ):
        adapter.load_model(short)
