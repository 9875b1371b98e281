"""Keyed Gumbel-max verification (``method="gumbel"``) by a Triton kernel.

:func:`verify_gumbel` runs the step of :func:`specsample.backends.eager.verify_gumbel` in one
launch of one program per request, with the same noise (:mod:`specsample.noise`) and the same
tokens. A program walks its request's target rows in order and stops at the first row whose
token is not the draft: the rows after it are never read. At a row of a sampled request it
reads the vocabulary block by block and keeps a running maximum of ``float64(z) + g`` over the
kept tokens (``z >= cutoff``), with the first index on ties, as
:func:`specsample.rules.gumbel.gumbel_argmax`:

* ``z = (float32(logit) - shift) * inv_temperature`` in float32, NaN and ``+inf`` read as 0
  (:func:`specsample.probs.scaled_logits`);
* the token bits ``h = mix32((mix32(v ^ key) + key) mod 2**32)`` in uint32 arithmetic, whose
  products wrap as the reference's masked int64 ones do;
* ``u = (h + 0.5) * 2**-32`` and ``g = -log(-log(u))`` in float64 (the CUDA math library's
  ``log`` when compiled, as PyTorch's on CUDA; NumPy's under the interpreter).

A block whose largest ``z`` plus :data:`specsample.noise.GUMBEL_MAX` does not exceed the best
score so far cannot hold the maximum, and its noise is not computed. A greedy request reads
its rows' argmax instead. Nothing on the host reads a device tensor.

The module is imported twice: as the host side, which never imports triton, and, on the first
launch in a mode, as that mode's kernel module, where the kernel is defined with the helpers
of the mode. Triton decides at decoration time whether a function is compiled or interpreted,
so, as for :mod:`specsample.kernels.triton.launch`, the kernel module is a submodule of the package
made for the mode (``_compiled``, or ``_interpreted`` under ``TRITON_INTERPRET=1``).
"""

from __future__ import annotations

from typing import Any

import torch

from specsample.kernels.triton.launch import (
    MODE_PACKAGES,
    _check_device,
    _next_power_of_two,
    mode_kernel,
)
from specsample.noise import GUMBEL_MAX
from specsample.plan import LogitsStep
from specsample.rules.rows import unit_columns

COLUMNS = 1024
"""Vocabulary columns a program reads at a time (a smaller vocabulary: the power of two at or
above it); read at each launch."""

_KERNEL_COPY = (__package__ or "").rpartition(".")[2] in MODE_PACKAGES.values()
"""Whether this copy is a mode's kernel module (see :func:`_kernel`), not the host side."""


def _kernel() -> Any:
    """The kernel for the current mode (compiled or interpreted), loaded once per mode."""
    return mode_kernel(__name__.rpartition(".")[2], "_gumbel_kernel")


def verify_gumbel(step: LogitsStep) -> tuple[torch.Tensor, torch.Tensor]:
    """A planned ``method="gumbel"`` step by the kernel: ``(token_ids, num_accepted)``.

    Parameters
    ----------
    step : LogitsStep
        ``target_logits [rows, vocab]`` (float32, float16, bfloat16 or float64; the draft
        rows only with ``bonus_token_ids``), ``draft_token_ids [total_drafts]`` int64 or
        int32, and the plan: the layout, the ``[rows]`` statistics (``inv_temperature``,
        ``cutoff`` and ``shift`` float32 of every row when a request samples, ``argmax``
        int64), ``greedy [batch]`` bool and ``keys [rows]`` int64 (None when every request
        is greedy). ``bonus_token_ids [batch]`` int64, when given, is contiguous.

    Returns
    -------
    tuple of torch.Tensor
        ``token_ids [batch, max_drafts + 1]`` int64 (the accepted drafts, the target's token
        at the first mismatch or the bonus position, then ``-1``) and ``num_accepted
        [batch]`` int64: those of :func:`specsample.backends.eager.verify_gumbel`.

    Raises
    ------
    RuntimeError
        Triton is missing, or the tensors are on the CPU without ``TRITON_INTERPRET=1``.

    Examples
    --------
    A sampled request with one draft: the keyed noise at the draft row picks the same token
    as its logit of 50 does, and the bonus row's token follows.

    >>> from specsample import backends, plan, probs
    >>> from specsample.kernels.triton.launch import supports
    >>> from specsample.params.layout import BatchLayout
    >>> logits = torch.tensor([[0.0, 50.0], [50.0, 0.0]])  # a draft row, then the bonus row
    >>> norms = probs.row_norms(logits, torch.ones(2))
    >>> keys = torch.tensor([3, 4])
    >>> planned = plan.Plan(BatchLayout.build([1], logits.device), norms, torch.tensor([False]),
    ...                     None, keys=keys)
    >>> verify = verify_gumbel if supports(logits) else backends.get("torch").gumbel
    >>> verify(LogitsStep(logits, torch.tensor([1]), planned, "gumbel"))
    (tensor([[1, 0]]), tensor([1]))
    """
    plan, bonus = step.plan, step.bonus_token_ids
    layout, norms = plan.layout, plan.norms
    _check_device(step.target_logits, step.draft_token_ids, plan.greedy, plan.keys, bonus)
    device = step.target_logits.device
    width = layout.max_drafts + 1
    token_ids = torch.empty(layout.batch, width, dtype=torch.int64, device=device)
    num_accepted = torch.empty(layout.batch, dtype=torch.int64, device=device)
    if layout.batch == 0:
        return token_ids, num_accepted
    logits = unit_columns(step.target_logits)
    vocab = logits.shape[-1]
    stand_in = torch.empty(1, dtype=torch.int64, device=device)
    ids = step.draft_token_ids.contiguous() if layout.total_drafts else stand_in
    _kernel()[(layout.batch,)](
        logits,
        logits.stride(0),
        norms.inv_temperature,
        norms.cutoff,
        norms.shift,
        norms.argmax,
        plan.keys if plan.keys is not None else stand_in,
        ids,
        layout.target_start,
        layout.draft_start,
        layout.num_drafts,
        plan.greedy.view(torch.uint8),
        bonus if bonus is not None else stand_in,
        token_ids,
        num_accepted,
        vocab,
        width,
        COLS=min(COLUMNS, _next_power_of_two(vocab)),
        K1=_next_power_of_two(width),
        SAMPLED=plan.keys is not None,
        BONUS_IDS=bonus is not None,
        num_warps=4,
        enable_fp_fusion=False,
    )
    return token_ids, num_accepted


if _KERNEL_COPY:
    import triton
    import triton.language as tl

    from ._common import _bound, _log

    NOISE_MAX: tl.constexpr = tl.constexpr(GUMBEL_MAX)

    @triton.jit
    def _mix32(x):
        """The lowbias32 mixer (:func:`specsample.random.mix32`) of uint32 ``x``."""
        x = x ^ (x >> 16)
        x = x * tl.full([], 0x7FEB352D, tl.uint32)
        x = x ^ (x >> 15)
        x = x * tl.full([], 0x846CA68B, tl.uint32)
        return x ^ (x >> 16)

    @triton.jit
    def _noise(tokens, key):
        """float64 Gumbel noise ``[COLS]`` of int64 ``tokens`` for the uint32 row ``key``."""
        h = _mix32(_mix32(tokens.to(tl.uint32) ^ key) + key)
        u = (h.to(tl.float64) + 0.5) * (1.0 / 4294967296.0)
        return -_log(-_log(u))

    @triton.jit
    def _gumbel_token(row, key, inv_t, cut, shift, vocab, COLS: tl.constexpr):
        """The row's keyed Gumbel-max token, int64 (0 when it keeps no token).

        ``row`` points at the row's logits, ``key`` is its uint32 key, ``inv_t``, ``cut``
        and ``shift`` its float32 statistics. Blocks are read in order, and a block's best
        score replaces the running one only when larger: the first index on ties.
        """
        cols = tl.arange(0, COLS).to(tl.int64)
        best = tl.full([], float("-inf"), tl.float64)
        best_at = tl.full([], 0, tl.int64)
        for start in range(0, _bound(vocab), COLS):
            at = start + cols
            inside = at < vocab
            x = tl.load(row + at, mask=inside, other=0.0).to(tl.float32)
            z = (x - shift) * inv_t
            z = tl.where((z != z) | (z == float("inf")), 0.0, z)
            z = tl.where(inside & (z >= cut), z.to(tl.float64), float("-inf"))
            if tl.max(z, axis=0) + NOISE_MAX > best:
                score = z + _noise(at, key)
                top = tl.max(score, axis=0)
                first = tl.min(tl.where(score == top, at, vocab), axis=0)
                best_at = tl.where(top > best, first, best_at)
                best = tl.maximum(best, top)
        return best_at

    @triton.jit
    def _sampled_token(logits, stride, norms, keys, row, token, draw, vocab, COLS: tl.constexpr):
        """Target row ``row``'s keyed Gumbel-max token (int64) when ``draw``, else ``token``.

        ``norms`` is ``(inv_temperature, cutoff, shift)``.
        """
        if draw:
            inv_t, cutoff, shift = norms
            key = tl.load(keys + row).to(tl.uint32)
            inv = tl.load(inv_t + row)
            cut = tl.load(cutoff + row)
            sh = tl.load(shift + row)
            token = _gumbel_token(logits + row * stride, key, inv, cut, sh, vocab, COLS)
        return token

    @triton.jit
    def _gumbel_kernel(
        logits, stride, inv_t, cutoff, shift, argmax, keys, ids,
        t_start, d_start, n_drafts, greedy, bonus, token_ids, num_accepted, vocab, width,
        COLS: tl.constexpr, K1: tl.constexpr, SAMPLED: tl.constexpr, BONUS_IDS: tl.constexpr,
    ):  # fmt: skip
        """One request per program: its rows in order up to the first mismatch, then its
        output row (see the module docstring).

        A row's token always lies in ``[0, vocab)``, so a draft equal to it is in range.
        """
        req = tl.program_id(0).to(tl.int64)
        t_first = tl.load(t_start + req).to(tl.int64)
        d_first = tl.load(d_start + req).to(tl.int64)
        n = tl.load(n_drafts + req).to(tl.int64)
        sampled = tl.load(greedy + req) == 0
        norms = (inv_t, cutoff, shift)
        count = n * 0
        final = count - 1
        going = count == 0
        while going:
            row = t_first + count
            drafted = count < n
            read = count <= n
            if BONUS_IDS:
                read = drafted
            token = tl.load(argmax + row, mask=read, other=0).to(tl.int64)
            if SAMPLED:
                token = _sampled_token(
                    logits, stride, norms, keys, row, token, read & sampled, vocab, COLS
                )
            if BONUS_IDS:
                given = tl.load(bonus + req, mask=~drafted, other=0).to(tl.int64)
                token = tl.where(drafted, token, given)
            draft = tl.load(ids + d_first + count, mask=drafted, other=-1).to(tl.int64)
            cut = tl.load(cutoff + row, mask=drafted, other=float("nan"))
            going = drafted & (draft == token) & (cut == cut)
            final = tl.where(going, final, token)
            count = tl.where(going, count + 1, count)
        cols = tl.arange(0, K1).to(tl.int64)
        accepted = tl.load(ids + d_first + cols, mask=cols < count, other=-1).to(tl.int64)
        out = tl.where(cols == count, final, tl.where(cols < count, accepted, -1))
        tl.store(token_ids + req * width + cols, out, mask=cols < width)
        tl.store(num_accepted + req, count)
