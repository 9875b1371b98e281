"""The public functions: :func:`verify` (chains, flattened and ragged), :func:`verify_padded`
(``[batch, k + 1, vocab]``) and :func:`verify_tree` (token trees), all through
:mod:`specsample.pipeline` and the backend seam of :mod:`specsample.backends`."""

from specsample.api.chain import VerifyOutput, verify, verify_padded
from specsample.api.options import RequestOptions, VerifyOptions
from specsample.api.tree import verify_tree

__all__ = [
    "RequestOptions",
    "VerifyOptions",
    "VerifyOutput",
    "verify",
    "verify_padded",
    "verify_tree",
]
