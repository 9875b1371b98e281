"""Threads are the caller's: no call changes ``torch.get_num_threads()``, and the CPU kernels
use no more threads than it allows.

Each case runs in a fresh interpreter, because what could change the count (starting numba's
thread pool, whose OpenMP start sets the calling thread's count) happens once per process:
the shipped pair, its weights in each format, generates speculatively and alone, sampled,
with the count set to 1 (and to 2), and the count is read after every call.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys

import pytest

from specsample.adapter.quantize import FORMATS
from specsample.kernels.cpu import compiler

SCRIPT = """
import json, sys, torch
threads, mode = int(sys.argv[1]), sys.argv[2]
torch.set_num_threads(threads)
from specsample import adapter, verify
from specsample.generate import ModelDrafter, NGramDrafter, speculative_generate, target_generate
seen = []
target_path, draft_path = adapter.default_pair()
target = adapter.load_model(target_path, quantize=mode)
seen.append(torch.get_num_threads())
draft = adapter.load_model(draft_path, quantize=mode)
prompts = [[1, 2, 3, 4, 5, 6, 7, 8], [100, 37, 2024, 5, 5, 61]]
common = dict(max_new_tokens=8, eos_token_id=None, temperature=1.0, seeds=[1, 2])
for run in (
    lambda: target_generate(target, prompts, **common),
    lambda: speculative_generate(target, prompts, ModelDrafter(draft), k=3, **common),
    lambda: speculative_generate(target, prompts, NGramDrafter(), k=3, **common),
    lambda: verify(torch.randn(40, 50000), torch.randint(0, 50000, (32,)), [4] * 8),
):
    run()
    seen.append(torch.get_num_threads())
import numba
pool = numba.config.NUMBA_NUM_THREADS
print(json.dumps({"torch": seen, "numba": numba.get_num_threads(), "pool": pool}))
"""


def _run(threads: int, mode: str) -> dict[str, object]:
    env = {**os.environ, "HF_HUB_OFFLINE": "1"}
    done = subprocess.run(
        [sys.executable, "-c", SCRIPT, str(threads), mode],
        capture_output=True, text=True, env=env, timeout=600, check=False,
    )  # fmt: skip
    assert done.returncode == 0, done.stderr[-3000:]
    result: dict[str, object] = json.loads(done.stdout.strip().splitlines()[-1])
    return result


@pytest.mark.slow
@pytest.mark.skipif(not compiler.available(), reason="the CPU kernels need numba")
@pytest.mark.parametrize("mode", ["none", *FORMATS])
def test_one_thread_stays_one_thread(mode: str) -> None:
    """After ``torch.set_num_threads(1)``, loading, generating (model and n-gram drafts, and
    target alone) and verifying leave the count at 1, and numba's count follows it."""
    result = _run(1, mode)
    assert result["torch"] == [1] * 5
    assert result["numba"] == 1


@pytest.mark.slow
@pytest.mark.skipif(not compiler.available(), reason="the CPU kernels need numba")
def test_two_threads_stay_two_threads() -> None:
    """The same calls with int4a8 weights and the count set to 2: it stays 2, and numba's
    count follows it (capped by numba's pool)."""
    result = _run(2, "int4a8")
    assert result["torch"] == [2] * 5
    assert result["numba"] == min(2, result["pool"])
