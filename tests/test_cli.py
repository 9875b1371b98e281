"""The ``specsample`` command line (:mod:`specsample.cli`): help, usage and runtime errors.

Covers :mod:`specsample.cli`, its shared argument helpers, :mod:`specsample.cli.args`, and
the checks every command makes before it runs: each bad option is a usage error (exit
status 2) on one line that names the command and the flag as it is typed, found before any
work (no model loads, no comparison runs).
"""

from __future__ import annotations

import re
import subprocess
import sys
from typing import Any

import pytest

import specsample
from specsample import adapter, cli
from specsample.cli import bench, compare, generate, main


def test_main_help_exits_zero(capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["--help"]) == 0
    out = capsys.readouterr().out
    assert "usage: specsample" in out and "demo" in out and "bench" in out
    assert main(["bench", "--help"]) == 0
    assert "--quick" in capsys.readouterr().out
    assert main(["generate", "--help"]) == 0
    described = " ".join(capsys.readouterr().out.split())
    assert "float32 only" not in described and "runs in float32" not in described
    assert "the linear layers' weights as --quantize says" in described
    assert "auto keeps the quantization of a .gguf file" in described


def test_version(capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["--version"]) == 0
    assert capsys.readouterr().out == f"specsample {specsample.__version__}\n"


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


@pytest.fixture
def nothing_runs(monkeypatch: pytest.MonkeyPatch) -> None:
    """Make running any command, or loading a model, fail the test."""

    def never(*args: Any, **kwargs: Any) -> None:
        pytest.fail("the command ran")

    for module in cli.COMMANDS.values():
        monkeypatch.setattr(module, "run", never)
    monkeypatch.setattr(generate, "load_models", never)


REFUSED = [
    (["generate", "x", "--top-p", "2"], "argument --top-p: expected a number in (0, 1], got 2.0"),
    (["generate", "x", "--top-p", "0"], "argument --top-p: expected a number in (0, 1]"),
    (["generate", "x", "--temperature", "-1"], "argument --temperature: expected a finite"),
    (["generate", "x", "--temperature", "nan"], "argument --temperature: expected a finite"),
    (["generate", "x", "--top-k", "-1"], "argument --top-k: expected an integer in [0,"),
    (["generate", "x", "--min-p", "1.5"], "argument --min-p: expected a number in [0, 1]"),
    (["generate", "x", "--plot", "chart.txt"], "argument --plot: expected a file name ending"),
    (["generate", "x", "--plot", "/no/such/dir/a.png"], "argument --plot: there is no directory"),
    (["generate", "   "], "the prompt is empty"),
    (["generate", "x", "--system", "hi"], "--system needs --chat"),
    (["generate", "x", "--ngram", "--draft", "d"], "pass --draft PATH or --ngram, not both"),
    (["generate", "x", "--target", "t"], "--target needs --draft PATH or --ngram"),
    (["generate", "x", "--ngram", "--method", "block"], "--method block needs the draft's"),
    (["generate", "x", "--tree", "6", "--fixed-k"], "--fixed-k does not apply with --tree"),
    (["generate", "x", "--tree", "6", "-k", "3"], "-k does not apply with --tree"),
    (["generate", "x", "--tree-drafting", "iid"], "--tree-drafting needs --tree NODES"),
    (
        ["generate", "x", "--tree", "6", "--tree-drafting", "deterministic", "--method", "mss"],
        "--method mss is biased with --tree-drafting deterministic: with it use --method onehot",
    ),
    (["generate", "x", "--tree", "6", "--tree-shape", "2,0"], "--tree-shape counts must be"),
    (["generate", "x", "--method", "blok"], "invalid choice: 'blok' (did you mean block?)"),
    (["compare", "--families", "nope"], "argument --families: invalid choice: 'nope'"),
    (["compare", "--seed", "-1"], "argument --seed: expected an integer in [0,"),
    (["compare", "--vocab", "837", "--k", "5"], "--vocab 837 with --k 5 needs toy tables"),
    (["compare", "--branching", "2", "--k", "10"], "--branching 2 with --k 10 makes trees of"),
    (["demo", "--vocab", "1000"], "--vocab 1000 with --k 4 needs toy tables"),
    (["bench", "--device", "meta"], "argument --device: expected cpu or cuda (cuda:N), got"),
    (["bench", "--quick", "--shapes", "2x2x8"], "pass --quick or --shapes, not both"),
]


@pytest.mark.parametrize(("argv", "fragment"), REFUSED)
def test_every_option_is_checked_before_the_command_runs(
    nothing_runs: None, capsys: pytest.CaptureFixture[str], argv: list[str], fragment: str
) -> None:
    """One line, naming the command and the flag in flag syntax (never ``name=value``)."""
    assert main(argv) == 2
    err = capsys.readouterr().err
    assert err.startswith(f"specsample {argv[0]}: error: ") and err.count("\n") == 1, err
    assert fragment in err and not re.search(r"[a-z_]=[\w'\"]", err), err


def test_misspellings_are_named_with_the_closest_match(
    nothing_runs: None, capsys: pytest.CaptureFixture[str]
) -> None:
    assert main(["generate", "x", "--temprature", "0.7"]) == 2
    assert capsys.readouterr().err.startswith(
        "specsample generate: error: unrecognized arguments: --temprature 0.7 (did you mean "
        "--temperature?)"
    )
    assert main(["generat", "x"]) == 2
    err = capsys.readouterr().err
    assert err.startswith("specsample: error: argument COMMAND: invalid choice: 'generat' (did")
    assert "(did you mean generate?)" in err
    assert main(["bench", "--sahpes=2x2x8"]) == 2
    assert "(did you mean --shapes?)" in capsys.readouterr().err


def test_plot_needs_matplotlib_before_the_work(
    nothing_runs: None, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    monkeypatch.setitem(sys.modules, "matplotlib", None)
    assert main(["compare", "--plot", "rules.png"]) == 2
    err = capsys.readouterr().err
    assert err.startswith("specsample compare: error: argument --plot: matplotlib is not")


def test_runtime_errors_are_one_clean_line(
    monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    def fails(*args: Any, **kwargs: Any) -> None:
        raise ValueError("the benchmark could not run")

    monkeypatch.setattr(bench, "run_benchmark", fails)
    assert main(["bench", "--shapes", "2x2x64"]) == 1
    err = capsys.readouterr().err
    assert err.strip() == "specsample bench: error: the benchmark could not run"


def _interrupt(*args: Any, **kwargs: Any) -> None:
    raise KeyboardInterrupt


def test_interrupt_exits_130_naming_the_command(
    monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    monkeypatch.setattr(compare, "compare_rules", _interrupt)
    assert main(["compare", "--k", "1"]) == 130
    assert capsys.readouterr().err == "specsample compare: interrupted\n"


MINIMAL_ARGV = {"generate": ["x"]}
"""Arguments a command needs to pass its checks (none for the others)."""


@pytest.mark.parametrize("command", sorted(cli.COMMANDS))
@pytest.mark.parametrize("stage", ["check", "run"])
def test_interrupt_at_any_stage_of_every_command_is_one_line(
    monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str], command: str, stage: str
) -> None:
    """Ctrl-C while the options are checked, or while the command runs (models loading
    included), exits 130 with one line on stderr and nothing else."""
    monkeypatch.setattr(cli.COMMANDS[command], stage, _interrupt)
    assert main([command, *MINIMAL_ARGV.get(command, [])]) == 130
    captured = capsys.readouterr()
    named = "specsample" if stage == "check" else f"specsample {command}"
    assert captured.err == f"{named}: interrupted\n" and captured.out == ""


SIGINT_WHILE_LOADING = """
import os, signal, sys, time
signal.signal(signal.SIGINT, signal.default_int_handler)
from specsample import adapter
from specsample.cli import main

def load_model(*args, **kwargs):
    os.kill(os.getpid(), signal.SIGINT)
    time.sleep(60)

adapter.load_model = load_model
sys.exit(main(["generate", "def parse(text):", "--max-new-tokens", "4"]))
"""
"""A ``specsample generate`` run that receives a real SIGINT as its target starts to load
(the handler is set first: a process started in the background may inherit SIGINT ignored)."""


@pytest.mark.slow
def test_sigint_while_models_load_is_one_line_and_status_130() -> None:
    if adapter.default_pair() is None:
        pytest.fail("the default model pair is not installed")
    done = subprocess.run(
        [sys.executable, "-c", SIGINT_WHILE_LOADING],
        capture_output=True,
        text=True,
        timeout=120,
        check=False,
    )
    assert done.returncode == 130, done.stderr
    assert done.stderr == "specsample generate: interrupted\n" and done.stdout == ""


def test_python_dash_m_specsample() -> None:
    done = subprocess.run(
        [sys.executable, "-m", "specsample", "--help"], capture_output=True, text=True, check=False
    )
    assert done.returncode == 0 and "usage: specsample" in done.stdout


def test_an_interrupt_a_library_turned_into_an_error_is_an_interrupt(
    monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    """transformers' lazy imports report a Ctrl-C as a RuntimeError raised while handling
    it: still one line and status 130."""

    def _import_interrupted(args: Any) -> int:
        try:
            raise KeyboardInterrupt
        except KeyboardInterrupt as interrupt:
            raise RuntimeError("Could not import module 'LlamaConfig'") from interrupt

    monkeypatch.setattr(cli.COMMANDS["bench"], "run", _import_interrupted)
    assert cli.main(["bench", "--quick"]) == 130
    assert capsys.readouterr().err == "specsample bench: interrupted\n"


def test_an_interrupt_while_the_command_line_imports_is_one_line(
    monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    """The ``specsample`` entry point imports the command line (and with it PyTorch) inside
    its guard: a Ctrl-C during those imports is one line and status 130."""
    import types

    from specsample.__main__ import entry

    importing = types.ModuleType("specsample.cli")

    def _interrupt(name: str) -> Any:
        raise KeyboardInterrupt

    importing.__getattr__ = _interrupt  # type: ignore[method-assign]
    monkeypatch.setitem(sys.modules, "specsample.cli", importing)
    assert entry(["--version"]) == 130
    assert capsys.readouterr().err == "specsample: interrupted\n"


def test_importing_the_package_does_not_import_torch() -> None:
    """``import specsample`` (what the entry point runs before its guard) is light: the
    public names load on first use."""
    code = "import sys, specsample; assert 'torch' not in sys.modules; specsample.verify"
    done = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True)
    assert done.returncode == 0, done.stderr
