"""The switches of the vLLM integration, read from the environment.

vLLM builds its samplers in worker processes, from its own configuration; a plugin can only
be told what to do by the environment those processes inherit:

``SPECSAMPLE_VLLM``
    ``1`` (or ``true``, ``on``, ``yes``) installs the specsample rejection sampler; unset,
    empty, ``0`` (or ``false``, ``off``, ``no``) leaves vLLM as it is.
``SPECSAMPLE_VLLM_METHOD``
    The exact rule vLLM's ``rejection_sample_method="standard"`` runs: ``chain`` (token by
    token, the default) or ``block`` (block verification, never fewer accepted tokens in
    expectation). vLLM's own ``"block"`` always runs block verification.
``SPECSAMPLE_VLLM_BACKEND``
    ``auto`` (the default), ``torch``, ``triton`` or ``cpu`` (see :mod:`specsample.backends`).

Examples
--------
>>> Settings.from_env({"SPECSAMPLE_VLLM": "1", "SPECSAMPLE_VLLM_METHOD": "block"})
Settings(enabled=True, method='block', backend='auto')
>>> Settings.from_env({}).enabled
False
"""

from __future__ import annotations

import os
from collections.abc import Mapping
from dataclasses import dataclass

from specsample.backends import BACKENDS
from specsample.methods import chain_methods

LOGGER = "vllm.specsample"
"""The integration's logger: a child of vLLM's own, so its lines reach vLLM's log."""

ENABLE = "SPECSAMPLE_VLLM"
METHOD = "SPECSAMPLE_VLLM_METHOD"
BACKEND = "SPECSAMPLE_VLLM_BACKEND"

EXACT_METHODS = chain_methods()
"""The specsample rules the integration runs: vLLM passes chains of drafts, not trees."""

_ON = ("1", "true", "on", "yes")
_OFF = ("", "0", "false", "off", "no")


def _choice(environ: Mapping[str, str], name: str, allowed: tuple[str, ...]) -> str:
    value = environ.get(name, allowed[0]).strip().lower() or allowed[0]
    if value not in allowed:
        raise ValueError(f"{name} must be one of {allowed}, got {environ[name]!r}")
    return value


@dataclass(frozen=True)
class Settings:
    """What the environment asks of the integration.

    Attributes
    ----------
    enabled : bool
        Whether the plugin installs the specsample sampler (``SPECSAMPLE_VLLM``).
    method : str
        ``"chain"`` or ``"block"`` (``SPECSAMPLE_VLLM_METHOD``).
    backend : str
        ``"auto"``, ``"torch"``, ``"triton"`` or ``"cpu"`` (``SPECSAMPLE_VLLM_BACKEND``).
    """

    enabled: bool = False
    method: str = "chain"
    backend: str = "auto"

    @classmethod
    def from_env(cls, environ: Mapping[str, str] | None = None) -> Settings:
        """Read the switches from ``environ`` (``os.environ`` by default).

        Raises
        ------
        ValueError
            A variable with a value it does not take (the message names it).
        """
        environ = os.environ if environ is None else environ
        switch = environ.get(ENABLE, "").strip().lower()
        if switch not in _ON + _OFF:
            raise ValueError(f"{ENABLE} must be 1 or 0 (or true/false, on/off), got {switch!r}")
        return cls(
            enabled=switch in _ON,
            method=_choice(environ, METHOD, EXACT_METHODS),
            backend=_choice(environ, BACKEND, BACKENDS),
        )
