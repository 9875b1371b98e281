"""Which forward runs a model (:mod:`specsample.adapter.choice`), on fake clocks.

The probe keeps, for forwards of 1 row and of several, whichever forward its clock found
faster (the model's own only when faster by a margin and in most rounds), within its round
budget; :class:`CachedLM` runs each shape class by the forward chosen, and greedy
speculative decoding with a mixed choice still gives ``transformers``' greedy tokens. A
pinned forward (argument, then environment variable) wins over any timing; a model the
fused forward does not serve, a row-exact quantized one and a small one are never probed;
a model is probed once per thread count. No test reads a real clock's verdict: the clocks
are fakes that advance by a set cost per forward.
"""

from __future__ import annotations

import functools
from collections.abc import Callable, Iterator
from typing import Any

import pytest
import torch

transformers = pytest.importorskip("transformers")

from specsample.adapter import CachedLM  # noqa: E402
from specsample.adapter import choice as choice_module  # noqa: E402
from specsample.adapter.choice import FORWARD_ENV, ForwardChoice, probe  # noqa: E402
from specsample.adapter.fused import FusedForward  # noqa: E402
from specsample.adapter.quantize import quantize_model  # noqa: E402
from specsample.generate import speculative_generate  # noqa: E402
from tests.tiny_llama import PROMPTS, hf_greedy, make_pair  # noqa: E402

Costs = dict[tuple[str, bool], float]
"""Fake seconds per forward, by forward (``"fused"``, ``"model"``) and several rows."""


class FakeClock:
    """A clock that moves only when a forward runs, by that forward's cost."""

    def __init__(self, costs: Costs) -> None:
        self.costs = costs
        self.time = 0.0
        self.reads = 0

    def now(self, device: Any = None) -> float:
        self.reads += 1
        return self.time

    def charge(self, forward: str, rows: int) -> None:
        self.time += self.costs[forward, rows > 1]


def _fake_run(clock: FakeClock, calls: list[tuple[str, int]]) -> Callable[[str, int], None]:
    def run(forward: str, n: int) -> None:
        calls.append((forward, n))
        clock.charge(forward, n)

    return run


@pytest.mark.parametrize(
    ("fused_one", "model_one", "fused_many", "model_many", "expected"),
    [
        (1.0, 2.0, 1.0, 2.0, (False, False)),
        (2.0, 1.0, 2.0, 1.0, (True, True)),
        (1.0, 2.0, 3.0, 1.0, (False, True)),
        (3.0, 1.0, 1.0, 3.0, (True, False)),
        (1.0, 0.99, 1.0, 0.99, (False, False)),  # within the margin: the fused one stays
    ],
)
def test_the_probe_keeps_the_faster_forward_of_each_shape(
    fused_one: float,
    model_one: float,
    fused_many: float,
    model_many: float,
    expected: tuple[bool, bool],
) -> None:
    costs = {
        ("fused", False): fused_one,
        ("model", False): model_one,
        ("fused", True): fused_many,
        ("model", True): model_many,
    }
    clock = FakeClock(costs)
    calls: list[tuple[str, int]] = []
    chosen = probe(_fake_run(clock, calls), clock=clock.now, rows=5, calls=3, budget=100.0)
    assert (chosen.model_one, chosen.model_many) == expected
    assert chosen.how == "probe"
    assert chosen.timings == pytest.approx((fused_one, model_one, fused_many, model_many))
    assert chosen.seconds == pytest.approx(4 * sum(costs.values()))  # warm-up and 3 rounds
    assert {n for _, n in calls} == {1, 5}


def test_the_model_must_win_most_rounds_not_just_its_fastest_call() -> None:
    seconds = {  # per call: the warm-up, then 3 rounds
        ("fused", 1): iter([1.0, 1.0, 1.0, 1.0]),
        ("model", 1): iter([1.0, 0.5, 2.0, 2.0]),  # one lucky call, then slower
        ("fused", 5): iter([1.0, 1.0, 1.0, 1.0]),
        ("model", 5): iter([1.0, 0.5, 0.5, 0.5]),
    }
    clock = FakeClock({})

    def run(forward: str, n: int) -> None:
        clock.time += next(seconds[forward, n])

    chosen = probe(run, clock=clock.now, rows=5, calls=3, budget=100.0)
    assert chosen.timings[1] == 0.5 < chosen.timings[0]
    assert not chosen.model_one  # fastest call 0.5 < 1.0, but 1 round of 3
    assert chosen.model_many  # 0.5 < 1.0 in every round


@pytest.mark.parametrize(("cost", "rounds"), [(1.0, 2), (1e-3, 5)])
def test_the_budget_bounds_the_rounds(cost: float, rounds: int) -> None:
    clock = FakeClock({(f, many): cost for f in ("fused", "model") for many in (False, True)})
    calls: list[tuple[str, int]] = []
    probe(_fake_run(clock, calls), clock=clock.now, calls=5, min_calls=2, budget=0.5)
    assert len(calls) == 4 * (1 + rounds)  # a warm-up call each, then the rounds


def test_probe_arguments_are_checked() -> None:
    clock = FakeClock({})
    with pytest.raises(ValueError, match="rows"):
        probe(lambda forward, n: None, clock=clock.now, rows=1)
    with pytest.raises(ValueError, match="min_calls"):
        probe(lambda forward, n: None, clock=clock.now, calls=2, min_calls=3)


@pytest.fixture
def probed(monkeypatch: pytest.MonkeyPatch) -> Iterator[Callable[[Any, Costs], FakeClock]]:
    """Probe any model (no size floor) on a fake clock charged by the forwards that run.

    ``probed(model, costs)`` charges ``costs`` per call of the fused forward (any model's)
    and of ``model``'s own forward, and returns the clock.
    """
    monkeypatch.setattr(choice_module, "PROBE_MIN_WEIGHTS", 0)
    monkeypatch.delenv(FORWARD_ENV, raising=False)
    clocks: list[FakeClock] = []
    original = FusedForward.__call__

    def fused_call(self: FusedForward, input_ids: torch.Tensor, *args: Any) -> torch.Tensor:
        for clock in clocks:
            clock.charge("fused", input_ids.numel())
        return original(self, input_ids, *args)

    monkeypatch.setattr(FusedForward, "__call__", fused_call)

    def setup(model: Any, costs: Costs) -> FakeClock:
        clock = FakeClock(costs)
        clocks.append(clock)
        own = model.forward

        @functools.wraps(own)
        def forward(*args: Any, **kwargs: Any) -> Any:
            clock.charge("model", kwargs["input_ids"].numel())
            return own(*args, **kwargs)

        monkeypatch.setattr(model, "forward", forward)
        monkeypatch.setattr(choice_module, "now", clock.now)
        return clock

    yield setup


MODEL_VERIFIES: Costs = {
    ("fused", False): 1.0,
    ("model", False): 2.0,
    ("fused", True): 3.0,
    ("model", True): 1.0,
}


def test_cached_lm_runs_each_shape_by_the_forward_its_probe_chose(probed: Any) -> None:
    target, draft = make_pair(seed=3)
    reference = [hf_greedy(target, prompt, 12) for prompt in PROMPTS[:3]]
    probed(target, MODEL_VERIFIES)
    lm = CachedLM(target)
    assert lm.choice.how == "probe"
    assert (lm.choice.model_one, lm.choice.model_many) == (False, True)
    assert lm.runs == "fused forward at 1 row, transformers' forward at more"
    assert "probe" in lm.describe() and "5 rows 3000.0 / 1000.0 ms" in str(lm.choice)
    assert lm.cache is None  # the probe ran on a cache of its own

    ran: list[tuple[str, int]] = []
    fused = lm.fused
    assert fused is not None
    own = target.forward
    with pytest.MonkeyPatch.context() as patch:
        patch.setattr(lm, "fused", _Spy(fused, ran))
        patch.setattr(target, "forward", functools.wraps(own)(_spy_model(own, ran)))
        lm.reset(1)
        with torch.inference_mode():
            lm.forward(torch.tensor([[1, 2, 3]]), torch.arange(3)[None])
            lm.forward(torch.tensor([[4]]), torch.tensor([[3]]))
    assert ran == [("model", 3), ("fused", 1)]

    out = speculative_generate(lm, PROMPTS[:3], draft, k=4, max_new_tokens=12, adaptive=False)
    assert out.sequences == reference


class _Spy:
    """A fused forward that records its calls."""

    def __init__(self, fused: FusedForward, ran: list[tuple[str, int]]) -> None:
        self.fused, self.ran, self.packed = fused, ran, fused.packed

    def __call__(self, input_ids: torch.Tensor, *args: Any) -> torch.Tensor:
        self.ran.append(("fused", input_ids.numel()))
        return self.fused(input_ids, *args)


def _spy_model(own: Callable[..., Any], ran: list[tuple[str, int]]) -> Callable[..., Any]:
    def forward(*args: Any, **kwargs: Any) -> Any:
        ran.append(("model", kwargs["input_ids"].numel()))
        return own(*args, **kwargs)

    return forward


def test_a_model_slower_at_every_shape_drops_the_fused_forward(probed: Any) -> None:
    target, _ = make_pair(seed=4)
    probed(target, {("fused", False): 2.0, ("model", False): 1.0, **_both(True, 2.0, 1.0)})
    lm = CachedLM(target)
    assert lm.fused is None and lm.runs == "transformers' forward"
    assert lm.describe().endswith("transformers' forward (auto, probe 24.00 s)")


def _both(many: bool, fused: float, model: float) -> Costs:
    return {("fused", many): fused, ("model", many): model}


def test_a_pinned_forward_wins_over_the_probe(probed: Any, monkeypatch: Any) -> None:
    target, _ = make_pair(seed=5)
    clock = probed(target, {**_both(False, 9.0, 1.0), **_both(True, 9.0, 1.0)})
    pinned = CachedLM(target, forward="fused")
    assert pinned.fused is not None and pinned.runs == "fused forward"
    assert str(pinned.choice) == "pinned by forward='fused'" and clock.reads == 0
    assert CachedLM(target, forward="model").fused is None
    assert CachedLM(target, fused=False).choice.source == "fused=False"
    monkeypatch.setenv(FORWARD_ENV, "fused")
    from_env = CachedLM(target)
    assert from_env.fused is not None and from_env.choice.source == f"{FORWARD_ENV}=fused"
    monkeypatch.setenv(FORWARD_ENV, "model")
    assert CachedLM(target).fused is None
    assert CachedLM(target, forward="fused").fused is not None  # the argument wins
    assert clock.reads == 0
    monkeypatch.delenv(FORWARD_ENV)
    assert CachedLM(target).fused is None and clock.reads > 0  # auto: the probe's choice


def test_models_without_a_choice_are_never_probed(monkeypatch: pytest.MonkeyPatch) -> None:
    def no_probe(*args: Any, **kwargs: Any) -> ForwardChoice:
        raise AssertionError("probed")

    monkeypatch.setattr(choice_module, "probe", no_probe)
    monkeypatch.delenv(FORWARD_ENV, raising=False)
    gpt2 = transformers.GPT2LMHeadModel(
        transformers.GPT2Config(vocab_size=32, n_embd=16, n_layer=1, n_head=2, n_positions=32)
    ).eval()
    unserved = CachedLM(gpt2)
    assert unserved.fused is None and unserved.choice.how == "unserved"
    assert unserved.runs == "transformers' forward"

    small = CachedLM(make_pair(seed=6)[0])  # a few thousand weights, under the floor
    assert small.fused is not None and small.choice.how == "small"

    monkeypatch.setattr(choice_module, "PROBE_MIN_WEIGHTS", 0)
    target = quantize_model(make_pair(seed=7)[0].float(), "int8")
    exact = CachedLM(target)
    assert exact.fused is not None and exact.fused.row_exact
    assert exact.choice.how == "row-exact" and exact.runs == "fused forward"


def test_a_model_is_probed_once_per_thread_count(probed: Any) -> None:
    target, _ = make_pair(seed=8)
    clock = probed(target, {**_both(False, 1.0, 2.0), **_both(True, 1.0, 2.0)})
    first = CachedLM(target).choice
    reads = clock.reads
    assert reads > 0 and CachedLM(target).choice is first and clock.reads == reads
    before = torch.get_num_threads()
    torch.set_num_threads(before + 1)
    try:
        assert CachedLM(target).choice is not first and clock.reads > reads
    finally:
        torch.set_num_threads(before)


def test_the_real_probe_leaves_the_logits_alone(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(choice_module, "PROBE_MIN_WEIGHTS", 0)
    monkeypatch.delenv(FORWARD_ENV, raising=False)
    target, _ = make_pair(seed=9)
    lm, plain = CachedLM(target), CachedLM(target, forward="model")
    assert lm.choice.how == "probe" and len(lm.choice.timings) == 4
    assert lm.choice.seconds > 0 and all(t > 0 for t in lm.choice.timings)
    ids, positions = torch.tensor([[5, 1, 9, 2, 7, 3]]), torch.arange(6)[None]
    logits = []
    for each in (lm, plain):
        each.reset(1)
        with torch.inference_mode():
            first = each.forward(ids[:, :5], positions[:, :5], keep=5)
            logits.append(torch.cat([first, each.forward(ids[:, 5:], positions[:, 5:])], 1))
    torch.testing.assert_close(logits[0], logits[1], rtol=1e-9, atol=1e-9)


def test_bad_forward_values_are_refused(monkeypatch: pytest.MonkeyPatch) -> None:
    target, _ = make_pair(seed=10)
    with pytest.raises(ValueError, match="forward must be one of auto, fused, model"):
        CachedLM(target, forward="fast")
    with pytest.raises(TypeError, match="forward must be a str"):
        CachedLM(target, forward=1)  # type: ignore[arg-type]
    with pytest.raises(ValueError, match="contradicts fused=False"):
        CachedLM(target, fused=False, forward="fused")
    monkeypatch.setenv(FORWARD_ENV, "fast")
    with pytest.raises(ValueError, match=f"{FORWARD_ENV} must be one of"):
        CachedLM(target)
