"""The kernels, one subpackage per target: what a backend of :mod:`specsample.backends` runs.

* :mod:`specsample.kernels.triton`: Triton kernels for the chain, block and keyed Gumbel-max
  steps, on CUDA tensors (or on CPU tensors under ``TRITON_INTERPRET=1``), each with its
  host-side launch;
* :mod:`specsample.kernels.cpu`: numba kernels for the CPU (the chain rule on probabilities
  and on logits, row statistics, filters, the keyed Gumbel-max step, counter-based uniforms,
  row-exact attention), compiled by :mod:`specsample.kernels.cpu.compiler`.

Importing this package imports neither triton nor numba.
"""
