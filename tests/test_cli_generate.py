"""``specsample generate`` (:mod:`specsample.cli.generate` and its options,
:mod:`specsample.cli.generate_args`) on tiny random Llama models saved here (never downloaded).

Covers :mod:`specsample.cli.generate`, :mod:`specsample.cli.generate_args` and what the
command prints, :mod:`specsample.cli.output` (on Ctrl-C too). The checks of the options
before anything loads: ``tests/test_cli.py``.
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path
from typing import Any

import pytest
import torch

from specsample import models
from specsample.cli import main, output
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


def _tiny_llama(layers: int, **overrides: Any) -> Any:
    """A random Llama over ``WORDS`` (float32, eval mode), its config given ``overrides``."""
    transformers = pytest.importorskip("transformers")
    from tests.tiny_llama import llama_config

    return transformers.LlamaForCausalLM(llama_config(layers, **overrides)).eval()


@pytest.fixture(scope="module")
def model_dirs(tmp_path_factory: pytest.TempPathFactory) -> dict[str, Path]:
    """A target, a draft, a model with a different tokenizer and one with a context of 16
    positions, saved with their tokenizers."""
    torch.manual_seed(0)
    root = tmp_path_factory.mktemp("models")
    dirs = {name: root / name for name in ("target", "draft", "other", "short")}
    draft = _tiny_llama(1)
    short = _tiny_llama(1, max_position_embeddings=16)
    for name, model in (("target", _tiny_llama(2)), ("draft", draft), ("other", draft)):
        model.save_pretrained(dirs[name])
    short.save_pretrained(dirs["short"])
    for name in ("target", "draft", "short"):
        _save_tokenizer(dirs[name], WORDS)
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
    """Refused as the options are parsed, not after the run."""
    monkeypatch.setitem(sys.modules, "matplotlib", None)
    args = ["generate", "w1 w2", "--target", str(model_dirs["target"]), "--ngram"]
    assert main([*args, "--max-new-tokens", "2", "--plot", str(tmp_path / "a.png")]) == 2
    captured = capsys.readouterr()
    assert "argument --plot: matplotlib is not installed" in captured.err
    assert "target:" not in captured.err and captured.out == ""


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
    assert main(["generate", "w1 \udcff", *target]) == 2
    assert "the prompt is not valid text" in capsys.readouterr().err


def test_cli_generate_needs_a_pair(model_dirs, capsys, monkeypatch, tmp_path) -> None:
    monkeypatch.setattr(models, "DEFAULT_DIR", tmp_path / "none")
    assert main(["generate", "w1"]) == 1
    assert "no default model pair is installed" in capsys.readouterr().err
    target = ["--target", str(model_dirs["target"]), "--ngram"]
    assert main(["generate", "   ", *target]) == 2
    assert "empty" in capsys.readouterr().err
    assert main(["generate", " ".join(["w1"] * 300), *target]) == 1
    assert "the prompt has 300 tokens but the target's context is 256" in capsys.readouterr().err


def test_cli_generate_refuses_drafts_beyond_the_context(model_dirs, capsys) -> None:
    """Said in flag syntax before the decoding loop refuses it."""
    args = ["generate", "w1 w2", "--target", str(model_dirs["short"]), "--ngram", "-k", "16"]
    assert main(args) == 1
    err = capsys.readouterr().err.splitlines()[-1]
    assert err == (
        "specsample generate: error: -k 16 must be below the target's context (16 positions): "
        "a step scores the drafts and one more slot"
    )


def test_cli_generate_interrupted(model_dirs, capsys, monkeypatch) -> None:
    """Ctrl-C ends the streamed line, prints the statistics of what ran and exits 130."""
    real = output.Stream.__call__
    calls: list[int] = []

    def stream_then_interrupt(self: Any, index: int, token_ids: list[int]) -> None:
        real(self, index, token_ids)
        calls.append(index)
        if len(calls) == 3:
            raise KeyboardInterrupt

    monkeypatch.setattr(output.Stream, "__call__", stream_then_interrupt)
    models = ["--target", str(model_dirs["target"]), "--draft", str(model_dirs["draft"])]
    assert main(["generate", "w1 w2 w3", *models, "--max-new-tokens", "60"]) == 130
    captured = capsys.readouterr()
    streamed, stats = captured.out.split("\n\nstatistics of the steps that ran before the ")
    assert streamed.startswith("w1 w2 w3 ") and "\n" not in streamed
    assert stats.startswith("interrupt:\nmode ") and "tokens generated" in stats
    assert captured.err.endswith("\nspecsample generate: interrupted\n")


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
