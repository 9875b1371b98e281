"""Exact verification of a token tree (several drafts per position).

A drafter may propose a *tree* of continuations instead of a single chain: node 0 is the
root (the last committed token), and every other node ``i`` is a drafted token
``draft_token_ids[b, i]`` continuing its parent ``parents[b, i] < i``. Verification walks
down from the root: at each node it tries the node's children in index order, accepts at
most one of them and descends into it; when none is accepted (or the node has no children)
it emits one more token and stops. The emitted tokens (the accepted path, then that one
token) follow the target distribution exactly, provided the rule matches how the children
were drafted. Notation as in the rest of the library: ``q`` is the target distribution,
``p`` the draft distribution.

Row convention: ``target_probs[b, i]`` is the target distribution of the token that
follows node ``i`` (that is, of node ``i``'s children, conditioned on the path from the root
to ``i``), and ``draft_probs[b, i]`` the distribution node ``i``'s children were drawn from.

How the tree was drafted decides the rule, so :func:`tree_verify` always takes the drafting
mode (``drafting``) and derives the rule from it; the modes, their rules and the reasons a
rule is refused for a mode are in the registry, :data:`specsample.methods.TREE_DRAFTINGS`
(:func:`specsample.methods.tree_method` derives and checks):

=========================  ============  =========  ==============================================
``drafting``               rule          traversal  children of a node
=========================  ============  =========  ==============================================
``"iid"``                  ``"mss"``     exact      drawn independently, with replacement, from
                                                    ``p_i``
``"without_replacement"``  ``"rrs"``     exact      drawn from ``p_i`` without replacement, in
                                                    order (sequentially, or by Gumbel-top-k)
``"deterministic"``        ``"onehot"``  refused    chosen without the verifier's randomness
                                                    (draft top-k, n-gram or suffix lookup, ...)
=========================  ============  =========  ==============================================

The "traversal" column says whether :func:`traversal_verify` (below) is exact for the mode.

* **MSS** (multi-round speculative sampling, SpecInfer): child ``x`` is accepted when
  ``u * p(x) < q(x)`` (probability ``min(1, q(x) / p(x))``); on rejection
  ``q <- normalize(max(q - p, 0))`` and the next child is tried; if every child fails, the
  token is drawn from the current ``q``.
* **RRS** (recursive rejection sampling): as MSS, and after each rejection of ``x`` the
  draft becomes ``p <- normalize(p with x removed)``, the law of the next sibling.
* **One-hot** (EAGLE, SGLang): the draft is taken as a point mass on each child: ``x`` is
  accepted when ``u < q(x)``; on rejection ``q <- normalize(q with x removed)``; if every
  child fails, the token is drawn from the remaining ``q``. It needs no draft probabilities
  and is exact for *any* children that do not depend on the verifier's random numbers,
  sampled ones included (only with lower acceptance than MSS or RRS).

An explicit ``method`` is accepted when it is exact for the stated drafting (``"onehot"`` for
every mode, otherwise the derived rule) and refused with a :class:`ValueError` otherwise:
MSS or RRS on deterministic children is badly biased (each child is treated as a sample
from ``p`` while it is not: a total variation of 0.3 in the first token on small examples),
MSS on children drawn without replacement is biased (it ignores that a later sibling cannot
repeat an earlier one), RRS on i.i.d. children is biased (it assumes the opposite), and MSS
or RRS without ``draft_probs`` cannot be run. Greedy decoding (temperature 0) has its own function,
:func:`tree_verify_greedy`.

**Traversal verification** (Weng, Hu et al. 2025, :func:`traversal_verify`, method
``"traversal"``) tries the tree the other way, leaf to root in post-order: each node is
tested with block verification's weight of its whole path,
``w_c = min(1, w_parent q(x) / p(x))``, and a rejected node is deleted, its parent's target row
replaced by ``normalize(max(w q - p, 0))`` and its weight by block verification's
``Z / (Z + 1 - w)``, so that a path through a rejected ancestor's sibling can still be
accepted. It needs ``draft_probs`` and is exact for ``"iid"`` children (the draft row is kept,
as in MSS) and for ``"without_replacement"`` children (the draft row loses each rejected
token, as in RRS); ``"deterministic"`` children are refused. On a chain it is block
verification. Its uniforms are laid out per node (:func:`traversal_uniforms`), which is why
it has its own entry point rather than a ``method`` of :func:`tree_verify`; the derivation is
in :mod:`~specsample.rules.tree.traversal`.

Edge cases, all of which keep the output exact:

* A node whose parent is ``-1`` (padding) or not smaller than its own index is not a child
  of anything. A child whose token lies outside ``[0, vocab)`` is skipped (its slot's uniform
  goes unused). Either way the node and its subtree are never visited, as if absent.
* A residual with no mass (after MSS or RRS, only when ``q == p``, which then rejects with
  probability zero; after the one-hot rule, only when the rejected child had ``q(x) = 1``,
  likewise) falls back to the current target row, the ``q`` in force before the update.
  A draft row emptied by RRS (every token of ``p`` already drafted) becomes all zeros: no
  further child can be a sample from it. No division by zero, hence no NaN, ever occurs.
* ``max_depth`` and ``max_children`` bound the loops. Smaller values than the tree's own
  truncate it (deeper nodes, or later siblings, are ignored), which is still exact: the
  first children of an i.i.d. or without-replacement draw are such a draw themselves.

The work is vectorised over the batch, with Python loops over the depth and over the child
slots of the current node only. Nothing synchronises with the device: every branch is a
:func:`torch.where`, and the loop bounds are host integers (given, computed from a host
``parents`` tensor, or the safe bound ``N - 1``). Each child test uses its own uniform and the
final draw one more, in the layout of :func:`tree_uniforms`; a seeded request reads counters
that depend only on its seed and its absolute position (see
:mod:`specsample.rules.tree.uniforms`).

The package is split in :mod:`~specsample.rules.tree.structure` (the tree's bounds, input
checks, child table and walk), :mod:`~specsample.rules.tree.uniforms` (the step's random
numbers), :mod:`~specsample.rules.tree.verify` (the top-down rules),
:mod:`~specsample.rules.tree.traversal` (traversal verification) and
:mod:`~specsample.rules.tree.traversal_walk` (its post-order walk).
"""

from specsample.methods import Drafting, TreeMethod
from specsample.rules.tree.structure import TreeVerifyResult, tree_bounds
from specsample.rules.tree.traversal import (
    check_traversal,
    traversal_expected_tokens,
    traversal_verify,
)
from specsample.rules.tree.uniforms import TREE_STRIDE, traversal_uniforms, tree_uniforms
from specsample.rules.tree.verify import tree_verify, tree_verify_greedy

__all__ = [
    "TREE_STRIDE",
    "Drafting",
    "TreeMethod",
    "TreeVerifyResult",
    "check_traversal",
    "traversal_expected_tokens",
    "traversal_uniforms",
    "traversal_verify",
    "tree_bounds",
    "tree_uniforms",
    "tree_verify",
    "tree_verify_greedy",
]
