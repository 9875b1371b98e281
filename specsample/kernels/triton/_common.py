"""Triton helpers shared by both kernels: constants, the inverse CDF, the accept side.

Everything here is ``@triton.jit`` and inlined into the kernels of
:mod:`specsample.kernels.triton._residual` and :mod:`specsample.kernels.triton.step_kernel`:
reading a request's
layout and drafts, ``q`` and ``p`` at each draft, the chain accept test, block
verification's weights, and the inverse-CDF choice of a cell (the rule of
:func:`specsample.random.inverse_cdf`).

The target is passed as a tuple ``(pointer, row stride, inv_temperature, cutoff,
log_norm, shift)``, the draft as ``(pointer, row stride, cutoff, log_norm, shift)``. Every
program handles ``R`` requests at once (vectors ``[R]``, matrices ``[R, K1]`` over the
draft positions).

Without :mod:`triton` installed this module defines nothing.
"""

try:
    import triton
    import triton.language as tl
except ImportError:
    triton = None

if triton is not None:
    from triton.language.extra import libdevice

    from specsample.rules.residual import BLOCK as _BLOCK

    BLOCK: tl.constexpr = tl.constexpr(_BLOCK)
    PART: tl.constexpr = tl.constexpr(32)
    PARTS: tl.constexpr = tl.constexpr(_BLOCK // 32)

    @triton.jit
    def _probe():
        """Decorated only to learn whether this copy of the module is interpreted."""

    VARYING = (
        "u_stride",
        "batch",
        "k",
        "t_step",
        "d_step",
        "n_blocks",
        "n_positions",
        "iters_per_split",
    )
    """Integer arguments not worth a compiled variant per value (strides and ``vocab`` are)."""

    INTERPRETED = type(_probe).__name__ == "InterpretedFunction"
    """Whether Triton's interpreter runs this copy (``TRITON_INTERPRET=1`` at load time)."""

    if INTERPRETED:

        @triton.jit
        def _exp(x):
            """``exp(x)`` in float32 (NumPy's, under the interpreter)."""
            return tl.exp(x)

    else:

        @triton.jit
        def _exp(x):
            """``exp(x)`` in float32 by the CUDA math library (libdevice ``expf``)."""
            return libdevice.exp(x)

    if INTERPRETED:

        @triton.jit
        def _log(x):
            """``log(x)`` in ``x``'s precision (NumPy's, under the interpreter)."""
            return tl.log(x)

    else:

        @triton.jit
        def _log(x):
            """``log(x)`` in ``x``'s precision by the CUDA math library (libdevice ``log`` for
            float64, ``logf`` for float32)."""
            return libdevice.log(x)

    if INTERPRETED:

        @triton.jit
        def _bound(x):
            """A loop bound (an argument or a scalar computed in the kernel) as the
            interpreter's ``range`` takes it: a Python int. The interpreter's scalars hold
            one-element arrays, which Triton 3.6's turns into an int with ``int(array)``, an
            error under NumPy 2.4 (later versions squeeze the array first)."""
            return int(x.handle.data.reshape(-1)[0])

    else:

        @triton.jit
        def _bound(x):
            """A loop bound computed in the kernel: the scalar itself, compiled."""
            return x

    @triton.jit
    def _take(values, j, pos):
        """Entry ``pos[r]`` of row ``r`` of ``values [R, K1]`` (``j`` the column index)."""
        return tl.sum(tl.where(j[None, :] == pos[:, None], values, 0), axis=1)

    @triton.jit
    def _pick(weights, idx, n, u):
        """Inverse-CDF choice of a cell of ``weights [R, N]`` (``n`` cells used) by ``u [R]``.

        The cell is the first one of positive weight whose float64 prefix sum exceeds
        ``u * total``, or, when rounding leaves none, the first of positive weight whose prefix
        sum reaches the total: the reference's cell whenever the prefix sums are monotone, and
        a cell of positive weight whatever they are (0 when the row has none). Also returns
        the uniform rescaled to the inside of the cell, as the reference does.
        """
        cum = tl.cumsum(weights, axis=1)
        positive = (idx[None, :] < n) & (weights > 0)
        total = tl.sum(tl.where(idx[None, :] == n - 1, cum, 0.0), axis=1)
        x = u * total
        above = tl.min(tl.where(positive & (cum > x[:, None]), idx[None, :], n), axis=1)
        full = tl.min(tl.where(positive & (cum >= total[:, None]), idx[None, :], n), axis=1)
        last = tl.max(tl.where(positive, idx[None, :], -1), axis=1)
        cell = tl.minimum(above, full)
        cell = tl.where(cell < n, cell, tl.maximum(last, 0))
        low = tl.sum(tl.where(idx[None, :] == cell[:, None] - 1, cum, 0.0), axis=1)
        high = tl.sum(tl.where(idx[None, :] == cell[:, None], cum, 0.0), axis=1)
        width = high - low
        inside = (x - low) / tl.where(width != 0.0, width, 1.0)
        inside = tl.where(width != 0.0, inside, tl.where(x - low > 0.0, 1.0, 0.0))
        inside = tl.where(inside == inside, inside, 0.0)
        inside = tl.where(inside < 0.0, 0.0, tl.where(inside > 1.0, 1.0, inside))
        return cell, inside

    @triton.jit
    def _logit_probs(x, shift, inv_t, cut, lse, mask):
        """``exp(z - lse)`` where ``z >= cut`` (and ``mask``), else 0, in float32.

        ``z = (x - shift) * inv_t``, 0 where ``x == shift``: the rule of
        :func:`specsample.probs.scaled_logits`, which never overflows.
        """
        x = x.to(tl.float32)
        z = tl.where(x == shift, 0.0, (x - shift) * inv_t)
        return tl.where((z >= cut) & mask, _exp(z - lse), 0.0)

    @triton.jit
    def _layout(req, live, starts, t_step, d_step, k, RAGGED: tl.constexpr):
        """First target row, first draft row, first draft id and draft count of each request."""
        t_start, d_start, n_drafts = starts
        if RAGGED:
            t_first = tl.load(t_start + req, mask=live, other=0).to(tl.int64)
            d_first = tl.load(d_start + req, mask=live, other=0).to(tl.int64)
            n = tl.load(n_drafts + req, mask=live, other=0).to(tl.int64)
            id_first = d_first
        else:
            t_first = req * t_step
            d_first = req * d_step
            n = tl.where(live, k, 0).to(tl.int64)
            id_first = req * k
        return t_first, d_first, id_first, n

    @triton.jit
    def _drafts(
        target,
        draft,
        ids,
        live,
        t_first,
        d_first,
        id_first,
        n,
        vocab,
        K1: tl.constexpr,
        TARGET_LOGITS: tl.constexpr,
        DRAFT: tl.constexpr,
    ):
        """Draft ids ``[R, K1]``, whether each is a real in-vocabulary draft, ``q`` and ``p``."""
        j = tl.arange(0, K1).to(tl.int64)
        in_request = live[:, None] & (j[None, :] < n[:, None])
        tok = tl.load(ids + id_first[:, None] + j[None, :], mask=in_request, other=-1)
        tok = tok.to(tl.int64)
        valid = in_request & (tok >= 0) & (tok < vocab)
        safe = tl.minimum(tl.maximum(tok, 0), vocab - 1)
        t_ptr, t_stride, inv_t, cutoff, log_norm, t_shift = target
        t_row = t_first[:, None] + j[None, :]
        raw_q = tl.load(t_ptr + t_row * t_stride + safe, mask=in_request, other=0.0)
        if TARGET_LOGITS:
            inv = tl.load(inv_t + t_row, mask=in_request, other=1.0)
            cut = tl.load(cutoff + t_row, mask=in_request, other=0.0)
            lse = tl.load(log_norm + t_row, mask=in_request, other=0.0)
            sh = tl.load(t_shift + t_row, mask=in_request, other=0.0)
            q_at = _logit_probs(raw_q, sh, inv, cut, lse, in_request).to(tl.float64)
        else:
            q_at = raw_q.to(tl.float64)
        d_ptr, d_stride, d_cut, d_norm, d_shift = draft
        d_at = d_ptr + (d_first[:, None] + j[None, :]) * d_stride + safe
        if DRAFT == 0:
            p_at = tl.where(in_request, 1.0, 0.0).to(tl.float64)
        elif DRAFT == 1:
            p_at = tl.load(d_at, mask=in_request, other=0.0).to(tl.float64)
        else:
            raw_p = tl.load(d_at, mask=in_request, other=0.0)
            d_row = d_first[:, None] + j[None, :]
            cut_p = tl.load(d_cut + d_row, mask=in_request, other=0.0)
            lse_p = tl.load(d_norm + d_row, mask=in_request, other=0.0)
            sh_p = tl.load(d_shift + d_row, mask=in_request, other=0.0)
            p_at = _logit_probs(raw_p, sh_p, 1.0, cut_p, lse_p, in_request).to(tl.float64)
        return j, tok, valid, q_at, p_at

    @triton.jit
    def _requests(
        target,
        draft,
        ids,
        starts,
        sizes,
        R: tl.constexpr,
        K1: tl.constexpr,
        TARGET_LOGITS: tl.constexpr,
        DRAFT: tl.constexpr,
        RAGGED: tl.constexpr,
    ):
        """This program's requests ``[R]``: ids, liveness, first rows, counts, ``_drafts``.

        ``starts`` are the ragged layout's pointers, ``sizes`` is ``(batch, vocab, k,
        t_step, d_step)``.
        """
        batch, vocab, k, t_step, d_step = sizes
        req = (tl.program_id(0) * R + tl.arange(0, R)).to(tl.int64)
        live = req < batch
        t_first, d_first, id_first, n = _layout(req, live, starts, t_step, d_step, k, RAGGED)
        drafts = _drafts(
            target, draft, ids, live, t_first, d_first, id_first, n, vocab, K1, TARGET_LOGITS, DRAFT
        )
        return req, live, t_first, d_first, n, drafts

    @triton.jit
    def _chain_accepted(uni, u_stride, req, live, j, valid, q_at, p_at, n, k, K1: tl.constexpr):
        """Drafts accepted in order by the test ``u * p < q``, ``[R]``."""
        u = tl.load(
            uni + req[:, None] * u_stride + j[None, :],
            mask=live[:, None] & (j[None, :] < k),
            other=1.0,
        )
        accepted = (u * p_at < q_at) & valid
        return tl.minimum(tl.min(tl.where(accepted, K1, j[None, :]), axis=1), n)

    @triton.jit
    def _block_weights(j, valid, q_at, p_at, K1: tl.constexpr):
        """Block verification's ``w_0 .. w_{K1 - 1}``, ``[R, K1]`` float64."""
        ratio = q_at / tl.where(p_at > 0.0, p_at, 1.0)
        ratio = tl.where(p_at > 0.0, ratio, tl.where(q_at > 0.0, float("inf"), 0.0))
        ratio = tl.where(valid, ratio, 0.0)
        weights = tl.where(j[None, :] == 0, 1.0, 0.0) + tl.zeros_like(ratio)
        w = tl.sum(tl.where(j[None, :] == 0, weights, 0.0), axis=1)
        for i in tl.static_range(K1 - 1):
            w = w * tl.sum(tl.where(j[None, :] == i, ratio, 0.0), axis=1)
            w = tl.where(w > 1.0, 1.0, w)
            weights = tl.where(j[None, :] == i + 1, w[:, None], weights)
        return weights

    @triton.jit
    def _draw_row(pos, n, j, tok, valid, t_first, d_first, w, read):
        """The selected rows ``(target row, draft row, read, w, keep, excluded)`` at ``pos``.

        ``keep``: a draft row applies (``pos < n``; else the bonus row, drawn from ``q``);
        ``excluded``: the one-hot draft at ``pos`` to remove (-1: none).
        """
        keep = pos < n
        own = keep & (_take(valid.to(tl.int32), j, pos) != 0)
        excluded = tl.where(own, _take(tok, j, pos), -1)
        return (t_first + pos, tl.where(keep, d_first + pos, 0), read, w, keep, excluded)
