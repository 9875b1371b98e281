"""The benchmark harness :mod:`specsample.bench`, on tiny shapes.

Covers the harness's modules: :mod:`specsample.bench.contestants`,
:mod:`specsample.bench.inputs`, :mod:`specsample.bench.measure`,
:mod:`specsample.bench.runner` and :mod:`specsample.bench.table`.

Nothing here asserts on timings: they depend on the machine and its load. The cache flush
is shrunk to 1 MiB so that every test runs in well under a second or two.
"""

from __future__ import annotations

from typing import Any

import pytest
import torch

from specsample import bench
from specsample.bench.contestants import _transformers_call

TINY = (2, 2, 64)


def _tiny_rows() -> list[dict[str, Any]]:
    return bench.run_benchmark([TINY], repeats=2, slow_repeats=1, flush_bytes=2**20, progress=False)


def test_run_benchmark_returns_the_documented_keys() -> None:
    rows = _tiny_rows()
    assert len(rows) == 1
    row = rows[0]
    expected = {"batch", "k", "vocab", "alpha", "others", "speedup", "ours_over_floor"}
    expected |= {"torch_over_floor"}
    expected |= {"hf_over_ours", "device", "dtype", "threads", "repeats", "slow_repeats"}
    expected |= {"flush_mib", "notes"}
    expected |= {f"{name}_{unit}" for name in bench.CONTESTANTS for unit in ("ms", "mem")}
    assert set(row) == expected
    assert (row["batch"], row["k"], row["vocab"]) == TINY
    for name in ("ours", "naive", "floor"):
        assert isinstance(row[f"{name}_ms"], float) and row[f"{name}_ms"] > 0
        assert isinstance(row[f"{name}_mem"], float) and row[f"{name}_mem"] >= 0
    assert row["speedup"] == pytest.approx(row["naive_ms"] / row["ours_ms"])
    assert row["ours_over_floor"] == pytest.approx(row["ours_ms"] / row["floor_ms"])
    assert row["torch_over_floor"] == pytest.approx(row["torch_ms"] / row["floor_ms"])
    assert 0.0 < row["alpha"] <= 1.0
    assert row["device"] == "cpu" and row["repeats"] == 2 and row["flush_mib"] == 1.0
    assert row["hf_ms"] is None or row["hf_ms"] > 0


def test_progress_goes_to_stderr(capsys: pytest.CaptureFixture[str]) -> None:
    bench.run_benchmark([TINY], repeats=1, slow_repeats=1, flush_bytes=2**20)
    captured = capsys.readouterr()
    assert captured.out == ""
    assert "[1/1] batch=2 k=2 vocab=64" in captured.err


def test_format_table_states_the_methodology() -> None:
    table = bench.format_table(_tiny_rows())
    assert "cold caches" in table and "1 MiB buffer is overwritten" in table
    assert "median of 2 cold calls" in table
    assert "naive/ours" in table and "ours/floor" in table
    assert any(line.split()[:3] == ["2", "2", "64"] for line in table.splitlines())
    assert bench.format_table([]) == "(no shapes benchmarked)"


def test_threads_are_restored() -> None:
    before = torch.get_num_threads()
    rows = bench.run_benchmark(
        [TINY], repeats=1, slow_repeats=1, threads=1, flush_bytes=2**20, progress=False
    )
    assert rows[0]["threads"] == 1
    assert torch.get_num_threads() == before


@pytest.mark.parametrize(
    ("kwargs", "error"),
    [
        ({"shapes": [(2, 0, 64)]}, ValueError),
        ({"shapes": [(2, 2)]}, TypeError),
        ({"shapes": [(2.0, 2, 64)]}, TypeError),
        ({"repeats": 0}, ValueError),
        ({"slow_repeats": 0}, ValueError),
        ({"threads": 0}, ValueError),
        ({"flush_bytes": 0}, ValueError),
        ({"device": "meta"}, ValueError),
    ],
)
def test_run_benchmark_validates(kwargs: dict[str, object], error: type[Exception]) -> None:
    arguments: dict[str, object] = {"shapes": [TINY], "flush_bytes": 2**20, "progress": False}
    arguments.update(kwargs)
    with pytest.raises(error):
        bench.run_benchmark(**arguments)  # type: ignore[arg-type]


def test_make_inputs_are_softmax_rows_with_sampled_drafts() -> None:
    inputs = bench.make_inputs(3, 4, 100, seed=5)
    assert inputs.target_probs.shape == inputs.draft_probs.shape == (3, 4, 100)
    assert inputs.bonus_token_ids.shape == (3, 1) and inputs.draft_token_ids.shape == (3, 4)
    assert inputs.bonus_probs.shape == (3, 100)
    for probs in (inputs.target_probs, inputs.draft_probs, inputs.bonus_probs):
        assert torch.allclose(probs.sum(-1), torch.ones(()), atol=1e-5)
    drafted = inputs.draft_probs.gather(2, inputs.draft_token_ids.unsqueeze(-1))
    assert bool((drafted > 0).all())
    again = bench.make_inputs(3, 4, 100, seed=5)
    assert all(torch.equal(a, b) for a, b in zip(inputs, again, strict=True))


def test_extra_peak_bytes_counts_live_allocations() -> None:
    def step() -> torch.Tensor:
        first = torch.empty(1000, dtype=torch.float32)
        second = torch.empty(3000, dtype=torch.float32)
        del first, second
        return torch.empty(500, dtype=torch.float64)

    assert bench.extra_peak_bytes(step) == 16_000
    assert bench.extra_peak_bytes(lambda: None) == 0
    with pytest.raises(ValueError, match="cpu or cuda"):
        bench.extra_peak_bytes(lambda: None, "meta")


def test_transformers_adapter_calls_one_sequence_at_a_time() -> None:
    inputs = bench.make_inputs(3, 2, 16, seed=1)
    seen: list[tuple[object, ...]] = []

    def current(
        candidate_input_ids: torch.Tensor,
        candidate_logits: torch.Tensor,
        candidate_length: int,
        new_logits: torch.Tensor,
        assistant_ensemble_weight: float | None = None,
    ) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
        shapes = (candidate_input_ids.shape, candidate_logits.shape, new_logits.shape)
        seen.append((*map(tuple, shapes[:2]), candidate_length, tuple(shapes[2])))
        return candidate_input_ids, torch.tensor(0), new_logits.softmax(-1)

    call = _transformers_call(current, inputs)
    assert call is not None
    results = call()
    assert isinstance(results, list) and len(results) == 3
    assert seen == [((1, 2), (1, 2, 16), 2, (1, 3, 16))] * 3
    recovered = results[1][2][0]
    expected = torch.cat([inputs.target_probs[1], inputs.bonus_probs[1:2]])
    assert torch.allclose(recovered, expected, atol=1e-6)

    def older(
        candidate_input_ids: torch.Tensor,
        candidate_logits: torch.Tensor,
        candidate_length: int,
        new_logits: torch.Tensor,
        last_assistant_token_is_eos: bool,
        max_matches: int,
    ) -> tuple[torch.Tensor, torch.Tensor]:
        assert last_assistant_token_is_eos is False and max_matches == 2
        return candidate_input_ids, torch.tensor(0)

    older_call = _transformers_call(older, inputs)
    assert older_call is not None
    older_results = older_call()
    assert isinstance(older_results, list) and len(older_results) == 3

    def unknown(
        candidate_input_ids: torch.Tensor,
        candidate_logits: torch.Tensor,
        candidate_length: int,
        new_logits: torch.Tensor,
        mystery: object,
    ) -> None:
        return None

    assert _transformers_call(unknown, inputs) is None
