"""Triton programs of the residual ``max(w q - p, 0)``: its block masses, and the draw.

* :func:`_store_masses`, the masses phase of
:func:`specsample.kernels.triton.step_kernel._step_kernel`
  (grid ``(request tiles, positions, vocabulary splits)``): for the row a request's draw reads
  (chain rule) or for every draft position (block rule), the per-block target mass ``sum q``
  and residual mass ``sum max(w q - p, 0)`` over blocks of :data:`BLOCK` columns, written to a
  ``[batch, positions, 2, blocks]`` float64 scratch;
* :func:`_draw`, called by its verify phase: the hierarchical
  inverse-CDF draw (block, 32-token part, token) from the masses and one segment of
  :data:`BLOCK` columns.

The arithmetic is that of :mod:`specsample.rules.residual`, operation by operation, so that
the block masses are the rule's bit for bit (up to the order of the float64 sums):

* block masses (:func:`_block_terms`): ``w q - p`` rounded once, as the rule's ``torch.sub``
  (``w = 1``) and ``torch.addcmul`` (a fused multiply-add) round it, in the dtype the rule
  computes in: float32, whatever the dtype of the probabilities (float16 and bfloat16 are
  widened first, never rounded back), and float64 for float64 target probabilities
  (``WIDE``, where the target terms are float64 too); the terms are clamped at 0 and summed
  per block in float64;
* within-block draw: float32 as the rule's segments, ``max(w q - p, 0)`` rounded once as
  for the masses (the rule's ``torch.addcmul``), float64 sums and prefix sums.

The selected rows are passed as ``(target row, draft row, read, w, keep, excluded)``, each
``[R]`` (see :func:`specsample.kernels.triton._common._draw_row`).

Without :mod:`triton` installed this module defines nothing. Imports within the package are
relative, so that each copy of the kernels loaded by :mod:`specsample.kernels.triton.launch` (one
compiled, one interpreted) uses helpers decorated in its own mode.
"""

try:
    import triton
    import triton.language as tl
except ImportError:
    triton = None

if triton is not None:
    from ._common import (
        BLOCK,
        PART,
        PARTS,
        _block_weights,
        _bound,
        _chain_accepted,
        _draw_row,
        _logit_probs,
        _pick,
        _take,
    )

    @triton.jit
    def _target_rows(target, rows, read, cols, mask, TARGET_LOGITS: tl.constexpr):
        """Target probabilities ``[R, C]`` (float32) at ``rows [R]`` and ``cols``, raw values."""
        ptr, stride, inv_t, cutoff, log_norm, shift = target
        raw = tl.load(ptr + rows[:, None] * stride + cols, mask=mask, other=0.0)
        if TARGET_LOGITS:
            inv = tl.load(inv_t + rows, mask=read, other=1.0)
            cut = tl.load(cutoff + rows, mask=read, other=0.0)
            lse = tl.load(log_norm + rows, mask=read, other=0.0)
            sh = tl.load(shift + rows, mask=read, other=0.0)
            q = _logit_probs(raw, sh[:, None], inv[:, None], cut[:, None], lse[:, None], mask)
        else:
            q = raw.to(tl.float32)
        return q, raw

    @triton.jit
    def _draft_rows(draft, rows, read, cols, mask, DRAFT: tl.constexpr):
        """Dense draft probabilities ``[R, C]`` (float32) at ``rows [R]``, and raw values."""
        ptr, stride, cutoff, log_norm, shift = draft
        raw = tl.load(ptr + rows[:, None] * stride + cols, mask=mask, other=0.0)
        if DRAFT == 2:
            cut = tl.load(cutoff + rows, mask=read, other=0.0)
            lse = tl.load(log_norm + rows, mask=read, other=0.0)
            sh = tl.load(shift + rows, mask=read, other=0.0)
            p = _logit_probs(raw, sh[:, None], 1.0, cut[:, None], lse[:, None], mask)
        else:
            p = raw.to(tl.float32)
        return p, raw

    @triton.jit
    def _block_terms(q, q_raw, p, p_raw, w, WIDE: tl.constexpr):
        """``w q - p`` rounded once, ``[R, C]``: float64 (``WIDE``) or float32.

        ``WIDE`` (float64 target probabilities, dense draft probabilities): from the raw values in
        float64; else from the float32 ``q`` and ``p``. A fused multiply-add, as the rule's
        ``addcmul``; with ``w = 1`` it is the exact difference rounded once, as ``torch.sub``.
        """
        if WIDE:
            d = tl.fma(q_raw.to(tl.float64), w[:, None].to(tl.float64), -p_raw.to(tl.float64))
        else:
            d = tl.fma(q, w[:, None], -p)
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
        WIDE: tl.constexpr,
    ):
        """``q`` and the residual ``[R, C]``, zero where ``mask`` is off: float32, or float64
        for ``WIDE`` rows (float64 target probabilities with dense draft probabilities).

        Dense draft: ``max(w q - p, 0)`` where ``keep``, else ``q``, rounded once
        (:func:`_block_terms`, as the masses and the draw of the rule both compute it);
        one-hot draft: ``q`` without column ``excluded``; none: ``q``.
        """
        t_row, d_row, read, w, keep, excluded = rows
        q, q_raw = _target_rows(target, t_row, read, cols, mask, TARGET_LOGITS)
        if WIDE:
            q = q_raw.to(tl.float64)
        if DRAFT == 0:
            r = tl.where(cols == excluded[:, None], 0.0, q)
        else:
            p, p_raw = _draft_rows(draft, d_row, read & keep, cols, mask & keep[:, None], DRAFT)
            d = _block_terms(q, q_raw, p, p_raw, w, WIDE)
            r = tl.where(keep[:, None], tl.where(d < 0.0, 0.0, d).to(q.dtype), q)
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
        WIDE: tl.constexpr,
    ):
        """Per-block ``sum q`` and residual mass of a tile of ``NT`` blocks, each ``[R, NT]``
        float64."""
        q, r = _residual(target, draft, rows, cols, mask, TARGET_LOGITS, DRAFT, WIDE)
        target_mass = tl.sum(tl.reshape(q.to(tl.float64), (R, NT, COLS)), axis=2)
        residual_mass = tl.sum(tl.reshape(r.to(tl.float64), (R, NT, COLS)), axis=2)
        return target_mass, residual_mass

    @triton.jit
    def _store_masses(
        target,
        draft,
        greedy,
        uniforms,
        masses,
        requests,
        sizes,
        R: tl.constexpr,
        K1: tl.constexpr,
        COLS: tl.constexpr,
        BPI: tl.constexpr,
        TARGET_LOGITS: tl.constexpr,
        DRAFT: tl.constexpr,
        RULE: tl.constexpr,
        BONUS_IDS: tl.constexpr,
        HAS_GREEDY: tl.constexpr,
        WIDE: tl.constexpr,
    ):
        """The masses phase: block masses of the row a request draws from (chain) or of every
        position (block), for program ``(tile, position, split)``.

        ``uniforms`` is ``(pointer, row stride)``, ``requests`` what
        :func:`specsample.kernels.triton._common._requests` returns, ``sizes`` is ``(vocab, k,
        n_blocks, n_positions, iters_per_split)``.
        """
        uni, u_stride = uniforms
        req, live, t_first, d_first, n, drafts = requests
        vocab, k, n_blocks, n_positions, iters_per_split = sizes
        j, tok, valid, q_at, p_at = drafts
        slot = tl.program_id(1)
        split = tl.program_id(2)
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
        rows = _draw_row(pos, n, j, tok, valid, t_first, d_first, w, active)
        first = split * iters_per_split
        last = tl.minimum(first + iters_per_split, tl.cdiv(n_blocks, BPI))
        last = tl.where(tl.max(active.to(tl.int32), axis=0) > 0, last, first)
        base = (req * n_positions + slot) * 2 * n_blocks
        for it in range(_bound(first), _bound(last)):
            cols = it * (BPI * BLOCK) + tl.arange(0, BPI * COLS).to(tl.int64)
            mask = active[:, None] & (cols[None, :] < vocab)
            target_mass, residual_mass = _tile_masses(
                target, draft, rows, cols[None, :], mask, R, BPI, COLS, TARGET_LOGITS, DRAFT, WIDE
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
            part, u = _pick(tl.sum(r.to(tl.float64), axis=2), parts, PARTS, u)
            inner = tl.sum(tl.where(parts[None, :, None] == part[:, None, None], r, 0.0), axis=1)
            offset, _ = _pick(inner.to(tl.float64), tl.arange(0, PART), PART, u)
            token = start + part * PART + offset
        return token

    @triton.jit
    def _draw(
        target,
        draft,
        rows,
        target_mass,
        residual_mass,
        u,
        n_blocks,
        vocab,
        R: tl.constexpr,
        COLS: tl.constexpr,
        NB_PAD: tl.constexpr,
        TARGET_LOGITS: tl.constexpr,
        DRAFT: tl.constexpr,
    ):
        """One token per request from the residual of ``rows``, its masses ``[R, NB_PAD]``.

        The target row is drawn instead where the residual has no positive mass; the token
        always lies in ``[0, vocab)``.
        """
        use_target = (tl.sum(residual_mass.to(tl.float64), axis=1) > 0.0) == 0
        block_mass = tl.where(use_target[:, None], target_mass, residual_mass)
        block, u = _pick(block_mass.to(tl.float64), tl.arange(0, NB_PAD), n_blocks, u)
        token = _segment_draw(
            target, draft, rows, use_target, u, block, vocab, R, COLS, TARGET_LOGITS, DRAFT
        )
        return tl.minimum(tl.maximum(token, 0), vocab - 1)
