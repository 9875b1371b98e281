"""The sampling parameters of the active sequences (:mod:`specsample.generate.sampling`).

:class:`SamplingState`: each row's draft uniforms read the counter-based stream at its
absolute position (unseeded rows the shared generator, in row order), the processed target
rows equal :func:`specsample.probs.processed_probs`, and rows selected from a call's state
equal a state built for those rows alone.
"""

from __future__ import annotations

import torch

from specsample.generate import SamplingState
from specsample.generate.sampling import DRAFT_STRIDE
from specsample.params import SamplingParams
from specsample.probs import processed_probs
from specsample.random import Stream, counter_uniform

VOCAB = 64


def test_sampling_state_streams_and_processing() -> None:
    cpu = torch.device("cpu")
    positions = torch.tensor([9, 9, 10])
    state = SamplingState.build(3, cpu, SamplingParams(temperature=1.0, seeds=[4, None, 4]))
    u = state.draft_uniforms(positions, 3)
    counters = positions.unsqueeze(1) * DRAFT_STRIDE + torch.arange(3)
    assert torch.equal(
        u[[0, 2]], counter_uniform(torch.tensor([4, 4]), counters[[0, 2]], Stream.DRAFT)
    )
    assert not torch.equal(u[0], u[2])  # the next position reads a stripe of its own
    alone = SamplingState.build(1, cpu, SamplingParams(temperature=1.0, seeds=[4]))
    alone_u = alone.draft_uniforms(positions[:1], 3)
    assert torch.equal(alone_u, u[:1])
    unseeded = [
        SamplingState.build(
            n,
            cpu,
            SamplingParams(
                temperature=1.0, seeds=seeds, generator=torch.Generator().manual_seed(1)
            ),
        )
        for n, seeds in ((1, None), (3, [4, None, 4]))
    ]
    assert torch.equal(
        unseeded[0].draft_uniforms(positions[:1], 2), unseeded[1].draft_uniforms(positions, 2)[1:2]
    )
    mixed = SamplingState.build(
        2, cpu, SamplingParams(temperature=[0.0, 0.5], top_k=[0, 2], seeds=[None, 3])
    )
    logits = torch.randn(2, 3, VOCAB, generator=torch.Generator().manual_seed(0))
    expected = processed_probs(
        logits.reshape(6, VOCAB),
        torch.tensor([0.0] * 3 + [0.5] * 3),
        top_k=torch.tensor([0] * 3 + [2] * 3),
    )
    assert torch.equal(mixed.probs(logits), expected.reshape(2, 3, VOCAB))
    kept = mixed.rows([1])
    assert kept.metadata.inv_temperature.tolist() == [2.0] and kept.seeds == [3]
    assert kept.seeding.seeds is not None and kept.seeding.seeds.tolist() == [3]


def test_selected_rows_equal_a_state_built_for_them_alone() -> None:
    """Rows selected from a call's state (validated once) carry the parameters, host hints,
    unused filters and random sources a state built for those rows alone has."""
    cpu = torch.device("cpu")
    params = {
        "temperature": [0.0, 0.7, 0.0, 1.0, 0.0],
        "top_k": [5, 0, 3, 0, 0],
        "top_p": [0.5, 1.0, 1.0, 0.9, 1.0],
        "min_p": [0.0, 0.0, 0.2, 0.0, 0.0],
        "seeds": [None, 8, 9, None, None],
    }
    generator = torch.Generator().manual_seed(3)
    call = SamplingState.build(5, cpu, SamplingParams(generators={3: generator}, **params))
    for rows in ([0, 2], [0, 2, 4], [1, 3], [4, 3, 1, 0], [3], []):
        chosen = {name: [values[i] for i in rows] for name, values in params.items()}
        own = {j: generator for j, i in enumerate(rows) if i == 3}
        alone = SamplingState.build(len(rows), cpu, SamplingParams(generators=own, **chosen))
        kept = call.rows(rows)
        assert kept.seeds == alone.seeds
        got, want = kept.metadata, alone.metadata
        assert (got.all_greedy, got.any_greedy, got.max_top_k) == (
            want.all_greedy,
            want.any_greedy,
            want.max_top_k,
        )
        for name in ("inv_temperature", "greedy", "top_k", "top_p", "min_p"):
            mine, theirs = getattr(got, name), getattr(want, name)
            assert (mine is None) == (theirs is None), (rows, name)
            assert mine is None or torch.equal(mine, theirs), (rows, name)
        for name in ("seeds", "shared_rows", "seeded"):
            mine, theirs = getattr(kept.seeding, name), getattr(alone.seeding, name)
            assert (mine is None) == (theirs is None), (rows, name)
            assert mine is None or torch.equal(mine, theirs), (rows, name)
        assert kept.seeding.generators == alone.seeding.generators
        assert kept.rows(list(range(len(rows)))[::-1]).seeds == alone.seeds[::-1]
