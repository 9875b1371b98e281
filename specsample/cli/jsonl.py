"""Prompt files and result files of ``specsample generate --input ... --output ...``.

An input file holds one JSON object per line (blank lines are skipped)::

    {"id": "a", "prompt": "def f(x):", "max_new_tokens": 32, "temperature": 0.7, "seed": 1}

``"prompt"`` (a non-empty string) is required; ``"id"`` (a string or an int) defaults to the
1-based line number; the sampling fields (:data:`PARAMETERS`) default to the command-line
options, a line without ``"seed"`` getting ``--seed`` plus its index among the file's
prompts, and ``"seed": null`` asking for an unseeded prompt. :func:`read_requests`
validates every line before anything is loaded and reports every bad line at once, each as
``FILE:LINE: ...`` naming the field or key: a line that is not UTF-8, not JSON or not an
object, that repeats a key, holds a lone surrogate (such as ``"\\ud800"``, which is no
text), an unknown field, a field of the wrong type or out of range, or an id already used.

A seed makes a sampled prompt's completion reproducible with ``--method gumbel`` (the
completion target-only decoding gives for that seed), or, with the other methods, only with
``--fixed-k`` (the same models, options and thread count, up to floating-point differences
between batch shapes): by default the draft length of each step is chosen from the acceptance and
the step times measured so far (:mod:`specsample.generate.policy`), and which positions are
drafted changes the draws. Greedy prompts (temperature 0) give the target's argmax either
way.

The output file gets one JSON object per finished prompt, appended and flushed as soon as the
prompt finishes (:class:`ResultWriter`): the prompt's id, line and text, what was generated,
and the sampling parameters it was generated with::

    {"id": "a", "line": 1, "prompt": "def f(x):", "completion": "...",
     "completion_tokens": 12, "finish_reason": "eos", "max_new_tokens": 32,
     "temperature": 0.7, "top_k": 0, "top_p": 1.0, "min_p": 0.0, "seed": 1}

so that an interrupted run can be resumed and checked against the input
(:mod:`specsample.cli.resume`).
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

MAX_REPORTED = 20
"""Most bad lines one error lists (then how many more there are)."""

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


def _is_int(value: object) -> bool:
    return isinstance(value, int) and not isinstance(value, bool)


def _is_number(value: object) -> bool:
    return isinstance(value, int | float) and not isinstance(value, bool)


def valid_id(value: object) -> bool:
    """Whether ``value`` can be a prompt's id: a string or an int (not a bool).

    Examples
    --------
    >>> valid_id("a"), valid_id(3), valid_id(True), valid_id(1.5)
    (True, True, False, False)
    """
    return _is_int(value) or isinstance(value, str)


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
    "seed": (
        "an int in [0, 2**64), or null (unseeded)",
        lambda v: v is None or (_is_int(v) and 0 <= v < 1 << 64),
    ),
}
"""What each sampling field accepts (as the error says it), and the test of it."""


def parameter_error(name: str, value: object) -> str | None:
    """What is wrong with ``value`` as the sampling field ``name``, or ``None`` if nothing.

    Examples
    --------
    >>> parameter_error("top_p", 0.5) is None, parameter_error("seed", None) is None
    (True, True)
    >>> parameter_error("top_k", -1)
    'top_k must be an int in [0, 2**63) (0: off), got -1'
    """
    allowed, check = _CHECKS[name]
    return None if check(value) else f"{name} must be {allowed}, got {value!r}"


class _DuplicateKey(ValueError):
    """A JSON object that repeats a key (its argument)."""


def _unique_keys(pairs: list[tuple[str, Any]]) -> dict[str, Any]:
    """The object of ``pairs``, refusing a repeated key (``json.loads``' object hook)."""
    record: dict[str, Any] = {}
    for key, value in pairs:
        if key in record:
            raise _DuplicateKey(key)
        record[key] = value
    return record


def _lone_surrogate(record: object) -> str | None:
    """What names the first string value of the object ``record`` that holds a lone
    surrogate (a ``\\ud800``-``\\udfff`` escape that is half of no pair), if any."""
    if not isinstance(record, dict):
        return None
    for key, value in record.items():
        if isinstance(value, str):
            try:
                value.encode("utf-8")
            except UnicodeEncodeError as exc:
                return (
                    f"{key!r} holds a lone surrogate {value[exc.start]!r} at character "
                    f"{exc.start + 1}, which is not text"
                )
    return None


def parse_line(where: str, raw: bytes) -> object:
    """The JSON value of one line, or a ``ValueError`` whose message starts with ``where``.

    The line must be UTF-8 and JSON, repeat no key of an object, and hold no lone surrogate
    in a string value of its top-level object.

    Examples
    --------
    >>> parse_line("f:1: ", b'{"prompt": "x"}')
    {'prompt': 'x'}
    >>> parse_line("f:2: ", b'{"prompt": "x", "prompt": "y"}')
    Traceback (most recent call last):
    ...
    ValueError: f:2: duplicate key 'prompt'
    """
    try:
        text = raw.decode("utf-8")
    except UnicodeDecodeError as exc:
        raise ValueError(f"{where}not valid UTF-8 (byte {exc.start + 1})") from None
    try:
        value = json.loads(text, object_pairs_hook=_unique_keys)
    except _DuplicateKey as exc:
        raise ValueError(f"{where}duplicate key {exc.args[0]!r}") from None
    except json.JSONDecodeError as exc:
        raise ValueError(f"{where}invalid JSON: {exc.msg} (column {exc.colno})") from None
    surrogate = _lone_surrogate(value)
    if surrogate is not None:
        raise ValueError(f"{where}{surrogate}")
    return value


def refuse(errors: Sequence[str], hint: str | None = None) -> None:
    """Raise one ``ValueError`` listing ``errors``, one a line, if there are any.

    At most :data:`MAX_REPORTED` are listed, then how many more there are, then ``hint``.

    Examples
    --------
    >>> refuse([])
    >>> refuse(["f:1: bad", "f:3: worse"], hint="fix them")
    Traceback (most recent call last):
    ...
    ValueError: f:1: bad
    f:3: worse
    fix them
    """
    if not errors:
        return
    shown = list(errors[:MAX_REPORTED])
    if len(errors) > MAX_REPORTED:
        shown.append(f"... and {len(errors) - MAX_REPORTED} more bad lines")
    if hint is not None:
        shown.append(hint)
    raise ValueError("\n".join(shown))


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
    if not valid_id(identifier):
        raise ValueError(f"{where}id must be a string or an int, got {identifier!r}")
    values = {}
    for name in PARAMETERS:
        if name not in record:
            values[name] = defaults[name]
            continue
        error = parameter_error(name, record[name])
        if error is not None:
            raise ValueError(f"{where}{error}")
        values[name] = record[name]
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
        a base: the ``i``-th prompt of the file (0-based) without a ``"seed"`` of its own
        gets ``defaults["seed"] + i`` (``None``: unseeded); ``"seed": null`` is unseeded.

    Returns
    -------
    list of Request
        The prompts in file order.

    Raises
    ------
    ValueError
        Lines that are not valid UTF-8 or JSON, repeat a key, hold a lone surrogate, are not
        an object, lack a non-empty ``"prompt"``, hold an unknown field, a field of the
        wrong type or out of range, or repeat an earlier line's id: every one is listed
        (:func:`refuse`), each ``"{path}:{line}: "`` and what is wrong with it. A file
        without any prompt.
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
    errors: list[str] = []
    first_line: dict[str | int, int] = {}
    with path.open("rb") as file:
        for line, raw in enumerate(file, 1):
            if not raw.strip():
                continue
            where = f"{path}:{line}: "
            try:
                request = _request(where, parse_line(where, raw), line, len(requests), defaults)
            except ValueError as exc:
                errors.append(str(exc))
                continue
            if request.id in first_line:
                errors.append(
                    f"{where}id {request.id!r} repeats the id of line {first_line[request.id]}"
                )
                continue
            first_line[request.id] = line
            requests.append(request)
    refuse(errors)
    if not requests:
        raise ValueError(f"{path}: holds no prompts")
    return requests


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
    is longer (dropping the line :func:`specsample.cli.resume.read_results` found cut
    short); nothing before that is rewritten.

    Parameters
    ----------
    path : str or Path
        The JSONL output file (created if missing).
    keep_bytes : int
        :attr:`specsample.cli.resume.Results.keep_bytes` of the file.

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
    >>> record["max_new_tokens"], record["seed"]
    (4, None)
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
            The prompt (its id, line, text and sampling parameters are written).
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
            **{name: getattr(request, name) for name in PARAMETERS},
        }
        self._file.write(json.dumps(record, ensure_ascii=False) + "\n")
        self._file.flush()
        self.written += 1
