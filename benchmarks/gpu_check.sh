#!/usr/bin/env bash
# Check the Triton kernels: the CPU interpreter tests always, the CUDA checks when a GPU is
# visible (exactness, parity, no host synchronisation, timings). See docs/gpu.md.
#
# Usage: benchmarks/gpu_check.sh [VENV_DIR | PYTHON] [gpu_check.py options...]
#   The interpreter defaults to $PYTHON, then ./.venv/bin/python, then python3.
#   Environment: CPU_TIMEOUT, GPU_TIMEOUT (seconds, default 270 each; both parts run side by
#   side), VLLM_TIMEOUT (default 900, the vLLM serving benchmark, after them), CPU_TESTS (the
#   pytest arguments of the CPU part, default tests/test_kernels.py,
#   tests/test_kernels_norms.py and tests/test_kernels_filters.py), REQUIRE_GPU=1 (exit 3
#   when no GPU is visible instead of 0, and 2 without triton instead of skipping).
# Exit status: 0 all run parts passed (or, without triton, one "skipped: ..." line), 1 a part
#   failed, 2 set-up error, 3 GPU required but absent.
set -euo pipefail

root="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
cd "$root"

target="${PYTHON:-}"
if [[ $# -gt 0 && "$1" != -* ]]; then
  target="$1"
  shift
fi
if [[ -z "$target" ]]; then
  if [[ -x .venv/bin/python ]]; then target=.venv/bin/python; else target=python3; fi
fi
if [[ -d "$target" ]]; then python="$target/bin/python"; else python="$target"; fi

if ! "$python" -c "import torch, specsample" 2>/dev/null; then
  echo "error: '$python' cannot import torch and specsample (pass a venv or set PYTHON)" >&2
  exit 2
fi
if ! "$python" -c "import importlib.util, sys; sys.exit(importlib.util.find_spec('triton') is None)"; then
  if [[ "${REQUIRE_GPU:-0}" == "1" ]]; then
    echo "error: triton is not installed for '$python': pip install 'specsample[triton]'" >&2
    exit 2
  fi
  echo "skipped: gpu_check.sh: triton is not installed for '$python': pip install 'specsample[triton]'"
  exit 0
fi
read -r -a cpu_tests <<<"${CPU_TESTS:-tests/test_kernels.py tests/test_kernels_norms.py tests/test_kernels_filters.py}"

timed_out() {
  if [[ $1 -eq 124 ]]; then echo ", timed out"; fi
}

gpu="$("$python" -c "import torch; print(torch.cuda.get_device_name(0) if torch.cuda.is_available() else '')")"
log="$(mktemp "${TMPDIR:-/tmp}/gpu_check_cpu.XXXXXX")"
vllm_log="$(mktemp "${TMPDIR:-/tmp}/gpu_check_vllm.XXXXXX")"
trap 'rm -f "$log" "$vllm_log"' EXIT

echo "== specsample kernel check: python $("$python" -c 'import sys; print(sys.version.split()[0])'), $("$python" -c 'import torch, triton; print("torch", torch.__version__, "triton", triton.__version__)')"
echo "== CPU part: ${cpu_tests[*]} under the Triton interpreter (TRITON_INTERPRET=1)"
TRITON_INTERPRET=1 timeout "${CPU_TIMEOUT:-270}" \
  "$python" -m pytest "${cpu_tests[@]}" -p no:cacheprovider -q -rs >"$log" 2>&1 &
cpu_pid=$!

gpu_status="SKIPPED (no CUDA device visible: torch.cuda.is_available() is False)"
gpu_rc=0
if [[ -n "$gpu" ]]; then
  echo "== GPU part on $gpu (running while the CPU part runs)"
  if env -u TRITON_INTERPRET timeout "${GPU_TIMEOUT:-270}" "$python" benchmarks/gpu_check.py "$@"; then
    gpu_status="PASSED"
  else
    gpu_rc=$?
    gpu_status="FAILED (exit $gpu_rc$(timed_out "$gpu_rc"))"
  fi
else
  echo "== GPU part SKIPPED: no CUDA device is visible to $python"
fi

cpu_rc=0
wait "$cpu_pid" || cpu_rc=$?
echo
echo "== CPU part output"
cat "$log"
if [[ $cpu_rc -eq 0 ]]; then
  cpu_status="PASSED"
else
  cpu_status="FAILED (exit $cpu_rc$(timed_out "$cpu_rc"))"
fi

vllm_status="SKIPPED (no GPU)"
if [[ -n "$gpu" ]]; then
  echo
  echo "== vLLM serving (benchmarks/vllm_e2e.py): vllm serve with and without the plugin"
  vllm_rc=0
  timeout "${VLLM_TIMEOUT:-900}" "$python" benchmarks/vllm_e2e.py | tee "$vllm_log" || vllm_rc=$?
  if [[ $vllm_rc -ne 0 ]]; then
    vllm_status="FAILED (exit $vllm_rc$(timed_out "$vllm_rc"))"
    gpu_rc=1
  elif grep -q '^skipped:' "$vllm_log"; then
    vllm_status="SKIPPED ($(sed -n 's/^skipped: vllm_e2e.py: //p' "$vllm_log"))"
  else
    vllm_status="PASSED"
  fi
fi

echo
echo "== summary"
echo "   CPU interpreter tests: $cpu_status"
echo "   GPU checks:            $gpu_status"
echo "   vLLM end to end:       $vllm_status"
if [[ $cpu_rc -ne 0 || $gpu_rc -ne 0 ]]; then
  exit 1
fi
if [[ -z "$gpu" && "${REQUIRE_GPU:-0}" == "1" ]]; then
  echo "   REQUIRE_GPU=1 and no GPU: exit 3"
  exit 3
fi
exit 0
