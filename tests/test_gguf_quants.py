"""Decoding GGUF tensor data (:mod:`specsample.adapter.gguf_quants`).

Every block format decodes random blocks (their float16 scales any bit pattern, infinities
and NaNs included) to the very float32 bits the ``gguf`` package's reference
``dequantize`` gives, over enough blocks to span several of the slices :func:`dequantize`
works in; its block shapes are the package's; sizes that do not match are refused.
"""

from __future__ import annotations

import numpy as np
import pytest

from specsample.adapter.gguf_quants import FORMATS, dequantize, tensor_bytes

gguf = pytest.importorskip("gguf", reason="the reference decoder is the gguf package's")


@pytest.mark.parametrize("kind", sorted(FORMATS))
def test_each_format_decodes_as_the_reference_bit_for_bit(kind: str) -> None:
    qtype = gguf.GGMLQuantizationType[kind]
    block = FORMATS[kind]
    assert (block.values, block.size) == gguf.GGML_QUANT_SIZES[qtype]
    blocks = 70_000 // block.values + 3
    data = np.random.default_rng(len(kind) * 7 + block.size).integers(
        0, 256, blocks * block.size, dtype=np.uint8
    )
    out = np.empty(blocks * block.values, dtype=np.float32)
    with np.errstate(all="ignore"):
        dequantize(kind, data, out)
        shaped = data if kind in ("F32", "F16") else data.reshape(blocks, block.size)
        want = np.asarray(gguf.quants.dequantize(shaped, qtype), dtype=np.float32).reshape(-1)
    np.testing.assert_array_equal(out.view(np.uint32), want.view(np.uint32))


def test_tensor_bytes_and_bad_sizes_are_refused() -> None:
    assert tensor_bytes("Q6_K", 512) == 420 and tensor_bytes("F32", 5) == 20
    with pytest.raises(ValueError, match="kind must be one of"):
        tensor_bytes("IQ2_XS", 256)
    with pytest.raises(ValueError, match="count must be a multiple of 32 for Q8_0"):
        tensor_bytes("Q8_0", 48)
    with pytest.raises(ValueError, match="data must hold 34 bytes, got 33"):
        dequantize("Q8_0", np.zeros(33, dtype=np.uint8), np.empty(32, dtype=np.float32))
    with pytest.raises(ValueError, match="out must be a contiguous float32 array"):
        dequantize("F16", np.zeros(8, dtype=np.uint8), np.empty(4, dtype=np.float64))
    with pytest.raises(ValueError, match="out must be a contiguous float32 array"):
        dequantize("F16", np.zeros(8, dtype=np.uint8), np.empty(8, dtype=np.float32)[::2])
