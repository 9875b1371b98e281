"""The row-statistics kernel (:mod:`specsample.kernels.triton.norms`) against PyTorch.

:func:`specsample.kernels.triton.norms.logit_norms` and the Triton backend's ``row_norms``
must give the :class:`~specsample.probs.RowNorms` of :func:`specsample.probs.sampling_norms`:
the argmax (first index on ties, 0 for a row without a distribution), cutoff and shift
exactly, ``log_norm`` to float32 rounding, on random, tied, all ``-inf``, NaN-containing and
``+inf`` rows, greedy, sampled and mixed batches, with and without ``need_norm``, float32,
float16, bfloat16 and float64 logits, vocabularies of one block, of several with a partial
last one, and split among programs (the combining launch).
Filtered batches are ``tests/test_kernels_filters.py``'s. End to end,
:func:`specsample.verify` with ``backend="triton"`` emits the tokens of ``backend="torch"``
on the same seeds: chain and block, greedy, sampled, mixed and filtered requests, ragged
counts with zeros, draft probabilities, draft logits and one-hot drafts.

The kernel runs under Triton's interpreter on CPU tensors, which must be switched on before
triton is first imported (see ``tests/test_kernels.py``): in a plain ``pytest`` run this
module's kernel tests run in the fresh process started by
``test_kernels.py::test_kernels_under_the_interpreter``, and in-process when ``pytest``
itself was started with ``TRITON_INTERPRET=1``. Without triton they are skipped.
"""

from __future__ import annotations

import math
import traceback
from typing import Any

import pytest
import torch
from torch.utils._python_dispatch import TorchDispatchMode

from specsample import backends, verify
from specsample.backends import eager
from specsample.backends import triton as triton_backend
from specsample.kernels.triton import norms
from specsample.params import Requests, SamplingParams
from specsample.params.layout import BatchLayout
from specsample.params.metadata import SamplingMetadata
from specsample.probs import RowNorms, row_norms, sampling_norms
from tests.test_kernels import requires_interpreter

DTYPES = [torch.float32, torch.float16, torch.bfloat16, torch.float64]


def test_triton_backend_runs_the_statistics_kernel() -> None:
    """The Triton backend's statistics slot is the kernel's; the PyTorch backend keeps its."""
    assert backends.get("triton").row_norms is triton_backend.row_norms
    assert backends.get("torch").row_norms is eager.row_norms


def _rows(vocab: int, seed: int) -> torch.Tensor:
    """``[12, vocab]`` logits: random, tied, all ``-inf``, NaN, ``+inf`` and huge rows."""
    gen = torch.Generator().manual_seed(seed)
    logits = torch.randn(12, vocab, generator=gen) * 3
    logits[1] = torch.round(logits[1])  # ties at the largest
    logits[2] = 0.5  # every token tied
    logits[3] = -math.inf
    logits[4, vocab // 2] = math.nan
    logits[5, vocab - 1] = math.inf
    logits[6, 1] = math.inf
    logits[6, vocab - 2] = math.inf
    logits[7, : vocab // 2] = -math.inf
    logits[8, 0] = 3e38
    logits[9, vocab - 1] = 40.0  # the largest in the partial last block
    logits[10, 2] = math.nan
    logits[10, 3] = math.inf
    logits[11, : vocab - 1] = -math.inf
    return logits


def _assert_same(kernel: RowNorms, reference: RowNorms) -> None:
    """Argmax, cutoff, shift and inverse temperature equal; log-norms to float32 rounding."""
    assert torch.equal(kernel.argmax, reference.argmax), (kernel.argmax, reference.argmax)
    for name in ("inv_temperature", "cutoff", "shift"):
        ours, theirs = getattr(kernel, name), getattr(reference, name)
        assert torch.equal(ours.isnan(), theirs.isnan()), name
        assert torch.equal(ours.nan_to_num(0.0), theirs.nan_to_num(0.0)), (name, ours, theirs)
    torch.testing.assert_close(
        kernel.log_norm, reference.log_norm, rtol=2e-6, atol=2e-6, equal_nan=True
    )


SAMPLINGS = {
    "sampled": [0.7, 1.0, 1.3, 0.4],
    "greedy": [0.0],
    "mixed": [0.0, 0.8, 0.0, 1.5],
}


@requires_interpreter
@pytest.mark.filterwarnings("ignore:overflow encountered:RuntimeWarning")
@pytest.mark.parametrize("dtype", DTYPES, ids=str)
def test_statistics_equal_pytorch(dtype: torch.dtype, monkeypatch: pytest.MonkeyPatch) -> None:
    """Every kind of row and batch, one block (vocab 5), several (300: blocks of 128, the
    last partial) and a row split among three programs. (A logit of ``3e38`` overflows
    float32 differences, as in PyTorch; the interpreter's NumPy warns of it.)"""
    monkeypatch.setattr(norms, "INTERPRETER_COLUMNS", 128)
    for vocab, splits in ((5, 1), (300, 1), (300, 3)):
        monkeypatch.setattr(norms, "INTERPRETER_SPLITS", splits)
        logits = _rows(vocab, seed=vocab + splits).to(dtype)
        for name, temperature in SAMPLINGS.items():
            sampling = SamplingMetadata.build(
                logits.shape[0], logits.device, temperature=temperature * (12 // len(temperature))
            )
            for need_norm in (False, True):
                kernel = triton_backend.row_norms(logits, sampling, need_norm=need_norm)
                norm = need_norm or name != "greedy"
                _assert_same(kernel, sampling_norms(logits, sampling, need_norm=norm))


@requires_interpreter
@pytest.mark.filterwarnings("ignore:overflow encountered:RuntimeWarning")
def test_strided_rows_and_empty_batches() -> None:
    """Rows with a stride, columns without a unit stride, no rows at all."""
    logits = _rows(40, seed=1)
    inv = torch.rand(6) + 0.5
    strided = logits[::2]
    _assert_same(norms.logit_norms(strided, inv), row_norms(strided, inv))
    transposed = logits.t().contiguous().t()
    inv = torch.ones(12)
    _assert_same(norms.logit_norms(transposed, inv), row_norms(logits, inv))
    empty = norms.logit_norms(torch.zeros(0, 7), torch.ones(0))
    assert empty.lazy is None and all(field.shape == (0,) for field in empty[:5])


def test_bad_arguments_are_refused_by_name() -> None:
    """Types, dtypes and shapes are checked before any kernel runs."""
    with pytest.raises(TypeError, match="logits"):
        norms.logit_norms([[1.0]], torch.ones(1))  # type: ignore[arg-type]
    with pytest.raises(TypeError, match="logits"):
        norms.logit_norms(torch.zeros(1, 2, dtype=torch.int64), torch.ones(1))
    with pytest.raises(TypeError, match="inv_temperature"):
        norms.logit_norms(torch.zeros(1, 2), torch.ones(1, dtype=torch.float64))
    with pytest.raises(ValueError, match="logits"):
        norms.logit_norms(torch.zeros(2), torch.ones(2))
    with pytest.raises(ValueError, match="logits"):
        norms.logit_norms(torch.zeros(2, 0), torch.ones(2))
    with pytest.raises(ValueError, match="inv_temperature"):
        norms.logit_norms(torch.zeros(2, 3), torch.ones(3))


END_TO_END: dict[str, dict[str, Any]] = {
    "sampled": {"temperature": 0.8},
    "greedy": {"temperature": 0.0},
    "mixed": {"temperature": [0.0, 0.7, 1.0, 0.0, 1.3, 0.9]},
    "filtered": {
        "temperature": [0.0, 0.7, 1.0, 0.0, 1.3, 0.9],
        "top_k": [5, 0, 40, 5, 0, 3],
        "top_p": [1.0, 0.9, 0.8, 1.0, 0.95, 1.0],
        "min_p": 0.05,
    },
}
COUNTS = [3, 0, 2, 4, 1, 0]


def _step(seed: int, vocab: int, draft: str) -> tuple[torch.Tensor, torch.Tensor, dict[str, Any]]:
    """Target logits, drafts favoured in their rows (some accepted, some not), draft rows."""
    gen = torch.Generator().manual_seed(seed)
    total = sum(COUNTS)
    logits = torch.randn(total + len(COUNTS), vocab, generator=gen) * 2
    ids = torch.randint(0, vocab, (total,), generator=gen)
    rows = torch.tensor([start + j for start, n in _starts() for j in range(n)])
    favoured = torch.rand(total, generator=gen) < 0.75
    logits[rows[favoured], ids[favoured]] += 9.0
    extra: dict[str, Any] = {}
    if draft == "probs":
        extra["draft_probs"] = torch.softmax(torch.randn(total, vocab, generator=gen), -1)
    elif draft == "logits":
        extra["draft_logits"] = torch.randn(total, vocab, generator=gen)
    return logits, ids, extra


def _starts() -> list[tuple[int, int]]:
    """Each request's first target row and draft count."""
    starts, row = [], 0
    for n in COUNTS:
        starts.append((row, n))
        row += n + 1
    return starts


@requires_interpreter
@pytest.mark.parametrize("method", ["chain", "block"])
@pytest.mark.parametrize("name", list(END_TO_END))
def test_verify_on_triton_equals_torch(name: str, method: str) -> None:
    """Same tokens, counts and log-probabilities as the PyTorch backend on the same seeds
    (one batch with log-probabilities, which an all-greedy batch then needs normalisers for,
    one without)."""
    drafts = ("probs", "logits") if method == "block" else ("probs", "none")
    accepted = rejected = 0
    for seed, draft in enumerate(drafts):
        logits, ids, extra = _step(seed, 300 if seed else 40, draft)
        outputs = [
            verify(
                logits,
                ids,
                COUNTS,
                method=method,
                backend=backend,
                generator=torch.Generator().manual_seed(seed),
                return_logprobs=seed == 0,
                **extra,
                **END_TO_END[name],
            )
            for backend in ("torch", "triton")
        ]
        reference, kernel = outputs
        assert torch.equal(kernel.token_ids, reference.token_ids), (kernel, reference)
        assert torch.equal(kernel.num_accepted, reference.num_accepted)
        if seed == 0:
            torch.testing.assert_close(kernel.logprobs, reference.logprobs, equal_nan=True)
        accepted += int(kernel.num_accepted.sum())
        rejected += int((kernel.num_accepted < torch.tensor(COUNTS)).sum())
    assert accepted > 0 and rejected > 0, (accepted, rejected)


class _DeviceWork(TorchDispatchMode):
    """Records the tensor operations issued outside Triton's interpreter (which runs the
    kernels) that do work on the device: allocations and views are left out."""

    FREE = ("empty", "view", "detach", "alias", "as_strided", "slice", "select", "unsqueeze")

    def __init__(self) -> None:
        super().__init__()
        self.work: list[str] = []

    def __torch_dispatch__(self, func: Any, types: Any, args: Any = (), kwargs: Any = None) -> Any:
        name = func.__name__.split(".")[0]
        in_kernel = any("interpreter" in frame.filename for frame in traceback.extract_stack())
        if not in_kernel and name not in self.FREE:
            self.work.append(name)
        return func(*args, **(kwargs or {}))


@requires_interpreter
@pytest.mark.parametrize("filtered", [False, True])
def test_a_step_with_built_parameters_launches_little_beside_the_kernels(filtered: bool) -> None:
    """With its layout and requests built once, a step on the Triton backend does no device
    work outside its kernels but draw its uniforms (a draw and the final draw moved last)
    and give each row its request's temperature and greedy flag (and filters): the row
    statistics' outputs are written by their kernel, the rows' requests come with the layout,
    and nothing is copied from the host, so a CUDA graph can capture the step."""
    logits, ids, extra = _step(0, 300, "probs")
    params = {"top_k": 5, "top_p": 0.9} if filtered else {}
    requests = Requests.build(len(COUNTS), logits.device, SamplingParams(temperature=0.8, **params))
    layout = BatchLayout.build(COUNTS, logits.device)
    verify(logits, ids, layout, requests=requests, backend="triton", **extra)
    with _DeviceWork() as mode:
        verify(logits, ids, layout, requests=requests, backend="triton", **extra)
    expected = ["index"] * (4 if filtered else 2) + ["rand", "index_select"]
    assert sorted(mode.work) == sorted(expected), mode.work
