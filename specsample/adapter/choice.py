"""Which exact forward computes a model's logits: the faster one on the machine at hand.

For a model the fused forward serves, two forwards compute its logits: ``transformers``'
own and :class:`~specsample.adapter.fused.FusedForward`, checked against it when built (up
to :func:`~specsample.adapter.checks.tolerance`). Which is faster depends on the CPU (its
vector width, the matrix kernels PyTorch and oneDNN pick for it), the threads and the shape
of the call: the shipped pair decoded 1.2 times faster than by ``transformers``'
``generate`` on one two-core machine, 0.9 to 1.0 times on another. So with
``forward="auto"`` a :class:`~specsample.adapter.lm.CachedLM` times both once per model,
thread count and device (:func:`probe`): forwards of 1 row (batch times new tokens: decoding
one sequence, drafting) and of :data:`PROBE_ROWS` rows (verifying a block of drafts; a
prefill or a batch goes the same way) after a :data:`PROBE_CONTEXT`-token context, in
alternated rounds. Each shape class then runs the faster forward: both are exact, so a step
may verify with one and decode with the other. The model's own forward replaces the fused
one only when its fastest call is faster by more than :data:`PROBE_MARGIN` and it wins most
rounds, so that a disturbed timing leaves the fused forward in place.

No probe runs

* for a forward pinned by ``forward="fused"`` or ``"model"``, or by the environment
  variable :data:`FORWARD_ENV` (the argument wins);
* where the fused forward does not serve the model (it keeps its own forward);
* where the fused forward is row-exact (:attr:`~specsample.adapter.fused.FusedForward.row_exact`:
  a float32 target on a CPU, or a quantized model, whose verified blocks give bit for bit
  the logits of target-only decoding, whatever the batch and its masked slots); the model's
  own forward is not, so the fused one runs every shape, and ``forward="fused"`` changes
  nothing then;
* for a model of fewer than :data:`PROBE_MIN_WEIGHTS` weights in its linear layers, whose
  forward is mostly per-operation overhead, which the fused forward cuts: it keeps the fused
  forward (this also keeps what the tests' tiny models run free of timing).

The probe's timings and cost are kept in the :class:`ForwardChoice`, which the command line
prints when it loads a model.
"""

from __future__ import annotations

import functools
import os
import weakref
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

import torch

from specsample.adapter.quantize import QuantizedLinear
from specsample.timing import now

FORWARDS = ("auto", "fused", "model")
"""What ``forward=`` (or :data:`FORWARD_ENV`) takes: ``"auto"`` chooses by a probe,
``"fused"`` runs the fused forward wherever it serves the model, ``"model"`` always runs
``transformers``' own."""

FORWARD_ENV = "SPECSAMPLE_FORWARD"
"""The environment variable that pins the forward when ``forward=`` is not given."""

PROBE_ROWS = 5
"""Rows of the probe's several-row forwards (a block of 4 drafts and its bonus token)."""

PROBE_CONTEXT = 16
"""Tokens in the cache before each probe forward."""

PROBE_CALLS = 5
"""Most timed calls of each forward at each shape (rounds), after one untimed warm-up call."""

PROBE_MIN_CALLS = 3
"""Fewest rounds, whatever they take: the model's own forward must win most of them."""

PROBE_BUDGET_S = 0.5
"""Seconds after which the probe starts no round beyond :data:`PROBE_MIN_CALLS`."""

PROBE_MARGIN = 0.03
"""How much faster (relative) the model's own forward's fastest call must be than the fused
one's for it to replace the fused one (it must also win most rounds)."""

PROBE_MIN_WEIGHTS = 1 << 20
"""Fewest weights in a model's linear layers for which the forwards are timed; a smaller
model keeps the fused forward."""

_NAMES = {"fused": "fused", "model": "transformers'"}


@dataclass(frozen=True)
class ForwardChoice:
    """Which forward runs each shape class of a model's forwards, and how that was decided.

    Attributes
    ----------
    how : str
        ``"probe"`` (timed), ``"pinned"`` (asked for), ``"row-exact"``, ``"small"`` (fused
        forward kept without a probe), or ``"unserved"`` (the fused forward does not serve
        the model).
    source : str
        What pinned it (``"forward='model'"``, ``"SPECSAMPLE_FORWARD=fused"``, ...), empty
        otherwise.
    model_one, model_many : bool
        Whether the model's own forward runs forwards of 1 row, and of several, in place of
        the fused forward (only a probe sets them).
    timings : tuple of float
        The probe's fastest calls, in seconds: fused and own forward at 1 row, then at
        :attr:`rows` rows (empty without a probe).
    rows : int
        Rows of the probe's several-row forwards.
    seconds : float
        What the probe took in all, warm-up included (0 without a probe).

    Examples
    --------
    >>> choice = ForwardChoice("probe", model_many=True, timings=(0.008, 0.01, 0.012, 0.011),
    ...                        rows=5, seconds=0.2)
    >>> choice.model_at(1), choice.model_at(5)
    (False, True)
    >>> print(choice)
    auto: 1 row fused 8.0 ms, transformers' 10.0 ms; 5 rows 12.0 / 11.0 ms; probe 0.20 s
    """

    how: str
    source: str = ""
    model_one: bool = False
    model_many: bool = False
    timings: tuple[float, ...] = ()
    rows: int = PROBE_ROWS
    seconds: float = 0.0

    def model_at(self, rows: int) -> bool:
        """Whether a forward of ``rows`` rows (batch times new slots) runs the model's own
        forward rather than the fused one."""
        return self.model_many if rows > 1 else self.model_one

    @property
    def summary(self) -> str:
        """A few words on how the forward was chosen (the probe's cost, not its timings)."""
        if self.how == "probe":
            return f"auto, probe {self.seconds:.2f} s"
        if self.how == "pinned":
            return f"pinned by {self.source}"
        if self.how == "unserved":
            return "the fused forward does not serve it"
        reason = "row-exact" if self.how == "row-exact" else "small model"
        return f"auto, {reason}, not probed"

    def __str__(self) -> str:
        if self.how != "probe":
            return self.summary
        one_fused, one_model, many_fused, many_model = (1e3 * t for t in self.timings)
        return (
            f"auto: 1 row fused {one_fused:.1f} ms, transformers' {one_model:.1f} ms; "
            f"{self.rows} rows {many_fused:.1f} / {many_model:.1f} ms; "
            f"probe {self.seconds:.2f} s"
        )


_CHOSEN: weakref.WeakKeyDictionary[Any, dict[tuple[int, str], ForwardChoice]] = (
    weakref.WeakKeyDictionary()
)
"""Per fused forward (one per model and weights): the probe's choice per thread count and
device."""


def forward_mode(forward: str | None) -> tuple[str, str]:
    """The forward asked for (one of :data:`FORWARDS`) and what asked for it.

    Parameters
    ----------
    forward : str or None
        The argument; ``None`` reads :data:`FORWARD_ENV`, ``"auto"`` when it is unset or
        empty.

    Returns
    -------
    tuple of str
        ``(mode, source)``, ``source`` naming the argument or the variable.

    Raises
    ------
    TypeError
        ``forward`` is neither a string nor ``None``.
    ValueError
        ``forward``, or the variable, is not one of :data:`FORWARDS`.

    Examples
    --------
    >>> forward_mode("model")
    ('model', "forward='model'")
    """
    if forward is None:
        value = os.environ.get(FORWARD_ENV, "").strip() or "auto"
        if value not in FORWARDS:
            raise ValueError(f"{FORWARD_ENV} must be one of {', '.join(FORWARDS)}, got {value!r}")
        return value, f"{FORWARD_ENV}={value}"
    if not isinstance(forward, str):
        raise TypeError(f"forward must be a str or None, got {type(forward).__name__}")
    if forward not in FORWARDS:
        raise ValueError(f"forward must be one of {', '.join(FORWARDS)}, got {forward!r}")
    return forward, f"forward={forward!r}"


def linear_weights(model: Any) -> int:
    """Weights in ``model``'s linear layers (``torch.nn.Linear`` and quantized ones).

    Examples
    --------
    >>> linear_weights(torch.nn.Sequential(torch.nn.Linear(4, 3), torch.nn.ReLU()))
    12
    """
    modules = getattr(model, "modules", None)
    if not callable(modules):
        return 0
    return sum(
        int(module.in_features) * int(module.out_features)
        for module in modules()
        if isinstance(module, (torch.nn.Linear, QuantizedLinear))
    )


def probe(
    run: Callable[[str, int], None],
    *,
    clock: Callable[[], float],
    rows: int = PROBE_ROWS,
    calls: int = PROBE_CALLS,
    min_calls: int = PROBE_MIN_CALLS,
    budget: float = PROBE_BUDGET_S,
) -> ForwardChoice:
    """Time both forwards at 1 row and at ``rows`` rows; the faster one for each.

    Each forward and shape is called once untimed, then the four are called in turn, the
    two forwards of a shape one after the other (which one first alternates), for
    ``min_calls`` rounds, then more up to ``calls`` while less than ``budget`` seconds have
    passed since the first.
    At a shape, the model's own forward is chosen when its fastest call beats the fused
    forward's by more than :data:`PROBE_MARGIN` and it is faster in most rounds: on a
    machine whose other work disturbs the timings, the fused forward stays.

    Parameters
    ----------
    run : callable
        ``run(forward, n)`` runs one forward of ``n`` rows by ``forward`` (``"fused"`` or
        ``"model"``) and leaves the state as it found it.
    clock : callable
        Seconds on a monotonic clock (on an accelerator, read once its queued work is done).
    rows : int
        Rows of the several-row forwards (at least 2).
    calls, min_calls : int
        Most and fewest rounds (timed calls of each forward at each shape), at least 1.
    budget : float
        Seconds after which no round beyond ``min_calls`` starts.

    Returns
    -------
    ForwardChoice
        ``how="probe"``.
    """
    if rows < 2:
        raise ValueError(f"rows must be at least 2, got {rows}")
    if not 1 <= min_calls <= calls:
        raise ValueError(f"need 1 <= min_calls <= calls, got {min_calls} and {calls}")
    cases = [(forward, n) for n in (1, rows) for forward in ("fused", "model")]
    start = clock()
    for forward, n in cases:
        run(forward, n)
    best = dict.fromkeys(cases, float("inf"))
    wins = dict.fromkeys((1, rows), 0)
    timed = clock()
    rounds = 0
    while rounds < min_calls or (rounds < calls and clock() - timed < budget):
        for n in (1, rows):
            seconds = {}
            order = ("fused", "model") if rounds % 2 == 0 else ("model", "fused")
            for forward in order:
                before = clock()
                run(forward, n)
                seconds[forward] = clock() - before
                best[forward, n] = min(best[forward, n], seconds[forward])
            wins[n] += seconds["model"] < seconds["fused"]
        rounds += 1
    timings = tuple(best[case] for case in cases)

    def model_wins(n: int) -> bool:
        faster = best["model", n] * (1.0 + PROBE_MARGIN) < best["fused", n]
        return faster and 2 * wins[n] > rounds

    return ForwardChoice(
        "probe",
        model_one=model_wins(1),
        model_many=model_wins(rows),
        timings=timings,
        rows=rows,
        seconds=clock() - start,
    )


def choose(
    fused: Any,
    mode: str,
    source: str,
    make_run: Callable[[], Callable[[str, int], None]],
    *,
    weights: int,
    device: torch.device | None = None,
) -> ForwardChoice:
    """The choice for a model that ``fused`` serves, probed at most once per thread count
    and device.

    Parameters
    ----------
    fused : FusedForward
        The model's fused forward (checked exact).
    mode, source : str
        From :func:`forward_mode` (``"model"`` is handled by the caller, which then builds
        no fused forward).
    make_run : callable
        Builds the ``run`` of :func:`probe` (called only when a probe runs).
    weights : int
        Weights in the model's linear layers (:func:`linear_weights`).
    device : torch.device, optional
        Where the model runs (its clock is synchronised).

    Returns
    -------
    ForwardChoice
    """
    if mode == "fused":
        return ForwardChoice("pinned", source)
    if getattr(fused, "row_exact", False):
        return ForwardChoice("row-exact")
    if weights < PROBE_MIN_WEIGHTS:
        return ForwardChoice("small")
    key = (torch.get_num_threads(), str(device))
    known = _CHOSEN.setdefault(fused, {})
    if key not in known:
        known[key] = probe(make_run(), clock=functools.partial(now, device))
    return known[key]
