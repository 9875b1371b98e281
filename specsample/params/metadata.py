"""What each row of a batch asks for: its sampling parameters, as tensors.

Metadata is kept apart from the computation. :class:`SamplingMetadata` (and
:class:`~specsample.params.layout.BatchLayout`, the draft layout) turn what the caller gives
(host values, CPU tensors or tensors on the batch's device) into a few small device tensors,
plus host-side hints (all greedy? any top-p? the widest top-k?) that let the device work be
planned without ever synchronising.

Host values are validated on the host. Tensors on an accelerator stay there: nothing is
copied back, so their values are only checked in strict mode (``strict=True`` of
:meth:`SamplingMetadata.build`), and the hints become conservative (some row may be greedy,
some may be sampled; top-k is taken over the whole vocabulary). A tensor on any other device
(neither the host nor the batch's) is refused.
"""

from __future__ import annotations

import math
import numbers
from collections.abc import Sequence
from dataclasses import dataclass, replace

import torch

from specsample.params.transfer import to_device

Scalars = float | int | Sequence[float] | Sequence[int] | torch.Tensor | None

GREEDY_BELOW = 2.0**-100
"""Temperatures below this (about ``7.9e-31``) are greedy, their limit as ``T -> 0``.

Keeps ``1 / T <= 2**100``, so ``logits / T`` stays finite in float32 for any logit of
magnitude below ``2**27``; a smaller positive ``T`` would make ``1 / T`` or ``logits / T``
overflow to infinity and leave the row without a distribution."""


def _on_host(value: torch.Tensor) -> bool:
    return value.device.type == "cpu"


def placed(name: str, value: torch.Tensor, device: torch.device) -> bool:
    """Whether ``value`` is a host tensor; refuse one neither on the host nor on ``device``."""
    if _on_host(value):
        return True
    if value.device != device:
        raise ValueError(
            f"{name} is on {value.device}: give it on the CPU, as host values, or on the "
            f"batch's device ({device})"
        )
    return False


def _real(name: str, value: object) -> float | int:
    """A host number of a parameter: an int or a float, never a bool (``TypeError``)."""
    if isinstance(value, bool) or not isinstance(value, numbers.Real):
        raise TypeError(f"{name} values must be real numbers, got {type(value).__name__}")
    return int(value) if isinstance(value, numbers.Integral) else float(value)


def _host_values(
    name: str, value: Scalars, batch: int, default: float, device: torch.device
) -> list[float] | None:
    """``value`` as one number per request, one number for all (a list of one, broadcast:
    nothing then depends on the batch size), or ``None`` for a tensor on ``device``."""
    if value is None:
        return [default] if batch else []
    if isinstance(value, torch.Tensor):
        if value.dtype == torch.bool or value.is_complex():
            raise TypeError(f"{name} must be a real tensor, got {value.dtype}")
        if name == "top_k" and value.dtype.is_floating_point:
            raise TypeError(f"top_k must be an integer tensor, got {value.dtype}")
        if value.dim() > 1 or (value.dim() == 1 and value.shape[0] != batch):
            raise ValueError(
                f"{name} must be a scalar or have shape ({batch},), got {tuple(value.shape)}"
            )
        if not placed(name, value, device):
            return None
        if value.dim() == 0:
            return [value.item()] if batch else []
        return list(value.tolist())
    if isinstance(value, str | bytes) or not isinstance(value, numbers.Real | Sequence):
        raise TypeError(
            f"{name} must be a number, a sequence or a tensor, got {type(value).__name__}"
        )
    if not isinstance(value, Sequence):
        scalar = _real(name, value)
        _validate(name, [scalar])
        return [scalar] if batch else []
    values = [_real(name, v) for v in value]
    if len(values) != batch:
        raise ValueError(f"{name} must have one value per request ({batch}), got {len(values)}")
    return values


def _pairs(values: list[float], temps: list[float]) -> list[tuple[float, float]]:
    """Each request's (value, temperature), a list of one standing for every request."""
    if len(values) == 1 and len(temps) > 1:
        return [(values[0], t) for t in temps]
    if len(temps) == 1 and len(values) > 1:
        return [(v, temps[0]) for v in values]
    return list(zip(values, temps, strict=True))


def _as_float(value: float) -> float:
    """``float(value)``, an int too large for a float becoming an infinity."""
    try:
        return float(value)
    except OverflowError:
        return math.inf if value > 0 else -math.inf


_ALLOWED = {
    "temperature": "finite and >= 0 (0 = greedy)",
    "top_k": "an integer in [0, 2**63) (0 = off)",
    "top_p": "in (0, 1] (1 = off)",
    "min_p": "in [0, 1] (0 = off)",
}
"""What each sampling parameter accepts, as the error messages say it."""


def _allowed(name: str, v: float) -> bool:
    if name == "top_k":
        if isinstance(v, int):
            return 0 <= v < 1 << 63
        return math.isfinite(v) and v == int(v) and 0 <= v < 2.0**63
    x = _as_float(v)
    if name == "temperature":
        return x >= 0.0 and math.isfinite(x)
    if name == "top_p":
        return 0.0 < x <= 1.0
    return 0.0 <= x <= 1.0


def _validate(name: str, values: list[float]) -> None:
    for v in values:
        if not _allowed(name, v):
            raise ValueError(f"{name} must be {_ALLOWED[name]}, got {v}")


def _device_values(
    values: list[float] | None, given: Scalars, batch: int, device: torch.device, dtype: torch.dtype
) -> torch.Tensor:
    if values is not None:
        if dtype == torch.int64:
            values = [int(v) for v in values]
        return torch.tensor(values, dtype=dtype).to(device, non_blocking=True).expand(batch)
    if not isinstance(given, torch.Tensor):
        raise TypeError("expected a tensor")
    return given.to(device=device, dtype=dtype).expand(batch)


def _check_device_values(name: str, value: torch.Tensor) -> None:
    """Strict-mode range check of a parameter given as a device tensor (synchronises)."""
    x = value.to(torch.float64)
    if name == "temperature":
        ok = torch.isfinite(x) & (x >= 0)
    elif name == "top_k":
        ok = x >= 0
    elif name == "top_p":
        ok = (x > 0) & (x <= 1)
    else:
        ok = (x >= 0) & (x <= 1)
    if x.numel() and not bool(ok.all()):
        bad = value.reshape(-1)[(~ok).reshape(-1)][0].item()
        raise ValueError(f"{name} must be {_ALLOWED[name]}, got {bad}")


def _parse(
    given: dict[str, Scalars], batch: int, device: torch.device, strict: bool
) -> dict[str, list[float] | None]:
    """Each parameter's host values, validated (``None`` for a tensor on ``device``)."""
    defaults = {"temperature": 1.0, "top_k": 0, "top_p": 1.0, "min_p": 0.0}
    host = {n: _host_values(n, v, batch, defaults[n], device) for n, v in given.items()}
    for name, values in host.items():
        value = given[name]
        if values is not None:
            _validate(name, values)
        elif strict and isinstance(value, torch.Tensor):
            _check_device_values(name, value)
    return host


@dataclass(frozen=True)
class SamplingMetadata:
    """Per-request sampling parameters as device tensors, with host-side hints.

    The target distribution is processed in this order: temperature, then top-k, then
    top-p, then min-p (see :mod:`specsample.probs`). Temperature 0 (or below
    :data:`GREEDY_BELOW`) means greedy; greedy requests have every filter off.

    Attributes
    ----------
    inv_temperature : torch.Tensor
        ``[batch]`` float32 ``1 / T`` (1 for greedy requests).
    greedy : torch.Tensor
        ``[batch]`` bool.
    top_k : torch.Tensor or None
        ``[batch]`` int64, 0 = off; ``None`` when no request uses it.
    top_p, min_p : torch.Tensor or None
        ``[batch]`` float32 (1, resp. 0 = off); ``None`` when no request uses them.
    all_greedy : bool
        Every request is known to be greedy: no softmax, no random numbers needed.
    any_greedy : bool
        Some request may be greedy.
    max_top_k : int or None
        The largest top-k, when known on the host (``None``: take the k-th largest over
        the whole vocabulary).

    Examples
    --------
    >>> meta = SamplingMetadata.build(3, torch.device("cpu"), temperature=[0.0, 0.7, 1.0],
    ...                               top_p=0.9)
    >>> meta.all_greedy, meta.any_greedy, meta.greedy.tolist(), meta.top_p.tolist()
    (False, True, [True, False, False], [1.0, 0.8999999761581421, 0.8999999761581421])
    """

    inv_temperature: torch.Tensor
    greedy: torch.Tensor
    top_k: torch.Tensor | None
    top_p: torch.Tensor | None
    min_p: torch.Tensor | None
    all_greedy: bool
    any_greedy: bool
    max_top_k: int | None

    @staticmethod
    def build(
        batch: int,
        device: torch.device,
        *,
        temperature: Scalars = 1.0,
        top_k: Scalars = None,
        top_p: Scalars = None,
        min_p: Scalars = None,
        strict: bool = False,
    ) -> SamplingMetadata:
        """Validate and expand the parameters: scalars, sequences, or tensors.

        Host values (numbers, sequences, CPU tensors) are validated. Tensors on the batch's
        device stay there (no synchronisation); their values are checked only with
        ``strict`` (which synchronises). A tensor on another device is refused. When every
        parameter is given on the host, the metadata is built there and its tensors reach
        the device in one copy.

        Raises
        ------
        TypeError
            A parameter (or one of its values) that is not a real number; a top-k tensor
            that is not of an integer dtype.
        ValueError
            A value out of range, a wrong length or shape, or a tensor on another device.
        """
        given = {"temperature": temperature, "top_k": top_k, "top_p": top_p, "min_p": min_p}
        host = _parse(given, batch, device, strict)
        on_host = all(values is not None for values in host.values())
        if device.type != "cpu" and on_host and not torch.compiler.is_compiling():
            return _moved(_assemble(host, given, batch, torch.device("cpu")), device)
        return _assemble(host, given, batch, device)

    @property
    def batch(self) -> int:
        """Number of requests."""
        return int(self.greedy.shape[0])

    def rows(self, index: torch.Tensor) -> SamplingMetadata:
        """The parameters of the requests at ``index`` (``[n]`` int64, on the device).

        Use it to give each flattened row its request's parameters, or to keep a subset of
        the requests; the host hints carry over.
        """
        return replace(
            self,
            inv_temperature=self.inv_temperature[index],
            greedy=self.greedy[index],
            top_k=None if self.top_k is None else self.top_k[index],
            top_p=None if self.top_p is None else self.top_p[index],
            min_p=None if self.min_p is None else self.min_p[index],
        )


def _assemble(
    host: dict[str, list[float] | None], given: dict[str, Scalars], batch: int, device: torch.device
) -> SamplingMetadata:
    """The metadata of validated parameters (``host``: their host values, ``None`` for a
    tensor on ``device``), built on ``device``."""
    temps = host["temperature"]
    t = _device_values(temps, given["temperature"], batch, device, torch.float32)
    greedy = t < GREEDY_BELOW
    inv_t = torch.where(greedy, 1.0, 1.0 / t.clamp(min=GREEDY_BELOW))
    filters: dict[str, torch.Tensor | None] = {}
    for name, off, dtype in (
        ("top_k", 0.0, torch.int64),
        ("top_p", 1.0, torch.float32),
        ("min_p", 0.0, torch.float32),
    ):
        values = host[name]
        if values is not None and all(v == off for v in values):
            filters[name] = None
            continue
        if values is not None and temps is not None:
            values = [off if s < GREEDY_BELOW else v for v, s in _pairs(values, temps)]
            if all(v == off for v in values):
                filters[name] = None
                continue
        tensor = _device_values(values, given[name], batch, device, dtype)
        filters[name] = tensor.masked_fill(greedy, off)
    known_k = host["top_k"]
    max_top_k = None
    if filters["top_k"] is None:
        max_top_k = 0
    elif known_k is not None and temps is not None:
        max_top_k = int(max(k for k, s in _pairs(known_k, temps) if s >= GREEDY_BELOW))
    return SamplingMetadata(
        inv_temperature=inv_t,
        greedy=greedy,
        top_k=filters["top_k"],
        top_p=filters["top_p"],
        min_p=filters["min_p"],
        all_greedy=temps is not None and all(s < GREEDY_BELOW for s in temps),
        any_greedy=temps is None or any(s < GREEDY_BELOW for s in temps),
        max_top_k=max_top_k,
    )


def _moved(meta: SamplingMetadata, device: torch.device) -> SamplingMetadata:
    """``meta``, built on the host, with its tensors on ``device``, moved in one copy."""
    names = ("inv_temperature", "greedy", "top_k", "top_p", "min_p")
    present = [n for n in names if getattr(meta, n) is not None]
    moved = dict(zip(present, to_device([getattr(meta, n) for n in present], device), strict=True))
    return replace(
        meta,
        inv_temperature=moved["inv_temperature"],
        greedy=moved["greedy"],
        top_k=moved.get("top_k"),
        top_p=moved.get("top_p"),
        min_p=moved.get("min_p"),
    )
