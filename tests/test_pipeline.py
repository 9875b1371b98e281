"""The verification pipeline: randomness per row, counters, syncs, backends, conventions.

Deterministic properties of :mod:`specsample.pipeline` as every entry point reaches it:

* an unseeded row of a mixed batch gets the tokens of the same row verified alone, with the
  same global generator state (the shared stream is consumed by unseeded rows only);
* over 1000 seeded steps with random draft counts, no ``(seed, stream, counter)`` is read
  twice;
* no op that forces a device-to-host synchronisation runs in default mode;
* the backend seam and given uniforms, the v1 convention (given bonus ids, no bonus rows),
  device-resident counts, and temperatures too small for ``1 / T``.
"""

from __future__ import annotations

from collections.abc import Callable, Iterator
from typing import Any

import pytest
import torch
from torch.utils._python_dispatch import TorchDispatchMode

import specsample.params.seeding as seeding_module
import specsample.random as random_module
import specsample.uniforms as uniforms_module
from specsample import RejectionSampler, verify
from specsample.params import metadata
from specsample.random import Stream

VOCAB = 12


def _probs(*shape: int, generator: torch.Generator) -> torch.Tensor:
    return torch.softmax(2.0 * torch.randn(*shape, generator=generator), dim=-1)


def _chain_inputs(batch: int, k: int, seed: int = 0) -> tuple[torch.Tensor, ...]:
    g = torch.Generator().manual_seed(seed)
    q = _probs(batch, k, VOCAB, generator=g)
    p = _probs(batch, k, VOCAB, generator=g)
    ids = torch.multinomial(p.view(-1, VOCAB), 1, generator=g).view(batch, k)
    bonus = torch.randint(0, VOCAB, (batch, 1), generator=g)
    return q, bonus, p, ids


# --------------------------------------------------------------------------------------
# Mixed seeded and unseeded rows
# --------------------------------------------------------------------------------------


@pytest.mark.parametrize("seeding", ["seeded_seqs", "seeds"])
def test_unseeded_row_of_mixed_batch_equals_single_row_call(seeding: str) -> None:
    """Rows 0 and 2 are seeded; row 1 (unseeded) equals row 1 verified alone.

    Each call starts from the same global generator state, so the equality holds only if
    the seeded rows consume nothing of the global stream. Repeated over 50 global seeds so
    that a row whose numbers came from another position in the stream would differ.
    """
    q, bonus, p, ids = _chain_inputs(3, 4)
    for global_seed in range(50):
        kwargs: dict[str, Any] = {}
        args: list[Any] = []
        if seeding == "seeded_seqs":
            args = [{0: torch.Generator().manual_seed(5), 2: torch.Generator().manual_seed(6)}]
        else:
            kwargs.update(seeds=torch.tensor([5, -1, 6]), positions=[0, 0, 0])
        torch.manual_seed(global_seed)
        mixed = RejectionSampler()(q, bonus, p, ids, *args, **kwargs)
        torch.manual_seed(global_seed)
        alone = RejectionSampler()(q[1:2], bonus[1:2], p[1:2], ids[1:2])
        assert torch.equal(mixed[1], alone[0])


def test_unseeded_request_of_mixed_verify_equals_single_request_call() -> None:
    """The same for :func:`verify` with host seeds and a per-request generator."""
    g = torch.Generator().manual_seed(1)
    counts = [3, 2, 4]
    logits = torch.randn(sum(counts) + 3, VOCAB, generator=g)
    ids = torch.randint(0, VOCAB, (sum(counts),), generator=g)
    for global_seed in range(50):
        torch.manual_seed(global_seed)
        mixed = verify(
            logits,
            ids,
            counts,
            seeds=[7, None, None],
            positions=[0, 0, 0],
            generators={2: torch.Generator()},
        )
        torch.manual_seed(global_seed)
        alone = verify(logits[4:7], ids[3:5], [2])
        assert torch.equal(mixed.token_ids[1, :3], alone.token_ids[0])


def test_row_with_its_own_generator_ignores_the_other_rows() -> None:
    """A ``seeded_seqs`` row gives the same tokens alone or in any batch."""
    q, bonus, p, ids = _chain_inputs(4, 3)
    batch = RejectionSampler()(q, bonus, p, ids, {3: torch.Generator().manual_seed(11)})
    alone = RejectionSampler()(
        q[3:], bonus[3:], p[3:], ids[3:], {0: torch.Generator().manual_seed(11)}
    )
    assert torch.equal(batch[3], alone[0])


# --------------------------------------------------------------------------------------
# Counters never repeat
# --------------------------------------------------------------------------------------


@pytest.fixture
def counter_log(monkeypatch: pytest.MonkeyPatch) -> Iterator[list[tuple[int, int, int]]]:
    """Record every ``(seed, stream, counter)`` the counter-based stream is asked for."""
    log: list[tuple[int, int, int]] = []
    original = random_module.counter_uniform

    def recording(
        seeds: torch.Tensor,
        counters: torch.Tensor,
        stream: Stream | int = Stream.ACCEPT,
        *,
        key: torch.Tensor | None = None,
    ) -> torch.Tensor:
        for seed, row in zip(seeds.tolist(), counters.tolist(), strict=True):
            if seed >= 0:
                log.extend((seed, int(stream), c) for c in row)
        return original(seeds, counters, stream, key=key)

    for module in (seeding_module, uniforms_module):  # where the step's numbers are drawn
        monkeypatch.setattr(module, "counter_uniform", recording)
    yield log


def test_no_counter_is_used_twice_over_1000_steps(counter_log: list[tuple[int, int, int]]) -> None:
    """1000 steps of 4 seeded sequences, each with a random draft count in 0..8 per step.

    Positions are the sequences' absolute positions and advance by the emitted tokens, as a
    generation loop does; every counter read by a step the sequence keeps must be new.
    """
    rng = torch.Generator().manual_seed(3)
    lengths = torch.tensor([5, 0, 17, 2])
    seeds = [11, 12, 13, 14]
    for _ in range(1000):
        counts = torch.randint(0, 9, (4,), generator=rng).tolist()
        total = sum(counts)
        logits = torch.randn(total + 4, VOCAB, generator=rng)
        ids = torch.randint(0, VOCAB, (total,), generator=rng)
        out = verify(logits, ids, counts, seeds=seeds, positions=lengths)
        lengths = lengths + out.num_emitted
    assert len(counter_log) > 20_000
    assert len(set(counter_log)) == len(counter_log)
    assert {stream for _, stream, _ in counter_log} == {Stream.ACCEPT, Stream.FINAL}


# --------------------------------------------------------------------------------------
# No hidden synchronisation
# --------------------------------------------------------------------------------------

_SYNC_OPS = {
    "aten::_local_scalar_dense",
    "aten::nonzero",
    "aten::masked_select",
    "aten::equal",
    "aten::is_nonzero",
    "aten::_unique",
    "aten::_unique2",
    "aten::unique_dim",
    "aten::unique_consecutive",
    "aten::unique_dim_consecutive",
}


class SyncRecorder(TorchDispatchMode):
    """Records the ops that force a device-to-host synchronisation on an accelerator.

    Those are the ops whose output size or value must be read on the host (``.item()``,
    ``nonzero``, ``masked_select``, ``equal``, ``is_nonzero``, ``unique``), plus indexing by
    a boolean mask (``aten::index`` with a bool index, which calls ``nonzero``).
    """

    def __init__(self) -> None:
        super().__init__()
        self.found: list[str] = []

    def __torch_dispatch__(
        self, func: Any, types: Any, args: tuple[Any, ...] = (), kwargs: Any = None
    ) -> Any:
        name = func._schema.name
        if name in _SYNC_OPS:
            self.found.append(name)
        if name in ("aten::index", "aten::index_put", "aten::index_put_"):
            indices = args[1] if len(args) > 1 else []
            if any(isinstance(i, torch.Tensor) and i.dtype == torch.bool for i in indices):
                self.found.append(f"{name} (boolean mask)")
        return func(*args, **(kwargs or {}))


def test_sync_recorder_sees_the_ops_it_looks_for() -> None:
    """The recorder is no empty check: each listed kind of op is caught."""
    x = torch.arange(4)
    with SyncRecorder() as recorder:
        int(x.sum())
        x.nonzero()
        x[x > 1]
        torch.equal(x, x)
        torch.unique(x)
    assert len(recorder.found) >= 5


def _device_resident(monkeypatch: pytest.MonkeyPatch) -> None:
    """Treat CPU tensors as tensors on an accelerator: metadata must not read them."""
    monkeypatch.setattr(metadata, "_on_host", lambda _tensor: False)


def _flat_batch(seed: int = 0) -> dict[str, Any]:
    g = torch.Generator().manual_seed(seed)
    counts = [3, 0, 2, 4]
    total = sum(counts)
    return {
        "logits": torch.randn(total + len(counts), VOCAB, generator=g),
        "ids": torch.randint(0, VOCAB, (total,), generator=g),
        "counts": counts,
        "draft_logits": torch.randn(total, VOCAB, generator=g),
    }


_PARAMS: dict[str, dict[str, Any]] = {
    "greedy": {"temperature": [0.0] * 4},
    "sampled": {"temperature": [1.0] * 4},
    "mixed": {"temperature": [0.0, 0.7, 1.0, 0.0]},
    "filters": {
        "temperature": [0.9, 0.0, 1.2, 1.0],
        "top_k": [3, 0, 5, 0],
        "top_p": [0.9, 1.0, 0.8, 1.0],
        "min_p": [0.0, 0.0, 0.05, 0.1],
    },
}


@pytest.mark.parametrize("given", ["lists", "tensors", "device tensors"])
@pytest.mark.parametrize("params", list(_PARAMS))
@pytest.mark.parametrize("drafts", ["probs", "logits", "one-hot"])
@pytest.mark.parametrize("method", ["chain", "block"])
def test_verify_never_synchronises(
    given: str, params: str, drafts: str, method: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    """:func:`verify` in default mode runs no op that would synchronise with a GPU."""
    if method == "block" and drafts == "one-hot":
        pytest.skip("block verification needs draft distributions")
    batch = _flat_batch()
    kwargs: dict[str, Any] = dict(_PARAMS[params])
    counts: Any = batch["counts"]
    if given != "lists":
        kwargs = {name: torch.tensor(value) for name, value in kwargs.items()}
        counts = torch.tensor(counts)
    if given == "device tensors":
        _device_resident(monkeypatch)
        kwargs["max_draft_tokens"] = max(batch["counts"])
        kwargs["seeds"] = torch.tensor([3, -1, 4, -1])
        kwargs["positions"] = torch.tensor([10, 0, 7, 2])
    else:
        kwargs["seeds"] = [3, None, 4, None]
        kwargs["positions"] = [10, 0, 7, 2]
    if drafts == "probs":
        kwargs["draft_probs"] = batch["draft_logits"].softmax(-1)
    elif drafts == "logits":
        kwargs["draft_logits"] = batch["draft_logits"]
    with SyncRecorder() as recorder:
        verify(batch["logits"], batch["ids"], counts, method=method, **kwargs)
    assert recorder.found == []


@pytest.mark.parametrize("method", ["chain", "block"])
@pytest.mark.parametrize(
    "call",
    [
        "plain",
        "with bonus row",
        "seeded_seqs",
        "seeds",
    ],
)
def test_rejection_sampler_never_synchronises(call: str, method: str) -> None:
    """:class:`RejectionSampler` in default mode runs no op that would synchronise."""
    q, bonus, p, ids = _chain_inputs(5, 4)
    args: list[Any] = [q, bonus, p, ids]
    kwargs: dict[str, Any] = {}
    if call == "with bonus row":
        args[0] = torch.cat([q, q[:, :1]], dim=1)
    elif call == "seeded_seqs":
        args.append({1: torch.Generator().manual_seed(1)})
    elif call == "seeds":
        kwargs = {"seeds": torch.tensor([1, -1, 2, -1, 3]), "positions": torch.arange(5)}
    sampler = RejectionSampler(method=method)
    with SyncRecorder() as recorder:
        sampler(*args, **kwargs)
    assert recorder.found == []


# --------------------------------------------------------------------------------------
# Conventions, backends, degenerate parameters
# --------------------------------------------------------------------------------------


def test_given_bonus_ids_match_bonus_rows() -> None:
    """Without bonus rows, ``bonus_token_ids`` is what a fully accepted request emits."""
    batch = _flat_batch(1)
    counts = batch["counts"]
    logits, ids = batch["logits"], batch["ids"]
    greedy = verify(logits, ids, counts, temperature=0.0)
    starts = torch.tensor([0, 4, 5, 8])
    bonus_rows = starts + torch.tensor(counts)
    draft_rows = torch.ones(logits.shape[0], dtype=torch.bool)
    draft_rows[bonus_rows] = False
    bonus = logits[bonus_rows].argmax(-1)
    given = verify(logits[draft_rows], ids, counts, temperature=0.0, bonus_token_ids=bonus)
    assert torch.equal(given.token_ids, greedy.token_ids)
    forced = verify(
        logits[draft_rows],
        logits[draft_rows].argmax(-1),
        counts,
        temperature=0.0,
        bonus_token_ids=bonus.view(-1, 1),
    )
    assert torch.equal(forced.num_accepted, torch.tensor(counts))
    emitted = forced.token_ids.gather(1, torch.tensor(counts).view(-1, 1)).view(-1)
    assert torch.equal(emitted, bonus)


def test_given_uniforms_make_the_step_deterministic() -> None:
    batch = _flat_batch(2)
    u = torch.rand(4, 5, dtype=torch.float64, generator=torch.Generator().manual_seed(0))
    first = verify(batch["logits"], batch["ids"], batch["counts"], uniforms=u, backend="torch")
    again = verify(batch["logits"], batch["ids"], batch["counts"], uniforms=u.clone())
    assert torch.equal(first.token_ids, again.token_ids)
    with pytest.raises(ValueError, match="uniforms must have shape"):
        verify(batch["logits"], batch["ids"], batch["counts"], uniforms=u[:, :3])


def test_unknown_or_unavailable_backend_is_refused() -> None:
    batch = _flat_batch()
    with pytest.raises(ValueError, match="backend must be one of"):
        verify(batch["logits"], batch["ids"], batch["counts"], backend="cuda")
    from specsample.kernels import triton as kernels

    if not kernels.supports(batch["logits"]):
        with pytest.raises(ValueError, match="backend='triton'"):
            verify(batch["logits"], batch["ids"], batch["counts"], backend="triton")


def test_device_counts_need_their_maximum(monkeypatch: pytest.MonkeyPatch) -> None:
    batch = _flat_batch()
    _device_resident(monkeypatch)
    with pytest.raises(ValueError, match="max_draft_tokens"):
        verify(batch["logits"], batch["ids"], torch.tensor(batch["counts"]))
    out = verify(
        batch["logits"],
        batch["ids"],
        torch.tensor(batch["counts"]),
        max_draft_tokens=4,
        temperature=torch.tensor(0.0),
    )
    assert torch.equal(
        out.token_ids,
        verify(batch["logits"], batch["ids"], batch["counts"], temperature=0.0).token_ids,
    )


@pytest.mark.parametrize("temperature", [1e-39, 1e-44, 5e-31])
@pytest.mark.parametrize("given", [float, torch.tensor])
def test_tiny_temperatures_are_greedy(temperature: float, given: Callable[[float], Any]) -> None:
    """A temperature too small for ``1 / T`` in float32 decodes greedily, not to token 0."""
    batch = _flat_batch(3)
    logits = batch["logits"] + 5.0
    out = verify(logits, batch["ids"], batch["counts"], temperature=given(temperature))
    greedy = verify(logits, batch["ids"], batch["counts"], temperature=0.0)
    assert torch.equal(out.token_ids, greedy.token_ids)
    assert bool((greedy.token_ids[:, 0] != 0).any())
