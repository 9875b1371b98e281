"""GGUF files, chat templates and several end-of-sequence ids, offline.

Covers the command's model loading, :mod:`specsample.cli.load`, with
:mod:`specsample.adapter.gguf` and :mod:`specsample.adapter.gguf_load` on a real file.

A tiny random Llama is written as a GGUF file with the ``gguf`` package
(``tests/gguf_files.py``), in llama.cpp's tensor names and layout (``token_embd``,
``blk.N.attn_q`` with the query and key rows permuted, ...), its feed-forward weights
quantized to ``Q8_0``, together with the shipped default pair's tokenizer (byte-level BPE)
and a chat template.
Loading it must give back the same weights (the quantized ones within the ``Q8_0`` error)
and the same tokenizer, and greedy speculative decoding on it must equal target-only
decoding and transformers' own greedy ``generate``. The command runs on it with ``--chat``
and ``--system``, stops at every end-of-sequence id of the generation config, and refuses
paths that are no model (an empty directory, a missing path, a file that is not GGUF) and
``--chat`` with a tokenizer without a chat template, with messages naming the path.
"""

from __future__ import annotations

import copy
import json
from pathlib import Path
from typing import Any

import pytest
import torch

transformers = pytest.importorskip("transformers")
pytest.importorskip("gguf", reason="writing a GGUF file needs the gguf package")
pytest.importorskip("accelerate", reason="loading a GGUF file needs accelerate")

from specsample import adapter, cli  # noqa: E402
from specsample.cli.load import eos_token_ids, prompt_encoder  # noqa: E402
from specsample.generate import (  # noqa: E402
    NGramDrafter,
    speculative_generate,
    target_generate,
)
from tests.gguf_files import (  # noqa: E402
    CHAT_TEMPLATE,
    LAYERS,
    default_tokenizer_dir,
    tiny_llama,
    write_gguf,
)

PROMPTS = ("def parse(text):", "class Node:\n    def __init__(self, value):", "import os\n")


@pytest.fixture(scope="module")
def tokenizer_dir() -> Path:
    return default_tokenizer_dir()


@pytest.fixture(scope="module")
def original() -> Any:
    """The random Llama the GGUF file holds (vocabulary of the default tokenizer)."""
    return tiny_llama()


@pytest.fixture(scope="module")
def gguf_file(tmp_path_factory: pytest.TempPathFactory, original: Any, tokenizer_dir: Path) -> Path:
    return write_gguf(tmp_path_factory.mktemp("gguf") / "tiny.gguf", original, tokenizer_dir)


@pytest.fixture(scope="module")
def loaded(gguf_file: Path) -> dict[str, Any]:
    return {"model": adapter.load_model(gguf_file), "tokenizer": adapter.load_tokenizer(gguf_file)}


def test_the_gguf_file_loads_the_same_weights(loaded: dict[str, Any], original: Any) -> None:
    model = loaded["model"]
    assert isinstance(model, transformers.LlamaForCausalLM) and not model.training
    assert model.config.num_hidden_layers == LAYERS and model.config.vocab_size == 4096
    got, want = model.state_dict(), original.state_dict()
    assert set(got) == set(want)
    for name, tensor in want.items():
        if ".mlp." in name:
            scale = float(tensor.abs().max())
            torch.testing.assert_close(got[name], tensor, atol=scale / 100, rtol=0)
        else:
            torch.testing.assert_close(got[name], tensor, atol=0, rtol=0, msg=name)


def test_the_gguf_tokenizer_is_the_directory_one(
    loaded: dict[str, Any], tokenizer_dir: Path
) -> None:
    adapter.check_same_tokenizer(loaded["tokenizer"], adapter.load_tokenizer(tokenizer_dir))
    assert loaded["tokenizer"].chat_template == CHAT_TEMPLATE


def test_gguf_header_and_description(gguf_file: Path, loaded: dict[str, Any]) -> None:
    header = adapter.read_gguf_header(gguf_file)
    assert header.architecture == "llama" and header.quantized
    assert header.tensor_types == {"F32": 3 + 6 * LAYERS, "Q8_0": 3 * LAYERS}
    text = adapter.describe_model(loaded["model"], adapter.model_source(gguf_file))
    assert "parameters in float32" in text and "Q8_0 x6" in text
    assert text.endswith("dequantized to float32 at load")


def test_greedy_on_the_gguf_model_equals_target_only(loaded: dict[str, Any]) -> None:
    model, tokenizer = copy.deepcopy(loaded["model"]).double(), loaded["tokenizer"]
    prompts = [tokenizer.encode(p) for p in PROMPTS]
    reference = target_generate(model, prompts, max_new_tokens=16)
    for drafter in (NGramDrafter(), model):
        got = speculative_generate(model, prompts, drafter, k=3, max_new_tokens=16)
        assert got.sequences == reference.sequences
    ids = torch.tensor([prompts[0]])
    theirs = model.generate(ids, max_new_tokens=16, do_sample=False, eos_token_id=None)
    assert theirs[0, len(prompts[0]) :].tolist() == reference.sequences[0]


def test_several_eos_ids_all_stop_generation(loaded: dict[str, Any]) -> None:
    model, tokenizer = loaded["model"], loaded["tokenizer"]
    prompt = tokenizer.encode(PROMPTS[1])
    free = target_generate(model, [prompt], max_new_tokens=12).sequences[0]
    first, second = free[3], free[6]
    assert first not in free[:3] and second not in free[:6] and 0 not in free[:7]
    before = model.generation_config.eos_token_id
    model.generation_config.eos_token_id = [first, second]
    try:
        ends = eos_token_ids(tokenizer, model)
        assert ends == [0, first, second]
        for stop, ids in ((first, ends), (second, [0, second])):
            for drafter in (None, NGramDrafter()):
                if drafter is None:
                    got = target_generate(model, [prompt], max_new_tokens=12, eos_token_id=ids)
                else:
                    got = speculative_generate(
                        model, [prompt], drafter, max_new_tokens=12, eos_token_id=ids
                    )
                assert got.sequences[0] == free[: free.index(stop) + 1]
    finally:
        model.generation_config.eos_token_id = before


def test_the_command_stops_at_every_eos_id_of_the_generation_config(
    gguf_file: Path, loaded: dict[str, Any], tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    tokenizer = loaded["tokenizer"]
    free = target_generate(loaded["model"], [tokenizer.encode(PROMPTS[1])], max_new_tokens=12)
    ids = free.sequences[0]
    load = adapter.load_model

    def with_two_ends(path: Any, role: str = "target", **options: Any) -> Any:
        model = load(path, role=role, **options)
        model.generation_config.eos_token_id = [ids[6], ids[3]]
        return model

    monkeypatch.setattr(adapter, "load_model", with_two_ends)
    source, destination = tmp_path / "in.jsonl", tmp_path / "out.jsonl"
    source.write_text(json.dumps({"prompt": PROMPTS[1]}) + "\n")
    args = ["generate", "--input", str(source), "--output", str(destination), "--ngram"]
    args += ["--target", str(gguf_file), "--max-new-tokens", "12", "--threads", "1"]
    assert cli.main([*args, "--quantize", "none"]) == 0
    record = json.loads(destination.read_text())
    assert (record["completion_tokens"], record["finish_reason"]) == (4, "eos")


def _chat_reply(tokenizer: Any, model: Any, prompt: str, system: str | None = None) -> str:
    """transformers' greedy reply to ``prompt`` as a chat (16 tokens at most)."""
    ids = prompt_encoder(tokenizer, chat=True, system=system)(prompt)
    head = [] if system is None else [{"role": "system", "content": system}]
    messages = [*head, {"role": "user", "content": prompt}]
    text = tokenizer.apply_chat_template(messages, add_generation_prompt=True, tokenize=False)
    assert tokenizer.decode(ids) == text
    out = model.generate(torch.tensor([ids]), max_new_tokens=16, do_sample=False)
    return str(tokenizer.decode(out[0, len(ids) :].tolist(), skip_special_tokens=True))


@pytest.mark.slow
def test_cli_chat_on_the_gguf_file_equals_transformers_greedy(
    gguf_file: Path, loaded: dict[str, Any], capsys: pytest.CaptureFixture[str]
) -> None:
    model, tokenizer = loaded["model"], loaded["tokenizer"]
    base = ["generate", "--target", str(gguf_file), "--ngram", "--chat", "--temperature", "0"]
    base += ["--max-new-tokens", "16", "--threads", "1", "--quantize", "none"]
    for system in (None, "be brief"):
        extra = [] if system is None else ["--system", system]
        assert cli.main([*base, *extra, PROMPTS[0]]) == 0
        captured = capsys.readouterr()
        reply = _chat_reply(tokenizer, model, PROMPTS[0], system)
        assert reply and captured.out.startswith(reply + "\n\n"), (captured.out, reply)
        assert "dequantized to float32 at load" in captured.err


def test_cli_chat_with_input_file(gguf_file: Path, loaded: dict[str, Any], tmp_path: Path) -> None:
    model, tokenizer = loaded["model"], loaded["tokenizer"]
    source, destination = tmp_path / "in.jsonl", tmp_path / "out.jsonl"
    source.write_text("".join(json.dumps({"prompt": p}) + "\n" for p in PROMPTS[:2]))
    args = ["generate", "--input", str(source), "--output", str(destination), "--chat"]
    args += ["--target", str(gguf_file), "--ngram", "--max-new-tokens", "16", "--threads", "1"]
    assert cli.main([*args, "--quantize", "none"]) == 0
    records = [json.loads(line) for line in destination.read_text().splitlines()]
    replies = [_chat_reply(tokenizer, model, p) for p in PROMPTS[:2]]
    assert all(replies) and [r["completion"] for r in records] == replies


def test_chat_needs_a_template(tokenizer_dir: Path, capsys: pytest.CaptureFixture[str]) -> None:
    assert cli.main(["generate", "x", "--target", str(tokenizer_dir), "--ngram", "--chat"]) == 1
    assert "--chat needs a tokenizer with a chat template" in capsys.readouterr().err
    assert cli.main(["generate", "x", "--ngram", "--system", "hi"]) == 2
    assert "--system needs --chat" in capsys.readouterr().err


def _not_a_model(kind: str, root: Path) -> Path:
    """A path of ``kind`` under ``root`` that holds no model."""
    if kind == "empty directory":
        (root / "model").mkdir()
        return root / "model"
    if kind == "other file":
        (root / "config.json").write_text("{}")
        return root / "config.json"
    if kind == "bad magic":
        (root / "model.gguf").write_bytes(b"GGML" + bytes(20))
        return root / "model.gguf"
    return root / "missing"


@pytest.mark.parametrize(
    ("kind", "message"),
    [
        ("empty directory", "holds no config.json"),
        ("missing path", "does not exist"),
        ("other file", "not a .gguf file"),
        ("bad magic", "is not a GGUF file"),
    ],
)
def test_paths_that_hold_no_model_are_refused(
    tmp_path: Path, capsys: pytest.CaptureFixture[str], kind: str, message: str
) -> None:
    path = _not_a_model(kind, tmp_path)
    assert cli.main(["generate", "x", "--target", str(path), "--ngram"]) == 1
    err = capsys.readouterr().err
    assert message in err and str(path) in err and "expected" in err
    with pytest.raises(ValueError, match=message):
        adapter.load_model(path, role="draft")
    with pytest.raises(ValueError, match="expected"):
        adapter.load_tokenizer(path)
