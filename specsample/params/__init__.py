"""What a request asks and how a batch is laid out, validated once: the parameter objects.

* :mod:`~specsample.params.requests`: :class:`SamplingParams` (what each request asks),
  :class:`Requests` (a batch's parameters, validated once and reused step after step) and
  :class:`DraftTree` (the draft layout of a tree step);
* :mod:`~specsample.params.layout`: :class:`~specsample.params.layout.BatchLayout` (the
  ragged draft layout of a chain step) and its checks against a step's other arguments;
* :mod:`~specsample.params.metadata`: :class:`~specsample.params.metadata.SamplingMetadata`
  (the processing each row asks for, as tensors);
* :mod:`~specsample.params.seeding`: :class:`~specsample.params.seeding.Seeding` (where each
  row's random numbers come from) and the checks of seeds, generators and positions;
* :mod:`~specsample.params.checks`: the validators of tensors and values, each check in one
  place, shared by every entry point;
* :mod:`~specsample.params.transfer`: host tensors sent to the device in one copy (what a
  parameter object built on the host sends).

Everything below the public API reads these objects; none of them imports anything but the
foundation (:mod:`specsample.methods`, :mod:`specsample.random`).
"""

from specsample.params.layout import Ints
from specsample.params.requests import DraftTree, Requests, SamplingParams, Seeds

__all__ = ["DraftTree", "Ints", "Requests", "SamplingParams", "Seeds"]
