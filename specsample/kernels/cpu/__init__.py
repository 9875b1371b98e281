"""Fused CPU kernels, compiled by numba: the kernels of the ``"cpu"`` backend.

* :mod:`~specsample.kernels.cpu.launch`: the host side, which calls the kernels take, the
  tensors as they read them, the thread counts and the calls (the backend,
  :mod:`specsample.backends.cpu`, is a table over it that falls back to PyTorch);
* :mod:`~specsample.kernels.cpu.compiler`: compilation once per machine and user into the user's
  cache, in the foreground and announced (or ahead of time, ``specsample warm``), on the
  caller's thread count;
* :mod:`~specsample.kernels.cpu.chain`: the chain rule on ``[batch, k, vocab]`` probabilities in
  one pass per sequence;
* :mod:`~specsample.kernels.cpu.logits`: the chain rule on flattened logits and the row statistics
  it needs;
* :mod:`~specsample.kernels.cpu.gumbel`: the keyed Gumbel-max step of ``method="gumbel"`` on
  flattened logits;
* :mod:`~specsample.kernels.cpu.filters`: the top-k, top-p and min-p thresholds of a row, by
  selection;
* :mod:`~specsample.kernels.cpu.floats`: the float32 arithmetic they share (a vectorised
  exponential, ``z`` as PyTorch computes it, integer keys that order floats);
* :mod:`~specsample.kernels.cpu.hashing`: the counter-based uniforms of :mod:`specsample.random`
  (what :func:`specsample.random.counter_uniform` runs on CPU tensors);
* :mod:`~specsample.adapter.int_products`: the integer dot products of the ``int4a8`` and ``int8a8``
  weight formats (:mod:`specsample.adapter.dot_weights`);
* :mod:`~specsample.kernels.cpu.memory`: a tensor's memory read and written through its address
  and strides.

The kernels take the tensors without copying them: the chain rule on probabilities their
addresses and strides (no NumPy view to build in a call that is latency-bound), the others
NumPy views. They compute what the rules of :mod:`specsample.rules` compute, with the same
arithmetic but for the exponential of the logits kernels, which rounds as its own (see
:mod:`specsample.kernels.cpu.floats`).
"""
