"""The benchmark harness and the ``specsample`` command line, on tiny shapes.

Nothing here asserts on timings: they depend on the machine and its load. The cache flush
is shrunk to 1 MiB so that every test runs in well under a second or two. The ``generate``
command runs on tiny random Llama models saved here (never downloaded).
"""

from __future__ import annotations

import argparse
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest
import torch

from specsample import bench, cli, models
from specsample.bench import runner
from specsample.bench.contestants import _transformers_call
from specsample.cli import main

TINY = (2, 2, 64)


@pytest.fixture
def small_flush(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(runner, "cache_flush_bytes", lambda device: 2**20)


def _tiny_rows() -> list[dict[str, Any]]:
    return bench.run_benchmark([TINY], repeats=2, slow_repeats=1, flush_bytes=2**20, progress=False)


def test_run_benchmark_returns_the_documented_keys() -> None:
    rows = _tiny_rows()
    assert len(rows) == 1
    row = rows[0]
    expected = {"batch", "k", "vocab", "alpha", "others", "speedup", "ours_over_floor"}
    expected |= {"hf_over_ours", "device", "dtype", "threads", "repeats", "slow_repeats"}
    expected |= {"flush_mib", "notes"}
    expected |= {f"{name}_{unit}" for name in bench.CONTESTANTS for unit in ("ms", "mem")}
    assert set(row) == expected
    assert (row["batch"], row["k"], row["vocab"]) == TINY
    for name in ("ours", "naive", "floor"):
        assert isinstance(row[f"{name}_ms"], float) and row[f"{name}_ms"] > 0
        assert isinstance(row[f"{name}_mem"], float) and row[f"{name}_mem"] >= 0
    assert row["speedup"] == pytest.approx(row["naive_ms"] / row["ours_ms"])
    assert row["ours_over_floor"] == pytest.approx(row["ours_ms"] / row["floor_ms"])
    assert 0.0 < row["alpha"] <= 1.0
    assert row["device"] == "cpu" and row["repeats"] == 2 and row["flush_mib"] == 1.0
    assert row["hf_ms"] is None or row["hf_ms"] > 0


def test_progress_goes_to_stderr(capsys: pytest.CaptureFixture[str]) -> None:
    bench.run_benchmark([TINY], repeats=1, slow_repeats=1, flush_bytes=2**20)
    captured = capsys.readouterr()
    assert captured.out == ""
    assert "[1/1] batch=2 k=2 vocab=64" in captured.err


def test_format_table_states_the_methodology() -> None:
    table = bench.format_table(_tiny_rows())
    assert "cold caches" in table and "1 MiB buffer is overwritten" in table
    assert "median of 2 cold calls" in table
    assert "naive/ours" in table and "ours/floor" in table
    assert any(line.split()[:3] == ["2", "2", "64"] for line in table.splitlines())
    assert bench.format_table([]) == "(no shapes benchmarked)"


def test_threads_are_restored() -> None:
    before = torch.get_num_threads()
    rows = bench.run_benchmark(
        [TINY], repeats=1, slow_repeats=1, threads=1, flush_bytes=2**20, progress=False
    )
    assert rows[0]["threads"] == 1
    assert torch.get_num_threads() == before


@pytest.mark.parametrize(
    ("kwargs", "error"),
    [
        ({"shapes": [(2, 0, 64)]}, ValueError),
        ({"shapes": [(2, 2)]}, TypeError),
        ({"shapes": [(2.0, 2, 64)]}, TypeError),
        ({"repeats": 0}, ValueError),
        ({"slow_repeats": 0}, ValueError),
        ({"threads": 0}, ValueError),
        ({"flush_bytes": 0}, ValueError),
        ({"device": "meta"}, ValueError),
    ],
)
def test_run_benchmark_validates(kwargs: dict[str, object], error: type[Exception]) -> None:
    arguments: dict[str, object] = {"shapes": [TINY], "flush_bytes": 2**20, "progress": False}
    arguments.update(kwargs)
    with pytest.raises(error):
        bench.run_benchmark(**arguments)  # type: ignore[arg-type]


def test_make_inputs_are_softmax_rows_with_sampled_drafts() -> None:
    inputs = bench.make_inputs(3, 4, 100, seed=5)
    assert inputs.target_probs.shape == inputs.draft_probs.shape == (3, 4, 100)
    assert inputs.bonus_token_ids.shape == (3, 1) and inputs.draft_token_ids.shape == (3, 4)
    assert inputs.bonus_probs.shape == (3, 100)
    for probs in (inputs.target_probs, inputs.draft_probs, inputs.bonus_probs):
        assert torch.allclose(probs.sum(-1), torch.ones(()), atol=1e-5)
    drafted = inputs.draft_probs.gather(2, inputs.draft_token_ids.unsqueeze(-1))
    assert bool((drafted > 0).all())
    again = bench.make_inputs(3, 4, 100, seed=5)
    assert all(torch.equal(a, b) for a, b in zip(inputs, again, strict=True))


def test_extra_peak_bytes_counts_live_allocations() -> None:
    def step() -> torch.Tensor:
        first = torch.empty(1000, dtype=torch.float32)
        second = torch.empty(3000, dtype=torch.float32)
        del first, second
        return torch.empty(500, dtype=torch.float64)

    assert bench.extra_peak_bytes(step) == 16_000
    assert bench.extra_peak_bytes(lambda: None) == 0
    with pytest.raises(ValueError, match="cpu or cuda"):
        bench.extra_peak_bytes(lambda: None, "meta")


def test_transformers_adapter_calls_one_sequence_at_a_time() -> None:
    inputs = bench.make_inputs(3, 2, 16, seed=1)
    seen: list[tuple[object, ...]] = []

    def current(
        candidate_input_ids: torch.Tensor,
        candidate_logits: torch.Tensor,
        candidate_length: int,
        new_logits: torch.Tensor,
        assistant_ensemble_weight: float | None = None,
    ) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
        shapes = (candidate_input_ids.shape, candidate_logits.shape, new_logits.shape)
        seen.append((*map(tuple, shapes[:2]), candidate_length, tuple(shapes[2])))
        return candidate_input_ids, torch.tensor(0), new_logits.softmax(-1)

    call = _transformers_call(current, inputs)
    assert call is not None
    results = call()
    assert isinstance(results, list) and len(results) == 3
    assert seen == [((1, 2), (1, 2, 16), 2, (1, 3, 16))] * 3
    recovered = results[1][2][0]
    expected = torch.cat([inputs.target_probs[1], inputs.bonus_probs[1:2]])
    assert torch.allclose(recovered, expected, atol=1e-6)

    def older(
        candidate_input_ids: torch.Tensor,
        candidate_logits: torch.Tensor,
        candidate_length: int,
        new_logits: torch.Tensor,
        last_assistant_token_is_eos: bool,
        max_matches: int,
    ) -> tuple[torch.Tensor, torch.Tensor]:
        assert last_assistant_token_is_eos is False and max_matches == 2
        return candidate_input_ids, torch.tensor(0)

    older_call = _transformers_call(older, inputs)
    assert older_call is not None
    older_results = older_call()
    assert isinstance(older_results, list) and len(older_results) == 3

    def unknown(
        candidate_input_ids: torch.Tensor,
        candidate_logits: torch.Tensor,
        candidate_length: int,
        new_logits: torch.Tensor,
        mystery: object,
    ) -> None:
        return None

    assert _transformers_call(unknown, inputs) is None


def test_parse_shape() -> None:
    assert bench.parse_shape("8x4x32000") == (8, 4, 32000)
    assert bench.parse_shape("1X1X2") == (1, 1, 2)
    for bad in ("8x4", "8x4x-1", "axbxc", "8x0x10", "8x4x1"):
        with pytest.raises(argparse.ArgumentTypeError):
            bench.parse_shape(bad)


def test_main_bench_on_a_tiny_shape(small_flush: None, capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["bench", "--shapes", "2x2x64", "--repeats", "1"]) == 0
    captured = capsys.readouterr()
    assert "cold caches" in captured.out and "[1/1] batch=2" in captured.err


def test_main_help_exits_zero(capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["--help"]) == 0
    out = capsys.readouterr().out
    assert "usage: specsample" in out and "demo" in out and "bench" in out
    assert main(["bench", "--help"]) == 0
    assert "--quick" in capsys.readouterr().out


@pytest.mark.parametrize(
    "argv",
    [
        [],
        ["nope"],
        ["bench", "--shapes", "8x4"],
        ["bench", "--repeats", "0"],
        ["demo", "--alpha", "2"],
    ],
)
def test_usage_errors_exit_two(argv: list[str], capsys: pytest.CaptureFixture[str]) -> None:
    assert main(argv) == 2
    assert "error:" in capsys.readouterr().err


def test_runtime_errors_are_one_clean_line(capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["bench", "--shapes", "2x2x64", "--device", "meta"]) == 1
    err = capsys.readouterr().err
    assert err.strip() == "specsample bench: error: the benchmark runs on cpu or cuda, got meta"


def test_demo_reports_every_family(capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["demo", "--rows", "3000", "--k", "2", "--no-speed"]) == 0
    out = capsys.readouterr().out
    for name in cli.DEMO_FAMILIES:
        assert f"exactness of family {name!r}" in out
    assert f"{len(cli.DEMO_FAMILIES)}/{len(cli.DEMO_FAMILIES)} families passed" in out


def test_demo_speed_table(
    small_flush: None, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    monkeypatch.setattr(cli, "_DEMO_SHAPES", (TINY,))
    monkeypatch.setattr(cli, "DEMO_FAMILIES", ("equal",))
    assert main(["demo", "--rows", "500", "--k", "1"]) == 0
    out = capsys.readouterr().out
    assert "exactness of family 'equal'" in out and "cold caches" in out


def test_python_dash_m_specsample() -> None:
    done = subprocess.run(
        [sys.executable, "-m", "specsample", "--help"], capture_output=True, text=True, check=False
    )
    assert done.returncode == 0 and "usage: specsample" in done.stdout


# --------------------------------------------------------------------------- generate

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
    config = transformers.LlamaConfig(
        vocab_size=VOCAB,
        hidden_size=32,
        intermediate_size=64,
        num_hidden_layers=layers,
        num_attention_heads=4,
        num_key_value_heads=2,
        max_position_embeddings=256,
        initializer_range=0.2,
        eos_token_id=None,
        bos_token_id=None,
        pad_token_id=None,
    )
    return transformers.LlamaForCausalLM(config).eval()


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
