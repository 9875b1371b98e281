"""The Triton programs behind :mod:`specsample.kernels` (see :mod:`specsample.kernels.launch`).

Two kernels share one argument list:

* :func:`masses_kernel`, grid ``(request tiles, positions, vocabulary splits)``: for the row a
  request's draw reads (chain rule) or for every draft position (block rule), the per-block
  target mass ``sum q`` and residual mass ``sum max(w q - p, 0)`` over blocks of
  :data:`BLOCK` columns, written to a ``[batch, positions, 2, blocks]`` float32 scratch;
* :func:`verify_kernel`, grid ``(request tiles,)``: the accept test, greedy matching, block
  verification's accepted length, then the hierarchical inverse-CDF draw (block, 32-token
  part, token) from the masses and one segment of :data:`BLOCK` columns, and the output row.

When the vocabulary fits in one block (``FUSED``) the second kernel computes the masses itself
and the first is not launched. Every program handles ``R`` requests (1 on a GPU; more under
the interpreter, where each operation is vectorised over them). The arithmetic follows
:mod:`specsample.rules.residual` operation by operation: probabilities in float32 (the block
masses of a chain over float16, bfloat16 or float64 probabilities in their own dtype, as
there), prefix sums and uniforms in float64, the same inverse-CDF cell rule, the same
fallbacks.

Helpers take the target as a tuple ``(pointer, row stride, inv_temperature, cutoff,
log_norm)``, the draft as ``(pointer, row stride, cutoff, log_norm)`` and the selected rows as
``(target row, draft row, read, w, keep, excluded)``, each ``[R]``: ``read`` marks the
requests whose rows are read, ``w`` is the weight on the target, ``keep`` whether the draft
row applies and ``excluded`` the one-hot draft to remove (-1: none).

Without :mod:`triton` installed this module defines nothing (the package imports without it);
it is loaded by the launcher, once per mode (compiled, or interpreted when
``TRITON_INTERPRET=1``), when a kernel first runs.
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
    def _logit_probs(x, inv_t, cut, lse, mask):
        """``exp(z - lse)`` where ``z = x * inv_t >= cut`` (and ``mask``), else 0, in float32."""
        z = x.to(tl.float32) * inv_t
        return tl.where((z >= cut) & mask, _exp(z - lse), 0.0)

    @triton.jit
    def _target_rows(target, rows, read, cols, mask, TARGET_LOGITS: tl.constexpr):
        """Target probabilities ``[R, C]`` at ``rows [R]`` and ``cols``, and the raw values."""
        ptr, stride, inv_t, cutoff, log_norm = target
        raw = tl.load(ptr + rows[:, None] * stride + cols, mask=mask, other=0.0)
        if TARGET_LOGITS:
            inv = tl.load(inv_t + rows, mask=read, other=1.0)
            cut = tl.load(cutoff + rows, mask=read, other=0.0)
            lse = tl.load(log_norm + rows, mask=read, other=0.0)
            q = _logit_probs(raw, inv[:, None], cut[:, None], lse[:, None], mask)
        else:
            q = raw.to(tl.float32)
        return q, raw

    @triton.jit
    def _draft_rows(draft, rows, read, cols, mask, DRAFT: tl.constexpr):
        """Dense draft probabilities ``[R, C]`` at ``rows [R]`` and ``cols``, and raw values."""
        ptr, stride, cutoff, log_norm = draft
        raw = tl.load(ptr + rows[:, None] * stride + cols, mask=mask, other=0.0)
        if DRAFT == 2:
            cut = tl.load(cutoff + rows, mask=read, other=0.0)
            lse = tl.load(log_norm + rows, mask=read, other=0.0)
            p = _logit_probs(raw, 1.0, cut[:, None], lse[:, None], mask)
        else:
            p = raw.to(tl.float32)
        return p, raw

    @triton.jit
    def _round_to_bfloat16(x):
        """Float32 ``x`` rounded to the nearest bfloat16 (ties to even), kept in float32."""
        bits = x.to(tl.uint32, bitcast=True)
        bits = (bits + 0x7FFF + ((bits >> 16) & 1)) & 0xFFFF0000
        return tl.where(x == x, bits.to(tl.float32, bitcast=True), x)

    @triton.jit
    def _difference_in_dtype(a, b):
        """``a - b`` as the inputs' dtype computes it (float64, or float32 then rounded)."""
        if a.dtype.is_fp64():
            d = a - b
        elif a.dtype.is_bf16():
            d = _round_to_bfloat16(a.to(tl.float32) - b.to(tl.float32))
        else:
            d = (a.to(tl.float32) - b.to(tl.float32)).to(a.dtype).to(tl.float32)
        return d

    @triton.jit
    def _residual(
        target,
        draft,
        rows,
        cols,
        mask,
        TARGET_LOGITS: tl.constexpr,
        DRAFT: tl.constexpr,
        RAW_MASS: tl.constexpr,
    ):
        """``q`` and the residual ``[R, C]`` (float32), zero where ``mask`` is off.

        Dense draft: ``max(w q - p, 0)`` where ``keep``, else ``q`` (``RAW_MASS``: ``q - p``
        in the inputs' dtype); one-hot draft: ``q`` without column ``excluded``; none: ``q``.
        """
        t_row, d_row, read, w, keep, excluded = rows
        q, q_raw = _target_rows(target, t_row, read, cols, mask, TARGET_LOGITS)
        if DRAFT == 0:
            r = tl.where(cols == excluded[:, None], 0.0, q)
        else:
            p, p_raw = _draft_rows(draft, d_row, read & keep, cols, mask & keep[:, None], DRAFT)
            d = _difference_in_dtype(q_raw, p_raw) if RAW_MASS else q * w[:, None] - p
            r = tl.where(keep[:, None], tl.where(d < 0.0, 0.0, d).to(tl.float32), q)
        return q, r

    @triton.jit
    def _tile_masses(
        target,
        draft,
        rows,
        cols,
        mask,
        R: tl.constexpr,
        NT: tl.constexpr,
        COLS: tl.constexpr,
        TARGET_LOGITS: tl.constexpr,
        DRAFT: tl.constexpr,
        RAW_MASS: tl.constexpr,
    ):
        """Per-block ``sum q`` and residual mass of a tile of ``NT`` blocks, each ``[R, NT]``."""
        q, r = _residual(target, draft, rows, cols, mask, TARGET_LOGITS, DRAFT, RAW_MASS)
        target_mass = tl.sum(tl.reshape(q, (R, NT, COLS)), axis=2)
        residual_mass = tl.sum(tl.reshape(r, (R, NT, COLS)), axis=2)
        return target_mass, residual_mass

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
        t_ptr, t_stride, inv_t, cutoff, log_norm = target
        t_row = t_first[:, None] + j[None, :]
        raw_q = tl.load(t_ptr + t_row * t_stride + safe, mask=in_request, other=0.0)
        if TARGET_LOGITS:
            inv = tl.load(inv_t + t_row, mask=in_request, other=1.0)
            cut = tl.load(cutoff + t_row, mask=in_request, other=0.0)
            lse = tl.load(log_norm + t_row, mask=in_request, other=0.0)
            q_at = _logit_probs(raw_q, inv, cut, lse, in_request).to(tl.float64)
        else:
            q_at = raw_q.to(tl.float64)
        d_ptr, d_stride, _, d_norm = draft
        d_at = d_ptr + (d_first[:, None] + j[None, :]) * d_stride + safe
        if DRAFT == 0:
            p_at = tl.where(in_request, 1.0, 0.0).to(tl.float64)
        elif DRAFT == 1:
            p_at = tl.load(d_at, mask=in_request, other=0.0).to(tl.float64)
        else:
            raw_p = tl.load(d_at, mask=in_request, other=0.0).to(tl.float32)
            lse_p = tl.load(d_norm + d_first[:, None] + j[None, :], mask=in_request, other=0.0)
            p_at = _exp(raw_p - lse_p).to(tl.float64)
        return j, tok, valid, q_at, p_at

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
    def _block_length(uni, u_stride, req, live, j, weights, z, n, k):
        """Block verification's accepted length: the last ``i`` with ``eta_i < h_i``, ``[R]``."""
        denominator = (z + 1.0) - weights
        h = z / tl.where(denominator > 0.0, denominator, 1.0)
        h = tl.where(denominator > 0.0, h, 0.0)
        before = tl.where(j[None, :] < n[:, None], h, 0.0)
        h = tl.where(j[None, :] == n[:, None], weights, before)
        h = tl.where((weights > 0.0) & (j[None, :] >= 1), h, 0.0)
        eta = tl.load(
            uni + req[:, None] * u_stride + (j[None, :] - 1),
            mask=live[:, None] & (j[None, :] >= 1) & (j[None, :] <= k),
            other=1.0,
        )
        return tl.max(tl.where(eta < h, j[None, :], 0), axis=1)

    @triton.jit
    def _greedy(argmax, cutoff, greedy, req, live, t_first, j, tok, valid, n, K1: tl.constexpr):
        """Greedy requests, their drafts matched in order and their final token, each ``[R]``."""
        g = tl.load(greedy + req, mask=live, other=0) != 0
        t_row = t_first[:, None] + j[None, :]
        in_request = live[:, None] & (j[None, :] < n[:, None])
        best = tl.load(argmax + t_row, mask=in_request, other=-1).to(tl.int64)
        cut = tl.load(cutoff + t_row, mask=in_request, other=0.0)
        matched = (tok == best) & (cut == cut) & valid
        count = tl.minimum(tl.min(tl.where(matched, K1, j[None, :]), axis=1), n)
        final = tl.load(argmax + t_first + count, mask=live & g, other=0).to(tl.int64)
        return g, count, final

    @triton.jit(do_not_specialize=VARYING)
    def masses_kernel(
        tgt,
        t_rs,
        t_inv,
        t_cut,
        t_lse,
        t_argmax,
        drf,
        d_rs,
        d_cut,
        d_lse,
        ids,
        uni,
        u_stride,
        t_start,
        d_start,
        n_drafts,
        greedy,
        bonus,
        masses,
        out,
        n_out,
        batch,
        vocab,
        k,
        t_step,
        d_step,
        n_blocks,
        n_positions,
        iters_per_split,
        R: tl.constexpr,
        K1: tl.constexpr,
        COLS: tl.constexpr,
        BPI: tl.constexpr,
        NB_PAD: tl.constexpr,
        TARGET_LOGITS: tl.constexpr,
        DRAFT: tl.constexpr,
        RULE: tl.constexpr,
        RAGGED: tl.constexpr,
        BONUS_IDS: tl.constexpr,
        HAS_GREEDY: tl.constexpr,
        SAMPLED: tl.constexpr,
        RAW_MASS: tl.constexpr,
        FUSED: tl.constexpr,
    ):
        """Block masses of the row a request draws from (chain) or of every position (block)."""
        target = (tgt, t_rs, t_inv, t_cut, t_lse)
        draft = (drf, d_rs, d_cut, d_lse)
        req = (tl.program_id(0) * R + tl.arange(0, R)).to(tl.int64)
        slot = tl.program_id(1)
        split = tl.program_id(2)
        live = req < batch
        starts = (t_start, d_start, n_drafts)
        t_first, d_first, id_first, n = _layout(req, live, starts, t_step, d_step, k, RAGGED)
        j, tok, valid, q_at, p_at = _drafts(
            target, draft, ids, live, t_first, d_first, id_first, n, vocab, K1, TARGET_LOGITS, DRAFT
        )
        sampled = live
        if HAS_GREEDY:
            sampled = live & (tl.load(greedy + req, mask=live, other=0) == 0)
        if RULE == 0:
            pos = _chain_accepted(uni, u_stride, req, live, j, valid, q_at, p_at, n, k, K1)
            w = tl.full([R], 1.0, tl.float32)
            active = sampled & (pos < n) if BONUS_IDS else sampled
        else:
            pos = tl.zeros([R], tl.int64) + slot
            w = _take(_block_weights(j, valid, q_at, p_at, K1), j, pos).to(tl.float32)
            active = sampled & (pos < n) if BONUS_IDS else sampled & (pos <= n)
        keep = pos < n
        excluded = tl.where(keep & (_take(valid.to(tl.int32), j, pos) != 0), _take(tok, j, pos), -1)
        rows = (t_first + pos, tl.where(keep, d_first + pos, 0), active, w, keep, excluded)
        first = split * iters_per_split
        last = tl.minimum(first + iters_per_split, tl.cdiv(n_blocks, BPI))
        last = tl.where(tl.max(active.to(tl.int32), axis=0) > 0, last, first)
        base = (req * n_positions + slot) * 2 * n_blocks
        for it in range(first, last):
            cols = it * (BPI * BLOCK) + tl.arange(0, BPI * COLS).to(tl.int64)
            mask = active[:, None] & (cols[None, :] < vocab)
            target_mass, residual_mass = _tile_masses(
                target,
                draft,
                rows,
                cols[None, :],
                mask,
                R,
                BPI,
                COLS,
                TARGET_LOGITS,
                DRAFT,
                RAW_MASS,
            )
            block = it * BPI + tl.arange(0, BPI)
            offset = base[:, None] + block[None, :]
            store = active[:, None] & (block[None, :] < n_blocks)
            tl.store(masses + offset, target_mass, mask=store)
            tl.store(masses + offset + n_blocks, residual_mass, mask=store)

    @triton.jit
    def _segment_draw(
        target,
        draft,
        rows,
        use_target,
        u,
        block,
        vocab,
        R: tl.constexpr,
        COLS: tl.constexpr,
        TARGET_LOGITS: tl.constexpr,
        DRAFT: tl.constexpr,
    ):
        """The token inside the chosen block: a 32-token part, then a token (one level if small)."""
        read = rows[2]
        if COLS < BLOCK:
            cols = tl.arange(0, COLS).to(tl.int64)
            mask = read[:, None] & (cols[None, :] < vocab)
            q, r = _residual(target, draft, rows, cols[None, :], mask, TARGET_LOGITS, DRAFT, False)
            r = tl.where(use_target[:, None], q, r)
            token, _ = _pick(r.to(tl.float64), cols, vocab, u)
        else:
            first = block * BLOCK
            start = tl.minimum(first, vocab - BLOCK)
            cols = start[:, None] + tl.arange(0, BLOCK).to(tl.int64)[None, :]
            mask = read[:, None] & (cols >= first[:, None])
            q, r = _residual(target, draft, rows, cols, mask, TARGET_LOGITS, DRAFT, False)
            r = tl.reshape(tl.where(use_target[:, None], q, r), (R, PARTS, PART))
            parts = tl.arange(0, PARTS)
            part, u = _pick(tl.sum(r, axis=2).to(tl.float64), parts, PARTS, u)
            inner = tl.sum(tl.where(parts[None, :, None] == part[:, None, None], r, 0.0), axis=1)
            offset, _ = _pick(inner.to(tl.float64), tl.arange(0, PART), PART, u)
            token = start + part * PART + offset
        return token

    @triton.jit(do_not_specialize=VARYING)
    def verify_kernel(
        tgt,
        t_rs,
        t_inv,
        t_cut,
        t_lse,
        t_argmax,
        drf,
        d_rs,
        d_cut,
        d_lse,
        ids,
        uni,
        u_stride,
        t_start,
        d_start,
        n_drafts,
        greedy,
        bonus,
        masses,
        out,
        n_out,
        batch,
        vocab,
        k,
        t_step,
        d_step,
        n_blocks,
        n_positions,
        iters_per_split,
        R: tl.constexpr,
        K1: tl.constexpr,
        COLS: tl.constexpr,
        BPI: tl.constexpr,
        NB_PAD: tl.constexpr,
        TARGET_LOGITS: tl.constexpr,
        DRAFT: tl.constexpr,
        RULE: tl.constexpr,
        RAGGED: tl.constexpr,
        BONUS_IDS: tl.constexpr,
        HAS_GREEDY: tl.constexpr,
        SAMPLED: tl.constexpr,
        RAW_MASS: tl.constexpr,
        FUSED: tl.constexpr,
    ):
        """Accept test, accepted length, residual draw and output row of ``R`` requests."""
        target = (tgt, t_rs, t_inv, t_cut, t_lse)
        draft = (drf, d_rs, d_cut, d_lse)
        req = (tl.program_id(0) * R + tl.arange(0, R)).to(tl.int64)
        live = req < batch
        starts = (t_start, d_start, n_drafts)
        t_first, d_first, id_first, n = _layout(req, live, starts, t_step, d_step, k, RAGGED)
        j, tok, valid, q_at, p_at = _drafts(
            target, draft, ids, live, t_first, d_first, id_first, n, vocab, K1, TARGET_LOGITS, DRAFT
        )
        g = req < 0
        count = tl.zeros([R], tl.int64)
        final = tl.zeros([R], tl.int64)
        if HAS_GREEDY:
            g, count, final = _greedy(
                t_argmax, t_cut, greedy, req, live, t_first, j, tok, valid, n, K1
            )
        if SAMPLED:
            sampled = live & (g == 0)
            nb = tl.arange(0, NB_PAD)
            cols = tl.arange(0, COLS).to(tl.int64)
            if RULE == 0:
                pos = _chain_accepted(uni, u_stride, req, live, j, valid, q_at, p_at, n, k, K1)
                w = tl.full([R], 1.0, tl.float32)
                slot = tl.zeros([R], tl.int64)
            else:
                weights = _block_weights(j, valid, q_at, p_at, K1)
                z = tl.zeros([R, K1], tl.float64)
                if FUSED:
                    none = tl.full([R], -1, tl.int64)
                    for i in tl.static_range(1, K1):
                        read = sampled & (i < n)
                        w_i = _take(weights, j, tl.zeros([R], tl.int64) + i).to(tl.float32)
                        rows_i = (
                            t_first + i,
                            tl.where(read, d_first + i, 0),
                            read,
                            w_i,
                            read,
                            none,
                        )
                        mask = read[:, None] & (cols[None, :] < vocab)
                        _, r_i = _tile_masses(
                            target,
                            draft,
                            rows_i,
                            cols[None, :],
                            mask,
                            R,
                            1,
                            COLS,
                            TARGET_LOGITS,
                            DRAFT,
                            False,
                        )
                        z_i = tl.sum(r_i.to(tl.float64), axis=1)
                        z = tl.where(j[None, :] == i, z_i[:, None], z)
                else:
                    at = ((req[:, None, None] * n_positions + j[None, :, None]) * 2 + 1) * n_blocks
                    wanted = (
                        sampled[:, None, None]
                        & (j[None, :, None] >= 1)
                        & (j[None, :, None] < n[:, None, None])
                        & (nb[None, None, :] < n_blocks)
                    )
                    per_block = tl.load(masses + at + nb[None, None, :], mask=wanted, other=0.0)
                    z = tl.sum(per_block.to(tl.float64), axis=2)
                pos = _block_length(uni, u_stride, req, live, j, weights, z, n, k)
                w = _take(weights, j, pos).to(tl.float32)
                slot = pos
            keep = pos < n
            bonus_used = pos == n if BONUS_IDS else req < 0
            need = sampled & (bonus_used == 0)
            excluded = tl.where(
                keep & (_take(valid.to(tl.int32), j, pos) != 0), _take(tok, j, pos), -1
            )
            rows = (t_first + pos, tl.where(keep, d_first + pos, 0), need, w, keep, excluded)
            if FUSED:
                mask = need[:, None] & (cols[None, :] < vocab)
                target_mass, residual_mass = _tile_masses(
                    target,
                    draft,
                    rows,
                    cols[None, :],
                    mask,
                    R,
                    1,
                    COLS,
                    TARGET_LOGITS,
                    DRAFT,
                    RAW_MASS,
                )
            else:
                at = (req * n_positions + slot) * 2 * n_blocks
                wanted = need[:, None] & (nb[None, :] < n_blocks)
                at = at[:, None] + nb[None, :]
                target_mass = tl.load(masses + at, mask=wanted, other=0.0)
                residual_mass = tl.load(masses + at + n_blocks, mask=wanted, other=0.0)
            use_target = (tl.sum(residual_mass.to(tl.float64), axis=1) > 0.0) == 0
            block_mass = tl.where(use_target[:, None], target_mass, residual_mass)
            u = tl.load(uni + req * u_stride + k, mask=live, other=0.0)
            block, u = _pick(block_mass.to(tl.float64), nb, n_blocks, u)
            token = _segment_draw(
                target, draft, rows, use_target, u, block, vocab, R, COLS, TARGET_LOGITS, DRAFT
            )
            token = tl.minimum(tl.maximum(token, 0), vocab - 1)
            if BONUS_IDS:
                given = tl.load(bonus + req, mask=live, other=0).to(tl.int64)
                token = tl.where(bonus_used, given, token)
            count = tl.where(g, count, pos)
            final = tl.where(g, final, token)
        last = tl.where(j[None, :] == count[:, None], final[:, None], -1)
        row = tl.where(j[None, :] < count[:, None], tok, last)
        store = live[:, None] & (j[None, :] <= k)
        tl.store(out + req[:, None] * (k + 1) + j[None, :], row, mask=store)
        tl.store(n_out + req, count, mask=live)
