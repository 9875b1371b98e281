"""Every script of ``benchmarks/`` runs to its end with tiny settings, offline.

Each script found by globbing ``benchmarks/*.py`` and ``benchmarks/*.sh`` runs as a
subprocess with the arguments of :data:`TINY` (one torch thread, ``HF_HUB_OFFLINE=1``; the
scripts that need models use the shipped default pair): it must exit with status 0 and print
its table (:attr:`Tiny.shows`), with no loading bars of transformers. A script whose GPU or
optional package is missing here must print one ``skipped: ...`` line and exit with 0; the
test then reports itself skipped with that line. A new file without an entry in
:data:`TINY` fails, and so does a helper module (:data:`HELPERS`) that no script imports.
Each run starts a Python process that imports torch (over 3 s on two cores): the runs are
marked slow (``make test`` runs them; ``make test-fast`` leaves them out).

In-process, cheaply: every option of every Python script has a help string and ``--help``
names the script; the skipped paths (no transformers, no triton, no CUDA device, no vLLM)
are taken with the package hidden.
"""

from __future__ import annotations

import argparse
import importlib
import os
import re
import subprocess
import sys
from pathlib import Path
from types import ModuleType
from typing import Any, NamedTuple

import pytest

ROOT = Path(__file__).resolve().parents[1]
BENCHMARKS = ROOT / "benchmarks"
SCRIPTS = sorted(path.name for pattern in ("*.py", "*.sh") for path in BENCHMARKS.glob(pattern))
TIMEOUT = 300
"""Seconds one tiny run may take (they take seconds; a hang fails instead of stalling)."""


class Tiny(NamedTuple):
    """How a script runs small: its command line (``{tmp}`` is a fresh directory,
    ``{python}`` this interpreter, ``{gguf}`` a tiny GGUF model, :func:`_tiny_gguf`), text its
    table always prints, and extra environment variables."""

    args: str
    shows: str
    env: tuple[tuple[str, str], ...] = ()


TINY = {
    "bench_forward.py": Tiny(
        "--batch-sizes 1 --widths 2 --context 4 --calls 1", "| draft | 1 | 2 |"
    ),
    "bench_generate.py": Tiny(
        "--threads 1 --rounds 1 --max-new-tokens 4 --prompts 1 --temperatures 0 --batch-sizes 1 "
        "--queue 1 --plot {tmp}/bench_generate.png --raw {tmp}/raw.jsonl",
        "| headline (batch 1) | ratio |",
    ),
    "bench_gguf.py": Tiny(
        "--gguf {gguf} --cache-dir {tmp} --rounds 1 --max-new-tokens 4 --prompts 2 --lookup 2",
        "| headline | ratio |",
    ),
    "bench_gumbel.py": Tiny(
        "--rounds 1 --prompts 1 --max-new-tokens 4 --threads 1", "| n-gram gumbel adaptive |"
    ),
    "bench_logits.py": Tiny("--shapes 1x1x64 --repeats 1 --threads 1", "| 64 |"),
    "bench_loop_verify.py": Tiny("--rounds 1 --calls 1 --threads 1 --shapes 2x2x64", "T=1/T=0"),
    "bench_sampler.py": Tiny("--shapes 1x1x64 --repeats 1 --threads 1", "64"),
    "bench_tree.py": Tiny(
        "--threads 1 --rounds 1 --max-new-tokens 8 --prompts 1 --batch-sizes 1",
        "| 1 | 1 | tree |",
    ),
    "compare_rules.py": Tiny("--families random --k 1 2 --rows 2 --vocab 8", "chain"),
    "compile_time.py": Tiny("sampler --backend eager", "equal to eager: True"),
    "filter_passes.py": Tiny("--vocab 300 --rows 2 --pivots 8", "| 8 | top-p 0.9 |"),
    "gpu_check.py": Tiny("--smoke --rows 400 --skip exactness", "0 failed check(s)"),
    "gpu_check.sh": Tiny(
        "{python}",
        "CPU interpreter tests: PASSED",
        (
            ("CPU_TESTS", "tests/test_kernels.py::test_empty_batches_and_no_drafts"),
            ("CUDA_VISIBLE_DEVICES", ""),
        ),
    ),
    "host_time.py": Tiny(
        "--batch 2 --k 2 --vocab 64 --calls 2 --rounds 1", "| chain_kernel_verify, probabilities |"
    ),
    "real_model.py": Tiny(
        "--gguf {gguf} --cache-dir {tmp} --rounds 1 --max-new-tokens 4", "self-draft sweep"
    ),
    "vllm_cold_start.py": Tiny("--rounds 1 --calls 2 --prompts 2 --max-tokens 4", "first call"),
    "vllm_e2e.py": Tiny(
        "--rounds 1 --methods ngram --concurrency 1 --temperatures 0 --requests 2 --max-tokens 8",
        "EQUAL",
    ),
}
"""The tiny settings of every script of ``benchmarks/``.

``real_model.py`` and ``bench_gguf.py`` run on a tiny GGUF model instead of the one they
download (``bench_gguf.py`` is skipped where llama.cpp's binding is not installed);
``gpu_check.sh`` runs one kernel test in its CPU part, its GPU part hidden."""

HELPERS = ("generate_contestants.py", "gpu_timings.py", "model_loading.py")
"""Modules of ``benchmarks/`` that scripts import; they run through those scripts."""

RUN = [name for name in SCRIPTS if name not in HELPERS]
PYTHON_SCRIPTS = [name for name in RUN if name.endswith(".py")]


def test_every_file_is_a_script_with_tiny_settings_or_an_imported_helper() -> None:
    assert set(TINY) | set(HELPERS) == set(SCRIPTS)
    texts = [(BENCHMARKS / name).read_text(encoding="utf-8") for name in TINY]
    for helper in HELPERS:
        stem = Path(helper).stem
        assert any(f"from {stem} import" in text for text in texts), helper


def _tiny_gguf(directory: Path) -> Path:
    """A random 2-layer Llama with the default tokenizer and a chat template, as a GGUF file
    (the test is skipped where writing one needs a package that is missing)."""
    files = pytest.importorskip("tests.gguf_files")
    path = directory / "tiny.gguf"
    return Path(files.write_gguf(path, files.tiny_llama(), files.default_tokenizer_dir()))


def _command(name: str, tiny: Tiny, tmp: Path) -> list[str]:
    places = {"tmp": tmp, "python": sys.executable}
    if "{gguf}" in tiny.args:
        places["gguf"] = _tiny_gguf(tmp)
    args = [arg.format(**places) for arg in tiny.args.split()]
    runner = ["bash"] if name.endswith(".sh") else [sys.executable]
    return [*runner, str(BENCHMARKS / name), *args]


@pytest.mark.slow
@pytest.mark.parametrize("name", RUN)
def test_the_script_runs_with_tiny_settings(name: str, tmp_path: Path) -> None:
    assert name in TINY, f"add the tiny settings of benchmarks/{name} to TINY"
    tiny = TINY[name]
    env = {**os.environ, "HF_HUB_OFFLINE": "1", "OMP_NUM_THREADS": "1", **dict(tiny.env)}
    done = subprocess.run(
        _command(name, tiny, tmp_path),
        cwd=ROOT,
        env=env,
        capture_output=True,
        text=True,
        timeout=TIMEOUT,
        check=False,
    )
    output = f"stdout:\n{done.stdout[-4000:]}\nstderr:\n{done.stderr[-4000:]}"
    assert done.returncode == 0, output
    assert "Loading weights" not in done.stdout + done.stderr, output
    lines = done.stdout.strip().splitlines()
    if lines and lines[0].startswith("skipped: "):
        assert len(lines) == 1, output
        pytest.skip(lines[0])
    assert tiny.shows in done.stdout, output


def _script(name: str, monkeypatch: pytest.MonkeyPatch, *argv: str) -> ModuleType:
    """The script's module, imported here, with ``sys.argv`` as its command line gives it."""
    monkeypatch.syspath_prepend(str(BENCHMARKS))
    monkeypatch.setattr(sys, "argv", [str(BENCHMARKS / name), *argv])
    return importlib.import_module(Path(name).stem)


def _hide(package: str, monkeypatch: pytest.MonkeyPatch) -> None:
    """Make ``package`` and its modules fail to import, as where it is not installed."""
    for module in [package, *(m for m in sys.modules if m.startswith(f"{package}."))]:
        monkeypatch.setitem(sys.modules, module, None)


@pytest.mark.parametrize("name", PYTHON_SCRIPTS)
def test_every_option_has_help_and_help_names_the_script(
    name: str, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    module = _script(name, monkeypatch, "--help")
    actions: list[argparse.Action] = []
    add_argument = argparse._ActionsContainer.add_argument

    def recorded(self: Any, *args: Any, **kwargs: Any) -> argparse.Action:
        action = add_argument(self, *args, **kwargs)
        actions.append(action)
        return action

    monkeypatch.setattr(argparse._ActionsContainer, "add_argument", recorded)
    with pytest.raises(SystemExit) as exit_:
        module.main()
    assert exit_.value.code == 0
    assert capsys.readouterr().out.startswith(f"usage: {name} ")
    assert [a.option_strings or a.dest for a in actions if not a.help] == []


@pytest.mark.parametrize("name", ["bench_forward.py", "bench_generate.py", "bench_tree.py"])
def test_model_scripts_skip_without_transformers(
    name: str, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    module = _script(name, monkeypatch)
    _hide("transformers", monkeypatch)
    assert module.main([]) == 0
    assert capsys.readouterr().out == (
        f"skipped: {name}: the models need transformers: pip install 'specsample[hf]'\n"
    )


def test_real_model_skips_without_its_packages_or_offline_without_the_file(
    monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str], tmp_path: Path
) -> None:
    module = _script("real_model.py", monkeypatch)
    monkeypatch.setenv("HF_HUB_OFFLINE", "1")
    assert module.main(["--cache-dir", str(tmp_path)]) == 0
    out = capsys.readouterr().out
    assert out.startswith("skipped: real_model.py: ") and out.count("\n") == 1
    assert "HF_HUB_OFFLINE" in out or "pip install" in out
    _hide("transformers", monkeypatch)
    assert module.main(["--cache-dir", str(tmp_path)]) == 0
    assert "needs transformers" in capsys.readouterr().out


@pytest.mark.parametrize(
    ("hidden", "reason"),
    [("triton", "triton is not installed"), ("cuda", "no CUDA device is visible")],
)
def test_gpu_check_skips_without_triton_or_a_gpu(
    hidden: str,
    reason: str,
    monkeypatch: pytest.MonkeyPatch,
    capsys: pytest.CaptureFixture[str],
) -> None:
    module = _script("gpu_check.py", monkeypatch)
    if hidden == "triton":
        _hide("triton", monkeypatch)
    else:
        pytest.importorskip("triton")
        monkeypatch.setattr(module.torch.cuda, "is_available", lambda: False)
    assert module.main([]) == 0
    out = capsys.readouterr().out
    assert out.startswith(f"skipped: gpu_check.py: {reason}") and out.count("\n") == 1


def test_vllm_e2e_skips_without_vllm(
    monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    module = _script("vllm_e2e.py", monkeypatch)
    _hide("vllm", monkeypatch)
    assert module.main([]) == 0
    out = capsys.readouterr().out
    assert out.startswith("skipped: vllm_e2e.py: vLLM cannot be imported") and out.count("\n") == 1


def test_bench_gguf_skips_without_llama_cpp(
    monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str], tmp_path: Path
) -> None:
    module = _script("bench_gguf.py", monkeypatch)
    _hide("llama_cpp", monkeypatch)
    assert module.main(["--cache-dir", str(tmp_path)]) == 0
    out = capsys.readouterr().out
    assert out.startswith("skipped: bench_gguf.py: llama_cpp is not importable: pip install")
    assert out.count("\n") == 1


def test_bench_gguf_reports_where_greedy_outputs_first_differ(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    module = _script("bench_gguf.py", monkeypatch)
    assert module.first_difference([1, 2, 3], [1, 2, 3]) is None
    assert module.first_difference([1, 2, 3], [1, 5, 3]) == 1
    assert module.first_difference([1, 2], [1, 2, 3]) == 2
    line = module.compare("a vs b", [[1, 2], [3, 4], [5, 6]], [[1, 2], [3, 0], [0, 6]])
    assert line == "a vs b: identical on 1/3 prompts; first differing position elsewhere: 1, 0"


def test_gpu_check_sh_runs_test_files_that_exist() -> None:
    """The default CPU part of ``gpu_check.sh`` names kernel test modules of this checkout."""
    text = (BENCHMARKS / "gpu_check.sh").read_text()
    found = re.search(r"\$\{CPU_TESTS:-([^}]*)\}", text)
    assert found, "no default CPU_TESTS in gpu_check.sh"
    files = found.group(1).split()
    assert files and all((ROOT / name).is_file() for name in files), files
