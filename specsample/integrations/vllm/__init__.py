"""specsample inside vLLM: a v1 rejection sampler and the plugin that installs it.

* :mod:`~specsample.integrations.vllm.sampler`: ``SpecsampleRejectionSampler``, with the
  constructor and ``forward(metadata, draft_probs, logits, sampling_metadata) ->
  SamplerOutput`` of vLLM v1's ``RejectionSampler``, verifying with
  :func:`specsample.verify`;
* :mod:`~specsample.integrations.vllm.plugin`: the ``vllm.general_plugins`` entry point
  that, with ``SPECSAMPLE_VLLM=1``, makes vLLM's model runner build that class;
* :mod:`~specsample.integrations.vllm.settings`: the switches, read from the environment.

Only the sampler module imports vLLM (the supported versions are pinned by the ``vllm``
extra), and only when it is imported itself; see ``docs/vllm.md``.
"""
