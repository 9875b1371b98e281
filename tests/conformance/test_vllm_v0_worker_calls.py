"""Conformance of both samplers with the calls vLLM v0's spec-decode worker makes.

Covers the ``forward`` call forms of :class:`specsample.RejectionSampler` and
:class:`specsample.TypicalAcceptanceSampler` (:mod:`specsample.sampler`) and the alias of
their first argument. vLLM v0's ``SpecDecodeWorker`` calls its sampler by keyword::

    sampler(target_with_bonus_probs=target_probs, bonus_token_ids=bonus_token_ids,
            draft_probs=proposal_probs, draft_token_ids=proposal_token_ids, **extra)

with ``extra`` either ``{"seeded_seqs": {row: torch.Generator}}`` or ``{}``; earlier v0
versions passed ``target_probs=`` (the draft positions only, ``[B, k, V]``) or the four
tensors positionally, later ones ``seeded_seqs`` positionally as a fifth argument. Each call
form is made on both classes (the same set for both), with the target ``[B, k + 1, V]`` or
``[B, k, V]`` as that form passes it, and the outputs are checked to be ``[B, k + 1]`` int64
and equal across the forms: :class:`TypicalAcceptanceSampler` is deterministic, and
:class:`RejectionSampler` gets, per form, freshly seeded generators for the seeded rows and
torch's global generator seeded the same for the others. Giving the target under both names,
or under neither, is a ``TypeError`` naming both.
"""

from __future__ import annotations

import inspect
from collections.abc import Callable
from typing import Any, NamedTuple

import pytest
import torch

from specsample import RejectionSampler, TypicalAcceptanceSampler

BATCH, K, VOCAB = 64, 3, 8
SEEDED_ROWS = (0, 5, 17, 40)
GLOBAL_SEED = 0
SAMPLERS = [RejectionSampler, TypicalAcceptanceSampler]


class Inputs(NamedTuple):
    """What the worker hands its sampler; ``target_with_bonus`` has the bonus row last."""

    target_with_bonus: torch.Tensor
    bonus: torch.Tensor
    draft: torch.Tensor
    ids: torch.Tensor

    @property
    def target(self) -> torch.Tensor:
        """``[B, k, V]``: the target at the draft positions only (earlier v0 versions)."""
        return self.target_with_bonus[:, :-1]


def _normalised(*shape: int, generator: torch.Generator) -> torch.Tensor:
    rows = torch.rand(*shape, generator=generator, dtype=torch.float64) + 1e-3
    return (rows / rows.sum(dim=-1, keepdim=True)).to(torch.float32)


def _inputs() -> Inputs:
    """Random rows, drafts sampled from the draft rows: some accepted, some rejected."""
    generator = torch.Generator().manual_seed(7)
    target = _normalised(BATCH, K + 1, VOCAB, generator=generator)
    draft = _normalised(BATCH, K, VOCAB, generator=generator)
    ids = torch.multinomial(draft.view(-1, VOCAB), 1, generator=generator).view(BATCH, K)
    bonus = torch.randint(VOCAB, (BATCH, 1), generator=generator)
    return Inputs(target, bonus, draft, ids)


def _seeded_seqs() -> dict[int, torch.Generator]:
    """Fresh generators for the seeded rows, seeded the same at every call."""
    return {row: torch.Generator().manual_seed(1000 + row) for row in SEEDED_ROWS}


def _keywords(sampler: Any, x: Inputs, **extra: Any) -> torch.Tensor:
    """The worker's call: every tensor by keyword, the target with its bonus row."""
    return sampler(
        target_with_bonus_probs=x.target_with_bonus,
        bonus_token_ids=x.bonus,
        draft_probs=x.draft,
        draft_token_ids=x.ids,
        **extra,
    )


def _keywords_seeded(sampler: Any, x: Inputs) -> torch.Tensor:
    return _keywords(sampler, x, **{"seeded_seqs": _seeded_seqs()})


def _keywords_no_extras(sampler: Any, x: Inputs) -> torch.Tensor:
    return _keywords(sampler, x, **{})


def _earlier_keywords(sampler: Any, x: Inputs) -> torch.Tensor:
    """vLLM 0.4.x: ``target_probs=`` holding the draft positions only."""
    return sampler(
        target_probs=x.target, bonus_token_ids=x.bonus, draft_probs=x.draft, draft_token_ids=x.ids
    )


def _positional(sampler: Any, x: Inputs) -> torch.Tensor:
    """vLLM 0.4.x: the four tensors positionally, the target ``[B, k, V]``."""
    return sampler(x.target, x.bonus, x.draft, x.ids)


def _positional_seeded(sampler: Any, x: Inputs) -> torch.Tensor:
    """Later v0 versions: ``seeded_seqs`` as a fifth positional argument."""
    return sampler(x.target_with_bonus, x.bonus, x.draft, x.ids, _seeded_seqs())


Call = Callable[[Any, Inputs], torch.Tensor]

SEEDED_FORMS: dict[str, Call] = {
    "keywords, seeded_seqs": _keywords_seeded,
    "positional, fifth seeded_seqs": _positional_seeded,
}
UNSEEDED_FORMS: dict[str, Call] = {
    "keywords, no extras": _keywords_no_extras,
    "target_probs keywords": _earlier_keywords,
    "positional": _positional,
}
FORMS = {**SEEDED_FORMS, **UNSEEDED_FORMS}


def _run(cls: type, form: Call, global_seed: int = GLOBAL_SEED) -> torch.Tensor:
    """A fresh sampler called in ``form``, torch's global generator seeded first."""
    torch.manual_seed(global_seed)
    return form(cls(), _inputs())


@pytest.mark.parametrize("cls", SAMPLERS)
@pytest.mark.parametrize("form", FORMS.values(), ids=FORMS.keys())
def test_every_worker_call_form_gives_the_output_layout(cls: type, form: Call) -> None:
    x = _inputs()
    out = _run(cls, form)
    assert out.shape == (BATCH, K + 1)
    assert out.dtype == torch.int64
    emitted = (out != -1).sum(dim=1)
    cols = torch.arange(K + 1)
    assert bool(torch.where(cols < emitted.unsqueeze(-1), (out >= 0) & (out < VOCAB), True).all())
    accepted = cols[:K] < (emitted - 1).unsqueeze(-1)
    assert bool(torch.where(accepted, out[:, :K] == x.ids, True).all())
    assert 0 < int((emitted - 1).sum()) < BATCH * K


AGREEING = [
    pytest.param(RejectionSampler, SEEDED_FORMS, id="RejectionSampler, seeded forms"),
    pytest.param(RejectionSampler, UNSEEDED_FORMS, id="RejectionSampler, unseeded forms"),
    pytest.param(TypicalAcceptanceSampler, FORMS, id="TypicalAcceptanceSampler, every form"),
]


@pytest.mark.parametrize(("cls", "forms"), AGREEING)
def test_call_forms_with_the_same_randomness_agree(cls: type, forms: dict[str, Call]) -> None:
    """Equal outputs: the same generators per form (typical acceptance draws none)."""
    outputs = {name: _run(cls, form) for name, form in forms.items()}
    first = next(iter(outputs.values()))
    for name, out in outputs.items():
        assert torch.equal(out, first), name


@pytest.mark.parametrize("form", SEEDED_FORMS.values(), ids=SEEDED_FORMS.keys())
def test_seeded_seqs_reach_the_rejection_sampler(form: Call) -> None:
    """Seeded rows follow their generators alone; the others follow the global seed."""
    out, other = _run(RejectionSampler, form), _run(RejectionSampler, form, GLOBAL_SEED + 1)
    seeded = torch.tensor(SEEDED_ROWS)
    assert torch.equal(out[seeded], other[seeded])
    assert not torch.equal(out, other)


def test_both_classes_take_the_same_arguments() -> None:
    """Same positional parameters in the same order, and the ``target_probs`` keyword."""
    shared = []
    for cls in SAMPLERS:
        parameters = inspect.signature(cls.forward).parameters.values()
        positional = [p.name for p in parameters if p.kind is p.POSITIONAL_OR_KEYWORD]
        keyword = {p.name: p.kind for p in parameters if p.kind is p.KEYWORD_ONLY}
        assert keyword["target_probs"] is inspect.Parameter.KEYWORD_ONLY
        shared.append(positional)
    assert (
        shared[0]
        == shared[1]
        == [
            "self",
            "target_with_bonus_probs",
            "bonus_token_ids",
            "draft_probs",
            "draft_token_ids",
            "seeded_seqs",
        ]
    )


@pytest.mark.parametrize("cls", SAMPLERS)
def test_target_under_both_names_is_a_type_error(cls: type) -> None:
    x = _inputs()
    with pytest.raises(TypeError, match="got both target_with_bonus_probs and target_probs"):
        cls()(x.target_with_bonus, x.bonus, x.draft, x.ids, target_probs=x.target)
    with pytest.raises(TypeError, match="got both target_with_bonus_probs and target_probs"):
        cls()(
            target_with_bonus_probs=x.target_with_bonus,
            target_probs=x.target,
            bonus_token_ids=x.bonus,
            draft_probs=x.draft,
            draft_token_ids=x.ids,
        )


@pytest.mark.parametrize("cls", SAMPLERS)
def test_target_under_neither_name_is_a_type_error(cls: type) -> None:
    x = _inputs()
    missing = r"missing the target probabilities: pass target_with_bonus_probs \(or target_probs\)"
    with pytest.raises(TypeError, match=missing):
        cls()(bonus_token_ids=x.bonus, draft_probs=x.draft, draft_token_ids=x.ids)
    with pytest.raises(TypeError, match=missing):
        cls()(None, x.bonus, x.draft, x.ids, {})
