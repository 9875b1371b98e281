"""Traversal verification: exact enumeration, the reference on injected uniforms, sampling.

Covers :mod:`specsample.rules.tree.traversal` and its walk,
:mod:`specsample.rules.tree.traversal_walk`.

The rule (see :mod:`specsample.rules.tree.traversal`) tries its tests in an order fixed by
the tree: post-order, each node with its sequence-level weight, the weights and rows of a
parent updated after each deleted child. Given the tree, the tests that would follow a
run of failures are therefore deterministic, and the step accepts at the first test that
passes. The reference here, written for float64 enumeration independently of the library,
lists those tests (node, weight, row of the final draw) for a drafted tree; from the list it
gives the exact law of what the step emits, ``P(stop at test t) = prod_{s < t}(1 - w_s) w_t``
followed by a draw from test ``t``'s row, and the run driven by given uniforms (the first
test ``t`` with ``u[node_t] < w_t``).

Exactness criterion, as in :mod:`tests.test_tree`: the emitted stream, continued with target
draws up to ``m = max_depth + 1`` tokens, must have the target's joint law of ``m`` tokens.
The enumeration covers every drafted tree with its probability (the drafting law) and the
verifier's randomness exactly, and must match to 1e-12 on three tree shapes, four families
of rows and both drafting modes the rule is exact for. The vectorised implementation is tied
to the reference twice: on injected uniforms it takes exactly the same decisions, tree after
tree; and sampled on 120_000 trees, its stream passes chi-square tests against the target.

False failures and power: each sampling test fails a correct rule with probability below
1.01e-4 (two chi-square tests at ``ALPHA / 2 = 5e-5`` and a 5-standard-error bound on the
mean tokens per step) and detects, with probability >= 99%, a deviation of TV >= 0.0119 in
the first-two-token law or >= 0.0147 in the three-token law (asserted).
"""

from __future__ import annotations

from collections import defaultdict
from dataclasses import dataclass

import numpy as np
import pytest
import torch

from specsample.methods import (
    METHODS,
    Drafting,
    check_traversal_drafting,
    tree_draftings,
    tree_method,
    tree_methods,
)
from specsample.params.seeding import Seeding, seeding_from
from specsample.random import Stream, counter_uniform
from specsample.rules.block import block_verify
from specsample.rules.tree import (
    TREE_STRIDE,
    check_traversal,
    traversal_expected_tokens,
    traversal_uniforms,
    traversal_verify,
    tree_bounds,
)
from specsample.testing import Family, draw_inputs, make_family
from tests.test_tree import (
    SHAPES,
    VOCAB,
    Law,
    Row,
    Toy,
    Tree,
    _children,
    _depths,
    _draft_trees,
    _draw_trees,
    _emitted_law,
    _max_error,
    _normalise,
    _offset,
    _padded,
    _tv,
    assert_stream_follows_target,
)

EXACT_TOL = 1e-12
ALPHA = 1e-4
"""Per-test false-failure rate of every sampling test (split over its chi-square tests)."""
ROWS = 120_000

TREES: dict[str, list[int]] = {
    "chain": [-1, 0, 1, 2],
    "binary": [-1, 0, 0, 1, 1, 2, 2],
    "irregular": [-1, 0, 1, 1, 0],
}
"""Enumerated shapes: a chain of 3, a full binary tree of depth 2, and root -> {a -> {c, d}, b}
(a = 1, c = 2, d = 3, b = 4: a subtree is tried before a later sibling of its root)."""

TOP_DOWN = {"iid": "mss", "without_replacement": "rrs"}


@dataclass
class Split(Toy):
    """Rows with partly disjoint supports: the target and the draft each put mass on two of
    the four tokens, sharing one, which moves with the path (so many drafts have ``q = 0``
    and many target tokens ``p = 0``)."""

    family: str = "split"

    def _row(self, kind: int, path: tuple[int, ...]) -> Row:
        key = (kind, path)
        if key not in self._rows:
            rng = np.random.default_rng([self.seed, kind, len(path), *path])
            shift = (sum(path) + len(path)) % self.vocab + (kind - 1)
            support = [(shift + j) % self.vocab for j in range(2)]
            row = [0.0] * self.vocab
            for token, value in zip(support, rng.dirichlet([1.0, 1.0]), strict=True):
                row[token] = float(value)
            self._rows[key] = row
        return self._rows[key]


def _toy(family: str, seed: int = 11) -> Toy:
    return Split(seed=seed) if family == "split" else Toy(seed=seed, family=family)


class Markov(Toy):
    """The rows of a :class:`specsample.testing.Family` (position and previous token), as a
    toy keyed by the path: lets the enumeration compare with block verification's own law."""

    def __init__(self, source: Family) -> None:
        super().__init__(vocab=source.vocab)
        self.start = source.start
        self.q = source.reference()
        draft = source.draft.to(torch.float64)
        self.p = draft / draft.sum(-1, keepdim=True)

    def target(self, path: tuple[int, ...]) -> Row:
        return self.q[len(path), path[-1] if path else self.start].tolist()

    def draft(self, path: tuple[int, ...]) -> Row:
        depth = min(len(path), self.p.shape[0] - 1)
        return self.p[depth, path[-1] if path else self.start].tolist()


# --------------------------------------------------------------------------------------
# Reference (float64, written for enumeration)
# --------------------------------------------------------------------------------------


def _weight(w: float, qx: float, px: float) -> float:
    """``min(1, w q(x) / p(x))``, 1 when ``p(x) = 0 < w q(x)``, else 0."""
    if px > 0.0:
        return min(1.0, w * qx / px)
    return 1.0 if w * qx > 0.0 else 0.0


def _tests(
    toy: Toy,
    tree: Tree,
    remove: bool,
    max_depth: int = 64,
    max_children: int = 64,
) -> list[tuple[int, float, Row]]:
    """Every test in the order tried if all failed: ``(node, weight, row of the final draw)``.

    ``remove``: the parent's draft row loses each rejected child's token (without
    replacement); otherwise it is kept (i.i.d.). Children past ``max_children`` (counted
    before skipping), with a token outside the vocabulary, or deeper than ``max_depth`` are
    skipped with their subtrees. The root comes last, with weight 1.
    """
    kids = _children(tree.parents)
    order: list[tuple[int, float, Row]] = []

    def visit(node: int, depth: int, w: float, q: Row, p: Row) -> None:
        for child in kids[node][:max_children]:
            x = tree.tokens[child]
            if depth >= max_depth or not 0 <= x < toy.vocab:
                continue
            context = tree.context(child)
            visit(child, depth + 1, _weight(w, q[x], p[x]), toy.target(context), toy.draft(context))
            residual = [max(w * a - b, 0.0) for a, b in zip(q, p, strict=True)]
            mass = sum(residual)
            denominator = mass + 1.0 - w
            w = 1.0 if node == 0 else mass / denominator if denominator > 0.0 else 0.0
            q = _normalise(residual, q)
            if remove:
                p = _normalise([0.0 if y == x else v for y, v in enumerate(p)], [0.0] * len(p))
        order.append((node, 1.0 if node == 0 else w, q))

    visit(0, 0, 1.0, toy.target(()), toy.draft(()))
    return order


def _traversal_law(toy: Toy, tree: Tree, remove: bool) -> Law:
    """Exact law of what one step emits on ``tree`` (accepted tokens, then one more)."""
    law: Law = defaultdict(float)
    survive = 1.0
    for node, w, q in _tests(toy, tree, remove):
        path = tree.context(node)
        for y, qy in enumerate(q):
            key = (*path, y)
            law[key] += survive * w * qy
        survive *= 1.0 - w
    return dict(law)


def _reference_run(
    toy: Toy, tree: Tree, remove: bool, u: list[float], max_depth: int, max_children: int
) -> tuple[list[int], list[int]]:
    """The rule driven by the library's uniform layout: ``(path, emitted tokens)``."""
    tests = _tests(toy, tree, remove, max_depth, max_children)
    node, _, row = next(t for t in tests if t[0] == 0 or u[t[0]] < t[1])
    path = [node]
    while path[-1] != 0:
        path.append(tree.parents[path[-1]])
    cum = np.cumsum(row)
    last_positive = int(np.searchsorted(cum, cum[-1], side="left"))
    final = min(int(np.searchsorted(cum, u[0] * cum[-1], side="right")), last_positive)
    return path[::-1], [*tree.context(node), final]


def _step(toy: Toy, parents: list[int], drafting: str, law_of: str) -> tuple[Law, float]:
    """Stream law (continued to ``max_depth + 1`` tokens) and mean tokens emitted per step.

    ``law_of`` is ``"traversal"``, ``"traversal-kept"`` (the i.i.d. update whatever the
    drafting) or a top-down rule of :mod:`tests.test_tree`.
    """
    emitted: Law = defaultdict(float)
    for tree, weight in _draft_trees(toy, parents, drafting):
        if law_of == "traversal":
            law = _traversal_law(toy, tree, drafting == "without_replacement")
        elif law_of == "traversal-kept":
            law = _traversal_law(toy, tree, False)
        else:
            law = _emitted_law(toy, tree, law_of)
        for s, w in law.items():
            emitted[s] += weight * w
    mean = sum(len(s) * w for s, w in emitted.items())
    return toy.continue_to(dict(emitted), max(_depths(parents)) + 1), mean


# --------------------------------------------------------------------------------------
# Enumeration
# --------------------------------------------------------------------------------------


@pytest.mark.parametrize("family", ["dirichlet", "close", "sparse", "split"])
@pytest.mark.parametrize("shape", list(TREES))
@pytest.mark.parametrize("drafting", tree_draftings("traversal"))
def test_enumeration_is_exact_and_beats_top_down(drafting: str, shape: str, family: str) -> None:
    """Stream law equals the target's to 1e-12; tokens per step >= the top-down rule's.

    Families: independent Dirichlet(0.5) rows ("dirichlet"), a draft close to the target
    ("close", ``p = 0.7 q + 0.3 r``), a zero in each row ("sparse") and two-token supports
    sharing one token ("split").
    """
    toy = _toy(family)
    parents = TREES[shape]
    law, mean = _step(toy, parents, drafting, "traversal")
    assert abs(sum(law.values()) - 1.0) < EXACT_TOL
    assert _max_error(law, toy.joint(max(_depths(parents)) + 1)) < EXACT_TOL
    _, top_down = _step(toy, parents, drafting, TOP_DOWN[drafting])
    assert mean >= top_down - EXACT_TOL


def test_traversal_gains_over_top_down() -> None:
    """The gain is real: on a Dirichlet toy, binary tree, over 0.03 token per step each way."""
    toy = Toy(seed=3, family="dirichlet")
    for drafting in tree_draftings("traversal"):
        _, mean = _step(toy, TREES["binary"], drafting, "traversal")
        _, top_down = _step(toy, TREES["binary"], drafting, TOP_DOWN[drafting])
        assert mean > top_down + 0.03, drafting


@pytest.mark.parametrize("name", ["random", "markov", "sparse", "peaked"])
def test_on_a_chain_it_is_block_verification(name: str) -> None:
    """Law of the accepted length on a chain of 3 equals block verification's exact law
    (:meth:`specsample.testing.Family.accepted_length_law`), to 1e-12."""
    family = make_family(name, k=3, vocab=4, seed=5)
    toy = Markov(family)
    accepted = torch.zeros(4, dtype=torch.float64)
    for tree, weight in _draft_trees(toy, TREES["chain"], "iid"):
        for s, w in _traversal_law(toy, tree, False).items():
            accepted[len(s) - 1] += weight * w
    block = family.accepted_length_law("block")
    assert float((accepted - block).abs().max()) < EXACT_TOL
    assert float((accepted - family.accepted_length_law("chain")).abs().max()) > 1e-6


def test_refused_and_unsound_variants_are_biased() -> None:
    """Why the drafting mode is required: the i.i.d. update on children drawn without
    replacement, and either update on deterministic (top-k) children, are biased."""
    toy = Toy(seed=11)
    joint = toy.joint(3)
    kept, _ = _step(toy, TREES["binary"], "without_replacement", "traversal-kept")
    assert _tv(kept, joint) > 0.05
    for law_of in ("traversal-kept", "traversal"):
        top_k, _ = _step(toy, TREES["binary"], "deterministic", law_of)
        assert _tv(top_k, joint) > 0.1
    with pytest.raises(ValueError, match="drafting='deterministic' is refused"):
        check_traversal_drafting("deterministic")


def test_disjoint_supports_accept_nothing_and_stay_exact() -> None:
    """Draft and target supports disjoint everywhere: no draft passes, one token per step,
    drawn from the target."""
    parents = torch.tensor(TREES["irregular"])
    target = torch.tensor([[0.6, 0.4, 0.0, 0.0]], dtype=torch.float64).expand(1, 5, 4)
    draft = torch.tensor([[0.0, 0.0, 0.5, 0.5]], dtype=torch.float64).expand(1, 5, 4)
    tokens = torch.tensor([[-1, 2, 3, 2, 3]])
    exact = traversal_expected_tokens(check_traversal(target, tokens, parents, "iid", draft))
    assert exact.tolist() == [1.0]
    u = torch.rand(500, 5, dtype=torch.float64, generator=torch.Generator().manual_seed(0))
    many = (target.expand(500, 5, 4), tokens.expand(500, 5), parents)
    out = traversal_verify(*many, drafting="iid", draft_probs=draft.expand(500, 5, 4), uniforms=u)
    assert bool((out.num_emitted == 1).all())
    assert out.token_ids[:, 0].tolist() == (u[:, 0] >= 0.6).to(torch.int64).tolist()


# --------------------------------------------------------------------------------------
# The vectorised implementation against the reference
# --------------------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("shape", "drafting", "corrupt", "bounds"),
    [
        ("binary", "iid", False, None),
        ("binary", "without_replacement", False, None),
        ("ragged", "iid", False, None),
        ("wide", "without_replacement", False, None),
        ("chain", "iid", False, None),
        ("binary", "iid", True, None),
        ("ragged", "without_replacement", True, None),
        ("binary", "iid", False, (1, 2)),
        ("wide", "iid", True, (2, 2)),
    ],
)
def test_matches_reference_on_injected_uniforms(
    shape: str, drafting: Drafting, corrupt: bool, bounds: tuple[int, int] | None
) -> None:
    """Same uniforms, same decisions: 1000 sparse-toy trees, no disagreement allowed, for
    both walks (the topology shared as ``parents [N]``, and given per row).

    With ``corrupt``, one node in ten gets an out-of-vocabulary token (-1 or ``VOCAB``);
    ``bounds`` truncates the tree (``max_depth``, ``max_children``).
    """
    toy = Toy(seed=5, family="sparse")
    g = torch.Generator().manual_seed(3)
    rows = 1000
    parents = torch.tensor(SHAPES[shape])
    _, tokens, target, draft = _draw_trees(toy, shape, drafting, rows, g)
    if corrupt:
        hit = torch.rand(tokens.shape, generator=g) < 0.1
        bad = torch.where(torch.rand(tokens.shape, generator=g) < 0.5, -1, VOCAB)
        tokens = torch.where(hit, bad, tokens)
    depth, width = bounds or tree_bounds(parents)
    u = torch.rand(rows, len(SHAPES[shape]), dtype=torch.float64, generator=g)
    outs = [
        traversal_verify(
            target,
            tokens,
            topology,
            drafting=drafting,
            draft_probs=draft,
            max_depth=depth,
            max_children=width,
            uniforms=u,
        )
        for topology in (parents, parents.expand(rows, -1))
    ]
    remove = drafting == "without_replacement"
    for b in range(rows):
        tree = Tree(SHAPES[shape], tokens[b].tolist())
        path, emitted = _reference_run(toy, tree, remove, u[b].tolist(), depth, width)
        for out in outs:
            assert out.path[b].tolist() == _padded(path, depth + 1), b
            assert out.token_ids[b].tolist() == _padded(emitted, depth + 1), b
            assert int(out.num_emitted[b]) == len(emitted)


@pytest.mark.parametrize("drafting", tree_draftings("traversal"))
def test_exact_expectation_matches_reference(drafting: Drafting) -> None:
    """:func:`traversal_expected_tokens` on every drafted tree of the irregular shape (both
    walks) equals the reference's expectation to 1e-12, and so does its average over the
    drafting law."""
    toy = Toy(seed=7, family="dirichlet")
    parents = TREES["irregular"]
    trees = _draft_trees(toy, parents, drafting)
    target_tab, draft_tab = toy.tables(2)
    vocab = toy.vocab
    index = torch.tensor(
        [[_code(tree.context(node), vocab) for node in range(len(parents))] for tree, _ in trees]
    )
    tokens = torch.tensor([tree.tokens for tree, _ in trees])
    shared = torch.tensor(parents)
    exact, per_row = (
        traversal_expected_tokens(
            check_traversal(target_tab[index], tokens, topology, drafting, draft_tab[index])
        )
        for topology in (shared, shared.expand(len(trees), -1))
    )
    assert float((exact - per_row).abs().max()) < EXACT_TOL
    reference = [
        sum(
            len(s) * w
            for s, w in _traversal_law(toy, tree, drafting == "without_replacement").items()
        )
        for tree, _ in trees
    ]
    assert float((exact - torch.tensor(reference, dtype=torch.float64)).abs().max()) < EXACT_TOL
    weights = torch.tensor([w for _, w in trees], dtype=torch.float64)
    _, mean = _step(toy, parents, drafting, "traversal")
    assert abs(float((weights * exact).sum()) - mean) < EXACT_TOL


def _code(path: tuple[int, ...], vocab: int) -> int:
    """Index of ``path``'s rows in :meth:`Toy.tables`."""
    value = 0
    for token in path:
        value = value * vocab + token
    return _offset(vocab, len(path)) + value


SAMPLING_CASES = [
    ("binary", "iid", "close", False),
    ("binary", "without_replacement", "dirichlet", False),
    ("ragged", "iid", "sparse", True),
]
"""``(shape, drafting, family, per_row)``: ``per_row`` gives the topology per row (the
general walk) rather than shared (the unrolled one)."""


@pytest.mark.parametrize(("shape", "drafting", "family", "per_row"), SAMPLING_CASES)
def test_sampling_matches_target(
    shape: str, drafting: Drafting, family: str, per_row: bool
) -> None:
    """120_000 sampled trees through the real implementation (float32, drawn uniforms).

    Two chi-square tests of the stream, each at level ``ALPHA / 2 = 5e-5``: the first two
    tokens (16 cells, df <= 15) and all ``m = max_depth + 1 = 3`` tokens (64 cells). A
    deviation of TV >= 0.0119 in the first-two-token law, or >= 0.0147 in the three-token
    law, is detected with probability >= 99% (asserted below). The mean tokens per step must
    also lie within 0.015 of the exact value: ``num_emitted`` lies in ``[1, 3]``, so its mean
    over 120_000 rows has standard error <= 0.0029 and 0.015 is over 5 of them (false
    failure < 1e-6). The false-failure rate of the test is below 1.01e-4.
    """
    toy = Toy(seed=23, family=family)
    g = torch.Generator().manual_seed(200 + len(shape) + len(drafting))
    _, tokens, target, draft = _draw_trees(toy, shape, drafting, ROWS, g)
    parents = torch.tensor(SHAPES[shape])
    if per_row:
        parents = parents.expand(ROWS, -1)
    seeding = seeding_from(ROWS, torch.device("cpu"), generator=g)
    q, p = target.float(), draft.float()
    out = traversal_verify(q, tokens, parents, drafting=drafting, draft_probs=p, seeding=seeding)
    assert assert_stream_follows_target(toy, out, shape, g) == 3
    _, exact = _step(toy, SHAPES[shape], drafting, "traversal")
    assert abs(float(out.num_emitted.double().mean()) - exact) < 0.015


def test_chain_takes_block_verification_decisions() -> None:
    """On chains, fed block verification's uniforms (its ``eta_i`` as node ``i``'s test, its
    residual draw as column 0), traversal accepts exactly as many drafts, row by row."""
    family = make_family("random", k=4, vocab=6, seed=1)
    rows = 5000
    inputs = draw_inputs(family, rows, seed=2)
    u = torch.rand(rows, 5, dtype=torch.float64, generator=torch.Generator().manual_seed(3))
    block = block_verify(
        inputs.target_probs, inputs.draft_probs, inputs.draft_token_ids, inputs.bonus_token_ids, u
    )
    last = inputs.draft_token_ids[:, -1]
    bonus_row = family.target[4, last].unsqueeze(1)
    target = torch.cat([inputs.target_probs, bonus_row], dim=1)
    draft = torch.cat([inputs.draft_probs, torch.zeros_like(bonus_row)], dim=1)
    tokens = torch.cat([torch.full((rows, 1), -1), inputs.draft_token_ids], dim=1)
    out = traversal_verify(
        target,
        tokens,
        torch.arange(-1, 4),
        drafting="iid",
        draft_probs=draft,
        uniforms=u.roll(1, 1),
    )
    assert torch.equal(out.num_emitted - 1, block.num_accepted)
    full = block.num_accepted == 4
    assert bool(full.any()) and bool((block.num_accepted < 4).any())
    assert torch.equal(out.token_ids[:, :4][full], block.token_ids[:, :4][full])


# --------------------------------------------------------------------------------------
# Randomness, API, edge cases
# --------------------------------------------------------------------------------------


def _batch(rows: int = 64) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor, torch.Tensor]:
    toy = Toy(seed=1)
    _, tokens, target, draft = _draw_trees(
        toy, "binary", "iid", rows, torch.Generator().manual_seed(0)
    )
    return tokens, target, draft, torch.tensor(SHAPES["binary"])


def test_uniform_layout_and_seeded_rows() -> None:
    """Seeded rows read :attr:`Stream.TRAVERSAL` at ``pos * TREE_STRIDE + i`` (column 0: the
    final draw); their output depends only on seed, position and their own rows."""
    cpu = torch.device("cpu")
    seeds, positions = torch.tensor([3, -1]), torch.tensor([4, 9])
    u = traversal_uniforms(Seeding.build(2, cpu, seeds=seeds), 7, cpu, positions)
    assert u.shape == (2, 7) and u.dtype == torch.float64
    expected = counter_uniform(
        seeds[:1], 4 * TREE_STRIDE + torch.arange(7).unsqueeze(0), Stream.TRAVERSAL
    )
    assert torch.equal(u[:1], expected)
    tokens, target, draft, parents = _batch(3)
    tokens[2], target[2], draft[2] = tokens[0], target[0], draft[0]
    seeded = torch.tensor([7, -1, 7])
    at = torch.tensor([5, 0, 5])
    kwargs = {"drafting": "iid", "seeding": seeding_from(3, cpu, seeds=seeded), "positions": at}
    out = traversal_verify(target, tokens, parents, draft_probs=draft, **kwargs)  # type: ignore[arg-type]
    alone = traversal_verify(
        target[:1],
        tokens[:1],
        parents,
        drafting="iid",
        draft_probs=draft[:1],
        seeding=seeding_from(1, cpu, seeds=[7]),
        positions=[5],
    )
    assert torch.equal(out.token_ids[0], out.token_ids[2])
    assert torch.equal(out.token_ids[:1], alone.token_ids)
    given = traversal_uniforms(Seeding.build(3, cpu, seeds=seeded), 7, cpu, at)
    again = traversal_verify(
        target, tokens, parents, drafting="iid", draft_probs=draft, uniforms=given
    )
    assert torch.equal(again.token_ids[[0, 2]], out.token_ids[[0, 2]])
    own = traversal_verify(
        target[1:2], tokens[1:2], parents, drafting="iid", draft_probs=draft[1:2],
        seeding=seeding_from(1, cpu, generators={0: torch.Generator().manual_seed(42)}),
    )  # fmt: skip
    beside = traversal_verify(
        target, tokens, parents, drafting="iid", draft_probs=draft,
        seeding=seeding_from(
            3, cpu, seeds=[5, None, None], generators={1: torch.Generator().manual_seed(42)}
        ),
        positions=[0, 0, 0],
    )  # fmt: skip
    assert torch.equal(own.token_ids[0], beside.token_ids[1])


def test_registration_and_refusals() -> None:
    assert "traversal" in tree_methods()
    method = METHODS["traversal"]
    assert (method.drafts, method.exact, method.needs_draft_probs) == ("tree", True, True)
    with pytest.raises(ValueError, match="own entry point, traversal_verify"):
        tree_method("iid", "traversal")
    tokens, target, draft, parents = _batch(2)
    with pytest.raises(ValueError, match="drafting='deterministic' is refused"):
        traversal_verify(target, tokens, parents, drafting="deterministic", draft_probs=draft)
    with pytest.raises(ValueError, match="drafting must be one of"):
        traversal_verify(target, tokens, parents, drafting="topk", draft_probs=draft)  # type: ignore[arg-type]
    with pytest.raises(TypeError, match="drafting must be a str"):
        check_traversal_drafting(1)
    with pytest.raises(ValueError, match="needs draft_probs"):
        traversal_verify(target, tokens, parents, drafting="iid", draft_probs=None)  # type: ignore[arg-type]
    with pytest.raises(ValueError, match="draft_probs must have the shape"):
        traversal_verify(target, tokens, parents, drafting="iid", draft_probs=draft[:, :3])
    with pytest.raises(TypeError, match="draft_probs must be a floating"):
        traversal_verify(target, tokens, parents, drafting="iid", draft_probs=draft.long())
    with pytest.raises(ValueError, match=r"uniforms must have shape \(2, 7\)"):
        traversal_verify(
            target,
            tokens,
            parents,
            drafting="iid",
            draft_probs=draft,
            uniforms=torch.rand(2, 5).double(),
        )
    with pytest.raises(TypeError, match="uniforms must be float64"):
        traversal_verify(
            target, tokens, parents, drafting="iid", draft_probs=draft, uniforms=torch.rand(2, 7)
        )
    with pytest.raises(ValueError, match="seeds/generators"):
        traversal_verify(
            target, tokens, parents, drafting="iid", draft_probs=draft,
            uniforms=torch.rand(2, 7).double(),
            seeding=seeding_from(2, torch.device("cpu"), seeds=[1, 2]),
        )  # fmt: skip
    with pytest.raises(ValueError, match="uniforms must lie in"):
        traversal_verify(
            target, tokens, parents, drafting="iid", draft_probs=draft,
            uniforms=torch.ones(2, 7).double(), strict=True,
        )  # fmt: skip
    with pytest.raises(ValueError, match="max_depth"):
        traversal_verify(target, tokens, parents, drafting="iid", draft_probs=draft, max_depth=-1)
    with pytest.raises(TypeError, match="strict"):
        traversal_verify(target, tokens, parents, drafting="iid", draft_probs=draft, strict=1)  # type: ignore[arg-type]
    with pytest.raises(ValueError, match="num_nodes"):
        traversal_uniforms(Seeding.build(1, torch.device("cpu")), 0, torch.device("cpu"))


def test_edge_cases_without_nan() -> None:
    """``q == p`` everywhere (empty residuals) accepts the first leaf surely; no children
    (``max_children=0``) emits one token from the root row; low precision runs; an empty
    batch returns empty results."""
    row = torch.tensor([0.5, 0.5, 0.0], dtype=torch.float64)
    same = row.expand(4, 5, 3).contiguous()
    tokens = torch.tensor([[-1, 0, 1, 1, 0]]).expand(4, 5)
    parents = torch.tensor(TREES["irregular"])
    for drafting in tree_draftings("traversal"):
        out = traversal_verify(same, tokens, parents, drafting=drafting, draft_probs=same)
        assert out.path[:, :3].tolist() == [[0, 1, 2]] * 4
        exact = traversal_expected_tokens(check_traversal(same, tokens, parents, drafting, same))
        assert exact.tolist() == [3.0] * 4
    none = traversal_verify(same, tokens, parents, drafting="iid", draft_probs=same, max_children=0)
    assert none.num_emitted.tolist() == [1] * 4 and none.path.tolist() == [[0, -1, -1]] * 4
    zero = same.clone()
    zero[:, 0] = torch.tensor([0.0, 0.0, 1.0])
    out = traversal_verify(zero, tokens, parents, drafting="iid", draft_probs=same)
    assert out.token_ids[:, 0].tolist() == [2] * 4
    batch_tokens, target, draft, shared = _batch()
    for dtype in (torch.float16, torch.bfloat16, torch.float32):
        low = traversal_verify(
            target.to(dtype), batch_tokens, shared, drafting="iid", draft_probs=draft.to(dtype)
        )
        assert bool(((low.token_ids[:, 0] >= 0) & (low.token_ids[:, 0] < VOCAB)).all())
    empty = traversal_verify(
        target[:0], batch_tokens[:0], shared, drafting="iid", draft_probs=draft[:0]
    )
    assert empty.path.shape == (0, 3) and empty.num_emitted.shape == (0,)


def test_decoding_loop_never_rereads_a_counter() -> None:
    """Positions advanced by ``num_emitted`` give disjoint TRAVERSAL counter sets."""
    tokens, target, draft, parents = _batch(1)
    position, seen = 0, set[int]()
    for step in range(6):
        counters = set(range(position * TREE_STRIDE, position * TREE_STRIDE + 7))
        assert not counters & seen
        seen |= counters
        out = traversal_verify(
            target, tokens, parents, drafting="iid", draft_probs=draft,
            seeding=seeding_from(1, torch.device("cpu"), seeds=[step]), positions=[position],
        )  # fmt: skip
        position += int(out.num_emitted[0])
