"""Prompt files and result files of ``specsample generate --input ... --output ...``.

An input file holds one JSON object per line (blank lines are skipped)::

    {"id": "a", "prompt": "def f(x):", "max_new_tokens": 32, "temperature": 0.7, "seed": 1}

``"prompt"`` (a non-empty string) is required; ``"id"`` (a string or an int) defaults to the
1-based line number; the sampling fields (:data:`PARAMETERS`) default to the command-line
options. :func:`read_requests` validates every line before anything is generated and names
the file, the line and the field of the first bad one.

The output file gets one JSON object per finished prompt, appended and flushed as soon as the
prompt finishes (:class:`ResultWriter`)::

    {"id": "a", "line": 1, "prompt": "def f(x):", "completion": "...",
     "completion_tokens": 12, "finish_reason": "eos"}

so an interrupted run can be resumed: :func:`read_results` collects the ids already written,
and drops a last line that an interrupted write cut short.
"""

from __future__ import annotations

import json
import math
from collections.abc import Collection, Mapping, Sequence
from pathlib import Path
from types import TracebackType
from typing import Any, NamedTuple

from specsample.generate.inputs import MAX_NEW_TOKENS

PARAMETERS = ("max_new_tokens", "temperature", "top_k", "top_p", "min_p", "seed")
"""The per-prompt sampling fields of an input line; missing ones take the defaults."""

FIELDS = frozenset(("id", "prompt", *PARAMETERS))
"""Every field an input line may hold."""

_INT64_MAX = (1 << 63) - 1


class Request(NamedTuple):
    """One prompt of an input file, with its parameters resolved.

    Attributes
    ----------
    id : str or int
        The line's ``"id"``, or its line number.
    line : int
        1-based line number in the input file.
    prompt : str
        The prompt text.
    max_new_tokens : int
        Most tokens to generate.
    temperature, top_p, min_p : float
        Sampling parameters (temperature 0: greedy; top-p 1 and min-p 0: off).
    top_k : int
        Top-k filter (0: off).
    seed : int or None
        The prompt's seed (``None``: unseeded).
    """

    id: str | int
    line: int
    prompt: str
    max_new_tokens: int
    temperature: float
    top_k: int
    top_p: float
    min_p: float
    seed: int | None


class Resume(NamedTuple):
    """What an existing output file already holds (see :func:`read_results`).

    Attributes
    ----------
    done : frozenset of (str or int)
        Ids of the prompts already written.
    keep_bytes : int
        Length of the file once a cut-short last line is dropped.
    dropped_line : int or None
        Line number of the last line, when it was cut short and is dropped.
    """

    done: frozenset[str | int]
    keep_bytes: int
    dropped_line: int | None


def _is_int(value: object) -> bool:
    return isinstance(value, int) and not isinstance(value, bool)


def _is_number(value: object) -> bool:
    return isinstance(value, int | float) and not isinstance(value, bool)


_CHECKS: dict[str, tuple[str, Any]] = {
    "max_new_tokens": (
        f"an int in [1, {MAX_NEW_TOKENS}]",
        lambda v: _is_int(v) and 1 <= v <= MAX_NEW_TOKENS,
    ),
    "temperature": (
        "a finite number >= 0 (0: greedy)",
        lambda v: _is_number(v) and math.isfinite(v) and v >= 0,
    ),
    "top_k": ("an int in [0, 2**63) (0: off)", lambda v: _is_int(v) and 0 <= v <= _INT64_MAX),
    "top_p": ("a number in (0, 1] (1: off)", lambda v: _is_number(v) and 0 < v <= 1),
    "min_p": ("a number in [0, 1] (0: off)", lambda v: _is_number(v) and 0 <= v <= 1),
    "seed": ("an int in [0, 2**64)", lambda v: _is_int(v) and 0 <= v < 1 << 64),
}
"""What each sampling field accepts (as the error says it), and the test of it."""


def _parse_line(where: str, raw: bytes) -> object:
    """The JSON value of one line, or a ``ValueError`` prefixed by ``where``."""
    try:
        text = raw.decode("utf-8")
    except UnicodeDecodeError as exc:
        raise ValueError(f"{where}not valid UTF-8 (byte {exc.start + 1})") from None
    try:
        return json.loads(text)
    except json.JSONDecodeError as exc:
        raise ValueError(f"{where}invalid JSON: {exc.msg} (column {exc.colno})") from None


def _request(
    where: str, record: object, line: int, index: int, defaults: Mapping[str, Any]
) -> Request:
    """Validate one parsed input line; prompt ``index`` (0-based) is seeded ``seed + index``."""
    if not isinstance(record, dict):
        raise ValueError(f"{where}expected a JSON object, got {type(record).__name__}")
    unknown = sorted(set(record) - FIELDS)
    if unknown:
        raise ValueError(
            f"{where}unknown field {unknown[0]!r} (known: {', '.join(sorted(FIELDS))})"
        )
    if "prompt" not in record:
        raise ValueError(f"{where}missing field 'prompt'")
    prompt = record["prompt"]
    if not isinstance(prompt, str) or not prompt.strip():
        raise ValueError(f"{where}prompt must be a non-empty string, got {prompt!r}")
    identifier = record.get("id", line)
    if not (_is_int(identifier) or isinstance(identifier, str)):
        raise ValueError(f"{where}id must be a string or an int, got {identifier!r}")
    values = {}
    for name in PARAMETERS:
        if name not in record:
            values[name] = defaults[name]
            continue
        value = record[name]
        allowed, check = _CHECKS[name]
        if not check(value):
            raise ValueError(f"{where}{name} must be {allowed}, got {value!r}")
        values[name] = value
    if "seed" not in record and values["seed"] is not None:
        values["seed"] += index
    return Request(id=identifier, line=line, prompt=prompt, **values)


def read_requests(path: str | Path, defaults: Mapping[str, Any]) -> list[Request]:
    """Read and validate every line of an input file.

    Parameters
    ----------
    path : str or Path
        The JSONL input file.
    defaults : mapping
        The value of every field of :data:`PARAMETERS` for lines that lack it. ``"seed"`` is
        a base: the ``i``-th prompt of the file (0-based) without a seed of its own gets
        ``defaults["seed"] + i`` (``None``: unseeded).

    Returns
    -------
    list of Request
        The prompts in file order.

    Raises
    ------
    ValueError
        A line that is not valid UTF-8 or JSON, not an object, lacks a non-empty
        ``"prompt"``, holds an unknown field, a field of the wrong type or out of range, or
        repeats an earlier line's id: the message starts ``"{path}:{line}: "`` and names the
        field. A file without any prompt.
    OSError
        The file cannot be read.

    Examples
    --------
    >>> import tempfile
    >>> defaults = dict(max_new_tokens=16, temperature=0.0, top_k=0, top_p=1.0, min_p=0.0,
    ...                 seed=None)
    >>> with tempfile.TemporaryDirectory() as folder:
    ...     path = Path(folder) / "prompts.jsonl"
    ...     _ = path.write_text('{"prompt": "a"}\\n\\n{"id": "b", "prompt": "c", "top_k": 5}\\n')
    ...     [(r.id, r.line, r.top_k) for r in read_requests(path, defaults)]
    [(1, 1, 0), ('b', 3, 5)]
    """
    path = Path(path)
    missing = sorted(set(PARAMETERS) - set(defaults))
    if missing:
        raise ValueError(f"defaults must give every parameter, missing {', '.join(missing)}")
    requests: list[Request] = []
    first_line: dict[str | int, int] = {}
    with path.open("rb") as file:
        for line, raw in enumerate(file, 1):
            if not raw.strip():
                continue
            where = f"{path}:{line}: "
            request = _request(where, _parse_line(where, raw), line, len(requests), defaults)
            if request.id in first_line:
                raise ValueError(
                    f"{where}id {request.id!r} repeats the id of line {first_line[request.id]}"
                )
            first_line[request.id] = line
            requests.append(request)
    if not requests:
        raise ValueError(f"{path}: holds no prompts")
    return requests


def _result_id(record: object) -> str | int | None:
    """The id of a result record, or ``None`` when it is not one."""
    if not isinstance(record, dict):
        return None
    identifier = record.get("id")
    return identifier if _is_int(identifier) or isinstance(identifier, str) else None


def read_results(path: str | Path) -> Resume:
    """The ids an output file already holds, for resuming an interrupted run.

    Every line must be a JSON object with a string or int ``"id"`` (blank lines are
    skipped), except the last: a last line without its newline, or (the last non-blank
    line) that is not such an object, was cut short by an interrupted write and is dropped
    (the file is truncated to ``keep_bytes`` before more results are appended). A missing
    file holds nothing.

    Parameters
    ----------
    path : str or Path
        The JSONL output file.

    Returns
    -------
    Resume
        The ids written, the length to keep and the line dropped, if any.

    Raises
    ------
    ValueError
        A line other than the last is not a result record (the message starts
        ``"{path}:{line}: "``).
    OSError
        The file exists but cannot be read.

    Examples
    --------
    >>> import tempfile
    >>> with tempfile.TemporaryDirectory() as folder:
    ...     path = Path(folder) / "out.jsonl"
    ...     _ = path.write_text('{"id": 1}\\n{"id": "b"}\\n{"id": 3, "compl')
    ...     resume = read_results(path)
    >>> sorted(map(str, resume.done)), resume.keep_bytes, resume.dropped_line
    (['1', 'b'], 22, 3)
    """
    path = Path(path)
    if not path.exists():
        return Resume(frozenset(), 0, None)
    pieces = path.read_bytes().split(b"\n")
    *complete, tail = pieces
    last = max((line for line, raw in enumerate(complete, 1) if raw.strip()), default=0)
    done: set[str | int] = set()
    offset = 0
    for line, raw in enumerate(complete, 1):
        if raw.strip():
            try:
                identifier = _result_id(_parse_line("", raw))
            except ValueError:
                identifier = None
            if identifier is None:
                if line == last and not tail:
                    return Resume(frozenset(done), offset, line)
                raise ValueError(
                    f"{path}:{line}: not a result record (a JSON object with a string or int "
                    '"id"); fix or remove the line, or write to another file'
                )
            done.add(identifier)
        offset += len(raw) + 1
    if tail:
        return Resume(frozenset(done), offset, len(pieces))
    return Resume(frozenset(done), offset, None)


def finish_reason(token_ids: Sequence[int], eos_ids: Collection[int]) -> str:
    """``"eos"`` when the generated ids end with an end-of-sequence id, else ``"length"``.

    Examples
    --------
    >>> finish_reason([5, 2], [2]), finish_reason([5, 6], [2]), finish_reason([], [])
    ('eos', 'length', 'length')
    """
    return "eos" if token_ids and token_ids[-1] in eos_ids else "length"


class ResultWriter:
    """Append result records to an output file, one flushed line per finished prompt.

    Opening (``with ResultWriter(...)``) first truncates the file to ``keep_bytes`` when it
    is longer (dropping the line :func:`read_results` found cut short); nothing before that
    is rewritten.

    Parameters
    ----------
    path : str or Path
        The JSONL output file (created if missing).
    keep_bytes : int
        :attr:`Resume.keep_bytes` of the file.

    Examples
    --------
    >>> import tempfile
    >>> request = Request("a", 1, "x", 4, 0.0, 0, 1.0, 0.0, None)
    >>> with tempfile.TemporaryDirectory() as folder:
    ...     path = Path(folder) / "out.jsonl"
    ...     with ResultWriter(path, 0) as writer:
    ...         writer.write(request, " y", [7, 2], "eos")
    ...     record = json.loads(path.read_text())
    >>> record["id"], record["completion"], record["completion_tokens"], record["finish_reason"]
    ('a', ' y', 2, 'eos')
    """

    def __init__(self, path: str | Path, keep_bytes: int) -> None:
        self.path = Path(path)
        self.keep_bytes = keep_bytes
        self.written = 0
        self._file: Any = None

    def __enter__(self) -> ResultWriter:
        if self.path.exists() and self.path.stat().st_size > self.keep_bytes:
            with self.path.open("r+b") as file:
                file.truncate(self.keep_bytes)
        self._file = self.path.open("a", encoding="utf-8", newline="\n")
        return self

    def __exit__(
        self,
        kind: type[BaseException] | None,
        error: BaseException | None,
        trace: TracebackType | None,
    ) -> None:
        self._file.close()

    def write(
        self, request: Request, completion: str, token_ids: Sequence[int], reason: str
    ) -> None:
        """Append and flush the record of one finished prompt.

        Parameters
        ----------
        request : Request
            The prompt.
        completion : str
            The decoded generated text.
        token_ids : sequence of int
            The generated ids (their count is ``"completion_tokens"``).
        reason : str
            ``"eos"`` or ``"length"`` (:func:`finish_reason`).
        """
        record = {
            "id": request.id,
            "line": request.line,
            "prompt": request.prompt,
            "completion": completion,
            "completion_tokens": len(token_ids),
            "finish_reason": reason,
        }
        self._file.write(json.dumps(record, ensure_ascii=False) + "\n")
        self._file.flush()
        self.written += 1
