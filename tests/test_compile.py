"""``torch.compile`` with batch shapes and draft counts that change from call to call.

Engines compile their sampling step, and their batches change every step. Both entry points
are compiled once with ``dynamic=None`` (the default: static first, then dynamic sizes
after a shape changes) and called on four shapes: every call equals the eager output under
the same seeds, nothing crashes, and dynamo records no graph break. The ``eager`` backend
traces exactly what inductor would receive, at a fraction of the compile time. Over thirty
calls whose batch size, draft count (from 1 up), vocabulary and row total all change, a
counting backend shows that ``verify`` is compiled at most twice (dynamo's own count of what
it handed over), and the sampler at most twice plus once for a draft count of 1: its drafts
are a dimension of its input tensors, and dynamo specialises an input size of 1 by design.
"""

from __future__ import annotations

import pytest
import torch
from torch._dynamo.utils import counters
from torch.fx.experimental.proxy_tensor import make_fx

from specsample import RejectionSampler, verify
from specsample.kernels.cpu import compiler
from specsample.params.seeding import Seeding
from specsample.random import Stream, counter_uniform
from specsample.uniforms import step_uniforms

SHAPES = [(8, 4, 50), (5, 3, 50), (3, 2, 50), (6, 5, 50)]
"""``(batch, k, vocab)`` of the successive calls: batch and draft count change every time."""


def _probs_inputs(
    batch: int, k: int, vocab: int, seed: int
) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor, torch.Tensor]:
    """Target probabilities, bonus ids, draft probabilities and draft ids (drawn from them)."""
    generator = torch.Generator().manual_seed(seed)
    target = torch.softmax(torch.randn(batch, k, vocab, generator=generator), -1)
    draft = torch.softmax(torch.randn(batch, k, vocab, generator=generator), -1)
    ids = torch.multinomial(draft.view(-1, vocab), 1, generator=generator).view(batch, k)
    bonus = torch.randint(0, vocab, (batch, 1), generator=generator)
    return target, bonus, draft, ids


@pytest.fixture
def graph_breaks() -> dict[str, int]:
    """Dynamo's graph-break counter, emptied before the test."""
    torch._dynamo.reset()
    counters.clear()
    return counters["graph_break"]


@pytest.mark.slow
def test_compiled_sampler_follows_changing_shapes(graph_breaks: dict[str, int]) -> None:
    """``torch.compile(RejectionSampler())`` on four shapes equals the eager sampler."""
    compiled = torch.compile(RejectionSampler(), backend="eager")
    for index, (batch, k, vocab) in enumerate(SHAPES):
        inputs = _probs_inputs(batch, k, vocab, seed=index)
        seeded = {
            "seeds": torch.arange(batch) + 10 * index,
            "positions": torch.zeros(batch, dtype=torch.int64),
        }
        expected = RejectionSampler()(*inputs, **seeded)
        assert torch.equal(compiled(*inputs, **seeded), expected), (batch, k)
    assert not graph_breaks


@pytest.mark.slow
def test_compiled_verify_follows_changing_shapes(graph_breaks: dict[str, int]) -> None:
    """``torch.compile(verify)`` on four ragged batches equals eager ``verify``."""
    compiled = torch.compile(verify, backend="eager")
    for index, (batch, k, vocab) in enumerate(SHAPES):
        generator = torch.Generator().manual_seed(index)
        counts = [k] * batch
        counts[0] = k - 1
        logits = torch.randn(sum(counts) + batch, vocab, generator=generator)
        drafts = torch.randint(0, vocab, (sum(counts),), generator=generator)
        seeded = {"seeds": list(range(10 * index, 10 * index + batch)), "positions": [0] * batch}
        got = compiled(logits, drafts, counts, temperature=1.0, **seeded)
        expected = verify(logits, drafts, counts, temperature=1.0, **seeded)
        assert torch.equal(got.token_ids, expected.token_ids), (batch, k)
        assert torch.equal(got.num_accepted, expected.num_accepted), (batch, k)
    assert not graph_breaks


class _CountingBackend:
    """A dynamo backend that runs each graph as traced and counts the compilations."""

    def __init__(self) -> None:
        self.compiles = 0

    def __call__(self, graph: torch.fx.GraphModule, inputs: list[torch.Tensor]) -> object:
        self.compiles += 1
        return graph.forward


def _sizes(call: int) -> tuple[int, int, int]:
    """The batch size, draft count and vocabulary of call ``call``: all three change from
    call to call, the first two calls differing in every one, as an engine's soon do.

    Draft counts run from 1 to 5 and vocabularies from 30 to 200. Batches stay at 2 or more:
    dynamo specialises an input size of 0 or 1 by design, so a batch of 1 adds one
    compilation of its own.
    """
    return 2 + (call * 3 + 3) % 8, 1 + (call * 3) % 5, 30 + (call * 37) % 171


@pytest.mark.slow
def test_the_sampler_compiles_at_most_twice_over_thirty_changing_calls(
    graph_breaks: dict[str, int],
) -> None:
    """Changing batch sizes, draft counts and vocabularies, seeds and CPU-tensor positions:
    the counters stay outside the traced values, so dynamo compiles at most twice (static
    first, then dynamic sizes), and once more for the draft count 1, an input size it
    specialises, shared by every such call whatever its batch and vocabulary. Every output
    equals the eager sampler's."""
    backend = _CountingBackend()
    compiled = torch.compile(RejectionSampler(), backend=backend)
    eager = RejectionSampler()
    compiled_at: list[int] = []  # the draft count of each call that compiled a graph
    for call in range(30):
        batch, k, vocab = _sizes(call)
        inputs = _probs_inputs(batch, k, vocab, seed=call)
        options = {"seeds": torch.arange(batch) + 100 * call, "positions": torch.arange(batch)}
        before = backend.compiles
        assert torch.equal(compiled(*inputs, **options), eager(*inputs, **options)), call
        compiled_at += [k] * (backend.compiles - before)
    assert len(compiled_at) <= 3
    assert compiled_at[2:] in ([], [1])
    assert not graph_breaks
    assert compiled.num_draft_tokens == eager.num_draft_tokens
    assert torch.equal(compiled.num_accepted_tokens, eager.num_accepted_tokens)


@pytest.mark.slow
def test_verify_compiles_at_most_twice_over_thirty_changing_calls(
    graph_breaks: dict[str, int],
) -> None:
    """Ragged draft counts as a CPU tensor (with their maximum, from 1 up), row totals, batch
    sizes, vocabularies, seeds and CPU-tensor positions change every call: at most two
    compilations, a draft count of 1 included, no graph break, and every output equals
    eager ``verify``."""
    backend = _CountingBackend()
    compiled = torch.compile(verify, backend=backend)
    for call in range(30):
        batch, k, vocab = _sizes(call)
        generator = torch.Generator().manual_seed(call)
        counts = torch.randint(1, k + 1, (batch,), generator=generator)
        counts[call % batch] = k
        total = int(counts.sum())
        logits = torch.randn(total + batch, vocab, generator=generator)
        drafts = torch.randint(0, vocab, (total,), generator=generator)
        options = {
            "temperature": 0.8,
            "top_k": 20,
            "seeds": torch.arange(batch) + 100 * call,
            "positions": torch.arange(batch) * 7,
            "max_draft_tokens": int(counts.max()),
        }
        got = compiled(logits, drafts, counts, **options)
        expected = verify(logits, drafts, counts, **options)
        assert torch.equal(got.token_ids, expected.token_ids), call
        assert torch.equal(got.num_accepted, expected.num_accepted), call
    assert backend.compiles <= 2
    assert not graph_breaks


def _seedings() -> list[Seeding]:
    """Five rows of each kind: counter-seeded (from a tensor, or from host seeds up to
    ``2**64``), with a generator of their own, or on the shared generator."""
    cpu = torch.device("cpu")
    own = {1: torch.Generator().manual_seed(9)}
    return [
        Seeding.build(5, cpu, seeds=torch.tensor([3, -1, 5, -2, 7])),
        Seeding.build(5, cpu, seeds=[3, None, 2**64 - 5, None, 1], generators=own),
    ]


@pytest.mark.parametrize("k", [0, 1, 4])
def test_a_graph_draws_the_eager_uniforms(k: int, monkeypatch: pytest.MonkeyPatch) -> None:
    """While dynamo traces, a step's uniforms are drawn without a tensor ``k`` columns wide
    (a width it would specialise at 1), and they are the eager numbers for every kind of row."""
    positions, cpu = torch.tensor([0, 3, 7, 11, 2]), torch.device("cpu")
    expected = []
    for seeding in _seedings():
        torch.manual_seed(1)
        expected.append(step_uniforms(seeding, k, cpu, positions))
    monkeypatch.setattr(torch.compiler, "is_compiling", lambda: True)
    for seeding, eager in zip(_seedings(), expected, strict=True):
        torch.manual_seed(1)
        assert torch.equal(step_uniforms(seeding, k, cpu, positions), eager)


def test_counter_hash_is_one_opaque_operator() -> None:
    """The hash reaches a compiler as one node, not as a chain of inlinable integer ops.

    Every xor-shift of the hash reads its input twice; inlined into its consumers, the chain
    grows into an expression tree that took inductor minutes to generate code for.
    """
    compiler.warm_up()  # the compiled CPU loop, where numba is installed, must not run
    seeds, counters_ = torch.arange(3), torch.arange(4).expand(3, 4)
    graph = make_fx(lambda s, c: counter_uniform(s, c, Stream.FINAL))(seeds, counters_)
    calls = [str(node.target) for node in graph.graph.nodes if node.op == "call_function"]
    assert calls.count("specsample.hash_uniform.default") == 1
    expected = counter_uniform(seeds, counters_, Stream.FINAL)
    assert torch.equal(graph(seeds, counters_), expected)
