"""Toy draft/target pairs whose rows depend on the position and on the previous token.

A :class:`Family` holds the target rows ``q_j(. | prev)`` and the draft rows
``p_j(. | prev)`` as tables; :func:`make_family` builds the named toy families of
:data:`FAMILIES` and :data:`EXTRA_FAMILIES` from a seed.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass

import torch

from specsample.methods import chain_methods, check_method
from specsample.params.checks import check_int

FAMILIES = ("random", "sparse", "equal", "onehot_draft", "onehot_target", "peaked", "markov")
"""The toy families every exact rule is tested on."""

EXTRA_FAMILIES = ("zipf",)
"""Further families, for comparisons on larger vocabularies."""

MAX_TABLE_ENTRIES = 1 << 22
"""Most entries of a family's target table, ``(k + 1) * vocab ** 2`` (32 MiB in float64).

:func:`make_family` refuses larger families: the tables, their float64 drafts and the
per-context counts of :func:`specsample.testing.exactness_report` all have this size."""

BLOCK_ENUMERATION_LIMIT = 1 << 20
"""Most draft sequences, ``vocab ** k``, that :meth:`Family.accepted_length_law` enumerates
for block verification (each takes a few float64 values per draft position)."""


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

        ``rule`` is an exact chain method (:func:`specsample.methods.chain_methods`).
        ``"chain"`` follows from :meth:`prefix_acceptance`. ``"block"`` (block verification,
        :mod:`specsample.rules.block`) enumerates every draft sequence (``vocab ** k`` of
        them, at most :data:`BLOCK_ENUMERATION_LIMIT`) with its probability; given the
        drafts, the accepted length is the last ``i`` with ``eta_i < h_i`` for independent
        uniforms, so ``P(tau = i) = h_i prod_{j > i} (1 - h_j)``.

        Raises
        ------
        TypeError
            ``rule`` is not a str.
        ValueError
            ``rule`` is unknown, or ``"block"`` would enumerate more than
            :data:`BLOCK_ENUMERATION_LIMIT` draft sequences.

        Examples
        --------
        >>> family = make_family("random", k=2, vocab=4)
        >>> bool(family.accepted_length_law("block")[1:].sum()
        ...      >= family.accepted_length_law("chain")[1:].sum() - 1e-12)
        True
        """
        if check_method(rule, chain_methods(), "rule") == "chain":
            prefix = torch.cat([self.prefix_acceptance(), torch.zeros(1, dtype=torch.float64)])
            return prefix[:-1] - prefix[1:]
        if self.vocab**self.k > BLOCK_ENUMERATION_LIMIT:
            raise ValueError(
                f"rule='block' enumerates vocab ** k = {self.vocab}**{self.k} draft sequences; "
                f"at most {BLOCK_ENUMERATION_LIMIT} (BLOCK_ENUMERATION_LIMIT) are allowed"
            )
        prob, h = self._block_acceptance()
        law = torch.zeros(self.k + 1, dtype=torch.float64)
        survive = torch.ones_like(prob)
        for i in range(self.k, 0, -1):
            law[i] = float((prob * h[i - 1] * survive).sum())
            survive = survive * (1.0 - h[i - 1])
        law[0] = float((prob * survive).sum())
        return law

    def _block_acceptance(self) -> tuple[torch.Tensor, list[torch.Tensor]]:
        """Every draft sequence: its probability ``[vocab ** k]`` and ``h_1 .. h_k``.

        ``h[i - 1]`` (``[vocab ** k]`` float64) is the probability, given the drafts, that
        block verification's test at length ``i`` passes.
        """
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
        return prob, h


def _normalise(rows: torch.Tensor) -> torch.Tensor:
    return rows / rows.sum(dim=-1, keepdim=True)


def _dirichlet(shape: tuple[int, ...], vocab: int, concentration: float) -> torch.Tensor:
    alpha = torch.full((*shape, vocab), concentration, dtype=torch.float64)
    rows = torch.distributions.Dirichlet(alpha).sample()
    return _normalise(rows.clamp(min=0.0))


def _onehot(index: torch.Tensor, vocab: int) -> torch.Tensor:
    return torch.nn.functional.one_hot(index, vocab).to(torch.float64)


_Pair = tuple[torch.Tensor, torch.Tensor]
"""``(target, draft)`` rows, each ``[k + 1, vocab, vocab]`` float64."""


def _random_pair(shape: tuple[int, int], vocab: int) -> _Pair:
    return _dirichlet(shape, vocab, 1.0), _dirichlet(shape, vocab, 1.0)


def _sparse_pair(shape: tuple[int, int], vocab: int) -> _Pair:
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


def _equal_pair(shape: tuple[int, int], vocab: int) -> _Pair:
    target = _dirichlet(shape, vocab, 1.0)
    return target, target.clone()


def _onehot_draft_pair(shape: tuple[int, int], vocab: int) -> _Pair:
    target = _dirichlet(shape, vocab, 1.0)
    return target, _onehot(target.argmax(dim=-1), vocab)


def _onehot_target_pair(shape: tuple[int, int], vocab: int) -> _Pair:
    target = _onehot(torch.randint(vocab, shape), vocab)
    return target, 0.5 * target + 0.5 * _dirichlet(shape, vocab, 1.0)


def _peaked_pair(shape: tuple[int, int], vocab: int) -> _Pair:
    logits = torch.randn(*shape, vocab, dtype=torch.float64)
    noise = torch.randn(*shape, vocab, dtype=torch.float64)
    target = torch.softmax(logits / 0.3, dim=-1)
    return target, torch.softmax((0.7 * logits + 0.7 * noise) / 0.3, dim=-1)


def _markov_pair(shape: tuple[int, int], vocab: int) -> _Pair:
    target = _dirichlet(shape, vocab, 0.3)
    return target, 0.5 * target + 0.5 * _dirichlet(shape, vocab, 0.3)


def _zipf_pair(shape: tuple[int, int], vocab: int) -> _Pair:
    ranks = torch.rand(*shape, vocab).argsort(dim=-1).to(torch.float64) + 1.0
    logits = -1.2 * ranks.log() + 0.5 * torch.randn(*shape, vocab, dtype=torch.float64)
    noise = 0.8 * torch.randn(*shape, vocab, dtype=torch.float64)
    return torch.softmax(logits, dim=-1), torch.softmax(0.8 * (logits + noise), dim=-1)


_BUILDERS: dict[str, Callable[[tuple[int, int], int], _Pair]] = {
    "random": _random_pair,
    "sparse": _sparse_pair,
    "equal": _equal_pair,
    "onehot_draft": _onehot_draft_pair,
    "onehot_target": _onehot_target_pair,
    "peaked": _peaked_pair,
    "markov": _markov_pair,
    "zipf": _zipf_pair,
}


def check_table_size(k: int, vocab: int) -> None:
    """Refuse a family whose target table would exceed :data:`MAX_TABLE_ENTRIES` entries.

    Raises
    ------
    ValueError
        ``(k + 1) * vocab ** 2 > MAX_TABLE_ENTRIES``, naming ``vocab`` and ``k``.

    Examples
    --------
    >>> check_table_size(5, 836)
    >>> check_table_size(5, 837)  # doctest: +ELLIPSIS
    Traceback (most recent call last):
    ...
    ValueError: vocab=837 with k=5 needs tables of (k + 1) * vocab**2 = 4203414 entries, ...
    """
    entries = (k + 1) * vocab * vocab
    if entries > MAX_TABLE_ENTRIES:
        raise ValueError(
            f"vocab={vocab} with k={k} needs tables of (k + 1) * vocab**2 = {entries} entries, "
            f"more than MAX_TABLE_ENTRIES = {MAX_TABLE_ENTRIES}: lower vocab or k"
        )


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
        Vocabulary size (``>= 2``), with ``(k + 1) * vocab ** 2 <= MAX_TABLE_ENTRIES``
        (for example ``vocab <= 836`` at ``k = 5``, ``vocab <= 254`` at ``k = 64``).
    seed : int
        Seeds the draws; the global random state is left untouched.
    start : int
        The token position 0 conditions on.

    Returns
    -------
    Family
        Tables ``target [k + 1, vocab, vocab]`` and ``draft [k, vocab, vocab]`` in float32.

    Raises
    ------
    TypeError
        ``k`` or ``vocab`` is not an int.
    ValueError
        ``name`` is unknown, or ``k`` or ``vocab`` is out of range.

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
    check_int("k", k, 1)
    check_int("vocab", vocab, 2)
    check_table_size(k, vocab)
    with torch.random.fork_rng(devices=[]):
        torch.manual_seed(seed)
        target, draft = _BUILDERS[name]((k + 1, vocab), vocab)
    return Family(
        name=name,
        target=_normalise(target).to(torch.float32),
        draft=_normalise(draft[:k]).to(torch.float32),
        start=start,
    )
