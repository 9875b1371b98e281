"""The default target/draft pair shipped in ``specsample/models/default``."""

from __future__ import annotations

import os
from pathlib import Path
from typing import Any

import pytest
import torch

from specsample import models
from specsample.models import default_model_dir

MAX_TOTAL_BYTES = 40 * 1000 * 1000

# The shapes documented in specsample/models/README.md.
SHAPES = {
    "target": {
        "num_hidden_layers": 12,
        "hidden_size": 320,
        "intermediate_size": 864,
        "num_attention_heads": 5,
    },
    "draft": {
        "num_hidden_layers": 1,
        "hidden_size": 128,
        "intermediate_size": 384,
        "num_attention_heads": 2,
    },
}
VOCAB_SIZE = 4096
PROBES = (
    "def main(argv=None):\n    return 0\n",
    "import os\nfrom pathlib import Path\n",
    "class Foo(Bar):\n    '''Docstring.'''\n",
    "x = [i * 2 for i in range(10)]  # comment",
    "héllo wörld ✓ \t\n",
)


def _transformers() -> Any:
    return pytest.importorskip(
        "transformers", reason="transformers is not installed (pip install -e '.[hf]')"
    )


@pytest.fixture(scope="module", autouse=True)
def _offline() -> None:
    os.environ["HF_HUB_OFFLINE"] = "1"


@pytest.fixture(scope="module")
def tokenizers() -> dict[str, Any]:
    transformers = _transformers()
    return {
        name: transformers.AutoTokenizer.from_pretrained(
            default_model_dir(name), local_files_only=True
        )
        for name in SHAPES
    }


@pytest.fixture(scope="module")
def lms() -> dict[str, Any]:
    transformers = _transformers()
    return {
        name: transformers.AutoModelForCausalLM.from_pretrained(
            default_model_dir(name), local_files_only=True
        ).eval()
        for name in SHAPES
    }


def test_default_model_dir_is_inside_the_package() -> None:
    package = Path(models.__file__).resolve().parent
    for name in SHAPES:
        directory = default_model_dir(name)
        assert directory == package / "default" / name
        assert (directory / "config.json").is_file()
        assert (directory / "model.safetensors").is_file()
        assert (directory / "tokenizer.json").is_file()


def test_default_model_dir_rejects_unknown_names() -> None:
    with pytest.raises(ValueError, match="target"):
        default_model_dir("medium")


def test_default_model_dir_reports_missing_models(
    monkeypatch: pytest.MonkeyPatch, tmp_path: Path
) -> None:
    monkeypatch.setattr(models, "DEFAULT_DIR", tmp_path)
    with pytest.raises(FileNotFoundError, match="not installed"):
        default_model_dir("draft")


def test_total_size_within_budget() -> None:
    total = sum(
        path.stat().st_size
        for name in SHAPES
        for path in default_model_dir(name).rglob("*")
        if path.is_file()
    )
    assert total <= MAX_TOTAL_BYTES, f"{total / 1e6:.1f} MB"


def test_tokenizer_is_shared(tokenizers: dict[str, Any]) -> None:
    target, draft = tokenizers["target"], tokenizers["draft"]
    assert target.get_vocab() == draft.get_vocab()
    assert len(target) == VOCAB_SIZE
    assert target.eos_token is not None
    assert target.eos_token_id == draft.eos_token_id
    for text in PROBES:
        ids = target.encode(text, add_special_tokens=True)
        assert ids == draft.encode(text, add_special_tokens=True)
        assert max(ids) < VOCAB_SIZE
        assert target.decode(ids, skip_special_tokens=True) == text
    assert (default_model_dir("target") / "tokenizer.json").read_bytes() == (
        default_model_dir("draft") / "tokenizer.json"
    ).read_bytes()


@pytest.mark.parametrize("name", sorted(SHAPES))
def test_config_as_documented(lms: dict[str, Any], tokenizers: dict[str, Any], name: str) -> None:
    config = lms[name].config
    assert config.model_type == "llama"
    for key, value in SHAPES[name].items():
        assert getattr(config, key) == value, key
    assert config.num_key_value_heads == config.num_attention_heads
    assert config.vocab_size == VOCAB_SIZE
    assert config.tie_word_embeddings
    assert config.attention_dropout == 0.0
    assert config.eos_token_id == tokenizers[name].eos_token_id


@pytest.mark.parametrize("name", sorted(SHAPES))
def test_loads_in_float32(lms: dict[str, Any], name: str) -> None:
    model = lms[name]
    assert model.dtype == torch.float32
    assert all(p.dtype == torch.float32 for p in model.parameters())
    assert model.lm_head.weight.data_ptr() == model.model.embed_tokens.weight.data_ptr()


@pytest.mark.parametrize("name", sorted(SHAPES))
def test_generates(lms: dict[str, Any], tokenizers: dict[str, Any], name: str) -> None:
    tokenizer = tokenizers[name]
    prompt = tokenizer("def fibonacci(n):\n", return_tensors="pt")
    with torch.inference_mode():
        out = lms[name].generate(
            **prompt,
            max_new_tokens=8,
            do_sample=False,
            pad_token_id=tokenizer.eos_token_id,
        )
    length = prompt["input_ids"].shape[1]
    assert out.shape[0] == 1
    assert length < out.shape[1] <= length + 8
    assert torch.equal(out[:, :length], prompt["input_ids"])
    assert isinstance(tokenizer.decode(out[0]), str)


def test_models_share_the_vocabulary_and_mostly_agree(
    lms: dict[str, Any], tokenizers: dict[str, Any]
) -> None:
    text = (
        "import os\n\n\ndef read_lines(path):\n"
        '    """Return the lines of the file at path."""\n'
        "    with open(path) as f:\n        return [line.rstrip() for line in f]\n"
    )
    ids = tokenizers["target"](text, return_tensors="pt")["input_ids"]
    with torch.inference_mode():
        target = lms["target"](input_ids=ids).logits
        draft = lms["draft"](input_ids=ids).logits
    assert target.shape == draft.shape == (1, ids.shape[1], VOCAB_SIZE)
    assert torch.isfinite(target).all() and torch.isfinite(draft).all()
    agreement = (target.argmax(-1) == draft.argmax(-1)).float().mean().item()
    assert agreement >= 0.5, agreement
