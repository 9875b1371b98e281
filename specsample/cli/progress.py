"""The progress reporters of the commands that run long: lines on stderr, now and then.

Each reports at most once every ``every`` seconds (on the clock of :mod:`specsample.timing`),
so a run shorter than that prints nothing. :class:`Progress` is the ``on_progress`` callback
of the decoding loops: the sequences done and the token rate so far, as a line on stderr,
or, given a progress bar (``tqdm``), as the bar's postfix, the bar itself being advanced by
whoever sees the prompts finish. :class:`PartsProgress` counts the parts of a longer
computation (the points of ``specsample compare``) and the time they took.

Examples
--------
>>> from types import SimpleNamespace
>>> shown = []
>>> progress = Progress(every=0.0, bar=SimpleNamespace(set_postfix_str=shown.append))
>>> progress(1, 4, 10)
>>> shown[0].endswith(" tokens/s")
True
"""

from __future__ import annotations

import sys
from typing import Any

from specsample.extras import install_command
from specsample.timing import Stopwatch


class _Throttle:
    """The seconds since creation, when ``every`` have passed since the last report."""

    def __init__(self, every: float) -> None:
        self.every = every
        self._watch = Stopwatch()
        self._last = 0.0

    def due(self) -> float | None:
        """The seconds elapsed if it is time to report (then counted as a report), else
        ``None``."""
        elapsed = self._watch.elapsed()
        if elapsed - self._last < self.every:
            return None
        self._last = elapsed
        return elapsed


class Progress:
    """Report the sequences done and the tokens per second, at most once every ``every`` s.

    Parameters
    ----------
    label : str
        Names the run in each line (``"[label] ..."``); unused with ``bar``.
    every : float
        Fewest seconds between two reports.
    bar : tqdm.tqdm, optional
        Show the rate as this bar's postfix instead of printing a line on stderr.
    """

    def __init__(self, label: str = "", *, every: float = 2.0, bar: Any = None) -> None:
        self.label = label
        self.bar = bar
        self._throttle = _Throttle(every)

    def __call__(self, finished: int, total: int, tokens: int) -> None:
        """Report ``finished`` of ``total`` sequences and ``tokens`` generated, if it is time."""
        elapsed = self._throttle.due()
        if elapsed is None:
            return
        rate = f"{tokens / elapsed:.1f} tokens/s" if elapsed > 0 else "- tokens/s"
        if self.bar is not None:
            self.bar.set_postfix_str(rate)
            return
        print(
            f"[{self.label}] {finished}/{total} sequences done, {tokens} tokens, {rate}",
            file=sys.stderr,
            flush=True,
        )


class PartsProgress:
    """Report the parts of a computation done and the time so far (parts may differ in cost
    by orders of magnitude, so no time left is estimated).

    Parameters
    ----------
    label : str
        Names the computation in each line (``"[label] ..."``).
    parts : str
        What a part is, plural (``"points"``).
    every : float
        Fewest seconds between two reports.
    """

    def __init__(self, label: str, parts: str, *, every: float = 2.0) -> None:
        self.label = label
        self.parts = parts
        self._throttle = _Throttle(every)

    def __call__(self, done: int, total: int) -> None:
        """Report ``done`` of ``total`` parts, if it is time."""
        elapsed = self._throttle.due()
        if elapsed is None:
            return
        print(
            f"[{self.label}] {done}/{total} {self.parts} done in {elapsed:.0f} s",
            file=sys.stderr,
            flush=True,
        )


def import_tqdm() -> Any:
    """The ``tqdm`` progress bar class, or an ``ImportError`` saying how to install it."""
    try:
        from tqdm import tqdm
    except ImportError:
        raise ImportError(f"--input needs tqdm; install it with: {install_command('hf')}") from None
    return tqdm
