"""The Triton kernels compile for a GPU, on a machine without one.

Triton's interpreter runs a kernel's Python, not what Triton makes of it for a GPU: a kernel
can pass every interpreted test and still fail to compile (an operation the compiler does
not take, a loop-carried value whose type changes) or spill to local memory. Triton's wheel
carries NVIDIA's assembler, so each kernel here is compiled, front end to machine code, for
an H100 (``sm_90``) with the launch parameters a GPU run uses, for every combination of its
compile-time switches and each logit dtype, and its machine code is checked to use no local
memory (no spilled registers). The loops that stream rows are checked to load 128 bits per
instruction when the rows are aligned. Skipped without triton or its NVIDIA back end, and
inside the interpreter's process.
"""

from __future__ import annotations

import importlib.util
import itertools
import os
import re
import subprocess
import tempfile
from typing import Any

import pytest

from specsample.kernels.triton import filters, norms
from specsample.kernels.triton.launch import mode_kernel
from specsample.rules.residual import BLOCK
from tests.test_kernels import IN_PROCESS

pytestmark = [
    pytest.mark.skipif(
        importlib.util.find_spec("triton") is None, reason="triton is not installed"
    ),
    pytest.mark.skipif(IN_PROCESS, reason="compiles kernels: not under TRITON_INTERPRET=1"),
    pytest.mark.slow,
]

DTYPES = ("fp32", "fp16", "bf16", "fp64")
H100 = ("cuda", 90, 32)
_MASSES = dict(
    R=1, K1=8, COLS=BLOCK, BPI=4, NB_PAD=256, DRAFT=1, RULE=0, BONUS_IDS=False, SAMPLED=True,
    WIDE=False, FUSED=False, PHASE=0, num_warps=4, enable_fp_fusion=False,
)  # fmt: skip
"""The step kernel's masses phase for a chain step on dense draft probabilities."""
_STEP_INTS = ("u_stride", "batch", "vocab", "k", "t_step", "d_step", "n_blocks", "n_positions",
              "iters_per_split")  # fmt: skip


def _compile(
    module: str,
    name: str,
    types: dict[str, str],
    constants: dict[str, Any],
    aligned: tuple[str, ...] = (),
) -> Any:
    """Kernel ``name`` of ``module`` compiled for an H100 with the given argument types
    (``*fp32`` for an argument not in ``types``); the ``aligned`` arguments are known to be
    multiples of 16 (bytes for a pointer), as Triton's launcher tells the compiler of every
    such argument it is given."""
    triton = pytest.importorskip("triton")
    from triton.backends.compiler import GPUTarget
    from triton.compiler import ASTSource

    if "nvidia" not in triton.backends.backends:
        pytest.skip("triton has no NVIDIA back end here")
    kernel = mode_kernel(module, name)
    options = {k: constants.pop(k) for k in ("num_warps", "enable_fp_fusion") if k in constants}
    signature = {
        a: "constexpr" if a in constants else types.get(a, "*fp32") for a in kernel.arg_names
    }
    attrs = {(kernel.arg_names.index(a),): [["tt.divisibility", 16]] for a in aligned}
    source = ASTSource(kernel, signature, constexprs=constants, attrs=attrs)
    return triton.compile(source, target=GPUTarget(*H100), options=options)


def _dump(compiled: Any, option: str) -> str:
    """What ``cuobjdump option`` prints of the kernel's machine code."""
    import triton

    tools = os.path.join(os.path.dirname(triton.__file__), "backends", "nvidia", "bin")
    with tempfile.TemporaryDirectory() as folder:
        path = os.path.join(folder, "kernel.cubin")
        with open(path, "wb") as file:
            file.write(compiled.asm["cubin"])
        return subprocess.run(
            [os.path.join(tools, "cuobjdump"), option, path],
            capture_output=True,
            text=True,
            check=True,
        ).stdout


def _local_memory(compiled: Any) -> int:
    """Bytes of local memory per thread the machine code uses: its stack frame (where
    registers spill) and any other local memory."""
    usage = _dump(compiled, "--dump-resource-usage")
    found = [re.search(rf"{name}:(\d+)", usage) for name in ("STACK", "LOCAL")]
    assert all(found), usage
    return sum(int(match.group(1)) for match in found if match)


def _types(dtype: str, ints: tuple[str, ...], **pointers: str) -> dict[str, str]:
    """Argument types of a kernel over ``dtype`` logits: the int32 ``ints``, an int64 row
    stride and the pointers other than float32 ones."""
    return {"logits": f"*{dtype}", "stride": "i64", **dict.fromkeys(ints, "i32"), **pointers}


@pytest.fixture(autouse=True)
def _own_cache(tmp_path: Any, monkeypatch: pytest.MonkeyPatch) -> None:
    """Triton's compiled kernels go to a folder of the test's, not the user's cache."""
    monkeypatch.setenv("TRITON_CACHE_DIR", str(tmp_path))


@pytest.mark.parametrize("dtype", DTYPES)
def test_statistics_kernel_compiles_without_spilling(dtype: str) -> None:
    """Every phase (whole rows, split rows, combining), with and without normalisers."""
    ints = ("rows_total", "vocab", "n_blocks", "splits", "iters_per_split")
    types = _types(dtype, ints, argmax="*i64", partial="*fp64", first="*i64")
    for phase, norm in itertools.product((0, 1, 2), (False, True)):
        constants = {
            "R": 1,
            "COLS": norms.COLUMNS,
            "SPLITS_PAD": 64,
            "WIDE": dtype == "fp64",
            "NORM": norm,
            "PHASE": phase,
            "num_warps": 8,
            "enable_fp_fusion": False,
        }
        compiled = _compile("norms", "_stats_kernel", types, constants)
        assert _local_memory(compiled) == 0, (phase, norm)


@pytest.mark.parametrize("dtype", DTYPES)
def test_filter_kernel_compiles_without_spilling(dtype: str) -> None:
    """Every combination of top-k, top-p and min-p."""
    types = _types(dtype, ("rows_total", "vocab", "n_blocks"), top_k="*i64")
    for has_k, has_p, has_min in itertools.product((False, True), repeat=3):
        constants = {
            "R": 1,
            "COLS": filters.COLUMNS,
            "P": filters.PIVOTS,
            "HAS_K": has_k,
            "HAS_P": has_p,
            "HAS_MIN": has_min,
            "num_warps": 4,
            "enable_fp_fusion": False,
        }
        compiled = _compile("filters", "_filter_kernel", types, constants)
        assert _local_memory(compiled) == 0, (has_k, has_p, has_min)


def _wide_loads(compiled: Any) -> int:
    """Global loads of 128 bits in the kernel's machine code."""
    return len(re.findall(r"LDG\.E\.128\b", _dump(compiled, "-sass")))


@pytest.mark.parametrize("dtype", ["fp32", "bf16"])
def test_rows_are_read_128_bits_at_a_time(dtype: str) -> None:
    """With aligned rows and a vocabulary that is a multiple of 16 (32000, 128256, 151936),
    the loops that stream rows, the statistics kernel's and the step kernel's masses phase
    (probabilities and logits), load 128 bits per instruction: a scalar load per element
    would need several times the instructions to keep up with the memory."""
    ints = ("rows_total", "vocab", "n_blocks", "splits", "iters_per_split")
    types = _types(dtype, ints, argmax="*i64", partial="*fp64", first="*i64")
    constants = {"R": 1, "COLS": norms.COLUMNS, "SPLITS_PAD": 64, "WIDE": False, "NORM": True,
                 "PHASE": 1, "num_warps": 8, "enable_fp_fusion": False}  # fmt: skip
    stats = _compile("norms", "_stats_kernel", types, constants, ("logits", "stride", "vocab"))
    assert _wide_loads(stats) >= 1
    pointers = ("tgt", "drf", "t_inv", "t_cut", "t_lse", "t_shift", "ids", "t_start", "d_start")
    kernel_types = {
        "tgt": f"*{dtype}", "drf": f"*{dtype}", "t_rs": "i64", "d_rs": "i64", "ids": "*i64",
        "uni": "*fp64", "t_start": "*i64", "d_start": "*i64", "n_drafts": "*i64",
        "greedy": "*u8", "bonus": "*i64", "masses": "*fp64", "t_argmax": "*i64", "out": "*i64",
        "n_out": "*i64", **dict.fromkeys(_STEP_INTS, "i32"),
    }  # fmt: skip
    for logits in (False, True):
        switches = dict(_MASSES, TARGET_LOGITS=logits, RAGGED=logits, HAS_GREEDY=logits)
        aligned = (*pointers, "t_rs", "d_rs", "vocab")
        masses = _compile("step_kernel", "_step_kernel", kernel_types, switches, aligned)
        assert _wide_loads(masses) >= 2, logits
