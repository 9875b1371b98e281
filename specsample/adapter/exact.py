"""Row-exact float32 forwards: a position's logits whatever else the forward computes.

Seeded speculative decoding gives the very text seeded target-only decoding gives only if
the target's logits for a position are the same bits whether the position is computed alone
(one token per sequence and forward) or inside a verified block, whatever the other
sequences of the batch, the masked slots of the cache (rejected drafts, left padding) and the
thread count. Row-wise operations (the embedding, RMS norms, rotary tables, SiLU, residual
additions) are so already; two kinds of operation are not, by default:

* the float32 matrix products: PyTorch's default product splits a row's sums differently
  for different numbers of rows. oneDNN's product on weights laid out for it
  (``torch.ops.mkldnn``) does not, on the x86-64 machines measured (1 to 2048 rows, 1 or 2
  threads, every projection shape of the shipped target): :func:`products_agree` checks it
  on the machine at hand, for each weight, at 1 thread and at 2 or PyTorch's count;
* attention: PyTorch's kernels group the sums over slots in blocks, so a masked slot, a
  wider cache or another query row changes how a row's sums are rounded.
  :func:`attend` runs :func:`specsample.kernels.cpu.rowexact.attend` instead, which visits the
  slots a row may see in order and skips the others.

:class:`~specsample.adapter.fused.FusedForward` does both where :func:`possible` allows
(float32 activations on a CPU, every float weight laid out for oneDNN, the CPU kernels
compiled) and the probes pass (:func:`~specsample.adapter.fused.fused_forward`).

Measured on the shipped target (float32 Llama, 12 layers, hidden 320) on a two-core AVX-512
x86-64 machine: the default forward gave a block's logits bit for bit those of its rows fed
one at a time for none of the positions probed (at batch 1, and at batch 4 with masked
slots; differences up to ``1.5e-5``), the row-exact one for all of them, at 1 and 2 threads.
It decoded 4 prompts of 64 tokens greedily 4% faster at one thread, target alone and with
the shipped draft (k = 4), and no slower at two, as its attention kernel runs about as fast
as PyTorch's at these widths and a few small products run faster laid out for oneDNN.
"""

from __future__ import annotations

from collections.abc import Iterator, Sequence
from contextlib import contextmanager
from typing import TYPE_CHECKING, Any

import torch

from specsample.adapter.cache import KVCache
from specsample.kernels.cpu import compiler

if TYPE_CHECKING:
    from specsample.adapter.fused import FusedForward

PARALLEL_WORK = 1 << 16
"""Fewest dot products (query rows times slots) for which :func:`attend` shares its rows
among threads: below it, waking a second thread pool costs more than it saves."""

PROBE_ROWS = (2, 3, 4, 5, 7, 8, 9, 15, 16, 17, 20, 25, 31, 32, 33, 48, 64)
"""Numbers of rows at which :func:`products_agree` compares a product with its rows alone."""


def possible(dtype: torch.dtype, device: torch.device) -> bool:
    """Whether a forward in ``dtype`` on ``device`` can attend row by row exactly: float32 on
    a CPU, with the CPU kernels compiled (compiled, or loaded, on first call).

    Examples
    --------
    >>> possible(torch.float64, torch.device("cpu"))
    False
    """
    return dtype == torch.float32 and device.type == "cpu" and compiler.ready()


def _memory(tensor: torch.Tensor) -> tuple[int, int, int, int]:
    """``(address, strides of the first three dimensions)`` in elements."""
    stride = tensor.stride()
    return (tensor.data_ptr(), stride[0], stride[1], stride[2])


def _rows_contiguous(tensor: torch.Tensor) -> torch.Tensor:
    """``tensor`` itself when its last two dimensions are contiguous, else a copy."""
    if tensor.stride(-1) == 1 and tensor.stride(-2) == tensor.shape[-1]:
        return tensor
    return tensor.contiguous()


def attend(
    query: torch.Tensor,
    keys: torch.Tensor,
    values: torch.Tensor,
    mask: torch.Tensor,
    scale: float,
) -> torch.Tensor | None:
    """Attention of each query row alone over the slots ``mask`` shows it, in slot order.

    Parameters
    ----------
    query : torch.Tensor
        ``[batch, heads, n, dim]`` float32 (its last dimension contiguous).
    keys, values : torch.Tensor
        ``[batch, kv_heads, width, dim]`` float32 (``heads`` a multiple of ``kv_heads``).
    mask : torch.Tensor
        ``[batch, 1, n, width]`` additive float32 mask; a slot below
        :data:`specsample.kernels.cpu.rowexact.MASKED` is skipped.
    scale : float
        The factor of the dot products.

    Returns
    -------
    torch.Tensor or None
        ``[batch, heads, n, dim]`` (a transposed view of ``[batch, n, heads, dim]``), or
        ``None`` where the kernels cannot take the call
        (:func:`specsample.kernels.cpu.compiler.runs_on`:
        traced, or not compiled).
    """
    if not compiler.runs_on(query):
        return None
    from specsample.kernels.cpu import rowexact

    batch, heads, n, dim = query.shape
    if query.stride(-1) != 1:
        query = query.contiguous()
    keys, values = _rows_contiguous(keys), _rows_contiguous(values)
    if mask.stride(-1) != 1:
        mask = mask.contiguous()
    out = query.new_empty(batch, n, heads, dim)
    shape = (batch, heads, keys.shape[1], n, keys.shape[2], dim)
    units = batch * heads * n
    chunks = min(compiler.threads(), units) if units * keys.shape[2] >= PARALLEL_WORK else 1
    kernel = rowexact.attend_serial if chunks == 1 else rowexact.attend
    kernel(
        _memory(query), _memory(keys), _memory(values), _memory(mask), out.data_ptr(), shape,
        float(scale), chunks,
    )  # fmt: skip
    return out.transpose(1, 2)


@contextmanager
def _threads(count: int) -> Iterator[None]:
    """PyTorch's thread count set to ``count`` for the block, then restored."""
    before = torch.get_num_threads()
    torch.set_num_threads(count)
    try:
        yield
    finally:
        torch.set_num_threads(before)


def products_agree(products: Sequence[Any], rows: Sequence[int] = PROBE_ROWS) -> bool:
    """Whether each product gives every row of a block bit for bit what it gives the row
    alone, for each number of ``rows``, at 1 thread and at ``max(2, PyTorch's count)``
    threads, and the same bits at both.

    Parameters
    ----------
    products : sequence of Projection
        The projections to probe (each by :meth:`~specsample.adapter.projection.Projection.joined`).
    rows : sequence of int
        Block sizes.

    Returns
    -------
    bool
    """
    largest = max(rows, default=1)
    generator = torch.Generator().manual_seed(0)
    for product in products:
        inputs = product.in_features
        x = torch.randn(largest, inputs, generator=generator)
        alone: torch.Tensor | None = None
        for count in sorted({1, max(2, torch.get_num_threads())}):
            with _threads(count), torch.inference_mode():
                single = torch.cat([product.joined(x[i : i + 1]) for i in range(largest)])
                if alone is not None and not torch.equal(single, alone):
                    return False
                alone = single
                for n in rows:
                    if not torch.equal(product.joined(x[:n]), single[:n]):
                        return False
    return True


def rows_agree(fused: FusedForward, prefix: int = 5, block: int = 4) -> bool:
    """Whether ``fused``, attending row by row, gives a block's logits bit for bit as the
    block's rows fed one at a time do.

    A probe of ``prefix`` tokens then ``block`` more goes through a fresh cache twice: the
    block in one forward, and one token per forward. The products of int4 and int8 weights
    compute each row alone; oneDNN's bfloat16 product does for some shapes only, so this
    is measured, not assumed.

    Parameters
    ----------
    fused : FusedForward
    prefix, block : int
        Tokens before the block, and in it.

    Returns
    -------
    bool
    """
    vocab = fused.embedding.shape[0]
    device, dtype = fused.embedding.device, fused.embedding.dtype
    tokens = (torch.arange(prefix + block, device=device) * 7 + 3).remainder(vocab)[None]
    before = fused.row_exact
    fused.row_exact = True
    try:
        with torch.inference_mode():
            together = _probe_logits(fused, tokens, [prefix, block], dtype)
            alone = _probe_logits(fused, tokens, [prefix] + [1] * block, dtype)
    finally:
        fused.row_exact = before
    return bool(torch.equal(together, alone))


def _probe_logits(
    fused: FusedForward, tokens: torch.Tensor, sizes: list[int], dtype: torch.dtype
) -> torch.Tensor:
    """The logits after the first block of ``tokens [1, total]`` fed in blocks of ``sizes``."""
    cache = KVCache(1, tokens.device)
    start, out = 0, []
    for size in sizes:
        cache.add_slots(size)
        slots = torch.arange(cache.width, device=tokens.device)
        rows = torch.arange(start, start + size, device=tokens.device)
        mask = torch.zeros(1, 1, size, cache.width, dtype=dtype, device=tokens.device)
        mask.masked_fill_(slots[None, :] > rows[:, None], float("-inf"))
        ids = tokens[:, start : start + size]
        out.append(fused(ids, rows[None], mask, cache, size))
        start += size
    return torch.cat(out[1:], dim=1)
