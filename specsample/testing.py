"""A statistical harness that checks any chain verifier for exactness.

A verifier is exact when the tokens it emits follow the target model exactly, whatever the
draft model. This module checks that empirically, on toy draft/target pairs small enough
for the exact answer to be known, for any callable with the forward signature of
:class:`specsample.sampler.RejectionSampler`::

    verifier(target_probs [batch, k, vocab], bonus_token_ids [batch, 1],
             draft_probs [batch, k, vocab], draft_token_ids [batch, k]) -> [batch, k + 1] int64

whose output holds the accepted drafts, one more token, then ``-1`` padding.

The toy pairs (:class:`Family`) are position-dependent Markov models: the target row
``q_j(. | prev)`` and the draft row ``p_j(. | prev)`` depend only on the draft position ``j``
and on the previously drafted token (position 0 conditions on a fixed start token). The
target has ``k + 1`` rows per context, the last one giving the bonus token.
:func:`simulate` drafts autoregressively from ``p``, hands the verifier the matching target
rows and a bonus token drawn from ``q_k(. | x_{k-1})``, and collects what it emits.

The exactness criterion is conditional: for every output position ``n`` and prefix ``s``
already emitted, ``P(O_n = x | O_<n = s, n emitted) = q_n(x | s)``; by induction over ``n``
this is what makes the emitted stream follow the target. For these Markov pairs the target
conditional ``q_n(x | s)`` depends on the prefix only through its last token, so under an
exact verifier the law of ``O_n`` given the previous emitted token ``t`` (and position ``n``
being emitted) is ``q_n(. | t)``: the conditional law given the whole prefix is the same for
every prefix ending in ``t``, hence also for their mixture. :func:`exactness_report`
therefore runs, per output position, a chi-square test of the emitted tokens against
``q_n(. | t)`` inside each context ``t``, summing the statistics and degrees of freedom of the
contexts into one p-value per position. This is a necessary condition, and it is sensitive
to exactly the bugs that context-free fixtures hide: reading a target, draft or residual row
from the wrong position or the wrong context. (A deviation that depends on tokens before the
previous one and cancels out on average over them would escape it.) The unconditional law
of ``O_n`` given only that ``n`` was emitted is no good reference: it mixes the rows
``q_n(. | t)`` with weights ``P(O_{n-1} = t | n emitted)``, and reaching position ``n`` favours
the previous tokens whose drafts are accepted more often, so those weights differ from the
target's own marginal even for an exact verifier.

Each report also compares the realised acceptance rate of draft position 0 with its exact
value ``sum_x min(q_0(x | start), p_0(x | start))`` and the mean number of accepted drafts with
its exact value, both as z-scores. :meth:`ExactnessReport.passed` applies a Bonferroni split
of the family-wise false-failure rate ``alpha`` over all these tests.

Examples
--------
>>> from specsample.sampler import RejectionSampler
>>> family = make_family("markov", k=2, seed=0)
>>> report = exactness_report(RejectionSampler(), family, rows=4000, seed=1)
>>> report.passed(1e-4), report.malformed_rows
(True, 0)
"""

from __future__ import annotations

import math
from collections.abc import Callable
from dataclasses import dataclass
from statistics import NormalDist
from typing import NamedTuple

import torch

__all__ = [
    "EXTRA_FAMILIES",
    "FAMILIES",
    "ExactnessReport",
    "Family",
    "PositionResult",
    "Simulation",
    "Verifier",
    "VerifierInputs",
    "chi2_isf",
    "chi2_sf",
    "detectable_tv",
    "draw_inputs",
    "exactness_report",
    "make_family",
    "ncx2_sf",
    "simulate",
]

Verifier = Callable[[torch.Tensor, torch.Tensor, torch.Tensor, torch.Tensor], torch.Tensor]
"""``verifier(target_probs, bonus_token_ids, draft_probs, draft_token_ids) -> token_ids``."""

FAMILIES = ("random", "sparse", "equal", "onehot_draft", "onehot_target", "peaked", "markov")
"""The toy families every exact rule is tested on."""

EXTRA_FAMILIES = ("zipf",)
"""Further families, for comparisons on larger vocabularies."""
"""Names accepted by :func:`make_family`."""

MIN_EXPECTED = 5.0
"""Chi-square cells expected to hold fewer counts than this are merged (or dropped)."""

_VARIANCE_FLOOR = 1e-12


# --------------------------------------------------------------------------------------
# Toy draft/target pairs
# --------------------------------------------------------------------------------------


@dataclass(frozen=True, eq=False)
class Family:
    """A toy draft/target pair whose rows depend on the position and the previous token.

    Attributes
    ----------
    name : str
        A label used in reports.
    target : torch.Tensor
        ``[k + 1, vocab, vocab]`` float32: ``target[j, prev]`` is the target row
        ``q_j(. | prev)``; row ``k`` gives the bonus token.
    draft : torch.Tensor
        ``[k, vocab, vocab]`` float32: ``draft[j, prev]`` is the draft row ``p_j(. | prev)``.
    start : int
        The token that position 0 conditions on.

    Examples
    --------
    >>> family = make_family("equal", k=2, vocab=4)
    >>> family.k, family.vocab, round(family.expected_acceptance(), 6)
    (2, 4, 1.0)
    """

    name: str
    target: torch.Tensor
    draft: torch.Tensor
    start: int = 0

    def __post_init__(self) -> None:
        if self.target.dim() != 3 or self.target.shape[1] != self.target.shape[2]:
            raise ValueError(
                f"target must have shape [k + 1, vocab, vocab], got {tuple(self.target.shape)}"
            )
        steps, vocab, _ = self.target.shape
        if steps < 2:
            raise ValueError("target must have at least 2 positions (k >= 1)")
        if tuple(self.draft.shape) != (steps - 1, vocab, vocab):
            raise ValueError(
                f"draft must have shape {(steps - 1, vocab, vocab)}, got {tuple(self.draft.shape)}"
            )
        if not 0 <= self.start < vocab:
            raise ValueError(f"start must lie in [0, {vocab}), got {self.start}")

    @property
    def k(self) -> int:
        """Number of drafted tokens per row."""
        return self.draft.shape[0]

    @property
    def vocab(self) -> int:
        """Vocabulary size."""
        return self.target.shape[-1]

    def reference(self) -> torch.Tensor:
        """The exact target conditionals, ``[k + 1, vocab, vocab]`` float64.

        These are the float32 rows handed to the verifier, renormalised in float64.
        """
        return _normalise(self.target.to(torch.float64))

    def prefix_acceptance(self) -> torch.Tensor:
        """``[k + 1]`` float64: probability that drafts ``0 .. j - 1`` are all accepted.

        Entry 0 is 1. Drafting ``x`` from ``p`` and accepting it with probability
        ``min(1, q(x) / p(x))`` has probability ``min(p(x), q(x))``; chaining this over the
        Markov contexts gives the law of the accepted prefix exactly.
        """
        q = self.reference()
        p = _normalise(self.draft.to(torch.float64))
        overlap = torch.minimum(q[: self.k], p)
        mass = torch.zeros(self.vocab, dtype=torch.float64)
        mass[self.start] = 1.0
        out = [1.0]
        for j in range(self.k):
            mass = mass @ overlap[j]
            out.append(float(mass.sum()))
        return torch.tensor(out, dtype=torch.float64)

    def expected_acceptance(self) -> float:
        """Exact acceptance probability of draft position 0, ``sum_x min(q_0, p_0)``."""
        return float(self.prefix_acceptance()[1])

    def expected_accepted(self) -> tuple[float, float]:
        """Exact mean and variance of the number of drafts accepted in order.

        With ``A = sum_{j=1..k} 1[drafts 0..j-1 accepted]`` (nested events),
        ``E[A] = sum_j P_j`` and ``E[A^2] = sum_j (2 j - 1) P_j``.
        """
        prefix = self.prefix_acceptance()[1:]
        weights = torch.arange(1, self.k + 1, dtype=torch.float64) * 2 - 1
        mean = float(prefix.sum())
        return mean, max(float((weights * prefix).sum()) - mean * mean, 0.0)

    def accepted_length_law(self, rule: str = "chain") -> torch.Tensor:
        """Exact law of the accepted length under a verification rule, ``[k + 1]`` float64.

        ``"chain"`` follows from :meth:`prefix_acceptance`. ``"block"`` (block verification,
        :mod:`specsample.rules.block`) enumerates every draft sequence (``vocab ** k`` of
        them) with its probability; given the drafts, the accepted length is the last ``i``
        with ``eta_i < h_i`` for independent uniforms, so
        ``P(tau = i) = h_i prod_{j > i} (1 - h_j)``.

        Examples
        --------
        >>> family = make_family("random", k=2, vocab=4)
        >>> bool(family.accepted_length_law("block")[1:].sum()
        ...      >= family.accepted_length_law("chain")[1:].sum() - 1e-12)
        True
        """
        if rule == "chain":
            prefix = torch.cat([self.prefix_acceptance(), torch.zeros(1, dtype=torch.float64)])
            return prefix[:-1] - prefix[1:]
        if rule != "block":
            raise ValueError(f"rule must be 'chain' or 'block', got {rule!r}")
        q = self.reference()
        p = _normalise(self.draft.to(torch.float64))
        prev = torch.full((1,), self.start, dtype=torch.int64)
        weight = torch.ones(1, dtype=torch.float64)
        prob = torch.ones(1, dtype=torch.float64)
        tokens = torch.arange(self.vocab)
        h: list[torch.Tensor] = []
        for j in range(self.k):
            ratio = torch.where(p[j, prev] > 0, q[j, prev] / p[j, prev], 0.0)
            prob = (prob.unsqueeze(-1) * p[j, prev]).reshape(-1)
            weight = torch.clamp(weight.unsqueeze(-1) * ratio, max=1.0).reshape(-1)
            h = [hi.repeat_interleave(self.vocab) for hi in h]
            prev = tokens.repeat(prev.shape[0])
            if j + 1 < self.k:
                z = (weight.unsqueeze(-1) * q[j + 1, prev] - p[j + 1, prev]).clamp(min=0).sum(-1)
                denominator = z + 1.0 - weight
                h.append(torch.where(denominator > 0, z / denominator, 0.0))
            else:
                h.append(weight)
        law = torch.zeros(self.k + 1, dtype=torch.float64)
        survive = torch.ones_like(prob)
        for i in range(self.k, 0, -1):
            law[i] = float((prob * h[i - 1] * survive).sum())
            survive = survive * (1.0 - h[i - 1])
        law[0] = float((prob * survive).sum())
        return law


def _normalise(rows: torch.Tensor) -> torch.Tensor:
    return rows / rows.sum(dim=-1, keepdim=True)


def _dirichlet(shape: tuple[int, ...], vocab: int, concentration: float) -> torch.Tensor:
    alpha = torch.full((*shape, vocab), concentration, dtype=torch.float64)
    rows = torch.distributions.Dirichlet(alpha).sample()
    return _normalise(rows.clamp(min=0.0))


def _onehot(index: torch.Tensor, vocab: int) -> torch.Tensor:
    return torch.nn.functional.one_hot(index, vocab).to(torch.float64)


def make_family(name: str, k: int, vocab: int = 8, seed: int = 0, start: int = 0) -> Family:
    """Build one of the toy pairs of :data:`FAMILIES` from a seed.

    Rows are drawn in float64, independently for every ``(position, previous token)``, then
    cast to float32.

    Parameters
    ----------
    name : str
        ``"random"``: Dirichlet(1) target and draft rows. ``"sparse"``: Dirichlet rows with
        about 40% zeros in both ``q`` and ``p``, including a token per context that the draft
        proposes often but the target forbids (``q = 0``, ``p >= 0.15``). ``"equal"``:
        ``p == q``. ``"onehot_draft"``: the draft deterministically proposes the target's
        mode. ``"onehot_target"``: the target is one-hot, the draft a mixture of it and a
        Dirichlet row. ``"peaked"``: low-temperature softmax rows, draft logits correlated
        with the target's. ``"markov"``: Dirichlet(0.3) target rows that change strongly
        with position and context, draft ``p = (q + r) / 2`` with another such row ``r``.
        ``"zipf"`` (in :data:`EXTRA_FAMILIES`, meant for larger vocabularies): language-model
        like rows, a Zipf law over a random ranking of the tokens with noisy logits, and a
        draft that sees the same logits through more noise and a flatter temperature.
    k : int
        Drafted tokens per row (``>= 1``).
    vocab : int
        Vocabulary size (``>= 2``).
    seed : int
        Seeds the draws; the global random state is left untouched.
    start : int
        The token position 0 conditions on.

    Returns
    -------
    Family
        Tables ``target [k + 1, vocab, vocab]`` and ``draft [k, vocab, vocab]`` in float32.

    Examples
    --------
    >>> family = make_family("sparse", k=3, vocab=6, seed=4)
    >>> tuple(family.target.shape), tuple(family.draft.shape), family.target.dtype
    ((4, 6, 6), (3, 6, 6), torch.float32)
    >>> bool(((family.target[:3] == 0) & (family.draft > 0)).any())
    True
    """
    if name not in FAMILIES + EXTRA_FAMILIES:
        raise ValueError(f"name must be one of {FAMILIES + EXTRA_FAMILIES}, got {name!r}")
    if k < 1:
        raise ValueError(f"k must be >= 1, got {k}")
    if vocab < 2:
        raise ValueError(f"vocab must be >= 2, got {vocab}")
    shape = (k + 1, vocab)
    with torch.random.fork_rng(devices=[]):
        torch.manual_seed(seed)
        if name == "random":
            target, draft = _dirichlet(shape, vocab, 1.0), _dirichlet(shape, vocab, 1.0)
        elif name == "sparse":
            target, draft = _sparse_pair(shape, vocab)
        elif name == "equal":
            target = _dirichlet(shape, vocab, 1.0)
            draft = target.clone()
        elif name == "onehot_draft":
            target = _dirichlet(shape, vocab, 1.0)
            draft = _onehot(target.argmax(dim=-1), vocab)
        elif name == "onehot_target":
            target = _onehot(torch.randint(vocab, shape), vocab)
            draft = 0.5 * target + 0.5 * _dirichlet(shape, vocab, 1.0)
        elif name == "peaked":
            logits = torch.randn(*shape, vocab, dtype=torch.float64)
            noise = torch.randn(*shape, vocab, dtype=torch.float64)
            target = torch.softmax(logits / 0.3, dim=-1)
            draft = torch.softmax((0.7 * logits + 0.7 * noise) / 0.3, dim=-1)
        elif name == "markov":
            target = _dirichlet(shape, vocab, 0.3)
            draft = 0.5 * target + 0.5 * _dirichlet(shape, vocab, 0.3)
        else:
            ranks = torch.rand(*shape, vocab).argsort(dim=-1).to(torch.float64) + 1.0
            logits = -1.2 * ranks.log() + 0.5 * torch.randn(*shape, vocab, dtype=torch.float64)
            noise = 0.8 * torch.randn(*shape, vocab, dtype=torch.float64)
            target = torch.softmax(logits, dim=-1)
            draft = torch.softmax(0.8 * (logits + noise), dim=-1)
    return Family(
        name=name,
        target=_normalise(target).to(torch.float32),
        draft=_normalise(draft[:k]).to(torch.float32),
        start=start,
    )


def _sparse_pair(shape: tuple[int, int], vocab: int) -> tuple[torch.Tensor, torch.Tensor]:
    target = _dirichlet(shape, vocab, 1.0)
    draft = _dirichlet(shape, vocab, 1.0)
    keep_target = _onehot(target.argmax(dim=-1), vocab).bool()
    keep_draft = _onehot(draft.argmax(dim=-1), vocab).bool()
    target = target.masked_fill((torch.rand(target.shape) < 0.4) & ~keep_target, 0.0)
    draft = draft.masked_fill((torch.rand(draft.shape) < 0.4) & ~keep_draft, 0.0)
    offset = torch.randint(1, vocab, shape)
    forbidden = (target.argmax(dim=-1) + offset) % vocab
    forbid = _onehot(forbidden, vocab).bool()
    target = target.masked_fill(forbid, 0.0)
    draft = torch.where(forbid, draft.clamp(min=0.15), draft)
    return _normalise(target), _normalise(draft)


# --------------------------------------------------------------------------------------
# Simulation
# --------------------------------------------------------------------------------------


class VerifierInputs(NamedTuple):
    """Inputs of one verification call, in the verifier's argument order.

    Attributes
    ----------
    target_probs : torch.Tensor
        ``[rows, k, vocab]`` float32 target rows ``q_j(. | x_{j-1})``.
    bonus_token_ids : torch.Tensor
        ``[rows, 1]`` int64 tokens drawn from ``q_k(. | x_{k-1})``.
    draft_probs : torch.Tensor
        ``[rows, k, vocab]`` float32 draft rows ``p_j(. | x_{j-1})``.
    draft_token_ids : torch.Tensor
        ``[rows, k]`` int64 drafts ``x_j ~ p_j(. | x_{j-1})``.
    """

    target_probs: torch.Tensor
    bonus_token_ids: torch.Tensor
    draft_probs: torch.Tensor
    draft_token_ids: torch.Tensor


class Simulation(NamedTuple):
    """What :func:`simulate` returns.

    Attributes
    ----------
    inputs : VerifierInputs
        What the verifier was given (on the CPU).
    token_ids : torch.Tensor
        ``[rows, k + 1]`` int64 output of the verifier (on the CPU).
    """

    inputs: VerifierInputs
    token_ids: torch.Tensor


def _draw(rows: torch.Tensor, generator: torch.Generator) -> torch.Tensor:
    return torch.multinomial(rows.to(torch.float64), 1, generator=generator).squeeze(-1)


def draw_inputs(family: Family, rows: int, seed: int = 0) -> VerifierInputs:
    """Draft ``rows`` sequences autoregressively and gather what a verifier needs.

    Drafts follow ``x_j ~ p_j(. | x_{j-1})`` (``x_{-1}`` being the start token); the target
    rows are ``q_j(. | x_{j-1})`` for ``j < k``, and the bonus token is drawn from the target
    row after the last draft, ``q_k(. | x_{k-1})``. A private generator seeded by ``seed``
    is used; the global random state is left untouched.

    Parameters
    ----------
    family : Family
        The toy pair.
    rows : int
        Number of sequences.
    seed : int
        Seed of the draws.

    Returns
    -------
    VerifierInputs
        ``target_probs``/``draft_probs`` ``[rows, k, vocab]`` float32 (contiguous),
        ``bonus_token_ids [rows, 1]`` and ``draft_token_ids [rows, k]`` int64, on the CPU.

    Examples
    --------
    >>> inputs = draw_inputs(make_family("random", k=3, vocab=5), rows=10)
    >>> tuple(inputs.target_probs.shape), tuple(inputs.bonus_token_ids.shape)
    ((10, 3, 5), (10, 1))
    """
    generator = torch.Generator().manual_seed(seed)
    k = family.k
    prev = torch.full((rows,), family.start, dtype=torch.int64)
    contexts = []
    drafts = []
    for j in range(k):
        contexts.append(prev)
        prev = _draw(family.draft[j][prev], generator)
        drafts.append(prev)
    bonus = _draw(family.target[k][prev], generator)
    context = torch.stack(contexts, dim=1)
    positions = torch.arange(k).expand(rows, k)
    return VerifierInputs(
        target_probs=family.target[positions, context].contiguous(),
        bonus_token_ids=bonus.unsqueeze(-1),
        draft_probs=family.draft[positions, context].contiguous(),
        draft_token_ids=torch.stack(drafts, dim=1),
    )


def _verifier_seed(seed: int) -> int:
    return (seed * 6364136223846793005 + 1442695040888963407) % (1 << 63)


def simulate(
    verifier: Verifier,
    family: Family,
    rows: int,
    *,
    seed: int = 0,
    batch_size: int = 8192,
    device: torch.device | str = "cpu",
) -> Simulation:
    """Run ``verifier`` on ``rows`` sequences drafted from ``family``.

    The verifier is called on consecutive chunks of ``batch_size`` rows, with its inputs on
    ``device``. Torch's global generators are seeded from ``seed`` for the duration of the
    calls and restored afterwards, so the result is reproducible and the caller's random
    state is untouched.

    Parameters
    ----------
    verifier : Verifier
        Any callable with the chain verifier's forward signature.
    family : Family
        The toy pair.
    rows : int
        Number of sequences.
    seed : int
        Seeds both the drafts (see :func:`draw_inputs`) and the verifier's randomness.
    batch_size : int
        Rows per verifier call (``1`` calls the verifier row by row).
    device : torch.device or str
        Where the verifier's inputs are placed.

    Returns
    -------
    Simulation
        The inputs and the ``[rows, k + 1]`` int64 output, both on the CPU.

    Raises
    ------
    ValueError
        The verifier returned a tensor of the wrong shape or dtype.
    """
    if batch_size < 1:
        raise ValueError(f"batch_size must be >= 1, got {batch_size}")
    inputs = draw_inputs(family, rows, seed)
    target_device = torch.device(device)
    if target_device.type == "cpu":
        fork = torch.random.fork_rng(devices=[])
    else:
        index = target_device.index
        if index is None:
            index = getattr(torch, target_device.type).current_device()
        fork = torch.random.fork_rng(devices=[index], device_type=target_device.type)
    outputs = []
    with fork:
        torch.manual_seed(_verifier_seed(seed))
        for begin in range(0, rows, batch_size):
            chunk = [t[begin : begin + batch_size].to(target_device) for t in inputs]
            out = verifier(*chunk)
            expected = (chunk[0].shape[0], family.k + 1)
            if not isinstance(out, torch.Tensor) or tuple(out.shape) != expected:
                shape = tuple(out.shape) if isinstance(out, torch.Tensor) else type(out).__name__
                raise ValueError(f"verifier must return a tensor of shape {expected}, got {shape}")
            if out.dtype not in (torch.int64, torch.int32):
                raise ValueError(f"verifier must return int64 token ids, got {out.dtype}")
            outputs.append(out.to(device="cpu", dtype=torch.int64))
    token_ids = torch.cat(outputs) if outputs else torch.empty(0, family.k + 1, dtype=torch.int64)
    return Simulation(inputs, token_ids)


# --------------------------------------------------------------------------------------
# Distributions (scipy when available, a self-contained implementation otherwise)
# --------------------------------------------------------------------------------------


def _gamma_q(a: float, x: float) -> float:
    """Regularised upper incomplete gamma function ``Q(a, x)`` for ``a > 0``."""
    if x <= 0.0:
        return 1.0
    log_front = a * math.log(x) - x - math.lgamma(a)
    if x < a + 1.0:
        term = total = 1.0 / a
        n = 0
        while abs(term) > abs(total) * 1e-16 and n < 100_000:
            n += 1
            term *= x / (a + n)
            total += term
        return max(0.0, 1.0 - total * math.exp(log_front))
    tiny = 1e-300
    b = x + 1.0 - a
    c = 1.0 / tiny
    d = 1.0 / b
    h = d
    for i in range(1, 100_000):
        an = -i * (i - a)
        b += 2.0
        d = an * d + b
        d = tiny if abs(d) < tiny else d
        c = b + an / c
        c = tiny if abs(c) < tiny else c
        d = 1.0 / d
        step = d * c
        h *= step
        if abs(step - 1.0) < 1e-16:
            break
    return math.exp(log_front) * h


def chi2_sf(statistic: float, df: int) -> float:
    """Upper tail ``P(X >= statistic)`` of a chi-square variable with ``df`` degrees of freedom.

    Uses :func:`scipy.stats.chi2.sf` when scipy is installed and a regularised incomplete
    gamma function otherwise. ``df = 0`` (a point mass at 0) gives 1.

    Examples
    --------
    >>> round(chi2_sf(3.841458820694124, 1), 6)
    0.05
    """
    if df <= 0 or statistic <= 0.0:
        return 1.0
    if math.isinf(statistic):
        return 0.0
    try:
        from scipy.stats import chi2
    except ImportError:
        return _gamma_q(df / 2.0, statistic / 2.0)
    return float(chi2.sf(statistic, df))


def ncx2_sf(statistic: float, df: int, noncentrality: float) -> float:
    """Upper tail of a non-central chi-square variable (``df`` and ``noncentrality``).

    Uses :func:`scipy.stats.ncx2.sf` when scipy is installed, otherwise the Poisson mixture
    ``sum_i Pois(i; lambda / 2) Q(df / 2 + i, statistic / 2)``.

    Examples
    --------
    >>> round(ncx2_sf(10.0, 3, 0.0), 6) == round(chi2_sf(10.0, 3), 6)
    True
    """
    if noncentrality <= 0.0:
        return chi2_sf(statistic, df)
    try:
        from scipy.stats import ncx2
    except ImportError:
        pass
    else:
        return float(ncx2.sf(statistic, df, noncentrality))
    mu = noncentrality / 2.0
    last = int(mu + 12.0 * math.sqrt(mu) + 40.0)
    total = 0.0
    for i in range(last + 1):
        weight = math.exp(-mu + i * math.log(mu) - math.lgamma(i + 1.0))
        total += weight * _gamma_q(df / 2.0 + i, statistic / 2.0)
    return min(total, 1.0)


def _bisect(function: Callable[[float], float], low: float, high: float) -> float:
    """Root of an increasing function on ``[low, high]`` by bisection."""
    for _ in range(200):
        middle = 0.5 * (low + high)
        if function(middle) < 0.0:
            low = middle
        else:
            high = middle
        if high - low <= 1e-12 * max(1.0, high):
            break
    return 0.5 * (low + high)


def chi2_isf(alpha: float, df: int) -> float:
    """Critical value ``c`` with ``P(X >= c) = alpha`` for a chi-square variable.

    Examples
    --------
    >>> round(chi2_isf(0.05, 1), 4)
    3.8415
    """
    if not 0.0 < alpha < 1.0:
        raise ValueError(f"alpha must lie in (0, 1), got {alpha}")
    if df <= 0:
        return 0.0
    high = df + 10.0
    while chi2_sf(high, df) > alpha:
        high *= 2.0
    return _bisect(lambda x: alpha - chi2_sf(x, df), 0.0, high)


def detectable_tv(rows: int, df: int, alpha: float, power: float = 0.99) -> float:
    """Total-variation deviation a chi-square test detects with the given power, whatever its shape.

    A test at level ``alpha`` with ``df`` degrees of freedom on ``rows`` counts rejects with
    probability ``power`` once the non-centrality ``lambda = rows * D`` reaches the value
    ``lambda*`` solving ``P(ncx2(df, lambda*) >= c_alpha) = power``, where
    ``D = sum_x (o(x) - q(x))^2 / q(x)`` is the chi-square divergence of the tested law ``o``
    from the target ``q``. Cauchy-Schwarz gives ``D >= 4 TV^2`` for any deviation, so every
    deviation with ``TV >= sqrt(lambda* / (4 rows))`` is detected with at least that power.
    (With several contexts pooled, the same bound holds for the count-weighted mean TV.)
    This relies on the usual large-sample chi-square approximation, and deviations hidden
    inside merged cells are not seen.

    Parameters
    ----------
    rows : int
        Counts entering the test.
    df : int
        Degrees of freedom of the test (``>= 1``).
    alpha : float
        Level of the test (its false-failure rate).
    power : float
        Required probability of failing the deviation.

    Returns
    -------
    float
        The smallest total-variation distance detected with probability ``power``.

    Examples
    --------
    >>> round(detectable_tv(100_000, 7, 1e-4), 4)
    0.0116
    """
    if rows <= 0 or df <= 0:
        return math.inf
    critical = chi2_isf(alpha, df)
    high = 1.0
    while ncx2_sf(critical, df, high) < power:
        high *= 2.0
    noncentrality = _bisect(lambda lam: ncx2_sf(critical, df, lam) - power, 0.0, high)
    return math.sqrt(noncentrality / (4.0 * rows))


# --------------------------------------------------------------------------------------
# Report
# --------------------------------------------------------------------------------------


@dataclass(frozen=True)
class PositionResult:
    """The chi-square test of one output position.

    Attributes
    ----------
    position : int
        Output column ``n`` (``0 .. k``).
    emitted : int
        Rows in which position ``n`` was emitted.
    contexts : int
        Previous tokens that contributed at least one degree of freedom.
    statistic : float
        Chi-square statistic summed over contexts (``inf`` if a token with zero target
        probability was emitted).
    df : int
        Degrees of freedom summed over contexts.
    p_value : float
        Upper tail of ``statistic`` under the chi-square law with ``df`` degrees of freedom.
    tv : float
        Estimated total-variation distance between the emitted and target laws, averaged
        over contexts with weights the context counts. It is biased upwards by sampling
        noise (about ``sqrt(vocab / emitted)``); it is a size, not a test.
    impossible : int
        Emitted tokens whose target probability is zero.
    """

    position: int
    emitted: int
    contexts: int
    statistic: float
    df: int
    p_value: float
    tv: float
    impossible: int


@dataclass(frozen=True)
class ExactnessReport:
    """Outcome of :func:`exactness_report`.

    Attributes
    ----------
    family : str
        Name of the toy pair.
    k, vocab, rows : int
        Drafts per row, vocabulary size, simulated rows.
    positions : tuple of PositionResult
        One chi-square test per output position ``0 .. k``.
    acceptance_rate : float
        Realised acceptance rate of draft position 0.
    expected_acceptance_rate : float
        Its exact value ``sum_x min(q_0(x | start), p_0(x | start))``.
    acceptance_z : float
        ``(realised - expected) / sqrt(expected (1 - expected) / rows)``.
    mean_accepted : float
        Realised mean number of drafts accepted in order.
    expected_mean_accepted : float
        Its exact value.
    mean_accepted_z : float
        ``(realised - expected) / sqrt(exact variance / rows)``.
    malformed_rows : int
        Output rows that break the layout (accepted prefix equal to the drafts, one token in
        ``[0, vocab)``, then ``-1``); they are left out of the other statistics.
    """

    family: str
    k: int
    vocab: int
    rows: int
    positions: tuple[PositionResult, ...]
    acceptance_rate: float
    expected_acceptance_rate: float
    acceptance_z: float
    mean_accepted: float
    expected_mean_accepted: float
    mean_accepted_z: float
    malformed_rows: int

    @property
    def num_tests(self) -> int:
        """Tests the family-wise ``alpha`` is split over: one per position, plus two z-tests."""
        return len(self.positions) + 2

    def p_value_threshold(self, alpha: float) -> float:
        """Bonferroni level of each test: ``alpha / num_tests``."""
        return alpha / self.num_tests

    def z_threshold(self, alpha: float) -> float:
        """Largest ``|z|`` a two-sided z-test at level ``alpha / num_tests`` accepts."""
        return NormalDist().inv_cdf(1.0 - self.p_value_threshold(alpha) / 2.0)

    def failures(self, alpha: float = 1e-4) -> list[str]:
        """Human-readable reasons for failing at family-wise level ``alpha`` (empty: passed)."""
        level, z_max = self.p_value_threshold(alpha), self.z_threshold(alpha)
        reasons = []
        if self.malformed_rows:
            reasons.append(f"{self.malformed_rows} malformed output rows")
        for result in self.positions:
            if result.impossible:
                reasons.append(
                    f"position {result.position}: {result.impossible} tokens with zero target "
                    "probability"
                )
            elif result.p_value < level:
                reasons.append(
                    f"position {result.position}: p-value {result.p_value:.3g} < {level:.3g}"
                )
        for label, z in (
            ("acceptance rate", self.acceptance_z),
            ("mean accepted", self.mean_accepted_z),
        ):
            if not abs(z) < z_max:
                reasons.append(f"{label}: |z| = {abs(z):.3g} >= {z_max:.3g}")
        return reasons

    def passed(self, alpha: float = 1e-4) -> bool:
        """Whether every test passes at family-wise false-failure rate ``alpha`` (Bonferroni).

        Each chi-square p-value must be at least ``alpha / num_tests`` and each ``|z|`` below
        the two-sided normal quantile of the same level; no output row may be malformed and
        no emitted token may have zero target probability.
        """
        return not self.failures(alpha)

    def detectable_tv(self, position: int = 0, alpha: float = 1e-4, power: float = 0.99) -> float:
        """Total variation that the test of ``position`` detects with probability ``power``.

        See :func:`detectable_tv`; the test runs at the Bonferroni level ``alpha / num_tests``
        with the counts and degrees of freedom realised at that position.
        """
        result = self.positions[position]
        return detectable_tv(result.emitted, result.df, self.p_value_threshold(alpha), power)

    def format(self, alpha: float = 1e-4) -> str:
        """A table of every test, marking failures at family-wise level ``alpha``."""
        level, z_max = self.p_value_threshold(alpha), self.z_threshold(alpha)
        verdict = "PASSED" if self.passed(alpha) else "FAILED"
        lines = [
            f"exactness of family {self.family!r}: k={self.k} vocab={self.vocab} "
            f"rows={self.rows}: {verdict} at alpha={alpha:g} "
            f"(per test: p >= {level:.3g}, |z| < {z_max:.3g})",
            f"{'pos':>4} {'emitted':>9} {'ctx':>4} {'chi2':>11} {'df':>4} {'p-value':>10} "
            f"{'TV':>8} {'zero-q':>7}",
        ]
        for r in self.positions:
            flag = "" if r.p_value >= level and not r.impossible else "  <-- FAIL"
            lines.append(
                f"{r.position:>4} {r.emitted:>9} {r.contexts:>4} {r.statistic:>11.3f} {r.df:>4} "
                f"{r.p_value:>10.3g} {r.tv:>8.4f} {r.impossible:>7}{flag}"
            )
        for label, realised, expected, z in (
            (
                "acceptance@0",
                self.acceptance_rate,
                self.expected_acceptance_rate,
                self.acceptance_z,
            ),
            (
                "mean accepted",
                self.mean_accepted,
                self.expected_mean_accepted,
                self.mean_accepted_z,
            ),
        ):
            flag = "" if abs(z) < z_max else "  <-- FAIL"
            lines.append(f"{label:>13}: {realised:.5f} (exact {expected:.5f}, z = {z:+.2f}){flag}")
        lines.append(f"malformed rows: {self.malformed_rows}")
        return "\n".join(lines)

    def __str__(self) -> str:
        return self.format()


def _z_score(realised: float, expected: float, variance: float, count: int) -> float:
    if count == 0:
        return 0.0
    scale = math.sqrt(max(variance, _VARIANCE_FLOOR) / count)
    return (realised - expected) / scale


def _well_formed(token_ids: torch.Tensor, drafts: torch.Tensor, vocab: int) -> torch.Tensor:
    """``[rows]`` bool: accepted drafts, one token in range, then ``-1``."""
    k = drafts.shape[1]
    length = (token_ids != -1).sum(dim=1)
    cols = torch.arange(k + 1)
    body = cols < length.unsqueeze(-1)
    in_vocab = (token_ids >= 0) & (token_ids < vocab)
    ok = (length >= 1) & torch.where(body, in_vocab, token_ids == -1).all(dim=1)
    accepted = cols[:k] < (length - 1).unsqueeze(-1)
    return ok & (~accepted | (token_ids[:, :k] == drafts)).all(dim=1)


def _context_test(observed: torch.Tensor, probs: torch.Tensor) -> tuple[float, int, int]:
    """Chi-square statistic, degrees of freedom and zero-probability hits of one context.

    Cells expected to hold fewer than :data:`MIN_EXPECTED` counts are pooled; a pool still
    too small is merged into the smallest remaining cell, or the context is dropped when no
    cell is large enough.
    """
    count = float(observed.sum())
    impossible = int(observed[probs == 0].sum())
    expected = probs * count
    positive = probs > 0
    big = positive & (expected >= MIN_EXPECTED)
    small = positive & ~big
    cell_expected = expected[big].tolist()
    cell_observed = observed[big].to(torch.float64).tolist()
    if bool(small.any()):
        pool_expected = float(expected[small].sum())
        pool_observed = float(observed[small].sum())
        if pool_expected >= MIN_EXPECTED:
            cell_expected.append(pool_expected)
            cell_observed.append(pool_observed)
        elif cell_expected:
            smallest = min(range(len(cell_expected)), key=cell_expected.__getitem__)
            cell_expected[smallest] += pool_expected
            cell_observed[smallest] += pool_observed
    if len(cell_expected) < 2:
        return 0.0, 0, impossible
    statistic = sum((o - e) ** 2 / e for o, e in zip(cell_observed, cell_expected, strict=True))
    return statistic, len(cell_expected) - 1, impossible


def exactness_report(
    verifier: Verifier,
    family: Family,
    rows: int = 100_000,
    seed: int = 0,
    *,
    batch_size: int = 8192,
    device: torch.device | str = "cpu",
    rule: str = "chain",
) -> ExactnessReport:
    """Test ``verifier`` for exactness on ``rows`` sequences drafted from ``family``.

    For each output position ``n`` and each previous emitted token ``t`` (the start token
    for ``n = 0``), the tokens emitted at ``n`` are compared with ``q_n(. | t)`` by a
    chi-square test (cells with expected count below :data:`MIN_EXPECTED` merged); statistics
    and degrees of freedom are summed over the contexts of a position, giving one p-value
    per position. The realised acceptance rate of draft position 0 and the mean number of
    accepted drafts are compared with their exact values by z-scores. See the module
    documentation for why conditioning on the previous token is the right criterion.

    Parameters
    ----------
    verifier : Verifier
        ``verifier(target_probs [b, k, vocab], bonus_token_ids [b, 1], draft_probs
        [b, k, vocab], draft_token_ids [b, k]) -> [b, k + 1]`` int64, ``-1`` padded.
    family : Family
        The toy pair (see :func:`make_family`).
    rows : int
        Sequences simulated.
    seed : int
        Seeds the drafts and the verifier's randomness (see :func:`simulate`).
    batch_size : int
        Rows per verifier call.
    device : torch.device or str
        Where the verifier runs.
    rule : str
        The rule whose exact acceptance the realised one is compared with: ``"chain"``
        (token by token) or ``"block"`` (see :meth:`Family.accepted_length_law`). The
        distribution tests do not depend on it.

    Returns
    -------
    ExactnessReport
        Use :meth:`ExactnessReport.passed` for a verdict and ``str(report)`` for a table.

    Examples
    --------
    >>> from specsample.sampler import RejectionSampler
    >>> report = exactness_report(RejectionSampler(), make_family("peaked", k=1),
    ...                           rows=2000, seed=3)
    >>> report.passed(), len(report.positions), report.num_tests
    (True, 2, 4)
    """
    simulation = simulate(verifier, family, rows, seed=seed, batch_size=batch_size, device=device)
    k, vocab = family.k, family.vocab
    drafts = simulation.inputs.draft_token_ids
    ok = _well_formed(simulation.token_ids, drafts, vocab)
    token_ids = simulation.token_ids[ok]
    good = token_ids.shape[0]
    length = (token_ids != -1).sum(dim=1)

    counts = torch.zeros((k + 1) * vocab * vocab, dtype=torch.int64)
    for n in range(k + 1):
        emitted = length > n
        if n == 0:
            prev = torch.full((int(emitted.sum()),), family.start, dtype=torch.int64)
        else:
            prev = token_ids[emitted, n - 1]
        index = (n * vocab + prev) * vocab + token_ids[emitted, n]
        counts += torch.bincount(index, minlength=counts.numel())
    counts = counts.view(k + 1, vocab, vocab)

    reference = family.reference()
    positions = []
    for n in range(k + 1):
        statistic, df, impossible, contexts, weighted_tv = 0.0, 0, 0, 0, 0.0
        for context in range(vocab):
            observed = counts[n, context]
            count = int(observed.sum())
            if count == 0:
                continue
            s, d, z = _context_test(observed, reference[n, context])
            statistic, df, impossible = statistic + s, df + d, impossible + z
            contexts += d > 0
            deviation = observed.to(torch.float64) / count - reference[n, context]
            tv = 0.5 * float(deviation.abs().sum())
            weighted_tv += count * tv
        emitted_total = int(counts[n].sum())
        p_value = 0.0 if impossible else chi2_sf(statistic, df)
        positions.append(
            PositionResult(
                position=n,
                emitted=emitted_total,
                contexts=contexts,
                statistic=math.inf if impossible else statistic,
                df=df,
                p_value=p_value,
                tv=weighted_tv / emitted_total if emitted_total else 0.0,
                impossible=impossible,
            )
        )

    accepted = (length - 1).to(torch.float64)
    law = family.accepted_length_law(rule)
    lengths = torch.arange(k + 1, dtype=torch.float64)
    alpha = min(max(float(law[1:].sum()), 0.0), 1.0)
    rate = float((accepted >= 1).to(torch.float64).mean()) if good else math.nan
    mean = float((law * lengths).sum())
    variance = max(float((law * lengths * lengths).sum()) - mean * mean, 0.0)
    realised_mean = float(accepted.mean()) if good else math.nan
    return ExactnessReport(
        family=family.name,
        k=k,
        vocab=vocab,
        rows=rows,
        positions=tuple(positions),
        acceptance_rate=rate,
        expected_acceptance_rate=alpha,
        acceptance_z=_z_score(rate, alpha, alpha * (1.0 - alpha), good),
        mean_accepted=realised_mean,
        expected_mean_accepted=mean,
        mean_accepted_z=_z_score(realised_mean, mean, variance, good),
        malformed_rows=rows - good,
    )
