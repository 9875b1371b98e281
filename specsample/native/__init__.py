"""Fused CPU kernels, compiled by numba: the kernels of the ``"cpu"`` backend.

* :mod:`~specsample.native.jit`: compilation into the user's cache, on a background thread
  (no call waits for it: until it is done, the backend runs the PyTorch code);
* :mod:`~specsample.native.chain`: the chain rule on ``[batch, k, vocab]`` probabilities in
  one pass per sequence;
* :mod:`~specsample.native.logits`: the chain rule on flattened logits, the row statistics
  it needs, and a vectorised float32 exponential.

The kernels take NumPy views of the tensors (no copy) and compute what the rules of
:mod:`specsample.rules` compute, with the same arithmetic but for the exponential of the
logits kernels, which rounds as its own (see :mod:`specsample.native.logits`).
"""
