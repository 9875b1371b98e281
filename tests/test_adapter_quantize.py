"""Weight-only quantized linear layers (:mod:`specsample.adapter.quantize`) and the loop on them.

Each format of PyTorch's products (bfloat16, int8, int4) applies ``bf16(bf16(x) @ W^T)``
with ``W`` its own dequantized weight; each of integer dot products (int4a8, int8a8) applies
``W`` to the input with each group of 32 quantized to int8 (float32 scales kept exactly),
the same float32 values whatever PyTorch's default dtype and the rows' dtype and layout, and
without numba says so before importing its kernels. Every format is bit for bit the same for
a row alone or among others, and joined weights give each part's outputs bit for bit;
quantizing from float stays within half a step (plus bfloat16's rounding of the scales).
GGUF's ``Q4_0``, ``Q4_1`` and ``Q4_K`` blocks, built here from random bytes, are read as the
file's own integers with a scale and an offset per group of 32 that give the values
:func:`~specsample.adapter.gguf_quants.dequantize` gives (float32 rounding apart); held as
int4, only bfloat16's rounding of the scales and offsets separates them. A tiny GGUF file
loads with its 4-bit tensors as int4 (query and key rows in the model's order; as int4a8 and
the ``Q8_0`` head as int8a8 where those are faster), and ``specsample generate`` keeps them
so by default (``--quantize``). On quantized models the fused forward gives the model's own
logits, and with int4, int8, int4a8 or int8a8 weights a block of rows gives bit for bit the
logits of its rows fed one at a time; greedy speculative decoding gives target-only
decoding's tokens (the shipped pair, int4 and int4a8), and sampled tokens follow the
quantized target's law (chi-square, as ``tests/test_generate.py`` tests the float models,
int4 and int4a8).
"""

from __future__ import annotations

import copy
import sys
import warnings
from pathlib import Path
from typing import Any

import numpy as np
import pytest
import torch

transformers = pytest.importorskip("transformers")

from specsample import adapter  # noqa: E402
from specsample.adapter import CachedLM  # noqa: E402
from specsample.adapter.dot_weights import (  # noqa: E402
    Int4Int8Weight,
    Int8Int8Weight,
    dot_products,
    int4_format,
)
from specsample.adapter.gguf_quants import FORMATS as GGML_FORMATS  # noqa: E402
from specsample.adapter.gguf_quants import dequantize, int4_groups  # noqa: E402
from specsample.adapter.quantize import (  # noqa: E402
    FORMATS,
    QuantizedLinear,
    computes_in_bfloat16,
    quantize_model,
    quantize_weight,
    quantized_layers,
)
from specsample.adapter.weight_formats import (  # noqa: E402
    BFloat16Weight,
    Int4Weight,
    Int8Weight,
    affine_groups,
)
from specsample.generate import (  # noqa: E402
    ModelDrafter,
    NGramDrafter,
    speculative_generate,
    target_generate,
)
from specsample.kernels.cpu import compiler  # noqa: E402
from tests.tiny_llama import make_pair  # noqa: E402

BF16_STEP = 2.0**-8
"""Twice bfloat16's relative rounding error: the bound used for one bfloat16 rounding."""


def _weight(rows: int, columns: int, seed: int = 0) -> torch.Tensor:
    generator = torch.Generator().manual_seed(seed)
    return torch.randn(rows, columns, generator=generator) * 0.1


def _input(rows: int, columns: int, seed: int = 1) -> torch.Tensor:
    return torch.randn(rows, columns, generator=torch.Generator().manual_seed(seed))


TORCH_FORMATS = ("bfloat16", "int8", "int4")
"""The formats applied by PyTorch's products (bfloat16 in and out)."""

DOT_FORMATS = tuple(f for f in FORMATS if f not in TORCH_FORMATS)
"""The formats of integer dot products (:mod:`specsample.adapter.int_products`; float32 in and
out)."""

needs_numba = pytest.mark.skipif(
    not compiler.available(), reason="the dot-product formats need numba"
)

ALL_FORMATS = [*TORCH_FORMATS, *(pytest.param(f, marks=needs_numba) for f in DOT_FORMATS)]
"""Every format, those of dot products skipped without numba."""


@pytest.mark.parametrize("format", TORCH_FORMATS)
def test_product_is_the_bfloat16_product_of_its_own_weight(format: str) -> None:
    weight = quantize_weight(_weight(72, 96), format)
    x = _input(5, 96)
    got = weight(x)
    assert got.dtype == torch.bfloat16 and got.shape == (5, 72)
    exact = x.to(torch.bfloat16).double() @ weight.dequantize().double().T
    error = (got.double() - exact).abs()
    assert bool((error <= BF16_STEP * exact.abs() + 1e-6 * exact.abs().max()).all())


@needs_numba
@pytest.mark.parametrize("format", DOT_FORMATS)
def test_dot_product_formats_quantize_each_group_of_inputs_to_int8(format: str) -> None:
    weight = quantize_weight(_weight(72, 96), format)
    x = _input(5, 96)
    got = weight(x)
    assert got.dtype == torch.float32 and got.shape == (5, 72)
    groups = x.double().reshape(5, 3, 32)
    steps = groups.abs().amax(dim=-1, keepdim=True) / 127
    quantized = (torch.round(groups / steps) * steps).reshape(5, 96)
    exact = quantized @ weight.dequantize().double().T
    assert float((got.double() - exact).abs().max()) <= 1e-5 * float(exact.abs().max())
    plain = x.double() @ weight.dequantize().double().T
    assert float((got.double() - plain).abs().max()) <= 0.02 * float(plain.abs().max())


@needs_numba
def test_dot_product_formats_keep_float32_scales() -> None:
    w = _weight(32, 64)
    q, scales, offsets = affine_groups(w, 32, torch.float32)
    weight = Int4Int8Weight(q, scales, offsets)
    assert torch.equal(weight.integers(), q)
    kept_scales, kept_offsets = weight.scales_and_offsets()
    assert torch.equal(kept_scales, scales) and torch.equal(kept_offsets, offsets)
    assert float((weight.dequantize() - w).abs().max()) <= float(scales.max()) / 2 + 1e-7
    eights = Int8Int8Weight.from_float(w)
    step = w.abs().reshape(32, 2, 32).amax(dim=-1) / 127
    assert (
        float((eights.dequantize() - w).abs().reshape(32, 2, 32).amax(-1).sub(step / 2).max())
        <= 1e-7
    )
    assert eights.nbytes == 32 * 64 + 32 * 2 * 4 and weight.nbytes == 32 * 32 + 2 * 32 * 2 * 4


@needs_numba
@pytest.mark.parametrize("format", DOT_FORMATS)
def test_dot_product_formats_ignore_the_default_dtype_and_the_rows_layout(format: str) -> None:
    w, x = _weight(48, 64), _input(3, 64)
    expected = quantize_weight(w, format)(x)
    previous = torch.get_default_dtype()
    torch.set_default_dtype(torch.float64)
    try:
        weight = quantize_weight(w, format)
        got = weight(x)
        strided = weight._matmul(x.double().T.contiguous().T)
    finally:
        torch.set_default_dtype(previous)
    assert got.dtype == torch.float32 and torch.equal(got, expected)
    assert strided.dtype == torch.float32 and torch.equal(strided, expected)


def test_dot_product_formats_without_numba_say_so(monkeypatch: pytest.MonkeyPatch) -> None:
    import specsample.kernels.cpu

    monkeypatch.setattr(compiler, "available", lambda: False)
    monkeypatch.delattr(specsample.kernels.cpu, "dots", raising=False)
    monkeypatch.setitem(sys.modules, "specsample.adapter.int_products", None)
    with pytest.raises(RuntimeError, match="int4a8 weights need numba"):
        Int4Int8Weight.from_float(_weight(16, 32))
    with pytest.raises(RuntimeError, match="int8a8 weights need numba"):
        Int8Int8Weight(torch.zeros(16, 32, dtype=torch.int8), torch.ones(16, 1))
    assert not dot_products() and int4_format() == "int4"


@pytest.mark.parametrize("format", ALL_FORMATS)
def test_rows_alone_or_together_give_the_same_bits(format: str) -> None:
    weight = quantize_weight(_weight(80, 64), format)
    x = _input(9, 64)
    alone = torch.cat([weight(x[i : i + 1]) for i in range(9)])
    for rows in (2, 5, 9):
        assert torch.equal(weight(x[:rows]), alone[:rows])
    assert torch.equal(weight(x.reshape(3, 3, 64)), alone.reshape(3, 3, 80))


@pytest.mark.parametrize("format", ALL_FORMATS)
@pytest.mark.parametrize("sizes", [(48, 64, 16), (64, 128, 40)])
def test_joined_weights_give_each_part_bit_for_bit(format: str, sizes: tuple[int, ...]) -> None:
    parts = [quantize_weight(_weight(n, 64, seed), format) for seed, n in enumerate(sizes)]
    joined = type(parts[0]).join(parts)
    assert joined.out_features == sum(sizes)
    x = _input(3, 64)
    assert torch.equal(joined(x), torch.cat([part(x) for part in parts], dim=1))
    assert torch.equal(joined.dequantize(), torch.cat([part.dequantize() for part in parts]))


def test_int8_round_trip() -> None:
    w = _weight(32, 48)
    weight = Int8Weight.from_float(w)
    scales = weight.scales.to(torch.float32)
    assert bool((scales == (w.abs().amax(1) / 127).to(torch.bfloat16).float()).all())
    assert bool(((w - weight.dequantize()).abs() <= 0.75 * scales[:, None]).all())
    again = Int8Weight(weight.integers, weight.scales)
    assert torch.equal(again.dequantize(), weight.integers.float() * scales[:, None])


def test_int4_round_trip() -> None:
    w = _weight(40, 64)
    weight = Int4Weight.from_float(w)
    scales, offsets = weight.scales_and_offsets()
    assert scales.shape == offsets.shape == (40, 2)
    error = (w - weight.dequantize()).reshape(40, 2, 32).abs()
    assert bool((error <= 0.6 * scales[..., None] + BF16_STEP * offsets.abs()[..., None]).all())
    integers = torch.randint(0, 16, (40, 64), generator=torch.Generator().manual_seed(2))
    given = Int4Weight(integers, scales * 1.001, offsets)
    assert torch.equal(given.integers(), integers.to(torch.int32))
    kept_scales, kept_offsets = given.scales_and_offsets()
    assert torch.equal(kept_scales, (scales * 1.001).to(torch.bfloat16).float())
    assert torch.equal(kept_offsets, offsets)
    steps = (integers - 8).float().reshape(40, 2, 32)
    expected = steps * kept_scales[..., None] + kept_offsets[..., None]
    assert torch.equal(given.dequantize(), expected.reshape(40, 64))


def test_a_constant_group_is_kept_to_bfloat16() -> None:
    w = torch.full((16, 32), 0.3)
    w[1] = 0.0
    dequantized = Int4Weight.from_float(w).dequantize()
    assert torch.equal(dequantized, w.to(torch.bfloat16).float())


def test_bfloat16_round_trip() -> None:
    w = _weight(20, 24)
    weight = BFloat16Weight(w)
    assert torch.equal(weight.dequantize(), w.to(torch.bfloat16).float())
    copied = copy.deepcopy(QuantizedLinear(weight))
    x = _input(3, 24)
    assert torch.equal(copied(x), QuantizedLinear(weight)(x))


def test_shapes_the_kernels_do_not_take_are_refused() -> None:
    with pytest.raises(ValueError, match="in_features must be a multiple of 16"):
        Int8Weight(torch.zeros(4, 40, dtype=torch.int8), torch.ones(4))
    with pytest.raises(ValueError, match="group must be a multiple of 32"):
        Int4Weight.from_float(torch.zeros(16, 48))
    with pytest.raises(ValueError, match=r"0\.\.15"):
        Int4Weight(torch.full((16, 32), 16), torch.ones(16, 1), torch.zeros(16, 1))
    with pytest.raises(ValueError, match="format must be one of"):
        quantize_weight(torch.zeros(2, 32), "int2")
    if compiler.available():
        with pytest.raises(ValueError, match="in_features must be a multiple of 32"):
            Int8Int8Weight(torch.zeros(16, 48, dtype=torch.int8), torch.ones(16, 1))
        with pytest.raises(ValueError, match="group must be a multiple of 32"):
            Int4Int8Weight.from_float(torch.zeros(16, 48))
    with pytest.raises(ValueError, match="quantize must be one of"):
        adapter.load_model("no such model", quantize="int3")


def test_layers_that_do_not_fit_keep_their_float_weights() -> None:
    model = torch.nn.Sequential(torch.nn.Linear(48, 32), torch.nn.Linear(32, 16))
    quantize_model(model, "int4", head=None)
    assert isinstance(model[0], torch.nn.Linear)
    assert isinstance(model[1], QuantizedLinear) and computes_in_bfloat16(model)
    with pytest.raises(ValueError, match="head must be one of"):
        quantize_model(model, "int8", head="fp8")


def _random_blocks(kind: str, count: int, seed: int) -> np.ndarray:
    """Random bytes for ``count`` values of ``kind``, with small normal float16 scales."""
    rng = np.random.default_rng(seed)
    block = GGML_FORMATS[kind]
    blocks = rng.integers(0, 256, size=(count // block.values, block.size), dtype=np.uint8)
    halves = 1 if kind == "Q4_0" else 2
    magnitudes = rng.uniform(1e-3, 5e-2, size=(len(blocks), halves))
    signs = rng.choice([-1.0, 1.0], size=magnitudes.shape)
    blocks[:, : 2 * halves] = (magnitudes * signs).astype(np.float16).view(np.uint8)
    return blocks.reshape(-1)


@pytest.mark.parametrize("kind", ["Q4_0", "Q4_1", "Q4_K"])
def test_gguf_4bit_blocks_are_integers_with_a_scale_and_an_offset(kind: str) -> None:
    rows, columns = 16, 512
    raw = _random_blocks(kind, rows * columns, seed=len(kind))
    values = np.empty(rows * columns, dtype=np.float32)
    dequantize(kind, raw, values)
    integers, scales, offsets = int4_groups(kind, raw, rows * columns)
    assert integers.dtype == np.uint8 and int(integers.max()) <= 15
    grouped = (integers.astype(np.float64) - 8).reshape(-1, 32)
    ours = grouped * scales[:, None].astype(np.float64) + offsets[:, None]
    scale = float(np.abs(values).max())
    np.testing.assert_allclose(ours.reshape(-1), values, rtol=0, atol=1e-6 * scale)
    weight = Int4Weight(
        torch.from_numpy(integers.reshape(rows, columns)),
        torch.from_numpy(scales.reshape(rows, -1)),
        torch.from_numpy(offsets.reshape(rows, -1)),
    )
    assert torch.equal(weight.integers(), torch.from_numpy(integers).reshape(rows, -1).int())
    bound = BF16_STEP * (8 * np.abs(scales) + np.abs(offsets))[:, None] + 1e-6 * scale
    error = np.abs(weight.dequantize().numpy().reshape(-1, 32) - values.reshape(-1, 32))
    assert bool((error <= bound).all())


@pytest.fixture(scope="module")
def gguf_file(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """A tiny tied Llama as GGUF: attention in Q4_0, feed-forward in Q4_1, embedding Q8_0."""
    pytest.importorskip("accelerate", reason="loading a GGUF file needs accelerate")
    from tests.gguf_files import default_tokenizer_dir, gguf, tiny_llama, write_gguf

    q = gguf.GGMLQuantizationType

    def kind(name: str) -> Any:
        if name == "token_embd.weight":
            return q.Q8_0
        if name.endswith("norm.weight"):
            return None
        return q.Q4_0 if ".attn_" in name else q.Q4_1

    folder = tmp_path_factory.mktemp("quantized")
    return write_gguf(folder / "tiny.gguf", tiny_llama(tied=True), default_tokenizer_dir(), kind)


def _from_file(mode: str) -> dict[str, int]:
    """The formats a tiny GGUF file's layers load in under ``mode``."""
    if mode == "auto" and dot_products():
        return {"int4a8": 14, "int8a8": 1}
    return {"int4" if mode == "auto" else mode: 14, "bfloat16": 1}


@pytest.mark.parametrize("mode", ["auto", "int4", pytest.param("int4a8", marks=needs_numba)])
def test_gguf_4bit_tensors_load_as_int4_from_their_blocks(gguf_file: Path, mode: str) -> None:
    dense = adapter.load_model(gguf_file)
    model = adapter.load_model(gguf_file, quantize=mode)
    formats = _from_file(mode)
    assert quantized_layers(model) == formats
    dense_modules = dict(dense.named_modules())
    for name, module in model.named_modules():
        if not isinstance(module, QuantizedLinear):
            continue
        weight = dense_modules[name].weight.detach()
        bound = BF16_STEP * weight.abs().max() + 1e-7
        assert float((module.quantized.dequantize() - weight).abs().max()) <= bound, name
    ids = torch.tensor([[5, 17, 300, 2, 9]])
    with torch.inference_mode():
        ours, theirs = model(input_ids=ids).logits, dense(input_ids=ids).logits
    assert float((ours - theirs).abs().max()) <= 0.05 * (1 + float(theirs.abs().max()))
    description = adapter.describe_model(model, adapter.model_source(gguf_file))
    listed = ", ".join(f"{format} x{count}" for format, count in sorted(formats.items()))
    assert listed in description and "dequantized" not in description


def test_generate_command_keeps_the_files_quantization(gguf_file: Path, capsys: Any) -> None:
    from specsample.cli import main

    argv = ["generate", "Hello", "--target", str(gguf_file), "--ngram", "--max-new-tokens", "4"]
    assert main(argv) == 0
    four_bit = next(f for f, count in _from_file("auto").items() if count == 14)
    assert f"{four_bit} x14" in capsys.readouterr().err
    assert main([*argv, "--quantize", "none"]) == 0
    assert "dequantized to float32" in capsys.readouterr().err
    assert main([*argv, "--quantize", "int2"]) == 2
    assert "--quantize: invalid choice: 'int2'" in capsys.readouterr().err


def _quantized_pair(format: str) -> tuple[Any, Any]:
    target, draft = (model.float() for model in make_pair())
    return quantize_model(target, format), quantize_model(draft, format)


@pytest.mark.parametrize("format", ALL_FORMATS)
def test_fused_forward_gives_the_quantized_models_own_logits(format: str) -> None:
    target, _ = _quantized_pair(format)
    fused, plain = CachedLM(target), CachedLM(target, fused=False)
    assert fused.fused is not None and set(fused.fused.formats) == {format, "bfloat16"}
    logits = []
    for lm in (fused, plain):
        lm.reset(2)
        valid = torch.tensor([[0, 0, 1, 1, 1, 1], [1, 1, 1, 1, 1, 1]])
        positions = (torch.arange(6) - (6 - valid.sum(1, keepdim=True))).clamp(min=0)
        ids = torch.tensor([[0, 0, 3, 9, 4, 1], [7, 2, 8, 8, 1, 5]])
        with torch.inference_mode():
            first = lm.forward(ids, positions, valid=valid, keep=0)[valid.bool()]
            block = lm.forward(ids[:, :3] + 10, positions[:, -1:] + 1 + torch.arange(3), keep=3)
        logits.append(torch.cat([first, block.reshape(-1, block.shape[-1])]))
    scale = 1 + float(logits[1].abs().max())
    assert float((logits[0] - logits[1]).abs().max()) <= 1e-2 * scale


@pytest.mark.parametrize("format", ["int4", "int8", *ALL_FORMATS[3:]])
def test_a_block_gives_the_logits_of_its_rows_fed_one_at_a_time(format: str) -> None:
    target, _ = _quantized_pair(format)
    lm = CachedLM(target)
    assert lm.fused is not None and lm.fused.row_exact
    ids = torch.tensor([[4, 9, 1, 33, 2, 7, 7, 50, 12, 3]])
    positions = torch.arange(10)[None]
    with torch.inference_mode():
        lm.reset(1)
        lm.forward(ids[:, :4], positions[:, :4])
        block = lm.forward(ids[:, 4:], positions[:, 4:], keep=6)
        lm.reset(1)
        lm.forward(ids[:, :4], positions[:, :4])
        alone = [lm.forward(ids[:, i : i + 1], positions[:, i : i + 1]) for i in range(4, 10)]
    assert torch.equal(block, torch.cat(alone, dim=1))


@pytest.fixture(scope="module", params=["int4", pytest.param("int4a8", marks=needs_numba)])
def default_int4(request: pytest.FixtureRequest) -> tuple[Any, Any, str]:
    pair = adapter.default_pair()
    if pair is None:
        pytest.fail("the default model pair is not installed")
    target, draft = pair
    mode = request.param
    return (
        adapter.load_model(target, quantize=mode),
        adapter.load_model(draft, quantize=mode),
        mode,
    )


def test_greedy_speculative_equals_target_only_on_the_int4_default_pair(
    default_int4: tuple[Any, Any, str],
) -> None:
    target, draft, mode = default_int4
    assert quantized_layers(target)[mode] > 0 and quantized_layers(draft)[mode] > 0
    prompts = [[1, 2, 3, 4, 5, 6, 7, 8], [100, 37, 2024, 5, 5, 61], [3000, 17]]
    common: dict[str, Any] = {"max_new_tokens": 40, "eos_token_id": None, "max_batch_size": 1}
    alone = target_generate(target, prompts, **common).sequences
    drafted = speculative_generate(target, prompts, ModelDrafter(draft), k=4, **common)
    looked_up = speculative_generate(target, prompts, NGramDrafter(), k=3, **common)
    assert drafted.sequences == alone and looked_up.sequences == alone
    assert drafted.stats.acceptance_rate > 0


QUANTIZED_ROWS = 20_000
"""Sampled sequences of each chi-square test on an int4 pair: half of ``tests/
test_generate.py``'s, so at its level (1e-5, so 2e-5 for the two formats) a two-token joint
off by a total variation of 0.047 is detected with probability 99%
(:func:`specsample.testing.chisquare.detectable_tv`, 225 cells)."""


@pytest.mark.parametrize("format", ["int4", pytest.param("int4a8", marks=needs_numba)])
def test_sampled_tokens_follow_the_quantized_target(format: str) -> None:
    """The chi-square test of ``tests/test_generate.py`` (its draft-chain case) on an int4
    pair (PyTorch's product, and integer dot products): the first two tokens against the
    quantized target's own two-token joint."""
    from tests.test_generate import (
        JOINT_ALPHA,
        JOINT_BATCH,
        JOINT_PROMPT,
        chi_square_pvalue,
        exact_joint,
    )

    target, draft = _quantized_pair(format)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        out = speculative_generate(
            target,
            [JOINT_PROMPT] * QUANTIZED_ROWS,
            ModelDrafter(draft),
            k=2,
            temperature=1.0,
            max_new_tokens=2,
            max_batch_size=JOINT_BATCH,
            seeds=list(range(QUANTIZED_ROWS)),
        )
    assert 0.0 < out.stats.acceptance_rate < 1.0
    pvalue = chi_square_pvalue(out.sequences, exact_joint(target, JOINT_PROMPT))
    assert pvalue > JOINT_ALPHA
