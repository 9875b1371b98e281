"""A statistical harness that checks any chain verifier for exactness.

A verifier is exact when the tokens it emits follow the target model exactly, whatever the
draft model. This package checks that empirically, on toy draft/target pairs small enough
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

The package holds the toy pairs (:mod:`specsample.testing.families`), the simulation
(:mod:`specsample.testing.simulation`), the chi-square tails and tests
(:mod:`specsample.testing.chisquare`) and the report (:mod:`specsample.testing.report`).
Three modules are imported on their own (importing the package does not load them): the
naive reference verifier the benchmark times (:mod:`specsample.testing.reference`), and the
comparison of the rules on the same drafts (:mod:`specsample.testing.compare`, which loads
the verification rules) with their exact values (:mod:`specsample.testing.exact_values`).

Examples
--------
>>> from specsample.sampler import RejectionSampler
>>> family = make_family("markov", k=2, seed=0)
>>> report = exactness_report(RejectionSampler(), family, rows=4000, seed=1)
>>> report.passed(1e-4), report.malformed_rows
(True, 0)
"""

from specsample.testing.chisquare import MIN_EXPECTED, chi2_isf, chi2_sf, detectable_tv, ncx2_sf
from specsample.testing.families import (
    BLOCK_ENUMERATION_LIMIT,
    EXTRA_FAMILIES,
    FAMILIES,
    MAX_TABLE_ENTRIES,
    Family,
    check_table_size,
    make_family,
)
from specsample.testing.joint import joint_test, two_token_joint
from specsample.testing.report import (
    ExactnessReport,
    PositionResult,
    exactness_report,
    well_formed,
)
from specsample.testing.simulation import (
    DRAW_BLOCK_ROWS,
    DRAW_BLOCK_VALUES,
    Simulation,
    Verifier,
    VerifierInputs,
    draw_inputs,
    simulate,
)

__all__ = [
    "BLOCK_ENUMERATION_LIMIT",
    "DRAW_BLOCK_ROWS",
    "DRAW_BLOCK_VALUES",
    "EXTRA_FAMILIES",
    "FAMILIES",
    "MAX_TABLE_ENTRIES",
    "MIN_EXPECTED",
    "ExactnessReport",
    "Family",
    "PositionResult",
    "Simulation",
    "Verifier",
    "VerifierInputs",
    "check_table_size",
    "chi2_isf",
    "chi2_sf",
    "detectable_tv",
    "draw_inputs",
    "exactness_report",
    "joint_test",
    "make_family",
    "ncx2_sf",
    "simulate",
    "two_token_joint",
    "well_formed",
]
