"""The fused forward computes the model's own logits, and is used only where it does.

Tiny random models of the served families (Llama, Mistral without a window, Qwen2 with its
projection biases; grouped-query attention) are fed through a :class:`CachedLM` with and
without the fused forward: a ragged, left-padded prefill, draft blocks, rejected slots
masked or dropped, rows selected, new rows joined, the cache compacted, and a token tree
with a 4-D mask. Every logit agrees with transformers' forward to rounding (float64:
1e-9; float32 with weights laid out for oneDNN: 1e-4 relative).

A float32 target's forward is row-exact: a sequence's logits in blocks of drafts with
masked rejections, in a left-padded batch with others, are bit for bit those of the
sequence fed alone one token at a time, on one thread or two; drafts, and
``row_exact=False``, keep the default forward.
"""

from __future__ import annotations

import warnings
from typing import Any

import pytest
import torch

transformers = pytest.importorskip("transformers")

from specsample.adapter import CachedLM  # noqa: E402
from specsample.adapter import fused as fused_module  # noqa: E402
from specsample.adapter import projection as projection_module  # noqa: E402
from specsample.adapter.fused import FusedForward, fused_forward  # noqa: E402
from specsample.adapter.projection import Projection  # noqa: E402
from specsample.generate import speculative_generate, target_generate  # noqa: E402

VOCAB = 50
COMMON: dict[str, Any] = {
    "vocab_size": VOCAB,
    "hidden_size": 32,
    "intermediate_size": 48,
    "num_hidden_layers": 2,
    "num_attention_heads": 4,
    "num_key_value_heads": 2,
    "max_position_embeddings": 128,
    "initializer_range": 0.3,
    "bos_token_id": None,
    "eos_token_id": None,
    "pad_token_id": None,
}
FAMILIES = {
    "llama": {},
    "llama-scaled-rope": {
        "rope_parameters": {
            "rope_type": "llama3",
            "rope_theta": 10000.0,
            "factor": 8.0,
            "low_freq_factor": 1.0,
            "high_freq_factor": 4.0,
            "original_max_position_embeddings": 16,
        }
    },
    "mistral": {"sliding_window": None},
    "qwen2": {"use_sliding_window": False},
}


def _model(name: str, dtype: torch.dtype = torch.float64, seed: int = 0) -> Any:
    model_type = name.split("-")[0]
    config = transformers.AutoConfig.for_model(model_type, **{**COMMON, **FAMILIES[name]})
    torch.manual_seed(seed)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        model = transformers.AutoModelForCausalLM.from_config(config, attn_implementation="sdpa")
    with torch.no_grad():
        for parameter in model.parameters():
            if parameter.dim() == 1:
                parameter.add_(0.2 * torch.randn_like(parameter))
    return model.to(dtype).eval()


def _drive(lm: CachedLM) -> list[torch.Tensor]:
    """Every logit a fixed script of cache operations produces."""
    generator = torch.Generator().manual_seed(1)

    def ids(rows: int, n: int) -> torch.Tensor:
        return torch.randint(0, VOCAB, (rows, n), generator=generator)

    out = []
    with torch.inference_mode():
        lm.reset(3)
        valid = torch.ones(3, 7, dtype=torch.int64)
        valid[0, :4] = 0
        valid[1, :1] = 0
        positions = (torch.arange(7) - (7 - valid.sum(1, keepdim=True))).clamp(min=0)
        out.append(lm.forward(ids(3, 7), positions, valid=valid, keep=0)[valid.bool()])
        length = valid.sum(1, keepdim=True)
        for step in range(3):
            block = torch.arange(5) + length
            out.append(lm.forward(ids(3, 5), block, keep=5))
            accepted = torch.tensor([[1, 1, 0, 0, 0], [1, 1, 1, 1, 1], [1, 0, 0, 0, 0]])
            lm.set_tail_valid(accepted.roll(step, 0))
            length = length + accepted.roll(step, 0).sum(1, keepdim=True)
        lm.select(torch.tensor([2, 0]))
        length = length[torch.tensor([2, 0])]
        lm.join(ids(1, 4), torch.arange(4)[None], torch.ones(1, 4, dtype=torch.int64))
        length = torch.cat([length, torch.tensor([[4]])])
        out.append(lm.forward(ids(3, 2), torch.arange(2) + length, keep=2))
        lm.drop_tail(1)
        length = length + 1
        assert lm.compact()
        out.append(lm.forward(ids(3, 1), length, keep=1))
        # A token tree: a root with two children, the second with a child of its own.
        visible = torch.tensor(
            [[1, 0, 0, 0], [1, 1, 0, 0], [1, 0, 1, 0], [1, 0, 1, 1]], dtype=torch.bool
        )
        depth = torch.tensor([0, 1, 1, 2])
        out.append(lm.forward(ids(3, 4), depth + length + 1, keep=0, visible=visible))
    return out


@pytest.mark.parametrize("name", list(FAMILIES))
def test_fused_logits_equal_the_models_own_through_every_cache_operation(name: str) -> None:
    model = _model(name)
    fused = CachedLM(model)
    plain = CachedLM(model, fused=False)
    assert fused.fused is not None and not fused.fused.packed
    assert plain.fused is None
    assert "fused forward" in fused.describe()
    for got, want in zip(_drive(fused), _drive(plain), strict=True):
        torch.testing.assert_close(got, want, rtol=0, atol=1e-9)


@pytest.fixture
def onednn_everywhere(monkeypatch: pytest.MonkeyPatch) -> None:
    """Lay even the tiny models' weights out for oneDNN (skip where torch has no oneDNN)."""
    if not torch.backends.mkldnn.is_available():
        pytest.skip("this torch build has no oneDNN")
    monkeypatch.setattr(projection_module, "PACK_MIN_ELEMENTS", 0)


@pytest.mark.usefixtures("onednn_everywhere")
def test_weights_laid_out_for_onednn_give_the_same_logits() -> None:
    model = _model("qwen2", torch.float32, seed=3)
    fused = CachedLM(model)
    assert fused.fused is not None and fused.fused.packed
    assert "oneDNN" in fused.describe()
    for got, want in zip(_drive(fused), _drive(CachedLM(model, fused=False)), strict=True):
        scale = float(want.abs().max())
        torch.testing.assert_close(got, want, rtol=0, atol=1e-4 * scale)


@pytest.mark.usefixtures("onednn_everywhere")
def test_projection_joins_layers_with_and_without_biases() -> None:
    torch.manual_seed(0)
    layers = [torch.nn.Linear(8, 5), torch.nn.Linear(8, 3, bias=False), torch.nn.Linear(8, 2)]
    x = torch.randn(2, 3, 8)
    joined = Projection(layers, pack=True)
    assert joined.packed is not None
    with torch.no_grad():
        for got, layer in zip(joined(x), layers, strict=True):
            torch.testing.assert_close(got, layer(x), rtol=1e-5, atol=1e-5)


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16, torch.float64], ids=str)
def test_rms_norm_is_the_models_own_bit_for_bit(dtype: torch.dtype) -> None:
    """On float32 rows the fused forward's norm is PyTorch's ``rms_norm``, one operation;
    on every dtype its values are ``transformers``' own."""
    from transformers.models.llama.modeling_llama import LlamaRMSNorm

    torch.manual_seed(4)
    norm = LlamaRMSNorm(576, eps=1e-5).to(dtype)
    with torch.no_grad():
        norm.weight.copy_(torch.randn(576) * 0.3 + 1)
        x = (torch.randn(3, 7, 576) * torch.logspace(-3, 3, 7)[:, None]).to(dtype)
        want = norm(x)
    got = fused_module._rms_norm(x, (norm.weight.detach(), norm.variance_epsilon))
    assert got.dtype == want.dtype
    assert torch.equal(got, want)


def test_models_it_does_not_serve_keep_their_own_forward() -> None:
    windowed = transformers.AutoConfig.for_model("mistral", **{**COMMON, "sliding_window": 4})
    torch.manual_seed(0)
    model = transformers.AutoModelForCausalLM.from_config(windowed).double().eval()
    assert CachedLM(model).fused is None
    gpt2 = transformers.GPT2LMHeadModel(
        transformers.GPT2Config(vocab_size=VOCAB, n_embd=16, n_layer=1, n_head=2)
    ).eval()
    assert fused_module.unsupported(gpt2) == "model type 'gpt2'"
    assert CachedLM(gpt2).fused is None


def test_a_forward_that_fails_its_check_is_not_used() -> None:
    model = _model("llama", seed=5)
    assert fused_forward(model, lambda candidate: False) is None
    assert CachedLM(model).fused is None


def test_changed_weights_build_a_new_forward() -> None:
    model = _model("llama", seed=6)
    first = CachedLM(model).fused
    assert first is not None
    assert CachedLM(model).fused is first
    with torch.no_grad():
        model.model.layers[0].mlp.down_proj.weight.mul_(2.0)
    second = CachedLM(model).fused
    assert isinstance(second, FusedForward) and second is not first
    got = _drive(CachedLM(model))
    for a, b in zip(got, _drive(CachedLM(model, fused=False)), strict=True):
        torch.testing.assert_close(a, b, rtol=0, atol=1e-9)


def test_generation_with_the_fused_forward_equals_the_plain_one() -> None:
    target, draft = _model("llama", seed=7), _model("llama", seed=8)
    prompts = [[1, 2, 3], [4, 5], [6, 7, 8, 9]]
    plain_target = CachedLM(target, fused=False)
    expected = target_generate(plain_target, prompts, max_new_tokens=12).sequences
    assert target_generate(target, prompts, max_new_tokens=12).sequences == expected
    out = speculative_generate(target, prompts, draft, k=3, max_new_tokens=12, max_batch_size=2)
    assert out.sequences == expected


def _row_exact(model: Any) -> CachedLM:
    """``model`` in a :class:`CachedLM` whose fused forward is row-exact (the test skips
    where it cannot be: no numba or no oneDNN)."""
    lm = CachedLM(model)
    if lm.fused is None or not lm.fused.exact_ready:
        pytest.skip("no row-exact forward here (numba or oneDNN missing)")
    assert lm.fused.row_exact and lm.choice.how == "row-exact"
    return lm


def _one_at_a_time(lm: CachedLM, tokens: list[int]) -> torch.Tensor:
    """``[len(tokens), vocab]``: each position's logits, fed one token per forward at batch 1."""
    lm.reset(1)
    with torch.inference_mode():
        return torch.cat(
            [lm.forward(torch.tensor([[t]]), torch.tensor([[i]])) for i, t in enumerate(tokens)],
            dim=1,
        )[0]


def _speculated(
    lm: CachedLM, sequences: list[list[int]], prompts: list[int], k: int
) -> list[dict[int, torch.Tensor]]:
    """Each sequence's logits by position, fed as the loop feeds a batch: a left-padded
    prefill of the first ``prompts[i]`` tokens, then blocks of ``k + 1`` whose rejected
    tail (a random number of garbage drafts) is masked for good, the cache compacted now
    and then."""
    generator = torch.Generator().manual_seed(2)
    batch, longest = len(sequences), max(prompts)
    ids = torch.zeros(batch, longest, dtype=torch.int64)
    positions, valid = torch.zeros_like(ids), torch.zeros_like(ids)
    for b, (tokens, length) in enumerate(zip(sequences, prompts, strict=True)):
        ids[b, longest - length :] = torch.tensor(tokens[:length])
        positions[b, longest - length :] = torch.arange(length)
        valid[b, longest - length :] = 1
    lm.reset(batch)
    seen: list[dict[int, torch.Tensor]] = [{} for _ in sequences]
    at = list(prompts)
    with torch.inference_mode():
        logits = lm.forward(ids, positions, valid=valid, keep=0)
        for b, length in enumerate(prompts):
            seen[b].update({j: logits[b, longest - length + j] for j in range(length)})
        while all(at[b] + k + 1 <= len(s) for b, s in enumerate(sequences)):
            kept = torch.randint(1, k + 2, (batch,), generator=generator).tolist()
            block = torch.randint(0, VOCAB, (batch, k + 1), generator=generator)
            for b, n in enumerate(kept):
                block[b, :n] = torch.tensor(sequences[b][at[b] : at[b] + n])
            logits = lm.forward(block, torch.arange(k + 1) + torch.tensor(at)[:, None], keep=0)
            for b, n in enumerate(kept):
                seen[b].update({at[b] + j: logits[b, j] for j in range(n)})
                at[b] += n
            lm.set_tail_valid((torch.arange(k + 1) < torch.tensor(kept)[:, None]).long())
            lm.maybe_compact(4 * max(at))
    return seen


@pytest.mark.parametrize("threads", [1, 2])
def test_a_row_exact_forward_gives_each_sequence_its_logits_alone(threads: int) -> None:
    """Bit for bit, whatever the block, the batch, its padding and its masked slots."""
    lm = _row_exact(_model("llama", torch.float32, seed=11))
    generator = torch.Generator().manual_seed(3)
    sequences = [torch.randint(0, VOCAB, (n,), generator=generator).tolist() for n in (30, 26, 33)]
    before = torch.get_num_threads()
    torch.set_num_threads(threads)
    try:
        alone = [_one_at_a_time(lm, tokens) for tokens in sequences]
        for got, want in zip(_speculated(lm, sequences, [3, 9, 5], k=3), alone, strict=True):
            assert len(got) > 10
            for position, logits in got.items():
                assert torch.equal(logits, want[position]), position
        one = _speculated(lm, sequences[:1], [6], k=4)[0]
        assert all(torch.equal(logits, alone[0][j]) for j, logits in one.items())
    finally:
        torch.set_num_threads(before)


def test_row_exact_logits_are_the_same_on_one_thread_and_two() -> None:
    lm = _row_exact(_model("qwen2", torch.float32, seed=12))
    tokens = list(range(1, 20))
    before = torch.get_num_threads()
    try:
        torch.set_num_threads(2)
        two = _one_at_a_time(lm, tokens)
        torch.set_num_threads(1)
        assert torch.equal(_one_at_a_time(lm, tokens), two)
    finally:
        torch.set_num_threads(before)


@pytest.mark.parametrize("name", list(FAMILIES))
def test_row_exact_logits_equal_the_models_own_through_every_cache_operation(name: str) -> None:
    model = _model(name, torch.float32, seed=13)
    lm = _row_exact(model)
    for got, want in zip(_drive(lm), _drive(CachedLM(model, fused=False)), strict=True):
        torch.testing.assert_close(got, want, rtol=0, atol=1e-4 * float(want.abs().max()))


def test_drafts_and_the_asking_choose_whether_a_forward_is_row_exact() -> None:
    model = _model("llama", torch.float32, seed=14)
    exact = _row_exact(model).fused
    assert exact is not None and all(p.packed is not None for p in exact.projections)
    for lm in (CachedLM(model, role="draft"), CachedLM(model, row_exact=False)):
        assert lm.fused is not None and not lm.fused.row_exact and not lm.fused.packed
    forced = CachedLM(model, role="draft", row_exact=True).fused
    assert forced is not None and forced.row_exact
    assert fused_forward(_model("llama", seed=14), lambda f: True) is not None  # float64
    assert not CachedLM(_model("llama", seed=15)).fused.row_exact  # type: ignore[union-attr]
