"""The fused CPU backend: the numba kernels of :mod:`specsample.kernels.cpu` behind the seam.

* The chain rule on ``[batch, k, vocab]`` probabilities (what :class:`specsample.RejectionSampler`
  runs): one fused pass per sequence (:func:`specsample.kernels.cpu.chain.chain_rule`).
* A chain step on flattened logits (what :func:`specsample.verify` and the generation loop
  run): the row statistics (:func:`row_norms`; the largest logit and normaliser of a sampled
  row without a filter only for the rows the rule reads, the thresholds of top-k, top-p and
  min-p by selection), then one fused pass per sequence
  (:func:`specsample.kernels.cpu.logits.chain_logits`).
* A keyed Gumbel-max step (``method="gumbel"``) on flattened logits: one pass per sequence
  that stops at its first rejected draft (:mod:`specsample.kernels.cpu.gumbel`).
* Every other slot (the block rule, typical acceptance, trees, log-probabilities) runs the
  PyTorch code of :mod:`specsample.backends.eager` until kernels exist for it.

It gives the tokens of the PyTorch backend on the same uniforms: up to a uniform falling
within about ``1e-16`` of a cell boundary on probabilities (see
:mod:`specsample.rules.residual`), and within about ``1e-7`` on logits (whose exponentials
round as float32's do, not bit for bit as PyTorch's, see :mod:`specsample.kernels.cpu.logits`).

The kernels run on CPU tensors (float32 or float64 probabilities, float32 logits) once
compiled: the first call that can use them compiles them in the foreground, announced, or
loads them from the user's cache (:func:`specsample.kernels.cpu.compiler.ready`, which is also where
numba is first imported: ``import specsample`` does not load it). Other calls (half
precision, another device, a call being recorded by ``torch.compile`` or ``make_fx``) run
the PyTorch code, which gives the same tokens (:func:`specsample.kernels.cpu.compiler.runs_on`).
Small
batches run on the calling thread; large ones share PyTorch's thread count
(:func:`specsample.kernels.cpu.compiler.threads`; for a sampled step, as soon as its rows are large:
the threads then share even one sequence's walk).
"""

from __future__ import annotations

import numpy as np
import torch

from specsample.backends import eager
from specsample.kernels.cpu import compiler, launch
from specsample.params.metadata import SamplingMetadata
from specsample.plan import LogitsStep
from specsample.probs import RowNorms
from specsample.random import hash_chain, hash_uniform_op
from specsample.rules.chain import (
    ChainStep,
    PaddedRule,
    VerifyResult,
    chain_verify,
    check_rule_inputs,
)


class FusedChainRule(PaddedRule):
    """:data:`specsample.rules.chain.chain_verify` by the fused kernel: same arguments (as
    :meth:`PaddedRule.__call__ <specsample.rules.chain.PaddedRule.__call__>` documents), same
    checks, same result on the same uniforms.

    Examples
    --------
    >>> import torch
    >>> q = torch.tensor([[[0.0, 1.0], [0.5, 0.5]]])
    >>> u = torch.tensor([[0.3, 0.9, 0.5]], dtype=torch.float64)
    >>> fused_chain(q, q, torch.tensor([[1, 0]]), torch.tensor([1]), u).num_accepted
    tensor([2])
    """

    def verify(self, step: ChainStep) -> VerifyResult:
        """The chain rule's result on ``step``, by the kernel when it takes the rows."""
        check_rule_inputs(*step)
        return self.run(step)

    def run(self, step: ChainStep) -> VerifyResult:
        """The chain rule's result on ``step``, its arguments already checked."""
        if not launch.takes_probs(step.target_probs, step.draft_probs):
            return chain_verify.run(step)
        return launch.chain_probs(step)


fused_chain = FusedChainRule()
"""The chain rule on probabilities by the fused CPU kernel (:class:`FusedChainRule`)."""


def row_norms(
    logits: torch.Tensor, sampling: SamplingMetadata, *, need_norm: bool = False
) -> RowNorms:
    """The statistics of ``[rows, vocab]`` logits (:func:`specsample.backends.eager.row_norms`).

    For float32 rows, by the kernel, each row read once from memory: with ``need_norm``, the
    log-norms of every row; without, the sampled rows without a filter are left to the step
    (:attr:`~specsample.probs.RowNorms.lazy`), which computes the statistics of the rows
    its walk reads, and the log-norms of greedy rows are not computed. Rows with a
    top-k, top-p or min-p filter get PyTorch's thresholds by selection
    (:mod:`specsample.kernels.cpu.filters`); a row whose top-p threshold is too close to call
    takes its statistics from PyTorch. Which computes a row depends on that row alone, so a
    request's result does not depend on the others in its batch. An all-greedy batch
    without ``need_norm`` needs the argmaxes alone: no filter is applied.
    """
    if not launch.takes_logits(logits):
        return eager.row_norms(logits, sampling, need_norm=need_norm)
    norms, undecided = launch.row_norms(logits, sampling, need_norm)
    if undecided.any():
        close = torch.from_numpy(np.flatnonzero(undecided))
        processed = eager.row_norms(logits[close], sampling.rows(close), need_norm=True)
        norms.cutoff[close] = processed.cutoff
        norms.log_norm[close] = processed.log_norm
    return norms


def verify_logits(step: LogitsStep) -> tuple[torch.Tensor, torch.Tensor]:
    """:func:`specsample.backends.eager.verify_logits`, by the kernel for a chain step on
    float32 CPU rows (the PyTorch code otherwise): the same tokens on the same uniforms."""
    fused = step.method == "chain" and launch.takes_logits(step.target_logits)
    draft = launch.draft_rows(step) if fused else None
    if draft is None:
        return eager.verify_logits(launch.completed(step))
    return launch.chain_logits(step, draft)


def verify_gumbel(step: LogitsStep) -> tuple[torch.Tensor, torch.Tensor]:
    """:func:`specsample.backends.eager.verify_gumbel`, by the kernel on float32 (or half)
    CPU rows (:func:`specsample.kernels.cpu.gumbel.gumbel_logits`, which reads a request's rows
    up to its first mismatch alone), the PyTorch code otherwise: the same tokens.

    Parameters
    ----------
    step : LogitsStep
        ``[rows, vocab]`` target logits, ``[total_drafts]`` drafts and the plan (its row keys
        ``[rows]`` int64, ``None`` when every request is greedy).

    Returns
    -------
    tuple of torch.Tensor
        ``[batch, max_drafts + 1]`` int64 tokens (-1 padded) and ``[batch]`` int64 accepted
        counts.
    """
    if not launch.takes_logits(step.target_logits):
        return eager.verify_gumbel(step)
    return launch.gumbel_logits(step)


@hash_uniform_op.register_kernel("cpu")
def _hash_uniform(key: torch.Tensor, counters: torch.Tensor) -> torch.Tensor:
    """The counter hash of :mod:`specsample.random` on CPU tensors: one compiled loop
    (:func:`specsample.kernels.cpu.launch.hash_uniform`, the same numbers bit for bit in a
    fifth of the time, compiled on first use), or the integer tensor chain where the kernels
    cannot run (numba missing)."""
    if not compiler.ready():
        return hash_chain(key, counters)
    return launch.hash_uniform(key, counters)


def prob_rule(method: str) -> PaddedRule:
    """The fused chain rule; the PyTorch rule for the other methods."""
    return fused_chain if method == "chain" else eager.prob_rule(method)
