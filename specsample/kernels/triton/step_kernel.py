"""The chain and block step kernel of :mod:`specsample.kernels.triton` (see
:mod:`specsample.kernels.triton.launch`).

One kernel, :func:`_step_kernel`, launched once or twice per step; its ``PHASE`` selects the
work:

* ``PHASE=0``, grid ``(request tiles, positions, vocabulary splits)``: the per-block target
  and residual masses of the rows the draw may read, into a float64 scratch
  (:func:`specsample.kernels.triton._residual._store_masses`);
* ``PHASE=1``, grid ``(request tiles,)``: the accept test, greedy matching, block
  verification's accepted length, then the residual draw
  (:func:`specsample.kernels.triton._residual._draw`) and the output row (:func:`_verify_requests`).

When the vocabulary fits in one block (``FUSED``) the second phase computes the masses itself
and the first is not launched. Every program handles ``R`` requests (1 on a GPU; more under
the interpreter, where each operation is vectorised over them). The arithmetic follows
:mod:`specsample.rules` operation by operation: accept tests, weights, prefix sums and
uniforms in float64, probabilities in float32, block masses as
:mod:`specsample.kernels.triton._residual` describes, the same inverse-CDF cell rule, the same
fallbacks. Shared helpers live in :mod:`specsample.kernels.triton._common`.

Without :mod:`triton` installed this module defines nothing (the package imports without it);
it is loaded by the launcher, once per mode (compiled, or interpreted when
``TRITON_INTERPRET=1``), when a kernel first runs. Imports within the package are relative,
so that each copy uses helpers decorated in its own mode.
"""

try:
    import triton
    import triton.language as tl
except ImportError:
    triton = None

if triton is not None:
    from ._common import (
        VARYING,
        _block_weights,
        _chain_accepted,
        _draw_row,
        _requests,
        _take,
    )
    from ._residual import _draw, _store_masses, _tile_masses

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
    def _greedy(
        argmax, cutoff, greedy, bonus, req, live, t_first, j, tok, valid, n,
        K1: tl.constexpr, BONUS_IDS: tl.constexpr,
    ):  # fmt: skip
        """Greedy requests, their drafts matched in order and their final token, each ``[R]``.

        With given bonus ids (``BONUS_IDS``, no bonus rows) a request whose drafts all match
        emits its bonus id, and no row past its drafts is read.
        """
        g = tl.load(greedy + req, mask=live, other=0) != 0
        t_row = t_first[:, None] + j[None, :]
        in_request = live[:, None] & (j[None, :] < n[:, None])
        best = tl.load(argmax + t_row, mask=in_request, other=-1).to(tl.int64)
        cut = tl.load(cutoff + t_row, mask=in_request, other=0.0)
        matched = (tok == best) & (cut == cut) & valid
        count = tl.minimum(tl.min(tl.where(matched, K1, j[None, :]), axis=1), n)
        read = live & g
        if BONUS_IDS:
            read = read & (count < n)
        final = tl.load(argmax + t_first + count, mask=read, other=0).to(tl.int64)
        if BONUS_IDS:
            given = tl.load(bonus + req, mask=live, other=0).to(tl.int64)
            final = tl.where(count == n, given, final)
        return g, count, final

    @triton.jit
    def _fused_block_z(
        target,
        draft,
        sampled,
        drafts,
        weights,
        t_first,
        d_first,
        n,
        vocab,
        R: tl.constexpr,
        K1: tl.constexpr,
        COLS: tl.constexpr,
        TARGET_LOGITS: tl.constexpr,
        DRAFT: tl.constexpr,
        WIDE: tl.constexpr,
    ):
        """``Z_i`` of positions ``1 .. n - 1``, ``[R, K1]`` float64, for a one-block vocabulary.

        As the rule: the float64 block mass of ``max(w_i q_i - p_i, 0)``.
        """
        j, tok, valid, _, _ = drafts
        cols = tl.arange(0, COLS).to(tl.int64)
        z = tl.zeros([R, K1], tl.float64)
        for i in tl.static_range(1, K1):
            at = tl.zeros([R], tl.int64) + i
            read = sampled & (i < n)
            w_i = _take(weights, j, at).to(tl.float32)
            rows_i = _draw_row(at, n, j, tok, valid, t_first, d_first, w_i, read)
            mask = read[:, None] & (cols[None, :] < vocab)
            _, mass = _tile_masses(
                target, draft, rows_i, cols[None, :], mask, R, 1, COLS, TARGET_LOGITS, DRAFT, WIDE
            )
            z = tl.where(j[None, :] == i, tl.sum(mass.to(tl.float64), axis=1)[:, None], z)
        return z

    @triton.jit
    def _stored_block_z(masses, req, sampled, j, n, n_blocks, n_positions, NB_PAD: tl.constexpr):
        """``Z_i`` of positions ``1 .. n - 1``, ``[R, K1]`` float64, from the stored masses."""
        nb = tl.arange(0, NB_PAD)
        at = ((req[:, None, None] * n_positions + j[None, :, None]) * 2 + 1) * n_blocks
        wanted = (
            sampled[:, None, None]
            & (j[None, :, None] >= 1)
            & (j[None, :, None] < n[:, None, None])
            & (nb[None, None, :] < n_blocks)
        )
        per_block = tl.load(masses + at + nb[None, None, :], mask=wanted, other=0.0)
        return tl.sum(per_block.to(tl.float64), axis=2)

    @triton.jit
    def _row_masses(
        target,
        draft,
        masses,
        rows,
        req,
        slot,
        vocab,
        n_blocks,
        n_positions,
        R: tl.constexpr,
        COLS: tl.constexpr,
        NB_PAD: tl.constexpr,
        TARGET_LOGITS: tl.constexpr,
        DRAFT: tl.constexpr,
        WIDE: tl.constexpr,
        FUSED: tl.constexpr,
    ):
        """Target and residual block masses of the drawn rows, each ``[R, NB_PAD]`` float64.

        Computed here for a one-block vocabulary (``FUSED``), else read at position ``slot``
        of the scratch written by the masses kernel.
        """
        need = rows[2]
        if FUSED:
            cols = tl.arange(0, COLS).to(tl.int64)
            mask = need[:, None] & (cols[None, :] < vocab)
            target_mass, residual_mass = _tile_masses(
                target, draft, rows, cols[None, :], mask, R, 1, COLS, TARGET_LOGITS, DRAFT, WIDE
            )
        else:
            nb = tl.arange(0, NB_PAD)
            at = (req * n_positions + slot) * 2 * n_blocks
            wanted = need[:, None] & (nb[None, :] < n_blocks)
            at = at[:, None] + nb[None, :]
            target_mass = tl.load(masses + at, mask=wanted, other=0.0)
            residual_mass = tl.load(masses + at + n_blocks, mask=wanted, other=0.0)
        return target_mass, residual_mass

    @triton.jit
    def _verify_requests(
        target,
        draft,
        t_argmax,
        greedy,
        bonus,
        uniforms,
        masses,
        outputs,
        requests,
        sizes,
        R: tl.constexpr,
        K1: tl.constexpr,
        COLS: tl.constexpr,
        NB_PAD: tl.constexpr,
        TARGET_LOGITS: tl.constexpr,
        DRAFT: tl.constexpr,
        RULE: tl.constexpr,
        BONUS_IDS: tl.constexpr,
        HAS_GREEDY: tl.constexpr,
        SAMPLED: tl.constexpr,
        WIDE: tl.constexpr,
        FUSED: tl.constexpr,
    ):
        """The verify phase: accept test, accepted length, residual draw and output row.

        ``uniforms`` is ``(pointer, row stride)``, ``outputs`` ``(token ids, accepted
        counts)``, ``requests`` what :func:`specsample.kernels.triton._common._requests` returns,
        ``sizes`` is ``(vocab, k, n_blocks, n_positions)``.
        """
        uni, u_stride = uniforms
        req, live, t_first, d_first, n, drafts = requests
        vocab, k, n_blocks, n_positions = sizes
        j, tok, valid, q_at, p_at = drafts
        _, _, _, t_cut, _, _ = target
        g = req < 0
        count = tl.zeros([R], tl.int64)
        final = tl.zeros([R], tl.int64)
        if HAS_GREEDY:
            g, count, final = _greedy(
                t_argmax, t_cut, greedy, bonus, req, live, t_first, j, tok, valid, n, K1,
                BONUS_IDS,
            )  # fmt: skip
        if SAMPLED:
            sampled = live & (g == 0)
            if RULE == 0:
                pos = _chain_accepted(uni, u_stride, req, live, j, valid, q_at, p_at, n, k, K1)
                w = tl.full([R], 1.0, tl.float32)
                slot = tl.zeros([R], tl.int64)
            else:
                weights = _block_weights(j, valid, q_at, p_at, K1)
                if FUSED:
                    z = _fused_block_z(
                        target, draft, sampled, drafts, weights, t_first, d_first, n, vocab,
                        R, K1, COLS, TARGET_LOGITS, DRAFT, WIDE,
                    )  # fmt: skip
                else:
                    z = _stored_block_z(masses, req, sampled, j, n, n_blocks, n_positions, NB_PAD)
                pos = _block_length(uni, u_stride, req, live, j, weights, z, n, k)
                w = _take(weights, j, pos).to(tl.float32)
                slot = pos
            bonus_used = pos == n if BONUS_IDS else req < 0
            need = sampled & (bonus_used == 0)
            rows = _draw_row(pos, n, j, tok, valid, t_first, d_first, w, need)
            target_mass, residual_mass = _row_masses(
                target, draft, masses, rows, req, slot, vocab, n_blocks, n_positions,
                R, COLS, NB_PAD, TARGET_LOGITS, DRAFT, WIDE, FUSED,
            )  # fmt: skip
            u = tl.load(uni + req * u_stride + k, mask=live, other=0.0)
            token = _draw(
                target, draft, rows, target_mass, residual_mass, u, n_blocks, vocab,
                R, COLS, NB_PAD, TARGET_LOGITS, DRAFT,
            )  # fmt: skip
            if BONUS_IDS:
                given = tl.load(bonus + req, mask=live, other=0).to(tl.int64)
                token = tl.where(bonus_used, given, token)
            count = tl.where(g, count, pos)
            final = tl.where(g, final, token)
        out, n_out = outputs
        last = tl.where(j[None, :] == count[:, None], final[:, None], -1)
        row = tl.where(j[None, :] < count[:, None], tok, last)
        store = live[:, None] & (j[None, :] <= k)
        tl.store(out + req[:, None] * (k + 1) + j[None, :], row, mask=store)
        tl.store(n_out + req, count, mask=live)

    # A Triton kernel takes every tensor, stride, size and switch as a separate scalar
    # argument (it cannot take a struct), hence the long parameter list; it is written once,
    # and the two phases it selects take them grouped.
    @triton.jit(do_not_specialize=VARYING)
    def _step_kernel(
        tgt,
        t_rs,
        t_inv,
        t_cut,
        t_lse,
        t_shift,
        t_argmax,
        drf,
        d_rs,
        d_cut,
        d_lse,
        d_shift,
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
        WIDE: tl.constexpr,
        FUSED: tl.constexpr,
        PHASE: tl.constexpr,
    ):
        """One phase of a step for ``R`` requests: ``PHASE`` 0 the block masses
        (:func:`specsample.kernels.triton._residual._store_masses`), 1 the verification
        (:func:`_verify_requests`)."""
        target = (tgt, t_rs, t_inv, t_cut, t_lse, t_shift)
        draft = (drf, d_rs, d_cut, d_lse, d_shift)
        starts = (t_start, d_start, n_drafts)
        layout = (batch, vocab, k, t_step, d_step)
        requests = _requests(
            target, draft, ids, starts, layout, R, K1, TARGET_LOGITS, DRAFT, RAGGED
        )
        uniforms = (uni, u_stride)
        if PHASE == 0:
            sizes = (vocab, k, n_blocks, n_positions, iters_per_split)
            _store_masses(
                target, draft, greedy, uniforms, masses, requests, sizes,
                R, K1, COLS, BPI, TARGET_LOGITS, DRAFT, RULE, BONUS_IDS, HAS_GREEDY, WIDE,
            )  # fmt: skip
        else:
            _verify_requests(
                target, draft, t_argmax, greedy, bonus, uniforms, masses, (out, n_out), requests,
                (vocab, k, n_blocks, n_positions),
                R, K1, COLS, NB_PAD, TARGET_LOGITS, DRAFT, RULE, BONUS_IDS, HAS_GREEDY, SAMPLED,
                WIDE, FUSED,
            )  # fmt: skip
