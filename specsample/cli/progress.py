"""The progress reporter of the commands that decode: the token rate so far, now and then.

:class:`Progress` is the ``on_progress`` callback of the decoding loops. It reports at most
once every ``every`` seconds (on the clock of :mod:`specsample.timing`): as a line on stderr,
or, given a progress bar (``tqdm``), as the bar's postfix, the bar itself being advanced by
whoever sees the prompts finish.

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

from specsample.timing import Stopwatch


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
        self.every = every
        self.bar = bar
        self._watch = Stopwatch()
        self._last = 0.0

    def __call__(self, finished: int, total: int, tokens: int) -> None:
        """Report ``finished`` of ``total`` sequences and ``tokens`` generated, if it is time."""
        elapsed = self._watch.elapsed()
        if elapsed - self._last < self.every:
            return
        self._last = elapsed
        rate = f"{tokens / elapsed:.1f} tokens/s"
        if self.bar is not None:
            self.bar.set_postfix_str(rate)
            return
        print(
            f"[{self.label}] {finished}/{total} sequences done, {tokens} tokens, {rate}",
            file=sys.stderr,
            flush=True,
        )


def import_tqdm() -> Any:
    """The ``tqdm`` progress bar class, or an ``ImportError`` saying how to install it."""
    try:
        from tqdm import tqdm
    except ImportError:
        raise ImportError(
            "--input needs tqdm; install it with: pip install 'specsample[hf]'"
        ) from None
    return tqdm
