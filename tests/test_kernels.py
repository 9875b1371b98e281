"""The Triton kernels of :mod:`specsample.kernels.triton` against the PyTorch reference, on the CPU.

Covers :mod:`specsample.kernels.triton` and its modules (``_common``, ``step_kernel``,
``_residual``,
``launch``, ``logits``, ``padded``), and the Triton backend behind the seam,
:mod:`specsample.backends.triton`.

The kernels run under Triton's interpreter (``TRITON_INTERPRET=1``), which must be switched on
before triton is first imported: triton's own library functions are compiled or interpreted
as they are decorated, and an interpreted kernel calling a compiled one fails. In a plain
``pytest`` run something may already have imported triton (the doctest collection of
:mod:`specsample.kernels.triton.step_kernel` does), so the tests of this module then run in a fresh
interpreter process started by :func:`test_kernels_under_the_interpreter`, with the variable
set from the start; they run in-process when ``pytest`` itself was started with
``TRITON_INTERPRET=1``. Without triton installed everything here is skipped, except the check
that the package imports without it.

What is checked:

* parity: on shared uniforms the kernels emit the same tokens as the PyTorch path, for
  probabilities (chain and block rules, float32/float16/bfloat16/float64, non-contiguous
  rows, int32 ids, ids outside the vocabulary, ``k = 0``) and for the functional path on
  logits (ragged counts with zeros, greedy, sampled and mixed batches, temperature, top-k,
  top-p, min-p, draft probabilities, draft logits and one-hot drafts, both rules), with the
  vocabulary in one block (one kernel) or several (two kernels, the last block partial). A
  row that differs must be explained by a floating-point tie (the reference emits the
  kernel's row once one uniform is moved by at most 1e-6), and at most 0.1% may differ; in
  practice none does. Rows with NaN inputs are left out of parity (only their ids are
  checked): which in-range token such a row gets is not specified.
* exactness, through :func:`specsample.testing.exactness_report`, with ``k = 2``, a
  vocabulary of 8 and ``ROWS = 50_000`` sequences per case: every family of
  :data:`specsample.testing.FAMILIES` under both rules, and the logits path in three modes.
  Each report runs ``k + 3 = 5`` tests at level ``ALPHA / 5`` (Bonferroni), so a correct
  kernel fails a case with probability at most ``ALPHA = 1e-4``; a deviation of total
  variation ``STATED_TV = 0.0172`` or more at output position 0 is detected with
  probability at least 99% (:meth:`ExactnessReport.detectable_tv`, asserted per case).
* edge cases: a draft with ``q(x) = 0`` is never accepted, not even with ``u = 0``; a
  residual without mass falls back to the target row; no emitted residual token has zero
  residual mass; NaN rows give ids in range; empty batches; the error paths.
"""

from __future__ import annotations

import importlib.util
import inspect
import math
import os
import subprocess
import sys
from collections.abc import Callable, Iterator
from typing import Any, NamedTuple

import pytest
import torch

from specsample import verify
from specsample.kernels import triton as kernels
from specsample.kernels.triton import launch
from specsample.probs import processed_probs
from specsample.rules.block import block_verify
from specsample.rules.chain import VerifyResult, chain_verify
from specsample.testing import FAMILIES, Family, exactness_report, make_family

HAVE_TRITON = importlib.util.find_spec("triton") is not None
IN_PROCESS = HAVE_TRITON and os.environ.get("TRITON_INTERPRET", "") == "1"

requires_interpreter = pytest.mark.skipif(
    not IN_PROCESS,
    reason=(
        "triton is not installed (pip install -e '.[triton]')"
        if not HAVE_TRITON
        else "runs in a TRITON_INTERPRET=1 subprocess (test_kernels_under_the_interpreter)"
    ),
)

ROWS = 50_000
K = 2
VOCAB = 8
ALPHA = 1e-4
STATED_TV = 0.0172
"""Largest TV at position 0 that a chi-square test on ``ROWS`` rows misses with probability > 1%."""

MAX_MISMATCH = 1e-3
NUDGES = (1e-12, -1e-12, 1e-9, -1e-9, 1e-6, -1e-6)


# --------------------------------------------------------------------------------------
# The outer process: run this module under the interpreter; imports without triton
# --------------------------------------------------------------------------------------


INTERPRETED_GROUPS = {
    "exactness": (["test_kernels"], "kernels_are_exact"),
    "parity": (
        ["test_kernels", "test_kernel_masses", "test_values_and_strides"],
        "not kernels_are_exact",
    ),
    "logits": (["test_kernels_gumbel", "test_kernels_norms", "test_kernels_filters"], ""),
}
"""The tests whose Triton cases need the interpreter: modules and a ``-k`` expression, in
groups of similar length (each group a process of its own, so that test workers share
them). This module's exactness tests are a group of their own; every other test of it runs
with the ``parity`` group."""


@pytest.mark.slow
@pytest.mark.skipif(not HAVE_TRITON, reason="triton is not installed")
@pytest.mark.skipif(IN_PROCESS, reason="already running under TRITON_INTERPRET=1")
@pytest.mark.parametrize("group", list(INTERPRETED_GROUPS))
def test_kernels_under_the_interpreter(group: str) -> None:
    """The tests of a group of :data:`INTERPRETED_GROUPS`, in a fresh process with
    ``TRITON_INTERPRET=1`` from the start."""
    env = dict(os.environ, TRITON_INTERPRET="1")
    here = os.path.dirname(__file__)
    names, expression = INTERPRETED_GROUPS[group]
    files = [os.path.join(here, f"{name}.py") for name in names]
    command = [sys.executable, "-m", "pytest", *files, "-k", expression, "-p", "no:cacheprovider"]
    done = subprocess.run(command, env=env, capture_output=True, text=True, timeout=900)
    assert done.returncode == 0, done.stdout[-6000:] + done.stderr[-3000:]
    assert " passed" in done.stdout and " failed" not in done.stdout, done.stdout[-3000:]


def test_package_imports_without_triton() -> None:
    """``import specsample`` and its kernels package work when triton cannot be imported."""
    code = (
        "import sys; sys.modules['triton'] = None\n"
        "import torch, specsample, specsample.kernels.triton as k\n"
        "import specsample.kernels.triton.step_kernel as j\n"
        "assert not k.available() and not k.triton_available() and j.triton is None\n"
        "assert not k.supports(torch.zeros(1))\n"
        "try:\n"
        "    k.chain_kernel_verify(*[torch.zeros(1, 1, 2)] * 2, torch.zeros(1, 1, dtype=int),\n"
        "                          torch.zeros(1, dtype=int), torch.zeros(1, 2).double())\n"
        "except RuntimeError as error:\n"
        "    assert 'triton' in str(error)\n"
        "else:\n"
        "    raise SystemExit('no error')\n"
    )
    done = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True)
    assert done.returncode == 0, done.stderr


def test_entry_points_take_the_reference_arguments() -> None:
    """The padded kernels are drop-in replacements for the rules they mirror."""
    for name, reference in (("chain", chain_verify), ("block", block_verify)):
        kernel = kernels.RULES[name]
        assert list(inspect.signature(kernel).parameters) == list(
            inspect.signature(reference).parameters
        )
    assert kernels.RULES["chain"] is kernels.chain_kernel_verify
    assert isinstance(kernels.available(), bool)


# --------------------------------------------------------------------------------------
# Parity helpers
# --------------------------------------------------------------------------------------

Reference = Callable[[torch.Tensor], tuple[torch.Tensor, torch.Tensor]]


class Parity(NamedTuple):
    """Rows compared, rows that differ, and how many of those a tie explains."""

    rows: int
    differing: int
    explained: int


def _nudged(reference: Reference, uniforms: torch.Tensor, row: int, wanted: torch.Tensor) -> bool:
    """Whether moving one uniform of ``row`` by at most 1e-6 makes the reference emit ``wanted``."""
    for col in range(uniforms.shape[1]):
        for nudge in NUDGES:
            moved = uniforms.clone()
            moved[row, col] = min(max(float(moved[row, col]) + nudge, 0.0), 1.0 - 2.0**-53)
            if torch.equal(reference(moved)[0][row], wanted):
                return True
    return False


def _parity(
    reference: Reference,
    kernel: tuple[torch.Tensor, torch.Tensor],
    uniforms: torch.Tensor,
    skip: torch.Tensor | None = None,
) -> Parity:
    """Compare the kernel's ``(token_ids, num_accepted)`` with the reference on ``uniforms``."""
    ref_ids, ref_count = reference(uniforms)
    ids, count = kernel
    assert ids.shape == ref_ids.shape and ids.dtype == torch.int64
    differ = (ids != ref_ids).any(dim=1) | (count != ref_count)
    if skip is not None:
        differ &= ~skip
    rows = [int(r) for r in differ.nonzero().flatten()]
    explained = sum(_nudged(reference, uniforms, r, ids[r]) for r in rows)
    return Parity(ids.shape[0] - (0 if skip is None else int(skip.sum())), len(rows), explained)


def _check(parity: Parity) -> None:
    assert parity.explained == parity.differing, parity
    assert parity.differing <= MAX_MISMATCH * max(parity.rows, 1), parity


def _well_formed(ids: torch.Tensor, count: torch.Tensor, vocab: int) -> None:
    """Accepted drafts, one token in ``[0, vocab)``, then -1."""
    cols = torch.arange(ids.shape[1])
    last = ids.gather(1, count.unsqueeze(-1)).squeeze(-1)
    assert bool(((last >= 0) & (last < vocab)).all())
    assert bool((ids[cols > count.unsqueeze(-1)] == -1).all())


@pytest.fixture
def split_vocabulary(monkeypatch: pytest.MonkeyPatch) -> Iterator[None]:
    """Use the two-kernel path even for a vocabulary that fits one block."""
    monkeypatch.setattr(launch, "FUSE_MAX_BLOCKS", 0)
    yield


# --------------------------------------------------------------------------------------
# Parity on probabilities (the RejectionSampler path)
# --------------------------------------------------------------------------------------


def _probs_case(
    seed: int, vocab: int, batch: int, k: int, dtype: torch.dtype
) -> tuple[tuple[torch.Tensor, ...], torch.Tensor, torch.Tensor]:
    """Sparse random rows, drafts from ``p``, a few invalid ids, a NaN row, one ``u = 0``.

    Returns the verifier arguments (without uniforms), the uniforms, and the rows holding NaN.
    """
    gen = torch.Generator().manual_seed(seed)

    def rows() -> torch.Tensor:
        x = torch.rand(batch, k, vocab, generator=gen) ** 6
        x = x.masked_fill(torch.rand(x.shape, generator=gen) < 0.3, 0.0)
        x[..., 0] += 1e-3
        return x / x.sum(dim=-1, keepdim=True)

    q, p = rows(), rows()
    if k and batch > 2:
        p[1] = q[1]
        q[2, k - 1] = math.nan
    ids = torch.zeros(batch, k, dtype=torch.int64)
    if k:
        ids = torch.multinomial(p.reshape(-1, vocab), 1, generator=gen).view(batch, k)
    if k and batch > 4:
        ids[3, 0], ids[4, k - 1] = -1, vocab
    uniforms = torch.rand(batch, k + 1, dtype=torch.float64, generator=gen)
    uniforms[0] = 0.0
    bonus = torch.randint(vocab, (batch, 1), generator=gen)
    nan = torch.zeros(batch, dtype=torch.bool)
    if k and batch > 2:
        nan[2] = True
    return (q.to(dtype), p.to(dtype), ids, bonus), uniforms, nan


PROBS_CASES = [
    (8, 64, 3, torch.float32),
    (8, 40, 0, torch.float32),
    (100, 48, 4, torch.float16),
    (1024, 24, 2, torch.bfloat16),
    (1025, 24, 3, torch.float32),
    (2500, 32, 1, torch.float64),
    (2500, 16, 5, torch.bfloat16),
]


@requires_interpreter
@pytest.mark.parametrize("split", [False, True])
@pytest.mark.parametrize("rule", ["chain", "block"])
def test_probs_parity(rule: str, split: bool, monkeypatch: pytest.MonkeyPatch) -> None:
    """Same tokens as ``chain_verify``/``block_verify`` on the same uniforms."""
    if split:
        monkeypatch.setattr(launch, "FUSE_MAX_BLOCKS", 0)
    reference_rule = chain_verify if rule == "chain" else block_verify
    kernel_rule = kernels.RULES[rule]
    total = Parity(0, 0, 0)
    for seed, (vocab, batch, k, dtype) in enumerate(PROBS_CASES):
        (q, p, ids, bonus), uniforms, nan = _probs_case(seed, vocab, batch, k, dtype)
        if seed % 2:
            q = torch.cat([q, q], dim=1)[:, :k]
            p = torch.cat([p, p], dim=1)[:, :k]
        if seed % 3 == 1:
            ids = ids.to(torch.int32)

        def reference(u: torch.Tensor, q=q, p=p, ids=ids, bonus=bonus) -> Any:
            result = reference_rule(q, p, ids, bonus, u)
            return result.token_ids, result.num_accepted

        result = kernel_rule(q, p, ids, bonus, uniforms)
        assert isinstance(result, VerifyResult)
        _well_formed(result.token_ids, result.num_accepted, vocab)
        parity = _parity(reference, tuple(result), uniforms, nan)
        total = Parity(*(a + b for a, b in zip(total, parity, strict=True)))
    _check(total)
    assert total.rows > 200


# --------------------------------------------------------------------------------------
# Parity on logits (the functional path)
# --------------------------------------------------------------------------------------


def kernel_verify(
    target_logits: torch.Tensor,
    draft_token_ids: torch.Tensor,
    num_draft_tokens: list[int],
    *,
    uniforms: torch.Tensor | None = None,
    draft_probs: torch.Tensor | None = None,
    draft_logits: torch.Tensor | None = None,
    method: str = "chain",
    **params: Any,
) -> tuple[torch.Tensor, torch.Tensor]:
    """``specsample.verify`` on the Triton backend: ``(token_ids, num_accepted)``.

    ``uniforms`` (default: drawn by the pipeline) are the step's uniforms.
    """
    out = verify(
        target_logits,
        draft_token_ids,
        num_draft_tokens,
        uniforms=uniforms,
        draft_probs=draft_probs,
        draft_logits=draft_logits,
        method=method,
        backend="triton",
        **params,
    )
    return out.token_ids, out.num_accepted


def _logits_case(seed: int, vocab: int, batch: int, draft: str) -> dict[str, Any]:
    """A ragged batch (zeros included) with per-request parameters and one NaN logits row."""
    gen = torch.Generator().manual_seed(seed)
    counts = torch.randint(0, 5, (batch,), generator=gen).tolist()
    counts[0] = 0
    total = sum(counts)
    logits = torch.randn(total + batch, vocab, generator=gen) * 3
    case: dict[str, Any] = {"num_draft_tokens": counts}
    if draft == "probs":
        case["draft_probs"] = torch.softmax(torch.randn(total, vocab, generator=gen) * 3, -1)
        rows = case["draft_probs"]
    elif draft == "logits":
        case["draft_logits"] = torch.randn(total, vocab, generator=gen) * 3
        rows = torch.softmax(case["draft_logits"], -1)
    else:
        rows = torch.softmax(logits[: max(total, 1)], -1)[:total]
    ids = torch.multinomial(rows, 1, generator=gen).view(-1) if total else torch.zeros(0)
    ids = ids.to(torch.int64)
    if total > 3:
        ids[1], ids[3] = -1, vocab
    temperature = (torch.rand(batch, generator=gen) * 1.5).tolist()
    case["temperature"] = [0.0 if t < 0.3 else t for t in temperature]
    case["top_k"] = torch.randint(0, 6, (batch,), generator=gen).tolist()
    case["top_p"] = [0.9 if x > 0.5 else 1.0 for x in torch.rand(batch, generator=gen).tolist()]
    case["min_p"] = [0.05 if x > 0.7 else 0.0 for x in torch.rand(batch, generator=gen).tolist()]
    if batch > 2 and total + batch > 2:
        logits[2] = math.nan
    case["target_logits"], case["draft_token_ids"] = logits, ids
    case["uniforms"] = torch.rand(batch, max(counts) + 1, dtype=torch.float64, generator=gen)
    return case


def _nan_requests(case: dict[str, Any]) -> torch.Tensor:
    """Requests with a NaN among their target rows."""
    counts = case["num_draft_tokens"]
    bad = torch.isnan(case["target_logits"]).any(dim=1).tolist()
    out, row = [], 0
    for n in counts:
        out.append(any(bad[row : row + n + 1]))
        row += n + 1
    return torch.tensor(out)


LOGITS_CASES = [(8, 24), (100, 20), (2500, 12)]


@requires_interpreter
@pytest.mark.parametrize("draft", ["probs", "logits", "none"])
@pytest.mark.parametrize("method", ["chain", "block"])
def test_logits_parity(draft: str, method: str, monkeypatch: pytest.MonkeyPatch) -> None:
    """Same tokens as ``specsample.verify`` on the same uniforms, every sampling mode."""
    if method == "block" and draft == "none":
        pytest.skip("block verification needs draft rows (tested in test_errors)")
    total = Parity(0, 0, 0)
    for seed, (vocab, batch) in enumerate(LOGITS_CASES):
        for split in (False, True):
            monkeypatch.setattr(launch, "FUSE_MAX_BLOCKS", 0 if split else 1)
            case = _logits_case(17 * seed + 3, vocab, batch, draft)
            nan = _nan_requests(case)
            uniforms = case.pop("uniforms")
            target_logits = case.pop("target_logits")
            draft_token_ids = case.pop("draft_token_ids")

            def reference(
                u: torch.Tensor, case=case, logits=target_logits, ids=draft_token_ids
            ) -> Any:
                out = verify(logits, ids, method=method, uniforms=u, backend="torch", **case)
                return out.token_ids, out.num_accepted

            ids, count = kernel_verify(
                target_logits, draft_token_ids, uniforms=uniforms, method=method, **case
            )
            _well_formed(ids, count, vocab)
            parity = _parity(reference, (ids, count), uniforms, nan)
            total = Parity(*(a + b for a, b in zip(total, parity, strict=True)))
    _check(total)
    assert total.rows > 60


@requires_interpreter
@pytest.mark.parametrize("draft", ["probs", "none"])
def test_all_greedy_and_no_drafts(draft: str) -> None:
    """An all-greedy batch (one kernel, no uniforms) and a batch without any draft."""
    case = _logits_case(5, 100, 10, draft)
    case.pop("uniforms")
    case["temperature"] = 0.0
    for key in ("top_k", "top_p", "min_p"):
        case.pop(key)
    expected = verify(**case)
    ids, count = kernel_verify(**case)
    assert torch.equal(ids, expected.token_ids) and torch.equal(count + 1, expected.num_emitted)
    logits = torch.randn(4, 50)
    none = torch.zeros(0, dtype=torch.int64)
    for method in ("chain", "block"):
        uniforms = torch.rand(4, 1, dtype=torch.float64)
        ids, count = kernel_verify(logits, none, [0] * 4, uniforms=uniforms, method=method)
        expected = verify(logits, none, [0] * 4, method=method, uniforms=uniforms, backend="torch")
        assert torch.equal(ids, expected.token_ids) and not bool(count.any())


# --------------------------------------------------------------------------------------
# Exactness through the harness
# --------------------------------------------------------------------------------------


def _probs_verifier(rule: str) -> Any:
    kernel_rule = kernels.RULES[rule]

    def verifier(
        target_probs: torch.Tensor,
        bonus_token_ids: torch.Tensor,
        draft_probs: torch.Tensor,
        draft_token_ids: torch.Tensor,
    ) -> torch.Tensor:
        batch, k = draft_token_ids.shape
        uniforms = torch.rand(batch, k + 1, dtype=torch.float64)
        return kernel_rule(
            target_probs, draft_probs, draft_token_ids, bonus_token_ids, uniforms
        ).token_ids

    return verifier


def _assert_exact(report: Any) -> None:
    assert report.passed(ALPHA), str(report)
    assert report.malformed_rows == 0
    if report.positions[0].df:
        assert report.detectable_tv(0, ALPHA) <= STATED_TV, report.detectable_tv(0, ALPHA)


@requires_interpreter
@pytest.mark.parametrize("rule", ["chain", "block"])
@pytest.mark.parametrize("name", FAMILIES)
def test_probs_kernels_are_exact(name: str, rule: str) -> None:
    """Every family under both rules: false-failure rate <= 1e-4, TV >= 0.0172 detected."""
    family = make_family(name, K, VOCAB, seed=29 + FAMILIES.index(name))
    report = exactness_report(_probs_verifier(rule), family, rows=ROWS, seed=7, rule=rule)
    _assert_exact(report)


def _logits_family(params: dict[str, Any], seed: int) -> tuple[Family, torch.Tensor]:
    """Raw target logits ``[K + 1, V, V]`` and the family whose target is their processing."""
    gen = torch.Generator().manual_seed(seed)
    logits = torch.randn(K + 1, VOCAB, VOCAB, generator=gen) * 1.5
    noise = torch.randn(K, VOCAB, VOCAB, generator=gen)
    draft = torch.softmax(0.7 * logits[:K] + 0.8 * noise, dim=-1)
    flat = logits.reshape(-1, VOCAB)
    filters = {
        name: torch.full((flat.shape[0],), params[name])
        for name in ("top_k", "top_p", "min_p")
        if name in params
    }
    target = processed_probs(flat, torch.full((flat.shape[0],), params["temperature"]), **filters)
    family = Family("logits", target.view(K + 1, VOCAB, VOCAB), draft)
    return family, logits


def _logits_verifier(logits: torch.Tensor, params: dict[str, Any], draft: str, rule: str) -> Any:
    """The kernels' logits path behind the harness's signature, each request cut at random."""
    gen = torch.Generator().manual_seed(11)

    def verifier(
        target_probs: torch.Tensor,
        bonus_token_ids: torch.Tensor,
        draft_probs: torch.Tensor,
        draft_token_ids: torch.Tensor,
    ) -> torch.Tensor:
        del target_probs, bonus_token_ids
        rows, k = draft_token_ids.shape
        context = torch.cat([torch.zeros(rows, 1, dtype=torch.int64), draft_token_ids], dim=1)
        raw = logits[torch.arange(k + 1).expand(rows, k + 1), context]
        counts = torch.randint(0, k + 1, (rows,), generator=gen)
        cols = torch.arange(k + 1)
        in_target, in_draft = cols <= counts[:, None], cols[:k] < counts[:, None]
        rows_of_drafts = draft_probs[in_draft]
        extra: dict[str, Any] = {}
        if draft == "probs":
            extra["draft_probs"] = rows_of_drafts
        elif draft == "logits":
            extra["draft_logits"] = rows_of_drafts.log()
        ids, _ = kernel_verify(
            raw[in_target],
            draft_token_ids[in_draft],
            counts.tolist(),
            method=rule,
            **extra,
            **params,
        )
        return torch.nn.functional.pad(ids, (0, k + 1 - ids.shape[1]), value=-1)

    return verifier


LOGITS_MODES = [
    ({"temperature": 0.8, "top_k": 5}, "probs", "chain"),
    ({"temperature": 1.0, "top_p": 0.9}, "none", "chain"),
    ({"temperature": 1.3, "min_p": 0.1}, "logits", "block"),
]


@requires_interpreter
@pytest.mark.parametrize(("params", "draft", "rule"), LOGITS_MODES)
def test_logits_kernels_are_exact(params: dict[str, Any], draft: str, rule: str) -> None:
    """The logits path on ragged requests: false-failure rate <= 1e-4, TV >= 0.0172 detected.

    Every request keeps a random prefix ``0..k`` of its drafts, so the exact law of the
    accepted length is no longer the harness's; the acceptance z-tests are left out and the
    per-position chi-square tests (each at level ``ALPHA / 5``) carry the verdict.
    """
    family, logits = _logits_family(params, seed=LOGITS_MODES.index((params, draft, rule)))
    verifier = _logits_verifier(logits, params, draft, rule)
    report = exactness_report(verifier, family, rows=ROWS, seed=3, rule=rule)
    level = report.p_value_threshold(ALPHA)
    assert report.malformed_rows == 0
    for position in report.positions:
        assert position.impossible == 0 and position.p_value >= level, str(report)
    assert report.detectable_tv(0, ALPHA) <= STATED_TV


# --------------------------------------------------------------------------------------
# Edge cases
# --------------------------------------------------------------------------------------


@requires_interpreter
@pytest.mark.usefixtures("split_vocabulary")
@pytest.mark.parametrize("rule", ["chain", "block"])
def test_zero_target_probability_is_never_accepted(rule: str) -> None:
    """``q(x) = 0`` rejects ``x`` even with ``u = 0``, and the residual never emits ``x``."""
    batch, k, vocab = 64, 2, 40
    gen = torch.Generator().manual_seed(1)
    q = torch.softmax(torch.randn(batch, k, vocab, generator=gen), -1)
    p = torch.softmax(torch.randn(batch, k, vocab, generator=gen), -1)
    ids = torch.randint(vocab, (batch, k), generator=gen)
    q.scatter_(2, ids.unsqueeze(-1), 0.0)
    uniforms = torch.zeros(batch, k + 1, dtype=torch.float64)
    uniforms[:, k] = torch.rand(batch, dtype=torch.float64, generator=gen)
    bonus = torch.zeros(batch, 1, dtype=torch.int64)
    result = kernels.RULES[rule](q, p, ids, bonus, uniforms)
    assert not bool(result.num_accepted.any())
    assert bool((result.token_ids[:, 0] != ids[:, 0]).all())
    assert bool((q[:, 0].gather(1, result.token_ids[:, :1]) > 0).all())


@requires_interpreter
@pytest.mark.parametrize("vocab", [8, 2500])
def test_residual_without_mass_falls_back_to_the_target(vocab: int) -> None:
    """``q == p`` and a draft of probability 0 under both: the token is drawn from ``q``."""
    batch = 256
    gen = torch.Generator().manual_seed(2)
    q = torch.rand(1, 1, vocab, generator=gen) ** 4
    q[..., 3] = 0.0
    q = (q / q.sum()).expand(batch, 1, vocab).contiguous()
    ids = torch.full((batch, 1), 3)
    uniforms = torch.rand(batch, 2, dtype=torch.float64, generator=gen)
    bonus = torch.zeros(batch, 1, dtype=torch.int64)
    result = kernels.chain_kernel_verify(q, q.clone(), ids, bonus, uniforms)
    expected = chain_verify(q, q.clone(), ids, bonus, uniforms)
    assert not bool(result.num_accepted.any())
    assert torch.equal(result.token_ids, expected.token_ids)
    drawn = result.token_ids[:, 0]
    assert bool((q[0, 0, drawn] > 0).all())
    inverse_cdf = torch.searchsorted(
        q[0, 0].double().cumsum(0), uniforms[:, 1].contiguous(), right=True
    )
    assert (drawn == inverse_cdf).float().mean() > 0.99


@requires_interpreter
@pytest.mark.usefixtures("split_vocabulary")
def test_residual_tokens_have_positive_residual_mass() -> None:
    """Over sparse rows, every token drawn at a rejection has ``q > p`` there."""
    batch, k, vocab = 128, 3, 1500
    gen = torch.Generator().manual_seed(3)
    q = torch.rand(batch, k, vocab, generator=gen) ** 8
    p = torch.rand(batch, k, vocab, generator=gen) ** 8
    q = q.masked_fill(torch.rand(q.shape, generator=gen) < 0.9, 0.0) + 0.0
    q[..., 7] += 1e-6
    q, p = q / q.sum(-1, keepdim=True), p / p.sum(-1, keepdim=True)
    ids = torch.multinomial(p.view(-1, vocab), 1, generator=gen).view(batch, k)
    uniforms = torch.rand(batch, k + 1, dtype=torch.float64, generator=gen)
    bonus = torch.zeros(batch, 1, dtype=torch.int64)
    result = kernels.chain_kernel_verify(q, p, ids, bonus, uniforms)
    rejected = result.num_accepted < k
    at = result.num_accepted.clamp(max=k - 1)
    drawn = result.token_ids.gather(1, result.num_accepted.unsqueeze(-1)).squeeze(-1)
    index = torch.arange(batch)
    residual = (q[index, at, drawn] - p[index, at, drawn])[rejected]
    assert int(rejected.sum()) > 50 and bool((residual > 0).all())


@requires_interpreter
@pytest.mark.filterwarnings("ignore:invalid value encountered:RuntimeWarning")
@pytest.mark.parametrize("rule", ["chain", "block"])
def test_nan_rows_give_ids_in_range(rule: str) -> None:
    """NaN probabilities or logits never crash and never give an id outside the vocabulary."""
    batch, k, vocab = 16, 3, 1100
    q = torch.softmax(torch.randn(batch, k, vocab), -1)
    p = torch.softmax(torch.randn(batch, k, vocab), -1)
    q[::2] = math.nan
    p[1::4] = math.nan
    ids = torch.randint(vocab, (batch, k))
    uniforms = torch.rand(batch, k + 1, dtype=torch.float64)
    bonus = torch.randint(vocab, (batch, 1))
    result = kernels.RULES[rule](q, p, ids, bonus, uniforms)
    _well_formed(result.token_ids, result.num_accepted, vocab)
    logits = torch.randn(batch * (k + 1), vocab)
    logits[::3] = math.nan
    logits[1::5, 7] = math.inf
    flat_ids = ids.view(-1)
    ids_out, count = kernel_verify(
        logits,
        flat_ids,
        [k] * batch,
        draft_probs=p.view(-1, vocab).nan_to_num(0.5),
        method=rule,
        temperature=[0.0, 1.0] * (batch // 2),
    )
    _well_formed(ids_out, count, vocab)


@requires_interpreter
def test_empty_batches_and_no_drafts() -> None:
    """Zero requests, and ``k = 0`` on probabilities (the bonus token is emitted)."""
    empty = torch.zeros(0, 2, 8)
    none = torch.zeros(0, 2, dtype=torch.int64)
    result = kernels.chain_kernel_verify(
        empty, empty, none, none[:, :1], torch.zeros(0, 3, dtype=torch.float64)
    )
    assert result.token_ids.shape == (0, 3) and result.num_accepted.shape == (0,)
    probs = torch.softmax(torch.randn(3, 0, 8), -1)
    bonus = torch.tensor([[1], [2], [3]])
    result = kernels.block_kernel_verify(
        probs, probs, torch.zeros(3, 0, dtype=torch.int64), bonus, torch.rand(3, 1).double()
    )
    assert result.token_ids.tolist() == [[1], [2], [3]]
    ids, count = kernel_verify(torch.zeros(0, 8), torch.zeros(0, dtype=torch.int64), [])
    assert ids.shape == (0, 1) and count.shape == (0,)


@requires_interpreter
def test_errors(monkeypatch: pytest.MonkeyPatch) -> None:
    """One-hot block verification, bad shapes, and CPU tensors without the interpreter."""
    logits = torch.randn(3, 8)
    ids = torch.tensor([1, 2])
    with pytest.raises(ValueError, match="block"):
        kernel_verify(logits, ids, [2], method="block")
    with pytest.raises(ValueError, match="method"):
        kernel_verify(logits, ids, [2], method="tree")
    q = torch.softmax(torch.randn(2, 2, 8), -1)
    u = torch.rand(2, 3, dtype=torch.float64)
    with pytest.raises(ValueError, match="uniforms"):
        kernels.chain_kernel_verify(q, q, torch.zeros(2, 2, dtype=torch.int64), ids, u.float())
    with pytest.raises(ValueError, match="draft_probs"):
        kernels.chain_kernel_verify(q, q[:, :1], torch.zeros(2, 2, dtype=torch.int64), ids, u)
    monkeypatch.setenv("TRITON_INTERPRET", "0")
    assert not kernels.supports(q)
    with pytest.raises(RuntimeError, match="CUDA"):
        kernels.chain_kernel_verify(q, q, torch.zeros(2, 2, dtype=torch.int64), ids, u)


def test_nudge_explains_a_tie() -> None:
    """The tie check accepts a row that a uniform on a cell boundary sends either way."""
    q = torch.tensor([[[0.0, 0.5, 0.5]]])
    p = torch.tensor([[[1.0, 0.0, 0.0]]])
    ids = torch.tensor([[0]])
    bonus = torch.tensor([[1]])
    uniforms = torch.tensor([[0.5, 0.5]], dtype=torch.float64)

    def reference(u: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        result = chain_verify(q, p, ids, bonus, u)
        return result.token_ids, result.num_accepted

    assert reference(uniforms)[0].tolist() == [[2, -1]]
    assert _nudged(reference, uniforms, 0, torch.tensor([1, -1]))
    assert not _nudged(reference, uniforms, 0, torch.tensor([0, -1]))
