"""``specsample generate --input prompts.jsonl --output out.jsonl``: files, resume, errors.

Covers :mod:`specsample.cli.jsonl` (the file formats) and the file mode of
:mod:`specsample.cli.generate`.

End to end with the shipped default pair (one thread, at most 8 new tokens): a 100-prompt
file with per-prompt parameters round-trips, its greedy lines equal target-only greedy
decoding, and an interrupted run resumes with only the missing prompts. The models run in
float64 there, so that no near-tie between two logits can flip an argmax between batch
shapes. Every kind of bad input line is refused with its line number before any model loads
and anything is written, every bad line of a file in one error, and conflicting arguments
are refused before anything is read. How a resumed run matches the output to an edited
input: ``tests/test_cli_resume.py``.
"""

from __future__ import annotations

import argparse
import json
from pathlib import Path
from typing import Any

import pytest

from specsample import adapter, cli
from specsample.cli import generate, jsonl
from specsample.cli.generate_args import FILE_BATCH_SIZE, add_arguments, batch_size
from specsample.generate import MAX_NEW_TOKENS, target_generate

SNIPPETS = (
    "def parse(text):",
    "class Node:\n    def __init__(self, value):",
    "    for",
    "import os\n\n",
    "return",
    "# compute the sum\n",
)


@pytest.fixture(scope="module")
def target_dir() -> Path:
    pytest.importorskip("transformers")
    pair = adapter.default_pair()
    if pair is None:
        pytest.fail("the default model pair is not installed")
    return pair[0]


@pytest.fixture
def float64(monkeypatch: pytest.MonkeyPatch, target_dir: Path) -> None:
    """Make the command load its models in float64."""
    load = adapter.load_model
    monkeypatch.setattr(
        adapter,
        "load_model",
        lambda path, role="target", **options: load(path, role=role, **options).double(),
    )


class _Calls:
    """Records what the command passes to ``speculative_generate``, then runs it."""

    def __init__(self) -> None:
        self.calls: list[tuple[int, dict[str, Any]]] = []
        self.real = generate.speculative_generate

    def __call__(self, target: Any, prompts: Any, drafter: Any, **kwargs: Any) -> Any:
        self.calls.append((len(prompts), kwargs))
        return self.real(target, prompts, drafter, **kwargs)


@pytest.fixture
def calls(monkeypatch: pytest.MonkeyPatch) -> _Calls:
    recorder = _Calls()
    monkeypatch.setattr(generate, "speculative_generate", recorder)
    return recorder


@pytest.fixture
def no_models(monkeypatch: pytest.MonkeyPatch) -> None:
    """Make loading a model fail the test."""

    def load_models(*args: Any) -> None:
        pytest.fail("a model was loaded")

    monkeypatch.setattr(generate, "load_models", load_models)


def _args(*argv: str) -> argparse.Namespace:
    parser = argparse.ArgumentParser()
    add_arguments(parser)
    return parser.parse_args(list(argv))


def _write(path: Path, records: list[dict[str, Any] | str]) -> None:
    """One line per record: a dict as JSON, a string as it is."""
    lines = [r if isinstance(r, str) else json.dumps(r) for r in records]
    path.write_text("".join(line + "\n" for line in lines), encoding="utf-8")


def _read(path: Path) -> list[dict[str, Any]]:
    return [json.loads(line) for line in path.read_text(encoding="utf-8").splitlines()]


def _hundred() -> list[dict[str, Any] | str]:
    """100 prompts (and a blank line) with per-prompt lengths and sampling parameters."""
    records: list[dict[str, Any] | str] = []
    for i in range(100):
        record: dict[str, Any] = {"prompt": SNIPPETS[i % len(SNIPPETS)] + f" x{i}"}
        if i % 3:
            record["id"] = f"p{i}"
        if i % 8:
            record["max_new_tokens"] = i % 8
        if i % 2:
            record["temperature"] = 0.9
            record.update(({"top_k": 40}, {"top_p": 0.9}, {"min_p": 0.05}, {})[i // 2 % 4])
            if i % 5 == 0:
                record["seed"] = 1000 + i
        records.append(record)
        if i == 49:
            records.append("")
    return records


@pytest.mark.slow
def test_hundred_prompts_round_trip(
    tmp_path: Path,
    float64: None,
    calls: _Calls,
    target_dir: Path,
    capsys: pytest.CaptureFixture[str],
) -> None:
    prompts, results = tmp_path / "prompts.jsonl", tmp_path / "out.jsonl"
    records = _hundred()
    _write(prompts, records)
    argv = ["--input", str(prompts), "--output", str(results), "--max-new-tokens", "8"]
    assert generate.run(_args(*argv, "-k", "3", "--seed", "7")) == 0
    captured = capsys.readouterr()
    assert "wrote 100 results" in captured.out and "tokens generated" in captured.out
    assert "100/100" in captured.err
    [(count, kwargs)] = calls.calls
    assert count == 100 and kwargs["max_batch_size"] == 8 and kwargs["adaptive"] is True

    given = [(line, r) for line, r in enumerate(records, 1) if isinstance(r, dict)]
    expected = {r.get("id", line): (line, r) for line, r in given}
    out = {record["id"]: record for record in _read(results)}
    assert len(_read(results)) == 100 and set(out) == set(expected)
    for identifier, (line, record) in expected.items():
        result = out[identifier]
        limit = record.get("max_new_tokens", 8)
        assert result["line"] == line and result["prompt"] == record["prompt"]
        assert 1 <= result["completion_tokens"] <= limit
        assert result["finish_reason"] in ("eos", "length")
        if result["finish_reason"] == "length":
            assert result["completion_tokens"] == limit

    greedy = [(line, r) for line, r in given if "temperature" not in r]
    tokenizer = adapter.load_tokenizer(target_dir)
    target = adapter.load_model(target_dir).double()
    reference = target_generate(
        target,
        [tokenizer.encode(r["prompt"]) for _, r in greedy],
        max_new_tokens=[r.get("max_new_tokens", 8) for _, r in greedy],
        eos_token_id=tokenizer.eos_token_id,
    )
    for (line, record), ids in zip(greedy, reference.sequences, strict=True):
        result = out[record.get("id", line)]
        assert result["completion"] == tokenizer.decode(ids, skip_special_tokens=True)
        assert result["completion_tokens"] == len(ids)


def test_resume_generates_only_the_missing_prompts(
    tmp_path: Path, float64: None, calls: _Calls, capsys: pytest.CaptureFixture[str]
) -> None:
    """Every prompt is greedy or seeded, so a resumed run writes the very same lines."""
    prompts, results = tmp_path / "prompts.jsonl", tmp_path / "out.jsonl"
    records: list[dict[str, Any] | str] = [
        {"id": f"q{i}", "prompt": SNIPPETS[i % len(SNIPPETS)], "temperature": 1.0 * (i % 2)}
        for i in range(12)
    ]
    _write(prompts, records)
    argv = ["--input", str(prompts), "--output", str(results), "--max-new-tokens", "6"]
    args = _args(*argv, "--seed", "3", "--batch-size", "4", "--fixed-k")
    assert generate.run(args) == 0
    assert calls.calls[0][0] == 12 and calls.calls[0][1]["adaptive"] is False
    assert calls.calls[0][1]["max_batch_size"] == 4
    full = results.read_text(encoding="utf-8").splitlines(keepends=True)

    # interrupted: a line lost, and the last one cut short by the kill
    kept = full[:3] + full[4:7]
    interrupted = "".join(kept) + full[7][: len(full[7]) // 2]
    results.write_text(interrupted, encoding="utf-8")
    capsys.readouterr()
    assert generate.run(args) == 0
    captured = capsys.readouterr()
    assert "skipping 6 of 12 prompts already done" in captured.err
    assert "line 7 was cut short" in captured.err
    assert calls.calls[1][0] == 6 and "wrote 6 results" in captured.out
    resumed = results.read_text(encoding="utf-8")
    assert resumed.startswith("".join(kept))
    assert sorted(resumed.splitlines(keepends=True)) == sorted(full)

    before = results.read_bytes()
    assert generate.run(args) == 0
    assert "already in" in capsys.readouterr().out
    assert len(calls.calls) == 2 and results.read_bytes() == before


BAD_LINES = [
    ('{"prompt": "x",', "invalid JSON"),
    ('["x"]', "expected a JSON object"),
    ('"x"', "expected a JSON object"),
    ('{"id": 5}', "missing field 'prompt'"),
    ('{"prompt": "   "}', "prompt must be a non-empty string"),
    ('{"prompt": 3}', "prompt must be a non-empty string"),
    ('{"prompt": "x", "temp": 1}', "unknown field 'temp'"),
    ('{"prompt": "x", "id": 1.5}', "id must be a string or an int"),
    ('{"prompt": "x", "id": true}', "id must be a string or an int"),
    ('{"prompt": "x", "id": null}', "id must be a string or an int"),
    ('{"prompt": "x", "max_new_tokens": 0}', "max_new_tokens must be"),
    ('{"prompt": "x", "max_new_tokens": "8"}', "max_new_tokens must be"),
    ('{"prompt": "x", "max_new_tokens": 4.0}', "max_new_tokens must be"),
    (f'{{"prompt": "x", "max_new_tokens": {MAX_NEW_TOKENS + 1}}}', "max_new_tokens must be"),
    ('{"prompt": "x", "temperature": -0.5}', "temperature must be"),
    ('{"prompt": "x", "temperature": "hot"}', "temperature must be"),
    ('{"prompt": "x", "temperature": true}', "temperature must be"),
    ('{"prompt": "x", "temperature": NaN}', "temperature must be"),
    ('{"prompt": "x", "top_k": -1}', "top_k must be"),
    ('{"prompt": "x", "top_k": 1.5}', "top_k must be"),
    ('{"prompt": "x", "top_p": 0}', "top_p must be"),
    ('{"prompt": "x", "top_p": 1.5}', "top_p must be"),
    ('{"prompt": "x", "min_p": -0.1}', "min_p must be"),
    ('{"prompt": "x", "min_p": 2}', "min_p must be"),
    ('{"prompt": "x", "seed": -1}', "seed must be"),
    ('{"prompt": "x", "seed": 18446744073709551616}', "seed must be"),
    ('{"prompt": "x", "seed": 1.0}', "seed must be"),
    ('{"prompt": "x", "seed": true}', "seed must be"),
    ('{"prompt": "x", "prompt": "y"}', "duplicate key 'prompt'"),
    ('{"prompt": "x", "seed": 1, "seed": 2}', "duplicate key 'seed'"),
    ('{"prompt": "x \\ud800"}', "'prompt' holds a lone surrogate '\\ud800' at character 3"),
    ('{"prompt": "x", "id": "\\udfff"}', "'id' holds a lone surrogate"),
    ('{"id": "a", "prompt": "x"}', "id 'a' repeats the id of line 1"),
    ('{"prompt": "x"}', "id 3 repeats the id of line 2"),
]


@pytest.mark.parametrize(("line", "message"), BAD_LINES)
def test_bad_line_is_refused_before_anything_is_written(
    tmp_path: Path, calls: _Calls, no_models: None, line: str, message: str
) -> None:
    prompts, results = tmp_path / "prompts.jsonl", tmp_path / "out.jsonl"
    _write(prompts, ['{"id": "a", "prompt": "x"}', '{"id": 3, "prompt": "y"}', line, ""])
    existing = b'{"id": "z", "completion": "done"}\n{"id": "w", "compl'
    results.write_bytes(existing)
    args = _args("--input", str(prompts), "--output", str(results))
    with pytest.raises(ValueError, match="^" + str(prompts) + ":3: ") as error:
        generate.run(args)
    assert message in str(error.value)
    assert results.read_bytes() == existing and not calls.calls


DEFAULTS = dict(max_new_tokens=8, temperature=0.0, top_k=0, top_p=1.0, min_p=0.0, seed=None)
"""The command-line defaults of the sampling fields, unseeded."""


def test_bad_utf8_and_late_bad_line(tmp_path: Path) -> None:
    """The line number is the file's, blank lines counted; a bad line anywhere is found."""
    prompts = tmp_path / "prompts.jsonl"
    prompts.write_bytes(b'{"prompt": "x"}\n\n{"prompt": "\xff"}\n')
    with pytest.raises(ValueError, match=f"^{prompts}:3: not valid UTF-8"):
        jsonl.read_requests(prompts, DEFAULTS)
    _write(prompts, [{"prompt": "x"}] * 99 + ["", '{"prompt": "y", "top_p": -1}'])
    with pytest.raises(ValueError, match=f"^{prompts}:101: top_p must be"):
        jsonl.read_requests(prompts, DEFAULTS)
    _write(prompts, ["", "  "])
    with pytest.raises(ValueError, match="holds no prompts"):
        jsonl.read_requests(prompts, DEFAULTS)


def test_defaults_and_seeds(tmp_path: Path) -> None:
    """Missing fields take the defaults; the i-th prompt without a seed gets SEED + i."""
    prompts = tmp_path / "prompts.jsonl"
    _write(prompts, [{"prompt": "a"}, "", {"prompt": "b", "seed": 1, "top_k": 2}, {"prompt": "c"}])
    defaults = dict(max_new_tokens=5, temperature=0.5, top_k=0, top_p=0.9, min_p=0.1, seed=10)
    requests = jsonl.read_requests(prompts, defaults)
    assert [(r.id, r.line, r.seed, r.top_k) for r in requests] == [
        (1, 1, 10, 0),
        (3, 3, 1, 2),
        (4, 4, 12, 0),
    ]
    assert {(r.max_new_tokens, r.temperature, r.top_p, r.min_p) for r in requests} == {
        (5, 0.5, 0.9, 0.1)
    }
    unseeded = jsonl.read_requests(prompts, {**defaults, "seed": None})
    assert [r.seed for r in unseeded] == [None, 1, None]


RECORD = (
    '"prompt": "x", "completion": "y", "max_new_tokens": 128, "temperature": 0.0, "top_k": 0, '
    '"top_p": 1.0, "min_p": 0.0, "seed": null}'
)
"""A result record of prompt ``x`` with the default parameters, after ``{"id": ..., ``."""


@pytest.mark.parametrize(
    "content",
    [
        f'{{"id": 1, {RECORD}\n{{"id": 2\n{{"id": 3, {RECORD}\n',
        f'{{"id": 1, {RECORD}\n[2]\n{{"id": 3',
        f'{{"id": 1.5, {RECORD}\n{{}}\n',
        f'{{"id": 1, "prompt": "x"}}\n{{"id": 2, {RECORD}\n',
        f'{{"id": 1, {RECORD[:-1]}, "seed": 5}}\n{{"id": 2, {RECORD}\n',
    ],
)
def test_malformed_result_line_is_refused(
    tmp_path: Path, calls: _Calls, no_models: None, content: str
) -> None:
    prompts, results = tmp_path / "prompts.jsonl", tmp_path / "out.jsonl"
    _write(prompts, [{"prompt": "x"}])
    results.write_text(content)
    with pytest.raises(ValueError, match=f"^{results}:[12]: not a result record"):
        generate.run(_args("--input", str(prompts), "--output", str(results)))
    assert results.read_text() == content and not calls.calls


def test_every_bad_line_is_reported_at_once(
    tmp_path: Path, capsys: pytest.CaptureFixture[str], calls: _Calls, no_models: None
) -> None:
    prompts, results = tmp_path / "prompts.jsonl", tmp_path / "out.jsonl"
    bad = ['{"prompt": "x", "top_k": -1}', "{", '{"prompt": "x \\ud800"}']
    _write(prompts, [{"prompt": "a"}, bad[0], {"prompt": "b"}, bad[1], "", bad[2]])
    argv = ["generate", "--input", str(prompts), "--output", str(results)]
    assert cli.main(argv) == 1
    lines = capsys.readouterr().err.splitlines()
    assert lines[0].startswith(f"specsample generate: error: {prompts}:2: top_k must be")
    assert lines[1].startswith(f"{prompts}:4: invalid JSON")
    assert lines[2].startswith(f"{prompts}:6: 'prompt' holds a lone surrogate")
    assert len(lines) == 3 and not results.exists() and not calls.calls

    _write(prompts, ["{"] * (jsonl.MAX_REPORTED + 5))
    with pytest.raises(ValueError) as error:
        jsonl.read_requests(prompts, DEFAULTS)
    lines = str(error.value).splitlines()
    assert len(lines) == jsonl.MAX_REPORTED + 1 and lines[-1] == "... and 5 more bad lines"
    assert lines[-2].startswith(f"{prompts}:{jsonl.MAX_REPORTED}: invalid JSON")


def test_seed_null_is_unseeded_and_surrogate_pairs_are_text(tmp_path: Path) -> None:
    prompts = tmp_path / "prompts.jsonl"
    records = [{"prompt": "a"}, {"prompt": "b", "seed": None}, {"prompt": "c \ud83d\ude00"}]
    _write(prompts, records)
    requests = jsonl.read_requests(prompts, {**DEFAULTS, "seed": 10})
    assert [r.seed for r in requests] == [10, None, 12]
    assert requests[2].prompt == "c \U0001f600"


def test_prompt_too_long_names_its_line(tmp_path: Path, target_dir: Path, calls: _Calls) -> None:
    prompts, results = tmp_path / "prompts.jsonl", tmp_path / "out.jsonl"
    _write(prompts, [{"prompt": "x"}, {"prompt": "def f(): pass\n" * 400}])
    with pytest.raises(ValueError, match=f"^{prompts}:2: prompt has .* context is 1024"):
        generate.run(_args("--input", str(prompts), "--output", str(results)))
    assert not results.exists() and not calls.calls


@pytest.mark.parametrize(
    ("argv", "message", "status"),
    [
        ([], "pass a prompt, or --input", 2),
        (["x", "--input", "{prompts}", "--output", "{results}"], "not both", 2),
        (["x", "--output", "{results}"], "--output needs --input", 2),
        (["--input", "{prompts}"], "--input needs --output", 2),
        (["--input", "{prompts}", "--output", "{results}", "--compare"], "not supported", 2),
        (["--input", "{prompts}", "--output", "{prompts}"], "another file than --input", 1),
    ],
)
def test_argument_conflicts(
    tmp_path: Path,
    capsys: pytest.CaptureFixture[str],
    calls: _Calls,
    argv: list[str],
    message: str,
    status: int,
) -> None:
    """Options that conflict are usage errors (status 2); the paths are checked as the files
    are read (status 1)."""
    prompts, results = tmp_path / "prompts.jsonl", tmp_path / "out.jsonl"
    _write(prompts, [{"prompt": "x"}])
    filled = [a.format(prompts=prompts, results=results) for a in argv]
    with pytest.raises(ValueError, match=message):
        generate.run(_args(*filled))
    assert cli.main(["generate", *filled]) == status
    error = capsys.readouterr().err
    assert error.startswith("specsample generate: error: ") and message in error
    assert not results.exists() and prompts.read_text() == '{"prompt": "x"}\n'
    assert not calls.calls


def test_batch_size_defaults_and_adaptive_flag(calls: _Calls, target_dir: Path) -> None:
    assert batch_size(_args("x")) == 1
    assert batch_size(_args("--input", "p", "--output", "o")) == FILE_BATCH_SIZE
    assert batch_size(_args("--input", "p", "--output", "o", "--batch-size", "3")) == 3
    assert generate.run(_args("def f():", "--max-new-tokens", "2", "--fixed-k")) == 0
    assert generate.run(_args("def f():", "--max-new-tokens", "2")) == 0
    assert [kwargs["adaptive"] for _, kwargs in calls.calls] == [False, True]
