"""Every option and argument that sizes work is bounded, or runs in bounded memory.

For each command-line flag an extreme value is either refused at once, on one line naming
the flag and the allowed range (a usage error, exit status 2, combined bounds such as the
toy table size included, before any work), or, at the bound itself, the command
runs in a subprocess whose peak resident memory (``ru_maxrss`` of the waited-for child,
read by a small wrapper process) stays under 2 GiB. The wrapper also caps the child's
address space, so a regression fails the test instead of exhausting the machine. The
Python APIs behind the flags are checked the same way, in process. The ``generate`` runs use
the tiny random Llama models of :mod:`tests.test_cli_generate`.
"""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest
import torch

from specsample import generate
from specsample.bench import make_inputs
from specsample.cli import main
from specsample.sampler import RejectionSampler
from specsample.testing import (
    DRAW_BLOCK_ROWS,
    MAX_TABLE_ENTRIES,
    compare,
    exactness_report,
    make_family,
    simulate,
)
from specsample.timing import Stopwatch

PEAK_LIMIT_KIB = 2 * 1024 * 1024
"""Peak resident memory allowed to a command at its bounds: 2 GiB."""

ADDRESS_LIMIT = 8 << 30
"""Address space the measured child may map (torch alone maps about 1.3 GiB)."""

_MEASURE = """
import resource, subprocess, sys

limit = int(sys.argv[1])


def cap():
    resource.setrlimit(resource.RLIMIT_AS, (limit, limit))


done = subprocess.run(sys.argv[2:], preexec_fn=cap, capture_output=True, text=True)
sys.stdout.write(done.stdout)
sys.stderr.write(done.stderr)
print("peak_kib", resource.getrusage(resource.RUSAGE_CHILDREN).ru_maxrss, file=sys.stderr)
sys.exit(done.returncode)
"""


def run_measured(args: list[str], timeout: float = 120.0) -> tuple[int, str, int]:
    """Run ``specsample ARGS`` in a subprocess: its exit status, stderr and peak RSS in KiB."""
    command = [sys.executable, "-c", _MEASURE, str(ADDRESS_LIMIT), sys.executable, "-m"]
    env = {**os.environ, "HF_HUB_OFFLINE": "1", "TOKENIZERS_PARALLELISM": "false"}
    done = subprocess.run(
        [*command, "specsample", *args], capture_output=True, text=True, timeout=timeout, env=env
    )
    *err, last = done.stderr.rstrip("\n").split("\n")
    label, peak = last.split()
    assert label == "peak_kib", done.stderr
    print(f"peak RSS of specsample {' '.join(args[:1])}: {int(peak) / 1024:.0f} MiB")
    return done.returncode, "\n".join(err), int(peak)


def assert_within_memory(args: list[str]) -> None:
    status, err, peak = run_measured(args)
    assert status == 0, err
    assert peak < PEAK_LIMIT_KIB, f"peak RSS {peak / 1024:.0f} MiB for {args}"


def assert_refused(args: list[str], capsys: pytest.CaptureFixture[str], *fragments: str) -> None:
    """The command refuses at once (exit status 2) with one line on stderr holding every
    fragment."""
    watch = Stopwatch()
    assert main(args) == 2
    elapsed = watch.elapsed()
    captured = capsys.readouterr()
    lines = captured.err.strip().splitlines()
    assert len(lines) == 1, captured.err
    assert "error:" in lines[0] and "Traceback" not in captured.err
    for fragment in fragments:
        assert fragment in lines[0], lines[0]
    assert elapsed < 5.0, f"refusing took {elapsed:.1f} s"


# --------------------------------------------------------------------------- compare


@pytest.mark.slow
def test_compare_k(capsys: pytest.CaptureFixture[str]) -> None:
    """``--k 300 --rows 10`` once grew past 20 GB; now k is at most 64."""
    assert_refused(["compare", "--k", "300", "--rows", "10"], capsys, "--k", "[1, 64], got 300")
    assert_within_memory(
        ["compare", "--k", "64", "--branching", "1", "--vocab", "254", "--rows", "2",
         "--families", "zipf"]
    )  # fmt: skip


@pytest.mark.slow
def test_compare_rows(capsys: pytest.CaptureFixture[str]) -> None:
    assert_refused(["compare", "--rows", str(10**12)], capsys, "--rows", "[2, 10000000]")
    assert_within_memory(
        ["compare", "--rows", "150000", "--k", "1", "--families", "random", "--vocab", "2"]
    )


def test_compare_vocab(capsys: pytest.CaptureFixture[str]) -> None:
    assert_refused(["compare", "--vocab", str(10**9)], capsys, "--vocab", str(MAX_TABLE_ENTRIES))
    assert_refused(["compare", "--vocab", "837", "--k", "5"], capsys, "--vocab 837 with --k 5")
    assert_within_memory(
        ["compare", "--vocab", "836", "--k", "5", "--rows", "2", "--families", "zipf"]
    )


def test_compare_branching(capsys: pytest.CaptureFixture[str]) -> None:
    assert_refused(["compare", "--branching", "5000"], capsys, "--branching", "[1, 1024]")
    assert_refused(["compare", "--branching", "2", "--k", "10"], capsys, "2046 nodes", "1024")
    assert_within_memory(
        ["compare", "--branching", "2", "--k", "9", "--vocab", "647", "--rows", "2",
         "--families", "random"]
    )  # fmt: skip


def test_compare_families(capsys: pytest.CaptureFixture[str]) -> None:
    """Families are run one after the other: many of them cost time, not memory."""
    assert_refused(["compare", "--families", "nope"], capsys, "invalid choice: 'nope'")
    assert main(["compare", "--families", *["random"] * 40, "--k", "2", "--rows", "2"]) == 0
    assert capsys.readouterr().out.count("random ") == 40 * len(compare.RULES)


def test_compare_rules_api_bounds() -> None:
    with pytest.raises(ValueError, match=r"every k must be in \[1, 64\], got 65"):
        compare.compare_rules(["random"], [65])
    with pytest.raises(ValueError, match=r"rows must be in \[2, 10000000\]"):
        compare.compare_rules(["random"], [1], rows=10**8)
    with pytest.raises(ValueError, match="more than MAX_SIMULATED_TREE_NODES"):
        compare.compare_rules(["random"], [11], branching=2)
    with pytest.raises(ValueError, match="vocab=5000 with k=1"):
        compare.compare_rules(["random"], [1], vocab=5000)
    with pytest.raises(TypeError, match="families"):
        compare.compare_rules("random", [1])  # type: ignore[arg-type]
    with pytest.raises(TypeError, match="rows must be an int"):
        compare.compare_rules(["random"], [1], rows=2.5)  # type: ignore[arg-type]


# --------------------------------------------------------------------------- demo and bench


def test_demo_rows(capsys: pytest.CaptureFixture[str]) -> None:
    assert_refused(["demo", "--rows", str(10**12)], capsys, "--rows", "[1, 10000000]")


def test_demo_k(capsys: pytest.CaptureFixture[str]) -> None:
    assert_refused(["demo", "--k", "65"], capsys, "--k", "[1, 64]")


def test_demo_vocab(capsys: pytest.CaptureFixture[str]) -> None:
    assert_refused(["demo", "--vocab", "1000", "--no-speed"], capsys, "--vocab 1000")


def test_bench_shapes(capsys: pytest.CaptureFixture[str]) -> None:
    assert_refused(["bench", "--shapes", "100000x8x151936"], capsys, "--shapes", "batch in")
    assert_refused(
        ["bench", "--shapes", "4096x8x151936"], capsys, "batch * (k + 1) * vocab <= 134217728"
    )
    with pytest.raises(ValueError, match="k in"):
        make_inputs(1, 300, 10)


def test_bench_repeats(capsys: pytest.CaptureFixture[str]) -> None:
    assert_refused(["bench", "--repeats", str(10**9)], capsys, "--repeats", "[1, 1000]")


@pytest.mark.parametrize("command", ["bench", "generate"])
def test_threads(command: str, capsys: pytest.CaptureFixture[str]) -> None:
    prompt = ["w1"] if command == "generate" else []
    assert_refused([command, *prompt, "--threads", str(10**6)], capsys, "--threads", "[1, 256]")


# --------------------------------------------------------------------------- testing harness


def test_make_family_table_bound() -> None:
    k = 64
    vocab = 255  # (64 + 1) * 255**2 > 2**22
    with pytest.raises(ValueError, match="vocab=255 with k=64"):
        make_family("random", k, vocab)
    with pytest.raises(TypeError, match="vocab must be an int"):
        make_family("random", 2, 8.0)  # type: ignore[arg-type]
    assert make_family("random", k, vocab - 1).target.shape == (k + 1, vocab - 1, vocab - 1)


def test_block_law_enumeration_bound() -> None:
    family = make_family("random", 10, 8)  # 8**10 draft sequences

    def never(*args: Any) -> torch.Tensor:
        raise AssertionError("the verifier ran before the refusal")

    with pytest.raises(ValueError, match="BLOCK_ENUMERATION_LIMIT"):
        exactness_report(never, family, rows=10, rule="block")


def test_exactness_report_rows_run_in_blocks() -> None:
    """Rows are drafted and verified a block at a time, whatever ``rows`` and ``batch_size``."""
    family = make_family("random", 4, 254)
    sizes: list[int] = []

    def recording(*args: torch.Tensor) -> torch.Tensor:
        sizes.append(args[0].shape[0])
        return RejectionSampler()(*args)

    rows = 20_000
    report = exactness_report(recording, family, rows=rows, batch_size=10**9)
    block = min(DRAW_BLOCK_ROWS, (1 << 23) // (4 * 254))
    assert sum(sizes) == rows and max(sizes) == block and len(sizes) == -(-rows // block)
    assert report.rows == rows and report.malformed_rows == 0
    with pytest.raises(ValueError, match="rows must be >= 0"):
        simulate(RejectionSampler(), family, rows=-1)
    with pytest.raises(TypeError, match="rows must be an int"):
        exactness_report(RejectionSampler(), family, rows=1e6)  # type: ignore[arg-type]
    with pytest.raises(ValueError, match="batch_size must be >= 1"):
        exactness_report(RejectionSampler(), family, rows=10, batch_size=0)


# --------------------------------------------------------------------------- generate


@pytest.fixture(scope="module")
def tiny_pair(tmp_path_factory: pytest.TempPathFactory) -> dict[str, Path]:
    """The tiny target and draft of :mod:`tests.test_cli_generate`, saved with a tokenizer."""
    pytest.importorskip("transformers")
    from tests.test_cli_generate import WORDS, _save_tokenizer, _tiny_llama

    torch.manual_seed(0)
    root = tmp_path_factory.mktemp("resources")
    dirs = {"target": root / "target", "draft": root / "draft"}
    for name, layers in (("target", 2), ("draft", 1)):
        _tiny_llama(layers).save_pretrained(dirs[name])
        _save_tokenizer(dirs[name], WORDS)
    return dirs


def _generate(tiny_pair: dict[str, Path], *extra: str, draft: bool = True) -> list[str]:
    models = ["--target", str(tiny_pair["target"])]
    models += ["--draft", str(tiny_pair["draft"])] if draft else ["--ngram"]
    return ["generate", "w1 w2 w3", *models, "--threads", "1", *extra]


@pytest.mark.slow
def test_generate_k(tiny_pair: dict[str, Path], capsys: pytest.CaptureFixture[str]) -> None:
    """``-k 1000`` once ran for minutes; now k is at most 64, refused before loading."""
    assert_refused(_generate(tiny_pair, "-k", "1000"), capsys, "argument -k", "[1, 64]")
    assert_within_memory(
        _generate(tiny_pair, "-k", "64", "--max-new-tokens", "8", "--temperature", "1")
    )


@pytest.mark.slow
def test_generate_max_new_tokens(
    tiny_pair: dict[str, Path], capsys: pytest.CaptureFixture[str]
) -> None:
    """At the bound, the tiny target's context (256 positions) ends the run first."""
    limit = generate.MAX_NEW_TOKENS
    args = _generate(tiny_pair, "--max-new-tokens", str(limit + 1), draft=False)
    assert_refused(args, capsys, "--max-new-tokens", f"[1, {limit}]")
    assert_within_memory(_generate(tiny_pair, "--max-new-tokens", str(limit), draft=False))


@pytest.mark.slow
def test_generate_batch_size(
    tiny_pair: dict[str, Path], capsys: pytest.CaptureFixture[str]
) -> None:
    assert_refused(_generate(tiny_pair, "--batch-size", str(10**6)), capsys, "[1, 1024]")
    assert_within_memory(
        _generate(
            tiny_pair, "--batch-size", "1024", "-k", "8", "--max-new-tokens", "2",
            "--temperature", "1", "--seed", "0",
        )
    )  # fmt: skip


def test_generate_prompt_length(
    tiny_pair: dict[str, Path], capsys: pytest.CaptureFixture[str]
) -> None:
    """A prompt longer than the target's context is refused once tokenized, in one line.

    (The lines before it describe the models loaded.)
    """
    args = _generate(tiny_pair)
    args[1] = " ".join(["w1"] * 100_000)
    assert main(args) == 1
    lines = capsys.readouterr().err.strip().splitlines()
    assert [line for line in lines if "error:" in line] == lines[-1:]
    assert "100000 tokens but the target's context is 256" in lines[-1]


def test_generate_api_bounds() -> None:
    pytest.importorskip("transformers")
    from tests.tiny_llama import make_pair

    target, draft = make_pair(max_position_embeddings=16)
    with pytest.raises(ValueError, match=r"k must be in \[1, 64\], got 65"):
        generate.speculative_generate(target, [[1, 2]], draft, k=65)
    with pytest.raises(ValueError, match=r"k must be below the target's context \(16"):
        generate.speculative_generate(target, [[1, 2]], draft, k=16)
    too_many = generate.MAX_NEW_TOKENS + 1
    with pytest.raises(ValueError, match=rf"max_new_tokens must be in \[1, {too_many - 1}\]"):
        generate.target_generate(target, [[1, 2]], max_new_tokens=too_many)
    with pytest.raises(ValueError, match="max_batch_size must be >= 1"):
        generate.target_generate(target, [[1, 2]], max_batch_size=0)
