"""``specsample generate`` (:mod:`specsample.cli.generate` and its options,
:mod:`specsample.cli.generate_args`) on tiny random Llama models saved here (never downloaded).

Covers :mod:`specsample.cli.generate`, :mod:`specsample.cli.generate_args` and what the
command prints, :mod:`specsample.cli.output`.
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path
from typing import Any

import pytest
import torch

from specsample import models
from specsample.cli import main
from specsample.cli.generate_args import add_arguments, tree_shape

VOCAB = 64
WORDS = ["[UNK]", "</s>"] + [f"w{i}" for i in range(VOCAB - 2)]


def _save_tokenizer(directory: Path, words: list[str]) -> None:
    transformers = pytest.importorskip("transformers")
    tokenizers = pytest.importorskip("tokenizers")

    level = tokenizers.models.WordLevel({w: i for i, w in enumerate(words)}, unk_token="[UNK]")
    tok = tokenizers.Tokenizer(level)
    tok.pre_tokenizer = tokenizers.pre_tokenizers.WhitespaceSplit()
    fast = transformers.PreTrainedTokenizerFast(
        tokenizer_object=tok, unk_token="[UNK]", eos_token="</s>"
    )
    fast.save_pretrained(directory)


def _tiny_llama(layers: int) -> Any:
    """A random Llama over ``WORDS`` (float32, eval mode)."""
    transformers = pytest.importorskip("transformers")
    from tests.tiny_llama import llama_config

    return transformers.LlamaForCausalLM(llama_config(layers)).eval()


@pytest.fixture(scope="module")
def model_dirs(tmp_path_factory: pytest.TempPathFactory) -> dict[str, Path]:
    """A target, a draft and a model with a different tokenizer, saved with their tokenizers."""
    torch.manual_seed(0)
    root = tmp_path_factory.mktemp("models")
    dirs = {name: root / name for name in ("target", "draft", "other")}
    draft = _tiny_llama(1)
    for name, model in (("target", _tiny_llama(2)), ("draft", draft), ("other", draft)):
        model.save_pretrained(dirs[name])
    _save_tokenizer(dirs["target"], WORDS)
    _save_tokenizer(dirs["draft"], WORDS)
    _save_tokenizer(dirs["other"], list(reversed(WORDS)))
    return dirs


def test_cli_generate_streams_and_compares(model_dirs, capsys, tmp_path) -> None:
    plot = tmp_path / "acceptance.png"
    status = main(
        [
            "generate",
            "w1 w2 w3 w4",
            "--target",
            str(model_dirs["target"]),
            "--draft",
            str(model_dirs["draft"]),
            "-k",
            "3",
            "--max-new-tokens",
            "12",
            "--compare",
            "--plot",
            str(plot),
        ]
    )
    captured = capsys.readouterr()
    assert status == 0, captured.err
    assert "w" in captured.out.splitlines()[0]
    assert "acceptance by position" in captured.out
    assert "target-only" in captured.out and "speedup" in captured.out
    assert plot.stat().st_size > 0


def test_cli_generate_ngram_batch(model_dirs, capsys) -> None:
    status = main(
        [
            "generate",
            "w1 w2 w1 w2 w1",
            "--target",
            str(model_dirs["target"]),
            "--ngram",
            "--batch-size",
            "3",
            "--temperature",
            "1.0",
            "--top-p",
            "0.9",
            "--seed",
            "4",
            "--max-new-tokens",
            "8",
        ]
    )
    captured = capsys.readouterr()
    assert status == 0, captured.err
    assert captured.out.count("[") >= 3
    assert "n-gram" in captured.out


def test_cli_plot_without_matplotlib(model_dirs, capsys, monkeypatch, tmp_path) -> None:
    monkeypatch.setitem(sys.modules, "matplotlib", None)
    args = ["generate", "w1 w2", "--target", str(model_dirs["target"]), "--ngram"]
    assert main([*args, "--max-new-tokens", "2", "--plot", str(tmp_path / "a.png")]) == 1
    assert "--plot needs matplotlib" in capsys.readouterr().err


@pytest.mark.parametrize(
    ("extra", "message"),
    [
        (["--draft", "{other}"], "tokenizers differ"),
        (["--draft", "{missing}"], "does not exist"),
        (["--draft", "{draft}", "--method", "block", "--ngram"], "not both"),
        (["--draft", "{draft}", "-k", "0"], "argument -k: expected an integer in [1, 64]"),
        (["--draft", "{draft}", "--seed", "-1"], "argument --seed: expected an integer in [0,"),
    ],
)
def test_cli_generate_errors(model_dirs, capsys, tmp_path, extra, message) -> None:
    fill = {"other": model_dirs["other"], "draft": model_dirs["draft"], "missing": tmp_path / "x"}
    args = ["generate", "w1 w2", "--target", str(model_dirs["target"])]
    args += [a.format(**fill) for a in extra]
    assert main(args) != 0
    assert message in capsys.readouterr().err


def test_cli_generate_refuses_a_prompt_that_is_not_text(model_dirs, capsys) -> None:
    """Bytes that are not UTF-8 (decoded by Python to surrogates) are named as such."""
    target = ["--target", str(model_dirs["target"]), "--ngram"]
    assert main(["generate", "w1 \udcff", *target]) == 1
    assert "the prompt is not valid text" in capsys.readouterr().err


def test_cli_generate_needs_a_pair(model_dirs, capsys, monkeypatch, tmp_path) -> None:
    monkeypatch.setattr(models, "DEFAULT_DIR", tmp_path / "none")
    assert main(["generate", "w1"]) == 1
    assert "no default model pair is installed" in capsys.readouterr().err
    target = ["--target", str(model_dirs["target"]), "--ngram"]
    assert main(["generate", "   ", *target]) == 1
    assert "empty" in capsys.readouterr().err
    assert main(["generate", " ".join(["w1"] * 300), *target]) == 1
    assert "context" in capsys.readouterr().err


@pytest.mark.parametrize(
    ("argv", "message"),
    [
        (["--tree-shape", "2,1"], "--tree-shape needs --tree"),
        (["--method", "traversal"], "needs --tree"),
        (["--tree", "4", "--ngram"], "cannot be used with --ngram"),
        (["--tree", "4", "--method", "block"], "verifies chains"),
        (["--tree", "4", "--tree-shape", "3,3"], "more than --tree 4"),
        (["--tree", "4", "--tree-shape", "x"], "comma-separated"),
    ],
)
def test_cli_tree_options_are_checked(argv: list[str], message: str) -> None:
    """``specsample generate`` tree options: each misuse gets a message naming it."""
    parser = argparse.ArgumentParser()
    add_arguments(parser)
    with pytest.raises(ValueError, match=message):
        tree_shape(parser.parse_args(["def f():", *argv]))
