"""vLLM v1's rejection sampler, verifying with specsample.

:class:`SpecsampleRejectionSampler` is a subclass of vLLM's
``vllm.v1.sample.rejection_sampler.RejectionSampler`` with the same constructor and the same
``forward(metadata, draft_probs, logits, sampling_metadata) -> SamplerOutput``. Everything
vLLM does around verification is vLLM's own code, called as vLLM calls it:

* the bonus token of each request is drawn by vLLM's ``Sampler`` (logits processors,
  penalties, min-p, top-k/top-p, per-request generators);
* the target rows at the draft positions go through vLLM's ``apply_logits_processors``
  (penalties, bad words, allowed-token masks, min-tokens), as in vLLM;
* logprobs, when ``sampling_metadata.max_num_logprobs`` is set, are gathered by vLLM's
  helpers, in vLLM's ``logprobs_mode``.

What changes is the verification itself: :func:`specsample.verify` applies each request's
temperature, top-k and top-p to the processed target rows and accepts drafts by an exact
rule (chain, or block), drawing a request's numbers from its generator only, so a seeded
request gives the same tokens whatever the batch. The output follows vLLM's conventions:
``[batch, max_spec_len + 1]`` int32, accepted drafts, then one more token, then ``-1``
(vLLM's placeholder).

vLLM's lossy ``rejection_sample_method`` values (``"synthetic"``, ``"fly"``) keep vLLM's
meaning: with them, :meth:`SpecsampleRejectionSampler.forward` is vLLM's own.
"""

from __future__ import annotations

import logging
import time
from dataclasses import replace
from typing import TYPE_CHECKING, Any

import torch
from vllm.v1.outputs import LogprobsTensors, SamplerOutput
from vllm.v1.sample import rejection_sampler as vllm_rejection
from vllm.v1.sample.metadata import SamplingMetadata
from vllm.v1.sample.sampler import Sampler
from vllm.v1.spec_decode.metadata import SpecDecodeMetadata

from specsample import verify
from specsample.backends import resolve
from specsample.integrations.vllm.settings import EXACT_METHODS, LOGGER, Settings
from specsample.kernels.cpu import compiler
from specsample.methods import METHODS

if TYPE_CHECKING:
    from vllm.config.speculative import SpeculativeConfig

VLLM_LOSSY_METHODS = ("synthetic", "fly")
"""vLLM's ``rejection_sample_method`` values that do not follow the target: left to vLLM."""

VllmRejectionSampler: Any = vllm_rejection.RejectionSampler
"""vLLM's class, as defined by vLLM (the plugin may later rebind the module's name)."""

logger = logging.getLogger(LOGGER)


def exact_method(spec_config: SpeculativeConfig | None, default: str) -> str | None:
    """The specsample rule for vLLM's ``rejection_sample_method``, ``None`` for a lossy one.

    ``"standard"`` runs ``default`` (``"chain"``, ``"block"`` or ``"gumbel"``), ``"block"``
    runs block verification, and vLLM's lossy methods map to ``None`` (vLLM's own sampler
    runs them).

    Examples
    --------
    >>> exact_method(None, "chain")
    'chain'
    """
    if default not in EXACT_METHODS:
        raise ValueError(f"method must be one of {EXACT_METHODS}, got {default!r}")
    asked = "standard" if spec_config is None else spec_config.rejection_sample_method
    if asked in VLLM_LOSSY_METHODS:
        return None
    return "block" if asked == "block" else default


def prepare_backend(backend: str, device: torch.device | str | None) -> str:
    """The concrete backend that verifies on ``device``, made ready to serve.

    The fused CPU kernels are compiled (or loaded from the cache) here, while vLLM builds
    its model runner, so that no request ever waits for a compiler.

    Parameters
    ----------
    backend : str
        ``"auto"``, ``"torch"``, ``"triton"`` or ``"cpu"``.
    device : torch.device or str or None
        Where vLLM runs (``None``: the CPU).

    Returns
    -------
    str
        ``"torch"``, ``"triton"`` or ``"cpu"`` (``"torch"`` where the CPU kernels failed to
        compile: a warning says why).

    Raises
    ------
    ValueError
        ``backend`` unknown, or unable to run on ``device`` (the message says why).

    Examples
    --------
    >>> prepare_backend("torch", "cpu")
    'torch'
    """
    concrete = resolve(backend, torch.empty(0, device=device or "cpu"))
    if concrete == "cpu" and not compiler.warm_up():
        return "torch"
    return concrete


def request_options(sampling_metadata: SamplingMetadata) -> dict[str, Any]:
    """The keywords of :func:`specsample.verify` for what vLLM's batch asks.

    vLLM marks a greedy request with temperature 0, top-k off with ``vocab`` and top-p off
    with 1, as :func:`specsample.verify` reads them; its ``generators`` map a request's
    index to its generator, as ``verify``'s ``generators`` do. Tensors stay on their device.
    """
    if sampling_metadata.all_greedy:
        return {"temperature": 0.0}
    options: dict[str, Any] = {
        "temperature": sampling_metadata.temperature,
        "generators": sampling_metadata.generators,
    }
    if sampling_metadata.top_k is not None:
        options["top_k"] = sampling_metadata.top_k
    if sampling_metadata.top_p is not None:
        options["top_p"] = sampling_metadata.top_p
    return options


class SpecsampleRejectionSampler(VllmRejectionSampler):  # type: ignore[misc]
    """vLLM v1's ``RejectionSampler``, verifying exactly with :func:`specsample.verify`.

    Parameters
    ----------
    sampler : vllm.v1.sample.sampler.Sampler
        vLLM's sampler: it draws the bonus tokens and computes logprobs.
    spec_config : vllm.config.SpeculativeConfig, optional
        vLLM's speculative configuration; its ``rejection_sample_method`` picks the rule
        (see :func:`exact_method`).
    device : torch.device, optional
        The device vLLM runs on.
    method : str, optional
        ``"chain"`` or ``"block"``: the rule for vLLM's ``"standard"`` method
        (``SPECSAMPLE_VLLM_METHOD`` when ``None``).
    backend : str, optional
        ``"auto"``, ``"torch"``, ``"triton"`` or ``"cpu"`` (``SPECSAMPLE_VLLM_BACKEND``
        when ``None``).

    Attributes
    ----------
    method : str or None
        The specsample rule in use; ``None`` when vLLM's own (lossy) method runs.
    backend : str
        The specsample backend asked for.

    Examples
    --------
    >>> import torch
    >>> from vllm.v1.sample.sampler import Sampler
    >>> from specsample.integrations.vllm.testing import sampling_metadata, spec_metadata
    >>> sampler = SpecsampleRejectionSampler(Sampler(), method="chain", backend="torch")
    >>> metadata = spec_metadata([[1, 0], [2]])
    >>> logits = torch.full((5, 3), -9.0)
    >>> logits[[0, 1, 2, 3, 4], [1, 2, 0, 1, 1]] = 9.0  # request 0: 1, 2, 0; request 1: 1, 1
    >>> out = sampler(metadata, None, logits, sampling_metadata([0.0, 0.0], vocab=3))
    >>> out.sampled_token_ids.tolist()
    [[1, 2, -1], [1, -1, -1]]
    """

    def __init__(
        self,
        sampler: Sampler,
        spec_config: SpeculativeConfig | None = None,
        device: torch.device | None = None,
        *,
        method: str | None = None,
        backend: str | None = None,
    ) -> None:
        super().__init__(sampler, spec_config, device)
        settings = Settings.from_env()
        self.method = exact_method(spec_config, method or settings.method)
        self.backend = backend or settings.backend
        if self.method is None:
            logger.info(
                "specsample: vLLM's own sampler runs rejection_sample_method=%r (lossy)",
                getattr(spec_config, "rejection_sample_method", None),
            )
            return
        started = time.perf_counter()
        runs_on = prepare_backend(self.backend, device)
        ready = f" (kernels ready in {time.perf_counter() - started:.1f} s)"
        logger.info(
            "specsample verifies the drafts: method %s, backend %s%s",
            self.method,
            runs_on,
            ready if runs_on == "cpu" else "",
        )

    def forward(
        self,
        metadata: SpecDecodeMetadata,
        draft_probs: torch.Tensor | None,
        logits: torch.Tensor,
        sampling_metadata: SamplingMetadata,
    ) -> SamplerOutput:
        """Accept a prefix of each request's drafts and emit one more token.

        Parameters
        ----------
        metadata : vllm.v1.spec_decode.metadata.SpecDecodeMetadata
            The drafts (``draft_token_ids [num_tokens]``, ``num_draft_tokens`` per request)
            and where their rows lie in ``logits``.
        draft_probs : torch.Tensor or None
            ``[num_tokens, vocab]`` float32 distributions the drafts were sampled from;
            ``None`` for drafts without probabilities (n-gram, greedy drafters): one-hot.
            Such drafts are verified by the chain rule when the method is ``"block"``, which
            accepts exactly as many of them in expectation.
        logits : torch.Tensor
            ``[num_tokens + batch, vocab]`` the target's logits, each request's draft rows
            then its bonus row. Not modified.
        sampling_metadata : vllm.v1.sample.metadata.SamplingMetadata
            What each request asks, as vLLM's input batch builds it.

        Returns
        -------
        vllm.v1.outputs.SamplerOutput
            ``sampled_token_ids [batch, max_spec_len + 1]`` int32 (accepted drafts, one more
            token, then -1) and ``logprobs_tensors`` when ``max_num_logprobs`` is set.
        """
        if self.method is None:
            return super().forward(metadata, draft_probs, logits, sampling_metadata)
        bonus = self.sampler(
            logits=logits[metadata.bonus_logits_indices],
            sampling_metadata=replace(sampling_metadata, max_num_logprobs=-1),
            predict_bonus_token=True,
            logprobs_mode_override=(
                "processed_logits" if self.is_processed_logprobs_mode else "raw_logits"
            ),
        )
        raw = logits[metadata.target_logits_indices].to(torch.float32)
        needs_rows = METHODS[self.method].needs_draft_probs
        keep_raw = sampling_metadata.max_num_logprobs is not None
        keep_raw = keep_raw and not self.is_processed_logprobs_mode
        target = self.apply_logits_processors(
            raw.clone() if keep_raw else raw, sampling_metadata, metadata
        )
        out = verify(
            target,
            metadata.draft_token_ids,
            metadata.num_draft_tokens,
            draft_probs=draft_probs,
            bonus_token_ids=bonus.sampled_token_ids.to(torch.int64),
            method=self.method if draft_probs is not None or not needs_rows else "chain",
            backend=self.backend,
            **request_options(sampling_metadata),
        )
        token_ids = out.token_ids.to(torch.int32)
        logprobs = None
        if sampling_metadata.max_num_logprobs is not None:
            logprobs = self._logprobs(
                metadata, logits, raw, target, bonus, token_ids, sampling_metadata
            )
        return SamplerOutput(sampled_token_ids=token_ids, logprobs_tensors=logprobs)

    def _logprobs(
        self,
        metadata: SpecDecodeMetadata,
        logits: torch.Tensor,
        raw: torch.Tensor,
        target: torch.Tensor,
        bonus: SamplerOutput,
        token_ids: torch.Tensor,
        sampling_metadata: SamplingMetadata,
    ) -> LogprobsTensors:
        """vLLM's logprobs of the emitted tokens, in its ``logprobs_mode``.

        The processed modes read the rows as vLLM's sampler would sample them (temperature,
        top-k and top-p applied by vLLM's own function); the raw modes read ``raw``.
        """
        rows = raw
        if self.is_processed_logprobs_mode:
            rows = vllm_rejection.apply_sampling_constraints(
                target.clone(), metadata.cu_num_draft_tokens, sampling_metadata
            )
        return self._get_logprobs_tensors(
            sampling_metadata.max_num_logprobs,
            metadata,
            logits,
            rows,
            bonus.logprobs_tensors.logprobs,
            token_ids,
        )
