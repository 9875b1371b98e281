"""Input validation: each error names the argument at fault and has the right type.

Shape, dtype and device errors are raised with or without strict mode; value errors (ids
out of range, negative or non-finite probabilities, rows not summing to 1) only in strict
mode, and without it the same inputs run to completion.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import pytest
import torch

from specsample.sampler import RejectionSampler

BATCH, K, VOCAB = 3, 4, 6

Inputs = dict[str, torch.Tensor]


def _valid() -> Inputs:
    generator = torch.Generator().manual_seed(0)
    target = torch.rand(BATCH, K, VOCAB, generator=generator) + 0.1
    draft = torch.rand(BATCH, K, VOCAB, generator=generator) + 0.1
    return {
        "target_probs": target / target.sum(dim=-1, keepdim=True),
        "bonus_token_ids": torch.randint(VOCAB, (BATCH, 1), generator=generator),
        "draft_probs": draft / draft.sum(dim=-1, keepdim=True),
        "draft_token_ids": torch.randint(VOCAB, (BATCH, K), generator=generator),
    }


def _call(sampler: RejectionSampler, inputs: Inputs, **kwargs: torch.Tensor) -> torch.Tensor:
    return sampler(
        inputs["target_probs"],
        inputs["bonus_token_ids"],
        inputs["draft_probs"],
        inputs["draft_token_ids"],
        **kwargs,
    )


def _replace(name: str, make: Callable[[torch.Tensor], torch.Tensor]) -> Callable[[], Inputs]:
    def build() -> Inputs:
        inputs = _valid()
        inputs[name] = make(inputs[name])
        return inputs

    return build


def _set(index: tuple[int, ...], value: float | int) -> Callable[[torch.Tensor], torch.Tensor]:
    def make(tensor: torch.Tensor) -> torch.Tensor:
        tensor = tensor.clone()
        tensor[index] = value
        return tensor

    return make


META = torch.device("meta")

STRUCTURE_ERRORS = [
    # rank
    ("target_probs", ValueError, lambda t: t[:, 0]),
    ("target_probs", ValueError, lambda t: t.unsqueeze(0)),
    ("draft_probs", ValueError, lambda t: t[:, 0]),
    ("draft_token_ids", ValueError, lambda t: t[:, 0]),
    ("draft_token_ids", ValueError, lambda t: t.unsqueeze(-1)),
    ("bonus_token_ids", ValueError, lambda t: t.unsqueeze(-1)),
    # shape
    ("draft_probs", ValueError, lambda t: torch.cat([t, t[:, :1]], dim=1)),
    ("draft_probs", ValueError, lambda t: t[..., :-1]),
    ("draft_probs", ValueError, lambda t: t[:-1]),
    ("draft_token_ids", ValueError, lambda t: t[:, :-1]),
    ("draft_token_ids", ValueError, lambda t: t[:-1]),
    ("bonus_token_ids", ValueError, lambda t: torch.cat([t, t], dim=1)),
    ("bonus_token_ids", ValueError, lambda t: t[:-1]),
    ("target_probs", ValueError, lambda t: t[..., :0]),
    # dtype
    ("target_probs", TypeError, lambda t: (t * 100).to(torch.int64)),
    ("target_probs", TypeError, lambda t: t.to(torch.float16)),
    ("draft_probs", TypeError, lambda t: (t * 100).to(torch.int32)),
    ("draft_probs", TypeError, lambda t: t.to(torch.float64)),
    ("draft_probs", TypeError, lambda t: t.to(torch.bfloat16)),
    ("draft_token_ids", TypeError, lambda t: t.to(torch.float32)),
    ("draft_token_ids", TypeError, lambda t: t.to(torch.uint8)),
    ("bonus_token_ids", TypeError, lambda t: t.to(torch.float64)),
    ("bonus_token_ids", TypeError, lambda t: t.to(torch.bool)),
    # not a tensor
    ("target_probs", TypeError, lambda t: t.tolist()),
    ("draft_token_ids", TypeError, lambda t: t.numpy()),
    # device
    ("draft_probs", ValueError, lambda t: t.to(META)),
    ("draft_token_ids", ValueError, lambda t: t.to(META)),
    ("bonus_token_ids", ValueError, lambda t: t.to(META)),
]


@pytest.mark.parametrize("strict", [False, True], ids=["lenient", "strict"])
@pytest.mark.parametrize(("name", "error", "make"), STRUCTURE_ERRORS)
def test_structure_errors_name_the_argument(
    name: str, error: type[Exception], make: Callable[[torch.Tensor], torch.Tensor], strict: bool
) -> None:
    inputs = _replace(name, make)()
    with pytest.raises(error, match=name):
        _call(RejectionSampler(strict_mode=strict), inputs)


def test_target_on_another_device_names_the_others() -> None:
    """With the target on ``meta`` the first other argument is reported as misplaced."""
    inputs = _valid()
    inputs["target_probs"] = inputs["target_probs"].to(META)
    with pytest.raises(ValueError, match="bonus_token_ids"):
        _call(RejectionSampler(), inputs)


@pytest.mark.parametrize("strict", [False, True], ids=["lenient", "strict"])
@pytest.mark.parametrize(
    ("name", "error", "value"),
    [
        ("seeds", TypeError, torch.zeros(BATCH)),
        ("seeds", ValueError, torch.zeros(BATCH + 1, dtype=torch.int64)),
        ("seeds", ValueError, torch.zeros(BATCH, dtype=torch.int64, device=META)),
        ("positions", TypeError, torch.zeros(BATCH, dtype=torch.int16)),
        ("positions", ValueError, torch.zeros(BATCH, 1, dtype=torch.int64)),
    ],
)
def test_seed_errors_name_the_argument(
    name: str, error: type[Exception], value: torch.Tensor, strict: bool
) -> None:
    with pytest.raises(error, match=name):
        _call(RejectionSampler(strict_mode=strict), _valid(), **{name: value})


VALUE_ERRORS = [
    ("draft_token_ids", _set((1, 2), -1)),
    ("draft_token_ids", _set((0, 0), VOCAB)),
    ("draft_token_ids", _set((2, 3), 1 << 40)),
    ("bonus_token_ids", _set((0, 0), -1)),
    ("bonus_token_ids", _set((2, 0), VOCAB)),
    ("target_probs", _set((1, 2, 3), -0.01)),
    ("draft_probs", _set((0, 0, 0), -1e-6)),
    ("target_probs", _set((2, 1, 0), float("nan"))),
    ("draft_probs", _set((1, 3, 5), float("inf"))),
    ("target_probs", _set((0, 3, 4), float("-inf"))),
    ("target_probs", lambda t: t * 0.9),
    ("draft_probs", lambda t: t * 1.1),
    ("draft_probs", _set((2, 0), 0.0)),
]


@pytest.mark.parametrize(("name", "make"), VALUE_ERRORS)
def test_value_errors_only_in_strict_mode(
    name: str, make: Callable[[torch.Tensor], torch.Tensor]
) -> None:
    inputs = _replace(name, make)()
    with pytest.raises(ValueError, match=name):
        _call(RejectionSampler(strict_mode=True), inputs)
    out = _call(RejectionSampler(strict_mode=False), inputs)
    assert out.shape == (BATCH, K + 1)


def test_strict_mode_accepts_valid_inputs_and_rounding() -> None:
    """Rows off by less than the float32 tolerance (1e-4) and zero probabilities pass."""
    inputs = _valid()
    inputs["target_probs"] = inputs["target_probs"] * (1 + 5e-5)
    inputs["draft_probs"][0, 0] = torch.tensor([1.0, 0, 0, 0, 0, 0])
    inputs["draft_token_ids"][0, 0] = 0
    out = _call(RejectionSampler(strict_mode=True), inputs)
    assert out.shape == (BATCH, K + 1)


@pytest.mark.parametrize("dtype", [torch.float16, torch.bfloat16])
def test_strict_mode_tolerance_follows_the_dtype(dtype: torch.dtype) -> None:
    inputs = _valid()
    inputs["target_probs"] = inputs["target_probs"].to(dtype)
    inputs["draft_probs"] = inputs["draft_probs"].to(dtype)
    _call(RejectionSampler(strict_mode=True), inputs)
    inputs["draft_probs"] = inputs["draft_probs"] * 1.2
    with pytest.raises(ValueError, match="draft_probs"):
        _call(RejectionSampler(strict_mode=True), inputs)


def test_strict_errors_report_the_offending_value() -> None:
    inputs = _replace("draft_token_ids", _set((1, 1), 99))()
    with pytest.raises(ValueError, match=r"draft_token_ids must lie in \[0, 6\), found 99"):
        _call(RejectionSampler(strict_mode=True), inputs)


@pytest.mark.parametrize(
    ("row", "message"),
    [
        ([0.5, 0.7, -0.2, 0.0], "negative"),
        ([0.5, 0.7, 0.2, 0.0], "sum to 1"),
        ([float("inf"), 0.0, 0.0, 0.0], "non-finite"),
        ([float("nan"), 0.0, 0.0, 1.0], "non-finite"),
    ],
)
def test_strict_verify_checks_draft_probabilities_like_the_sampler(
    row: list[float], message: str
) -> None:
    """``verify(strict=True)`` refuses draft rows that are not distributions.

    A negative draft probability would otherwise accept a token the target gives
    probability 0 (token 2 here, whose target logit is -inf).
    """
    from specsample import verify

    logits = torch.tensor([[0.0, 0.0, -float("inf"), 0.0], [0.0, 0.0, 0.0, 0.0]])
    drafts, probs = torch.tensor([2]), torch.tensor([row])
    seeded: dict[str, Any] = {"temperature": 1.0, "seeds": [1], "positions": [0]}
    with pytest.raises(ValueError, match=f"draft_probs .*{message}"):
        verify(logits, drafts, [1], draft_probs=probs, strict=True, **seeded)
    uniform = torch.full((1, 4), 0.25)
    out = verify(logits, drafts, [1], draft_probs=uniform, strict=True, **seeded)
    assert out.token_ids[0, 0] != 2
