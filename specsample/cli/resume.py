"""Resuming ``specsample generate --input ... --output ...``: what is left to generate.

Before anything is loaded, :func:`pending` checks both paths (:func:`check_paths`), reads
and validates every input line (:func:`specsample.cli.jsonl.read_requests`) and every
result already in the output file (:func:`read_results`), and matches them
(:func:`remaining`):

* a stored result belongs to the input line with the same id: the line's ``"id"``, or else
  its line number;
* it counts as done only if it also repeats that line's prompt and every resolved sampling
  parameter (:data:`specsample.cli.jsonl.PARAMETERS`, ``"seed"`` included); otherwise the
  run is refused, every such result listed as ``OUTPUT:LINE`` with the ``INPUT:LINE`` it
  contradicts and what differs, since the output would otherwise hold a completion under
  the id of another prompt;
* a stored result whose id names no input line (its line was deleted) is kept as it is,
  and said so on stderr.

So lines with an explicit ``"id"`` may be inserted, deleted or moved between runs; lines
without one are known by their line number, so that only appending lines (or deleting the
last ones) keeps the results already written. With ``--seed``, inserting, deleting or
moving a line also changes the seed of the lines after it that have no ``"seed"`` of their
own (``--seed`` plus its index), which the check refuses as well. The model options
(models, ``-k``, ``--method``, ``--chat``, ...) are not recorded and not compared.

The output file is one result record per line (:class:`specsample.cli.jsonl.ResultWriter`).
A last line that an interrupted write cut short is dropped and its prompt generated again.
"""

from __future__ import annotations

import os
import sys
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any, NamedTuple

from specsample.cli.jsonl import (
    MAX_REPORTED,
    PARAMETERS,
    Request,
    parameter_error,
    parse_line,
    read_requests,
    refuse,
    valid_id,
)


class Stored(NamedTuple):
    """One result record of an output file: what it was generated for.

    Attributes
    ----------
    line : int
        1-based line number in the output file.
    id : str or int
        The id of the prompt.
    prompt : str
        The prompt text.
    parameters : tuple
        The values of :data:`specsample.cli.jsonl.PARAMETERS`, in that order.
    """

    line: int
    id: str | int
    prompt: str
    parameters: tuple[Any, ...]


class Results(NamedTuple):
    """What an existing output file already holds (see :func:`read_results`).

    Attributes
    ----------
    stored : tuple of Stored
        The result records, in file order.
    keep_bytes : int
        Length of the file once a cut-short last line is dropped.
    dropped_line : int or None
        Line number of the last line, when it was cut short and is dropped.
    """

    stored: tuple[Stored, ...]
    keep_bytes: int
    dropped_line: int | None


class _Unreadable(ValueError):
    """An output line that is no JSON object with an id: cut short, if it is the last."""


def _stored(line: int, raw: bytes) -> Stored:
    """The record of output line ``line``, or a ``ValueError`` saying what it lacks
    (:class:`_Unreadable` when it is not even a JSON object with an id)."""
    try:
        record = parse_line("", raw)
    except ValueError as exc:
        raise _Unreadable(str(exc)) from None
    if not isinstance(record, dict) or not valid_id(record.get("id")):
        raise _Unreadable('no JSON object with a string or int "id"')
    if not isinstance(record.get("prompt"), str):
        raise ValueError('no string "prompt"')
    missing = [name for name in PARAMETERS if name not in record]
    if missing:
        raise ValueError(f"no {', '.join(missing)}: a record names its sampling parameters")
    for name in PARAMETERS:
        error = parameter_error(name, record[name])
        if error is not None:
            raise ValueError(error)
    return Stored(line, record["id"], record["prompt"], tuple(record[n] for n in PARAMETERS))


def read_results(path: str | Path) -> Results:
    """The result records an output file already holds, for resuming an interrupted run.

    Every line must be a result record (blank lines are skipped): a JSON object with a
    string or int ``"id"``, a string ``"prompt"`` and every field of
    :data:`specsample.cli.jsonl.PARAMETERS` (valid values), except the last: a last line
    without its newline, or (the last non-blank line) that is not a JSON object with an id,
    was cut short by an interrupted write and is dropped (the file is truncated to
    ``keep_bytes`` before more results are appended). A missing file holds nothing.

    Parameters
    ----------
    path : str or Path
        The JSONL output file.

    Returns
    -------
    Results
        The records, the length to keep and the line dropped, if any.

    Raises
    ------
    ValueError
        Lines other than a cut-short last one that are not result records: every one is
        listed, each ``"{path}:{line}: not a result record (...)"``.
    OSError
        The file exists but cannot be read.

    Examples
    --------
    >>> import tempfile
    >>> record = ('{"id": 1, "prompt": "a", "max_new_tokens": 4, "temperature": 0, '
    ...           '"top_k": 0, "top_p": 1, "min_p": 0, "seed": null}\\n')
    >>> with tempfile.TemporaryDirectory() as folder:
    ...     path = Path(folder) / "out.jsonl"
    ...     _ = path.write_text(record + '{"id": 2, "compl')
    ...     results = read_results(path)
    >>> [(s.line, s.id, s.prompt) for s in results.stored], results.dropped_line
    ([(1, 1, 'a')], 2)
    """
    path = Path(path)
    if not path.exists():
        return Results((), 0, None)
    *complete, tail = path.read_bytes().split(b"\n")
    last = max((line for line, raw in enumerate(complete, 1) if raw.strip()), default=0)
    stored: list[Stored] = []
    errors: list[str] = []
    offset = 0
    for line, raw in enumerate(complete, 1):
        if raw.strip():
            try:
                stored.append(_stored(line, raw))
            except _Unreadable as exc:
                if line == last and not tail:
                    return Results(_checked(stored, errors), offset, line)
                errors.append(f"{path}:{line}: not a result record ({exc})")
            except ValueError as exc:
                errors.append(f"{path}:{line}: not a result record ({exc})")
        offset += len(raw) + 1
    return Results(_checked(stored, errors), offset, len(complete) + 1 if tail else None)


def _checked(stored: list[Stored], errors: list[str]) -> tuple[Stored, ...]:
    """``stored``, once :func:`refuse` found no ``errors``."""
    refuse(errors, hint="fix or remove these lines, or write to another --output")
    return tuple(stored)


def _show(value: object) -> str:
    """A stored or requested value as the messages give it (prompts cut at 40 characters)."""
    if value is None:
        return "null"
    if isinstance(value, str) and len(value) > 40:
        return repr(value[:40]) + "..."
    return repr(value)


def _differences(stored: Stored, request: Request) -> list[str]:
    """What differs between a stored result and the input line with its id."""
    pairs = [("prompt", stored.prompt, request.prompt)]
    pairs += [
        (name, value, getattr(request, name))
        for name, value in zip(PARAMETERS, stored.parameters, strict=True)
    ]
    return [
        f"{name} {_show(old)} stored, {_show(new)} in the input"
        for name, old, new in pairs
        if old != new
    ]


MISMATCH_HINT = (
    'a stored result belongs to the input line with its id (the line\'s "id", or else its '
    'line number), and a line without "seed" gets --seed plus its index: inserting, '
    'deleting or moving lines without an "id", or changing a prompt or parameter, breaks '
    "the match. Undo the change to the input, remove the results that no longer match, or "
    "write to another --output"
)
"""What follows the list of stored results that contradict the input."""


def remaining(
    requests: Sequence[Request], results: Results, source: str | Path, destination: str | Path
) -> tuple[list[Request], list[int]]:
    """The requests not done yet, refusing stored results that contradict the input.

    Parameters
    ----------
    requests : sequence of Request
        The input lines (:func:`specsample.cli.jsonl.read_requests`).
    results : Results
        What the output file holds (:func:`read_results`).
    source, destination : str or Path
        The input and output files, as the messages name them.

    Returns
    -------
    todo : list of Request
        The requests that no stored result with their id, prompt and parameters answers, in
        input order.
    stale : list of int
        The output lines whose id names no input line (kept as they are).

    Raises
    ------
    ValueError
        Stored results whose id names an input line with another prompt or parameters:
        every one listed, ``"{destination}:{line}: ... {source}:{line}: ..."``, naming what
        differs, then :data:`MISMATCH_HINT`.

    Examples
    --------
    >>> a = Request(1, 1, "def a():", 4, 0.0, 0, 1.0, 0.0, None)
    >>> b = a._replace(id=2, line=2, prompt="def b():")
    >>> stored = Stored(1, 1, "def a():", (4, 0.0, 0, 1.0, 0.0, None))
    >>> todo, stale = remaining([a, b], Results((stored,), 0, None), "in", "out")
    >>> [r.prompt for r in todo], stale
    (['def b():'], [])
    >>> moved = [b._replace(id=1, line=1), a._replace(id=2, line=2)]  # a line inserted
    >>> remaining(moved, Results((stored,), 0, None), "in", "out")  # doctest: +ELLIPSIS
    Traceback (most recent call last):
    ...
    ValueError: out:1: the result of id 1 does not match in:1: prompt 'def a():' stored, ...
    """
    by_id = {request.id: request for request in requests}
    done: set[str | int] = set()
    stale: list[int] = []
    errors: list[str] = []
    for stored in results.stored:
        request = by_id.get(stored.id)
        if request is None:
            stale.append(stored.line)
            continue
        differences = _differences(stored, request)
        if differences:
            errors.append(
                f"{destination}:{stored.line}: the result of id {stored.id!r} does not match "
                f"{source}:{request.line}: {'; '.join(differences)}"
            )
        else:
            done.add(stored.id)
    refuse(errors, hint=MISMATCH_HINT)
    return [request for request in requests if request.id not in done], stale


def check_paths(source: str | Path, destination: str | Path) -> None:
    """Refuse an ``--input`` or ``--output`` path that cannot serve, before anything is read.

    Raises
    ------
    ValueError
        ``--input`` missing or a directory; ``--output`` a directory, in a directory that
        does not exist, the ``--input`` file itself, or not writable. Each message names
        the option.
    """
    source, destination = Path(source), Path(destination)
    if source.is_dir():
        raise ValueError(f"--input {source} is a directory; name a JSONL file")
    if not source.exists():
        raise ValueError(f"--input {source}: no such file")
    if destination.is_dir():
        raise ValueError(
            f"--output {destination} is a directory; name a file (it is created if missing)"
        )
    folder = destination.parent
    if not folder.is_dir():
        raise ValueError(f"--output {destination}: there is no directory {folder}")
    if destination.exists() and destination.resolve() == source.resolve():
        raise ValueError("--output must be another file than --input")
    if not os.access(destination if destination.exists() else folder, os.W_OK):
        raise ValueError(f"--output {destination}: not writable")


def _lines(numbers: Sequence[int]) -> str:
    """``"line 3"``, ``"lines 3, 5"``, at most :data:`MAX_REPORTED` numbers then ``...``."""
    shown = ", ".join(map(str, numbers[:MAX_REPORTED]))
    more = ", ..." if len(numbers) > MAX_REPORTED else ""
    return f"line{'s' if len(numbers) > 1 else ''} {shown}{more}"


def pending(
    source: str, destination: str, defaults: Mapping[str, Any]
) -> tuple[list[Request], int]:
    """The input's requests not done yet, and the length of the output file to keep.

    Everything is checked here, before any model loads (see the module docstring); what is
    skipped, results kept that name no input line and a last output line cut short (to
    be dropped) are said on stderr, and that nothing is left on stdout.

    Parameters
    ----------
    source, destination : str
        ``--input`` and ``--output``.
    defaults : mapping
        The command-line value of every field of :data:`specsample.cli.jsonl.PARAMETERS`.

    Returns
    -------
    todo : list of Request
        The requests to generate, in input order.
    keep_bytes : int
        :attr:`Results.keep_bytes` of the output file.

    Raises
    ------
    ValueError
        What :func:`check_paths`, :func:`specsample.cli.jsonl.read_requests`,
        :func:`read_results` and :func:`remaining` refuse.
    """
    check_paths(source, destination)
    requests = read_requests(source, defaults)
    results = read_results(destination)
    todo, stale = remaining(requests, results, source, destination)
    if results.dropped_line is not None:
        print(
            f"{destination}: line {results.dropped_line} was cut short by an interrupted "
            "write; dropping it",
            file=sys.stderr,
        )
    if stale:
        print(
            f"{destination}: keeping {len(stale)} result{'s' if len(stale) > 1 else ''} whose "
            f"id names no line of {source} ({_lines(stale)})",
            file=sys.stderr,
        )
    if len(todo) < len(requests):
        print(
            f"{destination}: skipping {len(requests) - len(todo)} of {len(requests)} prompts "
            "already done",
            file=sys.stderr,
        )
    if not todo:
        print(f"all {len(requests)} prompts of {source} are already in {destination}")
    return todo, results.keep_bytes
