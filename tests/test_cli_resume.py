"""Resuming ``specsample generate --input ... --output ...`` after the input was edited.

Covers :mod:`specsample.cli.resume`: reading an output file back, matching its results to
the input (by id, then checking the prompt and every sampling parameter), and the checks of
the ``--input`` and ``--output`` paths, all before any model loads.

The edits between two runs (lines appended, inserted, deleted or moved, a prompt, a
parameter or ``--seed`` changed; with and without explicit ids) run the command's resume
path (:func:`specsample.cli.resume.pending`, then :class:`specsample.cli.jsonl.ResultWriter`)
with a stand-in for the models whose completion names the prompt and seed it answers: no
stored result may ever be counted for another prompt. The reported case (a line inserted
above the others) also runs end to end with the shipped default pair, two new tokens.
"""

from __future__ import annotations

import argparse
import json
import os
from pathlib import Path
from typing import Any

import pytest

from specsample import adapter, cli
from specsample.cli import generate, jsonl, resume
from specsample.cli.generate_args import add_arguments

DEFAULTS = dict(max_new_tokens=8, temperature=0.0, top_k=0, top_p=1.0, min_p=0.0, seed=None)
"""The command-line defaults of the sampling fields, unseeded."""


def _write(path: Path, records: list[dict[str, Any]]) -> None:
    path.write_text("".join(json.dumps(r) + "\n" for r in records), encoding="utf-8")


def _read(path: Path) -> list[dict[str, Any]]:
    return [json.loads(line) for line in path.read_text(encoding="utf-8").splitlines()]


def _record(identifier: str | int, prompt: str = "x") -> str:
    """One result line, as the writer writes it."""
    return json.dumps({"id": identifier, "prompt": prompt, "completion": "y", **DEFAULTS}) + "\n"


def test_read_results(tmp_path: Path) -> None:
    results = tmp_path / "out.jsonl"
    assert resume.read_results(results) == resume.Results((), 0, None)
    one, two, three = _record(1), _record("b"), _record(3)

    def found(content: str) -> tuple[list[str | int], int, int | None]:
        results.write_text(content)
        read = resume.read_results(results)
        return [s.id for s in read.stored], read.keep_bytes, read.dropped_line

    assert found(one + "\n" + two) == ([1, "b"], len(one + "\n" + two), None)
    assert found(one + '{"id": "b", "completion": "x\n') == ([1], len(one), 2)
    assert found(one + two + three + "\n") == ([1, "b", 3], len(one + two + three) + 1, None)
    assert found(one + two + '{"i') == ([1, "b"], len(one + two), 3)
    assert found(one + three[:-1]) == ([1], len(one), 2)
    [stored] = resume.read_results(results).stored
    assert stored == resume.Stored(1, 1, "x", tuple(DEFAULTS.values()))


def test_every_bad_result_line_is_reported(tmp_path: Path) -> None:
    results = tmp_path / "out.jsonl"
    lines = ['{"id": 1}\n', "[1]\n", _record(3), _record(4)[:-2] + ', "top_p": 0}\n', _record(5)]
    results.write_text("".join(lines))
    with pytest.raises(ValueError) as error:
        resume.read_results(results)
    assert str(error.value).splitlines() == [
        f'{results}:1: not a result record (no string "prompt")',
        f'{results}:2: not a result record (no JSON object with a string or int "id")',
        f"{results}:4: not a result record (duplicate key 'top_p')",
        "fix or remove these lines, or write to another --output",
    ]


def _run(source: Path, destination: Path, **defaults: Any) -> list[jsonl.Request] | str:
    """One run of the file mode with a stand-in for the models, whose completion names the
    prompt and seed it answers: the requests it generated, or the error that refused it."""
    try:
        todo, keep_bytes = resume.pending(str(source), str(destination), {**DEFAULTS, **defaults})
    except ValueError as exc:
        return str(exc)
    with jsonl.ResultWriter(destination, keep_bytes) as writer:
        for request in todo:
            writer.write(request, f"<{request.prompt}|{request.seed}>", [1], "length")
    return todo


BASE = [{"prompt": f"def {name}():"} for name in "abcd"]
"""The input of the first run; its last prompt is not done when the run is interrupted."""

NEW = {"prompt": "def NEW():"}


def _edit(edit: str, lines: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """``lines`` after ``edit`` (what comes before a comma)."""
    edit = edit.split(",")[0]
    if edit == "append":
        return [*lines, NEW]
    if edit == "insert":
        return [NEW, *lines]
    if edit == "delete first":
        return lines[1:]
    if edit == "delete last":
        return lines[:-1]
    if edit == "move":
        return [lines[2], lines[0], lines[1], lines[3]]
    if edit == "change prompt":
        return [{**lines[0], "prompt": "def z():"}, *lines[1:]]
    if edit == "change temperature":
        return [lines[0], {**lines[1], "temperature": 0.5}, *lines[2:]]
    return lines  # "change --seed": the input stays as it was


EDITS = {
    # edit: (--seed of the first run and of the second, resumed without ids, with ids)
    "append": ((None, None), True, True),
    "append, seeded": ((3, 3), True, True),
    "insert": ((None, None), False, True),
    "insert, seeded": ((3, 3), False, False),  # the seeds of the lines below move
    "delete first": ((None, None), False, True),
    "delete last": ((None, None), True, True),
    "move": ((None, None), False, True),
    "change prompt": ((None, None), False, False),
    "change temperature": ((None, None), False, False),
    "change --seed": ((3, 5), False, False),
}


@pytest.mark.parametrize("named", [False, True], ids=["line numbers", "ids"])
@pytest.mark.parametrize("edit", EDITS)
def test_edited_input_never_takes_another_prompts_result(
    tmp_path: Path, capsys: pytest.CaptureFixture[str], edit: str, named: bool
) -> None:
    """Between an interrupted run and its resumption the input is edited: the run resumes
    with every prompt answered once and by its own result, or is refused, naming both
    files' lines, with the output as it was."""
    source, destination = tmp_path / "in.jsonl", tmp_path / "out.jsonl"
    base = [{"id": f"n{i}", **r} if named else r for i, r in enumerate(BASE)]
    _write(source, base)
    (first, second), *resumed = EDITS[edit]
    assert len(_run(source, destination, seed=first)) == 4
    interrupted = "".join(destination.read_text().splitlines(keepends=True)[:3])
    destination.write_text(interrupted)

    _write(source, _edit(edit, base))
    outcome = _run(source, destination, seed=second)
    requests = jsonl.read_requests(source, {**DEFAULTS, "seed": second})
    if not resumed[named]:
        assert isinstance(outcome, str) and destination.read_text() == interrupted
        assert outcome.startswith(f"{destination}:")
        assert f" does not match {source}:" in outcome and "stored" in outcome
        return
    assert not isinstance(outcome, str)
    records = _read(destination)
    for request in requests:
        [answer] = [r for r in records if r["id"] == request.id]
        assert answer["prompt"] == request.prompt
        assert answer["completion"] == f"<{request.prompt}|{request.seed}>"
        assert all(answer[name] == getattr(request, name) for name in jsonl.PARAMETERS)
    done = {json.loads(line)["id"] for line in interrupted.splitlines()}
    assert {request.id for request in outcome} == {r.id for r in requests} - done
    if edit == "delete first":
        assert "keeping 1 result whose id names no line" in capsys.readouterr().err


def test_mismatch_names_every_line_and_what_differs(tmp_path: Path) -> None:
    source, destination = tmp_path / "in.jsonl", tmp_path / "out.jsonl"
    _write(source, BASE[:2])
    _run(source, destination)
    _write(source, [BASE[0], {**BASE[1], "top_k": 5, "seed": 9}])
    assert _run(source, destination) == (
        f"{destination}:2: the result of id 2 does not match {source}:2: top_k 0 stored, 5 in "
        f"the input; seed null stored, 9 in the input\n{resume.MISMATCH_HINT}"
    )
    _write(source, [{"prompt": "p" * 50}])
    assert _run(source, destination).startswith(
        f"{destination}:1: the result of id 1 does not match {source}:1: prompt 'def a():' "
        f"stored, '{'p' * 40}'... in the input\n"
    )


def _args(*argv: str) -> argparse.Namespace:
    parser = argparse.ArgumentParser()
    add_arguments(parser)
    return parser.parse_args(list(argv))


@pytest.fixture
def no_models(monkeypatch: pytest.MonkeyPatch) -> None:
    """Make loading a model fail the test."""

    def load_models(*args: Any) -> None:
        pytest.fail("a model was loaded")

    monkeypatch.setattr(generate, "load_models", load_models)


@pytest.mark.parametrize(
    ("input_name", "output_name", "message"),
    [
        ("in.jsonl", "folder", "--output {folder} is a directory; name a file"),
        ("in.jsonl", "missing/out.jsonl", "--output {missing}/out.jsonl: there is no directory"),
        ("folder", "out.jsonl", "--input {folder} is a directory; name a JSONL file"),
        ("none.jsonl", "out.jsonl", "--input {none}.jsonl: no such file"),
    ],
)
def test_paths_are_refused_before_any_model_loads(
    tmp_path: Path,
    capsys: pytest.CaptureFixture[str],
    no_models: None,
    input_name: str,
    output_name: str,
    message: str,
) -> None:
    (tmp_path / "folder").mkdir()
    _write(tmp_path / "in.jsonl", BASE)
    names = {name: tmp_path / name for name in ("folder", "missing", "none")}
    argv = ["--input", str(tmp_path / input_name), "--output", str(tmp_path / output_name)]
    assert cli.main(["generate", *argv]) == 1
    expected = "specsample generate: error: " + message.format(**names)
    assert capsys.readouterr().err.startswith(expected)
    assert sorted(p.name for p in tmp_path.iterdir()) == ["folder", "in.jsonl"]


@pytest.mark.skipif(os.geteuid() == 0, reason="root may write anywhere")
def test_unwritable_output_is_refused(tmp_path: Path) -> None:
    _write(tmp_path / "in.jsonl", BASE)
    tmp_path.chmod(0o500)
    try:
        with pytest.raises(ValueError, match=r"--output .*out\.jsonl: not writable"):
            resume.check_paths(tmp_path / "in.jsonl", tmp_path / "out.jsonl")
    finally:
        tmp_path.chmod(0o700)


def test_inserted_line_with_the_default_pair(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    """The reported case: a line inserted above the others moves their default ids. The
    resumed run is refused before any model loads; giving the lines their old ids (and the
    new one another) resumes it, answering the new prompt only."""
    pytest.importorskip("transformers")
    if adapter.default_pair() is None:
        pytest.fail("the default model pair is not installed")
    source, destination = tmp_path / "in.jsonl", tmp_path / "out.jsonl"
    a, b = {"prompt": "def a():"}, {"prompt": "def b():"}
    _write(source, [a, b])
    argv = ["--input", str(source), "--output", str(destination), "--max-new-tokens", "2"]
    assert generate.run(_args(*argv)) == 0
    first = destination.read_text()
    assert [(r["id"], r["prompt"], r["max_new_tokens"]) for r in _read(destination)] == [
        (1, "def a():", 2),
        (2, "def b():", 2),
    ]

    _write(source, [{"prompt": "def NEW():"}, a, b])
    load = generate.load_models
    monkeypatch.setattr(generate, "load_models", lambda *args: pytest.fail("models loaded"))
    with pytest.raises(ValueError) as error:
        generate.run(_args(*argv))
    lines = str(error.value).splitlines()
    assert lines[:2] == [
        f"{destination}:1: the result of id 1 does not match {source}:1: prompt 'def a():' "
        "stored, 'def NEW():' in the input",
        f"{destination}:2: the result of id 2 does not match {source}:2: prompt 'def b():' "
        "stored, 'def a():' in the input",
    ]
    assert destination.read_text() == first

    monkeypatch.setattr(generate, "load_models", load)
    _write(source, [{"id": "new", "prompt": "def NEW():"}, {"id": 1, **a}, {"id": 2, **b}])
    capsys.readouterr()
    assert generate.run(_args(*argv)) == 0
    assert "skipping 2 of 3 prompts already done" in capsys.readouterr().err
    records = _read(destination)
    assert destination.read_text().startswith(first)
    assert [(r["id"], r["prompt"]) for r in records] == [
        (1, "def a():"),
        (2, "def b():"),
        ("new", "def NEW():"),
    ]
