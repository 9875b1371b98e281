"""Hypothesis fuzzing of every public entry point.

Each test draws a case (shapes including 0 and 1, the four floating dtypes, values with
NaN, infinities, zeros, huge and tiny entries, sampling parameters, seeds) and, in some
examples, an injected fault. Every entry point must then

* return a valid result: shapes, int64 ids in ``[0, vocab)``, ``-1`` only after the
  emitted tokens, accepted drafts equal to the drafts, consistent counters, and only tokens
  the target can produce; or
* raise a ``TypeError``/``ValueError`` whose message names one of its arguments (one the
  fault broke), and refuse every input it documents as invalid;
* and give the same outcome when every tensor holds the same values in another memory
  layout (transposed, padded, strided, expanded), the randomness being made identical by
  ``uniforms=``, seeds, fresh generators and torch's global seed; inputs are never written.

Budgets scale with the hypothesis profile (see ``tests/conftest.py``).
"""

from __future__ import annotations

import functools
import inspect
import math
import re
from collections.abc import Callable, Iterator, Sequence
from dataclasses import dataclass, field
from typing import Any, NamedTuple

import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st

from specsample import RejectionSampler, TypicalAcceptanceSampler, verify, verify_padded
from specsample.api import VerifyOptions
from specsample.methods import chain_methods, tree_draftings
from specsample.params.seeding import seeding_from
from specsample.rules.block import block_verify
from specsample.rules.chain import chain_verify
from specsample.rules.tree import tree_verify, tree_verify_greedy

SCALE = settings().max_examples / 100


def budget(examples: int) -> settings:
    """``examples`` under the ``ci`` profile, scaled for the others."""
    return settings(max_examples=max(1, round(examples * SCALE)))


@pytest.fixture(autouse=True, scope="module")
def _one_thread() -> Iterator[None]:
    """One intra-op thread: on tensors this small more only add latency (load-dependent)."""
    threads = torch.get_num_threads()
    torch.set_num_threads(1)
    yield
    torch.set_num_threads(threads)


def _names(*functions: Callable[..., object]) -> tuple[str, ...]:
    """The argument names the functions take, their keyword options expanded."""
    params = [inspect.signature(f).parameters for f in functions]
    named = tuple(n for p in params for n in p if n not in ("self", "kwargs", "options"))
    expanded = (tuple(VerifyOptions.__annotations__) for f in functions if f is verify)
    return named + tuple(n for names in expanded for n in names)


SAMPLER_NAMES = _names(RejectionSampler.__init__, RejectionSampler.forward)
TYPICAL_NAMES = _names(TypicalAcceptanceSampler.__init__, TypicalAcceptanceSampler.forward)
VERIFY_NAMES = _names(verify)
PADDED_NAMES = _names(verify_padded, verify)
RULE_NAMES = _names(chain_verify)
TREE_RANDOMNESS = ("seeds", "generators", "generator")
"""What the caller of :func:`tree_verify` builds its ``seeding`` from."""
TREE_NAMES = (*_names(tree_verify), *TREE_RANDOMNESS)
GREEDY_NAMES = _names(tree_verify_greedy)

Shape = tuple[int, ...]
DTYPES = (torch.float32, torch.float16, torch.bfloat16, torch.float64)
SPECIAL = (math.nan, math.inf, -math.inf, 0.0, -0.0, 3e38, -3e38, 1e-40, -1e-40, -1.0, 1e4)
LAYOUTS = ("contiguous", "transposed", "padded", "strided", "batch_strided", "expanded")
TOLERANCE = {torch.float64: 1e-6, torch.float32: 1e-4, torch.float16: 1e-2, torch.bfloat16: 2e-2}
"""Largest ``|sum(row) - 1|`` of valid probability rows (as strict mode documents it)."""


class Fault(NamedTuple):
    """Injected faults: what broke, the arguments involved, whether it must be refused."""

    what: str
    names: tuple[str, ...]
    must: bool = True


@dataclass
class Gen:
    """A generator, created afresh (same seed) for every call."""

    seed: int


@dataclass
class Case:
    """One drawn input: tensors (relaid out for the stride property) and other arguments.

    ``info`` holds what the checks need (sizes, host values) and, under ``"blank"``, a
    stand-in for each optional tensor argument a fault may break though it is absent.
    """

    tensors: dict[str, torch.Tensor]
    args: dict[str, Any]
    info: dict[str, Any]
    layouts: dict[str, str] = field(default_factory=dict)
    fault: Fault | None = None
    seed: int = 0

    def put(self, name: str, value: object) -> None:
        self.drop(name)
        if isinstance(value, torch.Tensor):
            self.tensors[name] = value
        else:
            self.args[name] = value

    def drop(self, *names: str) -> None:
        for name in names:
            self.tensors.pop(name, None)
            self.args.pop(name, None)

    def get(self, name: str) -> Any:
        blank = self.info.get("blank", {}).get(name)
        return self.tensors.get(name, self.args.get(name, blank))

    def add(self, fault: Fault | None) -> None:
        if fault is not None and self.fault is not None:
            old = self.fault
            what, names = f"{old.what} + {fault.what}", old.names + fault.names
            fault = Fault(what, names, old.must or fault.must)
        self.fault = fault or self.fault

    def inputs(self, varied: bool) -> dict[str, Any]:
        """Every argument, the tensors contiguous or in their drawn layouts."""
        torch.manual_seed(self.seed)
        out = {name: _materialise(value) for name, value in self.args.items()}
        for name, tensor in self.tensors.items():
            out[name] = relayout(tensor, self.layouts.get(name, "") if varied else "")
        return out


def _materialise(value: object) -> object:
    if isinstance(value, Gen):
        return torch.Generator().manual_seed(value.seed)
    if isinstance(value, dict):
        return {key: _materialise(item) for key, item in value.items()}
    return value


# ---------------------------------------------------------------- values and layouts


def bits(x: torch.Tensor) -> torch.Tensor:
    """The tensor's bit pattern (of a floating tensor), to compare values NaN included."""
    if not x.dtype.is_floating_point:
        return x
    return x.contiguous().view({8: torch.int64, 4: torch.int32, 2: torch.int16}[x.element_size()])


def _constant(x: torch.Tensor, dims: int) -> bool:
    """Whether ``x`` (non-empty) is constant over its first ``dims`` dimensions."""
    if x.numel() == 0:
        return False
    flat = bits(x).reshape(math.prod(x.shape[:dims]), -1)
    return bool(torch.equal(flat, flat[:1].expand_as(flat)))


def relayout(x: torch.Tensor, layout: str) -> torch.Tensor:
    """``x``'s values in a fresh tensor with the given memory layout ("": contiguous)."""
    if x.dim() == 0 or x.is_meta or layout in ("", "contiguous"):
        return x.clone()
    if layout == "expanded":
        if _constant(x, max(x.dim() - 1, 1)):
            return (x.reshape(-1, x.shape[-1])[0] if x.dim() > 1 else x[0]).expand(x.shape)
        if x.dim() > 1 and _constant(x, 1):
            return x[:1].clone().expand(x.shape)
        layout = "strided"
    if layout == "transposed":
        order = tuple(reversed(range(x.dim())))
        return x.permute(order).contiguous().permute(order)
    fill = True if x.dtype == torch.bool else math.nan if x.dtype.is_floating_point else 1234567
    shape = tuple(x.shape)
    if layout == "batch_strided":
        view = torch.full((2 * shape[0], *shape[1:]), fill, dtype=x.dtype)[::2]
    elif layout == "padded":
        view = torch.full((*shape[:-1], shape[-1] + 3), fill, dtype=x.dtype)[..., : shape[-1]]
    else:
        view = torch.full((*shape[:-1], 2 * shape[-1]), fill, dtype=x.dtype)[..., ::2]
    return view.copy_(x)


def _generator(draw: st.DrawFn) -> torch.Generator:
    return torch.Generator().manual_seed(draw(st.integers(0, 2**31 - 1)))


def _override(draw: st.DrawFn, x: torch.Tensor, pool: Sequence[float], most: int) -> None:
    if x.numel():
        where = st.tuples(st.integers(0, x.numel() - 1), st.sampled_from(pool))
        for i, value in draw(st.lists(where, max_size=most)):
            x.view(-1)[i] = value


@st.composite
def values(
    draw: st.DrawFn, shape: Shape, dtype: torch.dtype, *, probs: bool, specials: bool, same: bool
) -> torch.Tensor:
    """Probability rows (some zeros) or logits (some ``-inf``), then special values.

    With ``same`` every row is identical (so that the tensor can be an expanded one).
    """
    vocab, g = shape[-1], _generator(draw)
    rows = 1 if same else math.prod(shape[:-1])
    drop = torch.rand(rows, vocab, generator=g) < draw(st.sampled_from((0.0, 0.4, 0.9)))
    if probs:
        x = torch.rand(rows, vocab, generator=g, dtype=torch.float64)
        keep = torch.nn.functional.one_hot(x.argmax(dim=-1), vocab).bool() if vocab else drop
        x = x.masked_fill(drop & ~keep, 0.0)
        x = x / x.sum(dim=-1, keepdim=True).clamp(min=1e-300)
    else:
        x = torch.randn(rows, vocab, generator=g, dtype=torch.float64).masked_fill(drop, -math.inf)
        x = x * draw(st.sampled_from((1.0, 5.0, 30.0)))
    if specials:
        _override(draw, x, SPECIAL, 3)
    x = x.to(dtype)
    return x.expand(*shape).contiguous() if same else x.reshape(shape)


@st.composite
def token_ids(draw: st.DrawFn, shape: Shape, vocab: int, valid: bool = False) -> torch.Tensor:
    """int64 (or int32) ids in ``[0, vocab)``; unless ``valid``, a few outside it."""
    ids = torch.randint(max(vocab, 1), shape, generator=_generator(draw))
    if not valid:
        _override(draw, ids, (-1, vocab, vocab + 5, -7), 2)
    return ids.to(draw(st.sampled_from((torch.int64, torch.int64, torch.int32))))


@st.composite
def uniforms(draw: st.DrawFn, shape: Shape) -> torch.Tensor:
    u = torch.rand(shape, generator=_generator(draw), dtype=torch.float64)
    _override(draw, u, (0.0, 2.0**-53, 0.5, 1.0 - 2.0**-53), 3)
    return u


@st.composite
def randomness(
    draw: st.DrawFn, batch: int, width: int | None, *, lists: bool, generators: str = "generators"
) -> tuple[dict[str, Any], dict[str, torch.Tensor]]:
    """Uniforms (``width`` columns, when given), seeds and positions, generators, or none."""
    modes = ("seeds", "generators", "generator", "global") + ("uniforms",) * (width is not None)
    mode = draw(st.sampled_from(modes))
    args: dict[str, Any] = {}
    tensors: dict[str, torch.Tensor] = {}
    if mode == "uniforms" and width is not None:
        tensors["uniforms"] = draw(uniforms((batch, width)))
    elif mode == "seeds":
        seed = st.one_of(st.just(-1), st.integers(0, 2**63 - 1), st.just(2**63 - 1))
        position = st.one_of(st.integers(0, 1000), st.just(2**40 - 1))
        for name, entry in (("seeds", seed), ("positions", position)):
            value = draw(st.lists(entry, min_size=batch, max_size=batch))
            forms = ("tensor", "none", "list")[: 3 if lists else 2]
            if name == "positions" and "seeds" in {**args, **tensors}:
                forms = tuple(form for form in forms if form != "none")  # seeds need positions
            form = draw(st.sampled_from(forms))
            if form == "tensor":
                tensors[name] = torch.tensor(value, dtype=torch.int64)
            elif form == "list":
                args[name] = [None if s == -1 and draw(st.booleans()) else s for s in value]
    elif mode == "generators" and batch:
        rows = draw(st.sets(st.integers(0, batch - 1), max_size=batch))
        args[generators] = {i: Gen(draw(st.integers(0, 2**31 - 1))) for i in sorted(rows)}
    if mode in ("generators", "generator") and draw(st.booleans()):
        args["generator"] = Gen(draw(st.integers(0, 2**31 - 1)))
    return args, tensors


# ---------------------------------------------------------------- faults

Apply = Callable[[Case, st.DrawFn], None]
FaultEntry = tuple[tuple[str, ...], Apply, bool | str]
FaultTable = dict[str, FaultEntry]
"""Fault name -> (arguments it breaks, how, must it be refused: True, False or "batch")."""


def inject(draw: st.DrawFn, case: Case, table: FaultTable, odds: int = 3) -> None:
    """With probability ``1 / odds``, apply one fault of ``table`` to ``case``."""
    if draw(st.integers(1, odds)) != 1:
        return
    what = draw(st.sampled_from(sorted(table)))
    names, apply, must = table[what]
    apply(case, draw)
    case.add(Fault(what, names, must is True or (must == "batch" and case.info["batch"] > 0)))


def _put(name: str, make: Callable[[Case], object], *clear: str) -> Apply:
    def apply(case: Case, draw: st.DrawFn) -> None:
        value = make(case)
        case.drop(*clear)
        case.put(name, value)

    return apply


def _wider(x: torch.Tensor, dim: int) -> torch.Tensor:
    """Zeros like ``x`` with one more entry along ``dim``."""
    shape = list(x.shape)
    shape[dim] += 1
    return torch.zeros(shape, dtype=x.dtype)


MUTATIONS: dict[str, Callable[[torch.Tensor], object]] = {
    "int": lambda x: x.long(),
    "float": lambda x: x.float(),
    "other-float": lambda x: x.double() if x.dtype != torch.float64 else x.float(),
    "wider": lambda x: _wider(x, -1),
    "wider2": lambda x: _wider(_wider(x, -1), -1),
    "longer": lambda x: _wider(x, 0),
    "unsqueezed": lambda x: x.unsqueeze(0),
    "flattened": lambda x: x.flatten(0, 1),
    "meta": lambda x: x.to("meta"),
    "list": lambda x: x.tolist(),
}


def _mutated(name: str, mutation: Callable[[torch.Tensor], object]) -> Callable[[Case], object]:
    return lambda case: mutation(case.get(name))


def _repeated(entry: object) -> Callable[[Case], object]:
    return lambda case: [entry] * case.info["batch"]


def _drawn(name: str, values: st.SearchStrategy[Any], init: bool = False) -> Apply:
    """Set argument ``name`` (of the constructor, with ``init``) to a drawn value."""

    def apply(case: Case, draw: st.DrawFn) -> None:
        (case.args["init"] if init else case.args)[name] = draw(values)

    return apply


def mutations(spec: str, must: bool | str = True) -> FaultTable:
    """Faults ``"name:mutation[:other,names]"``: that argument mutated (others may be named)."""
    table: FaultTable = {}
    for item in spec.split():
        name, mutation, *others = item.split(":")
        make = MUTATIONS[mutation]
        apply = _put(name, _mutated(name, make))
        named = (name, *(others[0].split(",") if others else ()))
        table[f"{name} {mutation}"] = (named, apply, must)
    return table


def _vocab_zero(case: Case, draw: st.DrawFn) -> None:
    for name in ("target_logits", "target_probs", "target_with_bonus_probs", "draft_probs"):
        if name in case.tensors:
            case.put(name, case.tensors[name][..., :0])


def random_faults(generators: str, lists: bool) -> FaultTable:
    """Faults of the seeds, positions and generators (host lists too when ``lists``)."""
    clear = ("uniforms", generators, "seeds", "positions")
    b: Callable[[Case], int] = lambda c: c.info["batch"]  # noqa: E731
    table: FaultTable = {
        f"{generators} value": ((generators,), _put(generators, lambda c: {0: 1}, *clear), "batch"),
        f"{generators} row": (
            (generators,),
            _put(generators, lambda c: {b(c): Gen(1)}, *clear),
            True,
        ),
        "generator": (("generator",), _put("generator", lambda c: "g", *clear), True),
    }
    for name in ("seeds", "positions"):
        bad: list[tuple[str, Callable[[Case], object], bool | str]] = [
            ("float dtype", lambda c: torch.full((b(c),), 1.5), True),
            ("length", lambda c: torch.zeros(b(c) + 1, dtype=torch.int64), True),
            ("meta", lambda c: torch.zeros(b(c), dtype=torch.int64, device="meta"), True),
            ("list", lambda c: [0] * b(c), False),
        ]
        if lists:
            bad = [*bad[:3], ("list length", lambda c: [0] * (b(c) + 1), True)]
            for what, entry in (("2**64", 2**64), ("str", "1"), ("1.5", 1.5), ("-5", -5)):
                refused = what in ("2**64", "str") or (what, name) == ("-5", "seeds")
                bad.append((what, _repeated(entry), "batch" if refused else False))
        for what, make, must in bad:
            table[f"{name} {what}"] = ((name,), _put(name, make, *clear), must)
    return table


def uniform_faults(clear: tuple[str, ...]) -> FaultTable:
    """Given uniforms of the wrong shape, the wrong dtype, or outside ``[0, 1)``."""

    def make(kind: str) -> Apply:
        def apply(case: Case, draw: st.DrawFn) -> None:
            case.drop(*clear)
            u = torch.rand(case.info["batch"], case.info["width"], dtype=torch.float64)
            bad = draw(st.sampled_from((1.0, -0.5, math.nan, 2.0)))
            bad_uniforms = {"shape": _wider(u, 1), "dtype": u.float(), "values": u.fill_(bad)}
            case.put("uniforms", bad_uniforms[kind])

        return apply

    kinds = ("shape", "dtype", "values")
    return {f"uniforms {kind}": (("uniforms",), make(kind), kind != "values") for kind in kinds}


# ---------------------------------------------------------------- running a case


class Refused(NamedTuple):
    """The entry point refused the input with this exception type."""

    kind: type


def _names_one(message: str, names: Sequence[str]) -> bool:
    return any(re.search(rf"\b{re.escape(name)}\b", message) for name in names)


def attempt(names: Sequence[str], fault: Fault | None, call: Callable[[], object]) -> object:
    """Run ``call``: its result, or :class:`Refused` on a TypeError/ValueError naming an argument.

    Any other exception propagates: a wrong exception type fails the test.
    """
    try:
        result = call()
    except (TypeError, ValueError) as error:
        message = f"{type(error).__name__}: {error}"
        assert fault is not None, f"valid input refused: {message}"
        assert _names_one(str(error), names), f"error names no argument of {names}: {message}"
        broken = fault.names
        assert _names_one(str(error), broken), f"{fault.what}: names none of {broken}: {message}"
        return Refused(type(error))
    assert fault is None or not fault.must, f"invalid input accepted silently: {fault.what}"
    return result


def same(a: object, b: object) -> bool:
    """Equal outcomes: tensors of equal dtype, shape and values (NaN equal to NaN)."""
    if isinstance(a, torch.Tensor):
        if not isinstance(b, torch.Tensor) or a.dtype != b.dtype or a.shape != b.shape:
            return False
        nan = torch.isnan(a) & torch.isnan(b) if a.dtype.is_floating_point else False
        return bool(((a == b) | nan).all())
    if isinstance(a, tuple) and isinstance(b, tuple):
        return type(a) is type(b) and len(a) == len(b) and all(map(same, a, b))
    return bool(a == b)


def run_both(names: Sequence[str], case: Case, call: Callable[[dict[str, Any]], object]) -> Any:
    """The outcome on contiguous inputs, checked equal to the one on the drawn layouts."""
    outcomes = []
    for varied in (False, True):
        inputs = case.inputs(varied)
        tensors = {n: t for n, t in inputs.items() if isinstance(t, torch.Tensor) and not t.is_meta}
        before = {n: t.clone() for n, t in tensors.items()}
        outcomes.append(attempt(names, case.fault, functools.partial(call, dict(inputs))))
        for name, tensor in before.items():
            assert torch.equal(bits(tensor), bits(inputs[name])), f"{name} was written to"
    assert same(*outcomes), f"depends on the layout {case.layouts}: {outcomes[0]} vs {outcomes[1]}"
    return outcomes[0]


def _call(function: Callable[..., object], *positional: str) -> Callable[[dict[str, Any]], object]:
    """Call ``function`` with the named inputs as positional arguments, the others by name."""
    return lambda inputs: function(*[inputs.pop(n) for n in positional], **inputs)


def counters(sampler: Any) -> tuple[int, int, int]:
    accepted, emitted = sampler.num_accepted_tokens, sampler.num_emitted_tokens
    return int(accepted), int(emitted), sampler.num_draft_tokens


def draw_layouts(draw: st.DrawFn, case: Case) -> Case:
    case.layouts = {name: draw(st.sampled_from(LAYOUTS)) for name in case.tensors}
    return case


# ---------------------------------------------------------------- output checks


def check_emitted(
    out: torch.Tensor, drafts: list[list[int]], vocab: int, width: int, bonus: list[int] | None
) -> list[int]:
    """Check a ``[batch, width]`` chain output; returns the drafts accepted per row.

    Row ``b`` holds a prefix of ``drafts[b]``, one more id in ``[0, vocab)``, then ``-1``;
    when every draft is accepted the extra id is ``bonus[b]`` (when given).
    """
    shape = (len(drafts), width)
    assert out.dtype == torch.int64 and out.shape == shape, f"{out.dtype} {out.shape}, not {shape}"
    accepted = []
    for b, row in enumerate(out.tolist()):
        n = (row.index(-1) if -1 in row else width) - 1
        assert 0 <= n <= len(drafts[b]), f"row {b} accepts {n} of {len(drafts[b])} drafts: {row}"
        assert all(t == -1 for t in row[n + 1 :]), f"row {b}: -1 inside the emitted tokens: {row}"
        assert row[:n] == drafts[b][:n], f"row {b}: accepted {row[:n]}, not the drafts {drafts[b]}"
        assert all(0 <= t < vocab for t in row[: n + 1]), f"row {b}: id outside [0, {vocab}): {row}"
        if bonus is not None and n == len(drafts[b]):
            assert row[n] == bonus[b], f"row {b}: all accepted, but {row[n]} is not the bonus"
        accepted.append(n)
    return accepted


def clean_probs(rows: torch.Tensor) -> bool:
    """Probability rows that are finite, non-negative, each with mass."""
    x = rows.to(torch.float64)
    return bool(torch.isfinite(x).all() and (x >= 0).all() and (x.sum(dim=-1) > 0).all())


def nonnegative(x: torch.Tensor) -> bool:
    """Finite and non-negative (a draft row whose ratios are defined)."""
    return bool(torch.isfinite(x).all() and (x >= 0).all())


def valid_probs(x: torch.Tensor) -> bool:
    """Rows strict mode must accept: finite, non-negative, normalised within tolerance."""
    y = x.to(torch.float64)
    normalised = bool(((y.sum(-1) - 1).abs() <= TOLERANCE[x.dtype]).all())
    return not x.numel() or (nonnegative(y) and normalised)


def in_vocab(ids: torch.Tensor, vocab: int) -> bool:
    return bool(((ids >= 0) & (ids < vocab)).all())


def strict_fault(checks: list[tuple[str, bool]]) -> Fault | None:
    """The fault strict mode must refuse: the arguments whose check failed (if any)."""
    bad = tuple(name for name, ok in checks if not ok)
    return Fault("strict values", bad) if bad else None


def check_support(q: torch.Tensor, ids: list[int], out: list[int], n: int) -> None:
    """Accepted drafts, and the token at the first rejection, have ``q > 0`` at their rows."""
    for j in range(n):
        assert float(q[j, ids[j]]) > 0, f"accepted draft {j} = {ids[j]} has q = 0"
    if n < q.shape[0]:
        assert float(q[n, out[n]]) > 0, f"emitted {out[n]} at position {n} has q = 0"


def check_probability_step(case: Case, out: torch.Tensor, stats: object, target: str) -> None:
    """A ``[batch, k + 1]`` step on probabilities: layout, counters, and ``q > 0``."""
    q, ids = case.tensors[target], case.tensors["draft_token_ids"]
    k = ids.shape[-1]
    bonus = case.tensors["bonus_token_ids"].reshape(-1).tolist()
    accepted = check_emitted(out, ids.tolist(), q.shape[-1], k + 1, bonus)
    if stats is not None:
        emitted = int((out != -1).sum())
        assert stats == (sum(accepted), emitted, len(accepted) * k), (stats, accepted)
    for b, n in enumerate(accepted if case.fault is None else []):
        p = case.tensors.get("draft_probs", q[:, :k])
        if clean_probs(q[b, :k]) and nonnegative(p[b]):
            check_support(q[b, :k], ids[b].tolist(), out[b].tolist(), n)
            if target == "target_with_bonus_probs" and n < k:
                assert float(q[b, n, out[b, n]]) == float(q[b, n].max()), f"row {b}: not the argmax"


# ---------------------------------------------------------------- RejectionSampler

SAMPLER_FAULTS: FaultTable = {
    **mutations(
        "target_probs:int target_probs:flattened draft_probs:other-float:target_probs "
        "draft_probs:wider:target_probs draft_token_ids:float bonus_token_ids:float "
        "draft_token_ids:wider:draft_probs,target_probs bonus_token_ids:wider"
    ),
    "vocab 0": (("target_probs", "draft_probs"), _vocab_zero, True),
    **random_faults("seeded_seqs", lists=False),
    **uniform_faults(("seeds", "seeded_seqs")),
    **{
        name: ((name,), _drawn(name, st.just(bad), init=True), True)
        for name, bad in (("method", "blocks"), ("backend", "fastest"), ("strict_mode", 1))
    },
}


@st.composite
def sampler_cases(draw: st.DrawFn) -> Case:
    batch, k, vocab = draw(st.integers(0, 4)), draw(st.integers(0, 4)), draw(st.integers(1, 10))
    dtype = draw(st.sampled_from(DTYPES))
    kind = {"probs": True, "specials": draw(st.booleans()), "same": draw(st.booleans())}
    target = draw(values((batch, k + draw(st.booleans()), vocab), dtype, **kind))
    draft = draw(st.just(target[:, :k].clone()) | values((batch, k, vocab), dtype, **kind))
    ids = draw(token_ids((batch, k), vocab))
    bonus = draw(token_ids(draw(st.sampled_from(((batch, 1), (batch,)))), vocab, valid=True))
    args, tensors = draw(randomness(batch, k + 1, lists=False, generators="seeded_seqs"))
    init = {"method": draw(st.sampled_from(chain_methods())), "strict_mode": draw(st.booleans())}
    tensors.update(target_probs=target, draft_probs=draft, draft_token_ids=ids)
    tensors["bonus_token_ids"] = bonus
    info = {"batch": batch, "width": k + 1}
    case = Case(tensors, {**args, "init": init}, info, seed=draw(st.integers(0, 99)))
    if init["strict_mode"]:
        checks = [("target_probs", valid_probs(target[:, :k])), ("draft_probs", valid_probs(draft))]
        case.add(strict_fault([*checks, ("draft_token_ids", in_vocab(ids, vocab))]))
    inject(draw, case, SAMPLER_FAULTS)
    _refuse_uniforms_with_gumbel(case, init["method"])
    return draw_layouts(draw, case)


def _call_sampler(inputs: dict[str, Any]) -> tuple[torch.Tensor, tuple[int, int, int]]:
    sampler = RejectionSampler(**inputs.pop("init"))
    names = ("target_probs", "bonus_token_ids", "draft_probs", "draft_token_ids")
    out = sampler(*[inputs.pop(n) for n in names], inputs.pop("seeded_seqs", None), **inputs)
    return out, counters(sampler)


@pytest.mark.slow
@budget(1000)
@given(sampler_cases())
def test_rejection_sampler(case: Case) -> None:
    """``RejectionSampler`` (chain and block; ``[B, k, V]`` and ``[B, k + 1, V]`` targets)."""
    outcome = run_both(SAMPLER_NAMES, case, _call_sampler)
    if not isinstance(outcome, Refused):
        check_probability_step(case, outcome[0], outcome[1], "target_probs")


# ---------------------------------------------------------------- TypicalAcceptanceSampler

TYPICAL_FAULTS: FaultTable = {
    **mutations(
        "target_with_bonus_probs:int draft_token_ids:float bonus_token_ids:wider "
        "draft_token_ids:wider2:draft_probs,target_with_bonus_probs "
        "draft_probs:wider:target_with_bonus_probs"
    ),
    **{
        name: ((name,), _drawn(name, bad, init=True), True)
        for name, bad in (
            ("posterior_threshold", st.sampled_from((-0.1, math.nan, math.inf, "0.1", True))),
            ("posterior_alpha", st.sampled_from((-1.0, math.nan, math.inf, None))),
            ("strict_mode", st.sampled_from((1, "yes", None))),
        )
    },
}


@st.composite
def typical_cases(draw: st.DrawFn) -> Case:
    batch, k, vocab = draw(st.integers(0, 4)), draw(st.integers(0, 4)), draw(st.integers(1, 10))
    dtype = draw(st.sampled_from(DTYPES))
    kind = {"probs": True, "specials": draw(st.booleans()), "same": draw(st.booleans())}
    target = draw(values((batch, k + draw(st.booleans()), vocab), dtype, **kind))
    ids = draw(token_ids((batch, k), vocab))
    bonus = draw(token_ids((batch, 1), vocab, valid=True))
    tensors = {"target_with_bonus_probs": target, "bonus_token_ids": bonus, "draft_token_ids": ids}
    if draw(st.booleans()):
        tensors["draft_probs"] = draw(values((batch, k, vocab), dtype, **kind))
    init = {
        "posterior_threshold": draw(st.sampled_from((0.09, 0.0, 0.5, 1.0, 1e-9))),
        "posterior_alpha": draw(st.sampled_from((0.3, 0.0, 1.0, 10.0))),
        "strict_mode": draw(st.booleans()),
    }
    info = {"batch": batch, "blank": {"draft_probs": target[:, :k]}}
    case = Case(tensors, {"init": init}, info)
    if init["strict_mode"]:
        draft = tensors.get("draft_probs", target[:, :k])
        checks = [("target_with_bonus_probs", valid_probs(target[:, :k]))]
        checks.append(("draft_probs", valid_probs(draft)))
        case.add(strict_fault([*checks, ("draft_token_ids", in_vocab(ids, vocab))]))
    inject(draw, case, TYPICAL_FAULTS)
    return draw_layouts(draw, case)


def _call_typical(inputs: dict[str, Any]) -> tuple[torch.Tensor, tuple[int, int, int]]:
    sampler = TypicalAcceptanceSampler(**inputs.pop("init"))
    out = sampler(**inputs)
    return out, counters(sampler)


@pytest.mark.slow
@budget(500)
@given(typical_cases())
def test_typical_acceptance_sampler(case: Case) -> None:
    """``TypicalAcceptanceSampler``: deterministic; its corrections are the target's argmax."""
    outcome = run_both(TYPICAL_NAMES, case, _call_typical)
    if not isinstance(outcome, Refused):
        check_probability_step(case, outcome[0], outcome[1], "target_with_bonus_probs")


# ---------------------------------------------------------------- chain_verify, block_verify


@st.composite
def rule_cases(draw: st.DrawFn) -> Case:
    batch, k, vocab = draw(st.integers(0, 4)), draw(st.integers(0, 4)), draw(st.integers(1, 10))
    dtype = draw(st.sampled_from(DTYPES))
    kind = {"probs": True, "specials": draw(st.booleans()), "same": draw(st.booleans())}
    target = draw(values((batch, k, vocab), dtype, **kind))
    draft = draw(st.just(target.clone()) | values((batch, k, vocab), dtype, **kind))
    bonus = draw(token_ids(draw(st.sampled_from(((batch, 1), (batch,)))), vocab, valid=True))
    ids = draw(token_ids((batch, k), vocab))
    tensors = {"target_probs": target, "draft_probs": draft, "draft_token_ids": ids}
    tensors.update(bonus_token_ids=bonus, uniforms=draw(uniforms((batch, k + 1))))
    rule = draw(st.sampled_from((chain_verify, block_verify)))
    case = Case(tensors, {"rule": rule}, {"batch": batch})
    names = ("draft_probs", "draft_token_ids", "bonus_token_ids", "uniforms")
    inject(draw, case, mutations(" ".join(f"{name}:wider" for name in names)), 5)
    return draw_layouts(draw, case)


@pytest.mark.slow
@budget(600)
@given(rule_cases())
def test_chain_and_block_rules(case: Case) -> None:
    """``chain_verify`` and ``block_verify`` on given uniforms."""
    outcome: Any = run_both(RULE_NAMES, case, lambda inputs: inputs.pop("rule")(**inputs))
    if not isinstance(outcome, Refused):
        check_probability_step(case, outcome.token_ids, None, "target_probs")
        assert outcome.num_accepted.dtype == torch.int64
        assert outcome.num_accepted.tolist() == (outcome.token_ids != -1).sum(dim=1).sub(1).tolist()


# ---------------------------------------------------------------- verify, verify_padded

PARAMETERS: dict[str, tuple[float, tuple[float, ...], tuple[object, ...]]] = {
    "temperature": (
        1.0,
        (0.0, 1.0, 0.5, 2.0, 1e-3, 1e-39, 1e-40, 100.0),
        (-1.0, math.nan, math.inf, None, "1", 1j),
    ),
    "top_k": (0, (0, 1, 2, 5, 50), (-1, 1.5, math.inf, math.nan, 2**63, "2")),
    "top_p": (1.0, (1.0, 0.9, 0.5, 1e-9), (0.0, 1.5, -0.1, math.nan)),
    "min_p": (0.0, (0.0, 0.1, 0.5, 1.0), (-0.1, 1.5, math.nan)),
}
"""Per sampling parameter: its default, valid values and invalid ones."""


@st.composite
def sampling(draw: st.DrawFn, batch: int) -> tuple[dict[str, list[float]], dict[str, Any]]:
    """Sampling parameters as defaults, scalars, lists or tensors; and their values."""
    host: dict[str, list[float]] = {}
    given_: dict[str, Any] = {}
    for name, (default, pool, _) in PARAMETERS.items():
        form = draw(st.sampled_from(("default", "scalar", "list", "tensor")))
        chosen = draw(st.lists(st.sampled_from(pool), min_size=batch, max_size=batch))
        if form == "scalar":
            given_[name] = draw(st.sampled_from(pool))
            chosen = [given_[name]] * batch
        elif form == "list":
            given_[name] = chosen
        elif form == "tensor":
            dtypes = (torch.long, torch.int) if name == "top_k" else (torch.float, torch.double)
            given_[name] = torch.tensor(chosen, dtype=draw(st.sampled_from(dtypes)))
            chosen = given_[name].tolist()
        host[name] = [float(v) for v in chosen] if form != "default" else [float(default)] * batch
    return host, given_


def _bad_parameter(case: Case, draw: st.DrawFn) -> None:
    """One sampling parameter holding an invalid value (scalar, list, tensor), or too many."""
    batch = case.info["batch"]
    name = draw(st.sampled_from(tuple(PARAMETERS)))
    default, _, pool = PARAMETERS[name]
    bad = draw(st.sampled_from(pool))
    form = draw(st.sampled_from(("scalar", "list", "tensor", "length")))
    chosen: list[Any] = [default] * batch
    if batch:
        chosen[draw(st.integers(0, batch - 1))] = bad
    if form == "length":
        case.put(name, [default] * (batch + 1))
    elif form == "tensor" and (isinstance(bad, (float, complex)) or bad == -1):
        case.put(name, torch.tensor(chosen))
    else:
        case.put(name, bad if form == "scalar" and bad is not None else chosen)
    must = batch > 0 or form == "length" or (form == "scalar" and bad is not None)
    case.add(Fault(f"{name} {form} {bad!r}", (name,), must))


def _counts(make: Callable[[list[int]], object], must: bool | str = True) -> FaultEntry:
    names = ("num_draft_tokens", "draft_token_ids", "target_logits", "max_draft_tokens")
    return names, _put("num_draft_tokens", lambda c: make(c.info["counts"])), must


def _both_drafts(case: Case, draw: st.DrawFn) -> None:
    case.put("draft_probs", case.get("draft_probs"))
    case.put("draft_logits", case.get("draft_logits"))


def _logprobs_with_bonus(case: Case, draw: st.DrawFn) -> None:
    case.put("return_logprobs", True)
    if "bonus_token_ids" in case.tensors:
        case.add(Fault("logprobs and bonus ids", ("return_logprobs", "bonus_token_ids")))


VERIFY_FAULTS: FaultTable = {
    "parameter": ((), _bad_parameter, False),
    "method": (("method",), _put("method", lambda c: "blocks"), True),
    "backend": (("backend",), _put("backend", lambda c: "fastest"), True),
    **{
        f"max_draft_tokens {what}": (("max_draft_tokens",), _put("max_draft_tokens", make), True)
        for what, make in (("small", lambda c: max(c.info["counts"], default=0) - 1), ("str", str))
    },
    **random_faults("generators", lists=True),
    **uniform_faults(("seeds", "generators")),
}
"""Faults of :func:`verify`'s keyword arguments (which :func:`verify_padded` passes on)."""

FLAT_FAULTS: FaultTable = {
    "counts None": _counts(lambda n: None),
    "counts int": _counts(sum),
    "counts negative": _counts(lambda n: [-1, *n[1:]], "batch"),
    "counts sum": _counts(lambda n: [*n[:-1], n[-1] + 1] if n else [1]),
    "counts float tensor": _counts(lambda n: torch.tensor(n, dtype=torch.float32)),
    "counts meta": _counts(lambda n: torch.tensor(n, dtype=torch.int64, device="meta")),
    "counts 0.5": _counts(lambda n: [c + 0.5 for c in n], False),
    **mutations(
        "target_logits:int target_logits:unsqueezed target_logits:longer:num_draft_tokens "
        "draft_token_ids:float draft_token_ids:unsqueezed bonus_token_ids:wider "
        "bonus_token_ids:float draft_probs:wider:draft_logits draft_probs:longer:draft_logits "
        "draft_probs:int:draft_logits draft_logits:wider:draft_probs "
        "draft_logits:longer:draft_probs"
    ),
    "vocab 0": (("target_logits",), _vocab_zero, True),
    "both drafts": (("draft_probs", "draft_logits"), _both_drafts, True),
    "logprobs with bonus": (("return_logprobs", "bonus_token_ids"), _logprobs_with_bonus, False),
}
"""Faults of :func:`verify`'s flattened tensors and counts."""


@st.composite
def verify_cases(draw: st.DrawFn, padded: bool = False) -> Case:
    batch, vocab, k = draw(st.integers(0, 4)), draw(st.integers(1, 10)), draw(st.integers(0, 4))
    counts = draw(st.lists(st.integers(0, 4), min_size=batch, max_size=batch))
    counts = [k] * batch if padded else counts
    total, given_bonus = sum(counts), not padded and draw(st.booleans())
    kind = {"specials": draw(st.booleans()), "same": draw(st.booleans())}
    shape = (total + batch * (not given_bonus), vocab)
    logits = draw(values(shape, draw(st.sampled_from(DTYPES)), probs=False, **kind))
    t = {"target_logits": logits, "draft_token_ids": draw(token_ids((total,), vocab))}
    draft = draw(st.sampled_from(("onehot", "draft_probs", "draft_logits")))
    if draft != "onehot":
        dtype = draw(st.sampled_from(DTYPES))
        t[draft] = draw(values((total, vocab), dtype, probs=draft == "draft_probs", **kind))
    if given_bonus:
        bonus_shape = draw(st.sampled_from(((batch,), (batch, 1))))
        t["bonus_token_ids"] = draw(token_ids(bonus_shape, vocab, valid=True))
    widest = max(counts, default=0)
    a: dict[str, Any] = {"max_draft_tokens": draw(st.sampled_from((None, widest, widest + 2)))}
    width = (widest if a["max_draft_tokens"] is None else a["max_draft_tokens"]) + 1
    form = "list" if padded else draw(st.sampled_from(("list", "tuple", "int64", "int32")))
    a["num_draft_tokens"] = tuple(counts) if form == "tuple" else counts
    if form not in ("list", "tuple"):
        a["num_draft_tokens"] = torch.tensor(counts, dtype=getattr(torch, form))
    host, parameters = draw(sampling(batch))
    random_args, random_tensors = draw(randomness(batch, width, lists=True))
    a.update(random_args, method=draw(st.sampled_from(chain_methods())), strict=draw(st.booleans()))
    a["return_logprobs"] = not given_bonus and draw(st.booleans())
    blank = {"bonus_token_ids": torch.zeros(batch, dtype=torch.int64)}
    blank.update(draft_probs=torch.rand(total, vocab), draft_logits=torch.rand(total, vocab))
    info = {"batch": batch, "counts": counts, "vocab": vocab, "width": width, "host": host, "k": k}
    info["blank"] = blank
    case = Case({**t, **random_tensors}, a, info, seed=draw(st.integers(0, 99)))
    for name, value in {**parameters, "num_draft_tokens": a["num_draft_tokens"]}.items():
        case.put(name, value)
    if a["method"] == "block" and draft == "onehot":
        sampled = total > 0 and any(t >= 1e-6 for t in host["temperature"])
        names = ("method", "draft_probs", "draft_logits")
        case.add(Fault("block without draft rows", names, sampled))
    if a["strict"]:
        checks = [("target_logits", not logits.isnan().any())]
        checks.append(("draft_token_ids", in_vocab(t["draft_token_ids"], vocab)))
        if draft == "draft_probs":
            checks.append((draft, valid_probs(t[draft])))
        elif draft != "onehot":
            checks.append((draft, not t[draft].isnan().any()))
        case.add(strict_fault(checks))
    inject(draw, case, VERIFY_FAULTS if padded else {**VERIFY_FAULTS, **FLAT_FAULTS})
    _refuse_uniforms_with_gumbel(case, a["method"])
    return case if padded else draw_layouts(draw, case)


def _refuse_uniforms_with_gumbel(case: Case, method: object) -> None:
    """``method="gumbel"`` reads keyed noise: uniforms given with it must be refused."""
    if method == "gumbel" and case.tensors.get("uniforms") is not None:
        case.add(Fault("uniforms with gumbel", ("uniforms", "method")))


_call_verify = _call(verify, "target_logits", "draft_token_ids", "num_draft_tokens")


def _row_kind(row: list[float], greedy: bool) -> str:
    """The row's class: clean, empty (all -inf: no distribution) or skip (NaN; sampled +inf)."""
    if any(math.isnan(v) for v in row) or (not greedy and math.inf in row):
        return "skip"
    return "empty" if all(v == -math.inf for v in row) else "clean"


def can_emit(row: list[float], token: int, temperature: float, top_k: float, min_p: float) -> bool:
    """Whether the processed row can give ``token`` any probability (generously rounded).

    Greedy rows emit a maximiser; sampled ones a token with ``(l - max) / T > -1000`` in
    the top-k (ties included) and within min-p of the maximum.
    """
    top = max(row)
    if temperature == 0:
        return row[token] == top
    gap = (row[token] - top) / temperature if row[token] > -math.inf else -math.inf
    if not gap >= -1000 or (top_k > 0 and sum(v > row[token] for v in row) >= top_k):
        return False
    return not (min_p > 0 and gap < math.log(min_p) * (1 + 1e-5) - 1e-3)


def _draft_clean(case: Case, start: int, n: int) -> bool:
    if "draft_probs" in case.tensors:
        return nonnegative(case.tensors["draft_probs"][start : start + n])
    if "draft_logits" not in case.tensors:
        return True
    rows = case.tensors["draft_logits"][start : start + n].to(torch.float64)
    defined = torch.isfinite(rows).any(-1).all()
    return bool(defined and not (rows.isnan() | (rows == math.inf)).any())


def check_request(case: Case, i: int, out: list[int], accepted: int) -> None:
    """The tokens request ``i`` emitted are ones its processed target rows can give.

    A row of ``-inf`` has no distribution: (sampled) drafts there are rejected and it emits
    token 0, as the README states.
    """
    counts, host = case.info["counts"], case.info["host"]
    ids = case.tensors["draft_token_ids"].reshape(-1)
    n, start, bonus_rows = counts[i], sum(counts[:i]), "bonus_token_ids" not in case.tensors
    params = [host[name][i] for name in ("temperature", "top_k", "min_p")]
    greedy, first = params[0] == 0, start + i * bonus_rows
    rows = case.tensors["target_logits"][first : first + n + bonus_rows].to(torch.float64).tolist()
    kinds = [_row_kind(row, greedy) for row in rows]
    if "skip" in kinds or not _draft_clean(case, start, n):
        return
    for j in range(accepted):
        assert greedy or kinds[j] != "empty", f"request {i} accepted a draft at a row of -inf"
        assert can_emit(rows[j], out[j], *params), f"request {i} accepted impossible draft {j}"
    if accepted < len(rows):
        token = out[accepted]
        if kinds[accepted] == "empty":
            assert token == 0, f"request {i}: a row of -inf emits {token}, not 0"
        else:
            assert can_emit(rows[accepted], token, *params), f"request {i} emitted {token}"
        if greedy and accepted < n and kinds[accepted] == "clean":
            assert token != int(ids[start + accepted]), f"greedy request {i} emitted its rejection"


def check_logprobs(case: Case, out: Any) -> None:
    """NaN at padding; at emitted tokens of finite rows ``log q`` of the processed row.

    Without filters the value is ``log_softmax(l / T)`` (``T = 1`` for greedy rows); filters
    only raise the probability of a token they keep, and give ``-inf`` to the others.
    """
    lp, ids = out.logprobs, out.token_ids
    assert lp.dtype == torch.float32 and lp.shape == ids.shape, (lp.dtype, lp.shape)
    assert bool(torch.isnan(lp[ids == -1]).all()), "logprobs not NaN at padding"
    counts, host = case.info["counts"], case.info["host"]
    logits = case.tensors["target_logits"].to(torch.float64)
    for i in range(len(counts) if case.fault is None else 0):
        t = host["temperature"][i]
        plain = host["top_k"][i] == 0 and host["top_p"][i] == 1 and host["min_p"][i] == 0
        for j in range(int(out.num_accepted[i]) + 1 if not 0 < t < 1e-6 else 0):
            row = logits[sum(counts[:i]) + i + j]
            if row.isnan().any() or (row == math.inf).any() or not row.isfinite().any():
                continue
            expected = float(torch.log_softmax((row - row.max()) / (t or 1.0), dim=-1)[ids[i, j]])
            got, tolerance = float(lp[i, j]), 1e-3 + 1e-4 * abs(expected)
            close = got == expected or abs(got - expected) <= tolerance
            kept = got == -math.inf or expected - tolerance <= got <= tolerance
            assert close or (not plain and kept), f"logprob {got}, expected {expected} ({i}, {j})"


def check_verify(case: Case, out: Any) -> None:
    counts, vocab, width = case.info["counts"], case.info["vocab"], case.info["width"]
    ids = case.tensors["draft_token_ids"].reshape(-1).tolist()
    drafts = [ids[sum(counts[:i]) : sum(counts[: i + 1])] for i in range(len(counts))]
    bonus = case.tensors.get("bonus_token_ids")
    bonus_ids = None if bonus is None else bonus.reshape(-1).tolist()
    accepted = check_emitted(out.token_ids, drafts, vocab, width, bonus_ids)
    assert out.num_accepted.dtype == torch.int64 and out.num_accepted.tolist() == accepted
    if case.args.get("return_logprobs"):
        check_logprobs(case, out)
    else:
        assert out.logprobs is None
    rows = out.token_ids.tolist()
    for i, n in enumerate(accepted if case.fault is None else []):
        check_request(case, i, rows[i], n)


@pytest.mark.slow
@budget(1500)
@given(verify_cases())
def test_verify(case: Case) -> None:
    """``verify``: ragged counts, draft rows or one-hot, sampling parameters, seeds."""
    outcome = run_both(VERIFY_NAMES, case, _call_verify)
    if not isinstance(outcome, Refused):
        check_verify(case, outcome)


PADDED_FAULTS = mutations(
    "target_logits:flattened draft_token_ids:flattened draft_probs:wider draft_logits:longer"
)
"""Faults of :func:`verify_padded`'s own shape checks (and a permuted ``[k, B, V]`` draft)."""
PADDED_FAULTS["draft permuted"] = (
    ("draft_probs",),
    _put("draft_probs", lambda c: c.get("draft_probs").transpose(0, 1).contiguous()),
    "permuted",
)


@st.composite
def padded_cases(draw: st.DrawFn) -> Case:
    """A :func:`verify` case with ``k`` drafts each, its tensors ``[batch, k (+ 1), vocab]``."""
    case = draw(verify_cases(padded=True))
    batch, k, vocab = case.info["batch"], case.info["k"], case.info["vocab"]
    case.drop("num_draft_tokens")
    names = ("target_logits", "draft_token_ids", "draft_probs", "draft_logits")
    case.info["flat"] = {n: case.tensors[n] for n in names if n in case.tensors}
    shapes = ((batch, k + 1, vocab), (batch, k), (batch, k, vocab), (batch, k, vocab))
    for name, shape in zip(names, shapes, strict=True):
        if name in case.tensors:
            case.tensors[name] = case.tensors[name].reshape(shape)
    case.info["blank"] = {n: torch.rand(batch, k, vocab) for n in names[2:]}
    if case.fault is None and draw(st.integers(0, 3)) == 0:
        what = draw(st.sampled_from(sorted(PADDED_FAULTS)))
        names_, apply, must = PADDED_FAULTS[what]
        case.drop("draft_probs", "draft_logits")
        apply(case, draw)
        case.add(Fault(what, names_, must is True or batch != k))
    return draw_layouts(draw, case)


@pytest.mark.slow
@budget(600)
@given(padded_cases())
def test_verify_padded(case: Case) -> None:
    """``verify_padded`` gives what ``verify`` gives on the flattened batch."""
    outcome = run_both(PADDED_NAMES, case, _call(verify_padded, "target_logits", "draft_token_ids"))
    if case.fault is not None and case.fault.what in PADDED_FAULTS:
        return
    args = {**case.args, "num_draft_tokens": case.info["counts"]}
    tensors = {**case.tensors, **case.info["flat"]}
    flat = Case(tensors, args, case.info, fault=case.fault, seed=case.seed)
    reference = attempt(VERIFY_NAMES, flat.fault, lambda: _call_verify(flat.inputs(False)))
    assert same(outcome, reference), f"verify_padded gives {outcome}, verify {reference}"
    if not isinstance(outcome, Refused):
        check_verify(flat, outcome)


# ---------------------------------------------------------------- tree_verify, tree_verify_greedy

TREE_INPUTS = ("target_probs", "draft_token_ids", "parents")
DERIVED = {"iid": "mss", "without_replacement": "rrs", "deterministic": "onehot"}
BIASED = (
    ("iid", "rrs"),
    ("without_replacement", "mss"),
    ("deterministic", "mss"),
    ("deterministic", "rrs"),
)


def tree_shape(parents: list[list[int]]) -> tuple[int, int]:
    """Depth of the deepest node reachable from the root, and most children of any node."""
    depth_max = children_max = 0
    for row in parents:
        depth, children = [0] + [-1] * (len(row) - 1), [0] * len(row)
        for i in range(1, len(row)):
            if 0 <= row[i] < i:
                children[row[i]] += 1
                depth[i] = depth[row[i]] + 1 if depth[row[i]] >= 0 else -1
        depth_max, children_max = max(depth_max, *depth), max(children_max, *children)
    return depth_max, children_max


def children_of(row: list[int], node: int, limit: int) -> list[int]:
    return [c for c in range(1, len(row)) if 0 <= row[c] < c and row[c] == node][:limit]


@st.composite
def tree_inputs(draw: st.DrawFn, probs: bool | None) -> Case:
    """Rows, node tokens, parents (``[N]`` or ``[batch, N]``, some not in the tree), bounds."""
    batch, n, vocab = draw(st.integers(0, 3)), draw(st.integers(1, 6)), draw(st.integers(1, 8))
    kind = {"specials": draw(st.booleans()), "same": draw(st.booleans())}
    kind["probs"] = draw(st.booleans()) if probs is None else probs

    def row() -> list[int]:
        wild = draw(st.integers(0, 4)) == 0
        parent = (st.integers(-3, i + 2) if wild else st.integers(-1, i - 1) for i in range(1, n))
        return [-1] + [draw(p) for p in parent]

    shared = draw(st.booleans())
    rows = [row()] if shared else [row()] * batch if kind["same"] else [row() for _ in range(batch)]
    dtype = draw(st.sampled_from((torch.int64, torch.int32)))
    parents = torch.tensor(rows, dtype=dtype).reshape(-1, n)
    t = {
        "target_probs": draw(values((batch, n, vocab), draw(st.sampled_from(DTYPES)), **kind)),
        "draft_token_ids": draw(token_ids((batch, n), vocab)),
        "parents": parents[0] if shared else parents,
    }
    bound = st.one_of(st.none(), st.integers(0, n))
    a = {"max_depth": draw(bound), "max_children": draw(bound)}
    depth, children = tree_shape(rows)
    depth = depth if a["max_depth"] is None else a["max_depth"]
    children = children if a["max_children"] is None else a["max_children"]
    info = {"batch": batch, "n": n, "vocab": vocab, "kind": kind, "given": rows, "depth": depth}
    info.update(rows=rows * batch if shared else rows, children=children)
    info["width"] = depth * children + 1
    info["blank"] = {"draft_probs": torch.rand(batch, n, vocab)}
    return Case(t, a, info)


def _tree_drafting(drafting: str, method: str | None, mutate: str = "") -> Apply:
    """Set the drafting and method (with draft rows, mutated or dropped: ``"drop"``)."""

    def apply(case: Case, draw: st.DrawFn) -> None:
        case.args.update(drafting=drafting, method=method)
        if mutate == "drop":
            case.drop("draft_probs")
        else:
            x = case.get("draft_probs")
            case.put("draft_probs", MUTATIONS[mutate](x) if mutate else x)

    return apply


def _no_nodes(case: Case, draw: st.DrawFn) -> None:
    for name in ("target_probs", "draft_token_ids", "parents", "draft_probs"):
        if name in case.tensors:
            x = case.tensors[name]
            case.tensors[name] = x[..., :0, :] if name.endswith("probs") else x[..., :0]


def _bounds_for_uniforms(table: FaultTable) -> FaultTable:
    """Uniform faults, with the loop bounds given (the uniforms' width depends on them)."""

    def wrap(apply: Apply) -> Apply:
        def bounded(case: Case, draw: st.DrawFn) -> None:
            case.args.update(max_depth=case.info["depth"], max_children=case.info["children"])
            apply(case, draw)

        return bounded

    return {what: (names, wrap(apply), must) for what, (names, apply, must) in table.items()}


def _uniforms_and_seeds(case: Case, draw: st.DrawFn) -> None:
    case.put("uniforms", torch.rand(case.info["batch"], case.info["width"], dtype=torch.float64))
    case.put("seeds", [1] * case.info["batch"])


TREE_SHAPE_FAULTS: FaultTable = {
    **mutations(
        "target_probs:flattened draft_token_ids:float draft_token_ids:wider parents:float "
        "parents:wider"
    ),
    **mutations("parents:list", must=False),
    "vocab 0": (("target_probs",), _vocab_zero, True),
    "no nodes": (("target_probs",), _no_nodes, True),
    **{
        name: ((name,), _drawn(name, st.sampled_from((-1, 1.5, "2"))), True)
        for name in ("max_depth", "max_children")
    },
}
"""Faults that :func:`tree_verify` and :func:`tree_verify_greedy` must both refuse."""

TREE_FAULTS: FaultTable = {
    **TREE_SHAPE_FAULTS,
    **mutations("target_probs:int parents:meta"),
    **{f"{d} with {m}": (("method", "drafting"), _tree_drafting(d, m), True) for d, m in BIASED},
    "unknown drafting": (("drafting",), _tree_drafting("greedy", None), True),
    "unknown method": (("method",), _tree_drafting("iid", "greedy"), True),
    "iid without draft_probs": (("draft_probs",), _tree_drafting("iid", None, "drop"), True),
    "draft_probs wider": (("draft_probs",), _tree_drafting("iid", None, "wider"), True),
    "draft_probs int": (("draft_probs",), _tree_drafting("iid", None, "int"), True),
    **_bounds_for_uniforms(uniform_faults(("seeds", "generators"))),
    **_bounds_for_uniforms({"uniforms and seeds": (("uniforms",), _uniforms_and_seeds, True)}),
    **random_faults("generators", lists=True),
}


def _tree_strict(case: Case, rule: str) -> None:
    """Add the fault ``strict=True`` must refuse: bad parents, node ids, NaN, negatives, inf.

    An infinite draft probability may be refused too.
    """
    t, vocab = case.tensors, case.info["vocab"]
    uses_draft = rule != "onehot" and "draft_probs" in t
    if uses_draft and bool(t["draft_probs"].isinf().any()):
        case.add(Fault("strict inf draft_probs", ("draft_probs",), False))
    ids, rows = t["draft_token_ids"].tolist(), case.info["rows"]
    nodes = [(b, i, p) for b, r in enumerate(rows[: len(ids)]) for i, p in enumerate(r) if i]
    parents = [(i, p) for r in case.info["given"] for i, p in enumerate(r) if i]
    checks = [("parents", all(-1 <= p < i for i, p in parents))]
    checks.append(("draft_token_ids", all(p < 0 or 0 <= ids[b][i] < vocab for b, i, p in nodes)))
    for name in ("target_probs",) + ("draft_probs",) * uses_draft:
        x = t[name].to(torch.float64)
        bad = x.isnan() | (x < 0) | (x.isinf() & (name == "target_probs"))
        checks.append((name, not bad.any()))
    case.add(strict_fault(checks))


@st.composite
def tree_cases(draw: st.DrawFn) -> Case:
    case = draw(tree_inputs(probs=True))
    drafting = draw(st.sampled_from(tree_draftings()))
    method = draw(st.sampled_from((None, DERIVED[drafting], "onehot")))
    if (method or DERIVED[drafting]) != "onehot" or draw(st.booleans()):
        shape, dtype = case.tensors["target_probs"].shape, draw(st.sampled_from(DTYPES))
        case.tensors["draft_probs"] = draw(values(shape, dtype, **case.info["kind"]))
    case.args.update(drafting=drafting, method=method, strict=draw(st.booleans()))
    explicit = case.args["max_depth"] is not None and case.args["max_children"] is not None
    width = case.info["width"] if explicit else None
    args, tensors = draw(randomness(case.info["batch"], width, lists=True, generators="generators"))
    case.args.update(args)
    case.tensors.update(tensors)
    case.seed = draw(st.integers(0, 99))
    if case.args["strict"]:
        _tree_strict(case, method or DERIVED[drafting])
    inject(draw, case, TREE_FAULTS)
    return draw_layouts(draw, case)


def check_tree(case: Case, out: Any) -> list[list[int]]:
    """Check a tree result's layout; returns each row's accepted path (root first)."""
    batch, vocab, depth, children = (case.info[n] for n in ("batch", "vocab", "depth", "children"))
    ids = case.tensors["draft_token_ids"].tolist()
    assert all(x.dtype == torch.int64 for x in out), [x.dtype for x in out]
    shapes = [tuple(x.shape) for x in out]
    assert shapes == [(batch, depth + 1), (batch, depth + 1), (batch,)], (shapes, depth)
    paths = []
    for b, (path, tokens, e) in enumerate(zip(*(x.tolist() for x in out), strict=True)):
        assert 1 <= e <= depth + 1 and path[0] == 0, f"row {b} emits {e}, path {path}"
        assert all(x == -1 for x in path[e:] + tokens[e:]), f"row {b}: path {path}, tokens {tokens}"
        for j in range(1, e):
            allowed = children_of(case.info["rows"][b], path[j - 1], children)
            assert path[j] in allowed, f"row {b}: path {path}"
        assert tokens[: e - 1] == [ids[b][x] for x in path[1:e]], f"row {b}: {tokens}, path {path}"
        assert all(0 <= x < vocab for x in tokens[:e]), f"row {b}: id outside [0, {vocab})"
        paths.append(path[:e])
    return paths


def _call_tree(batch: int) -> Callable[[dict[str, Any]], object]:
    """Call :func:`tree_verify` with the seeding built from the seeds and generators drawn."""
    tree = _call(tree_verify, *TREE_INPUTS)

    def call(inputs: dict[str, Any]) -> object:
        randomness = {n: inputs.pop(n) for n in TREE_RANDOMNESS if n in inputs}
        if randomness:
            inputs["seeding"] = seeding_from(batch, torch.device("cpu"), **randomness)
        return tree(inputs)

    return call


@pytest.mark.slow
@budget(900)
@given(tree_cases())
def test_tree_verify(case: Case) -> None:
    """``tree_verify``: every drafting mode and allowed rule, bounds, seeds, strict."""
    outcome: Any = run_both(TREE_NAMES, case, _call_tree(case.info["batch"]))
    if isinstance(outcome, Refused):
        return
    paths = check_tree(case, outcome)
    q, p = case.tensors["target_probs"], case.tensors.get("draft_probs")
    rule = case.args["method"] or DERIVED[case.args["drafting"]]
    p = p if rule != "onehot" else None
    for b, path in enumerate(paths if case.fault is None else []):
        if clean_probs(q[b]) and (p is None or nonnegative(p[b])):
            tokens = outcome.token_ids[b].tolist()
            for j, node in enumerate(path):
                assert float(q[b, node, tokens[j]]) > 0, f"row {b}: {tokens[j]} has q = 0 at {node}"


@st.composite
def greedy_tree_cases(draw: st.DrawFn) -> Case:
    case = draw(tree_inputs(probs=None))
    inject(draw, case, TREE_SHAPE_FAULTS, odds=5)
    return draw_layouts(draw, case)


def greedy_walk(case: Case, b: int) -> list[int]:
    """The tokens greedy decoding emits on row ``b``'s tree (argmax ties to the lowest id)."""
    rows = case.tensors["target_probs"][b].to(torch.float64).tolist()
    ids, parents = case.tensors["draft_token_ids"][b].tolist(), case.info["rows"][b]
    depth, children = case.info["depth"], case.info["children"]
    node, out = 0, []
    for _ in range(depth):
        best = rows[node].index(max(rows[node]))
        follow = [c for c in children_of(parents, node, children) if ids[c] == best]
        if not follow:
            break
        node = follow[0]
        out.append(ids[node])
    return [*out, rows[node].index(max(rows[node]))]


@budget(500)
@given(greedy_tree_cases())
def test_tree_verify_greedy(case: Case) -> None:
    """``tree_verify_greedy`` emits exactly what greedy decoding on the rows emits."""
    outcome: Any = run_both(GREEDY_NAMES, case, _call(tree_verify_greedy, *TREE_INPUTS))
    if isinstance(outcome, Refused):
        return
    paths = check_tree(case, outcome)
    for b, path in enumerate(paths if case.fault is None else []):
        if not case.tensors["target_probs"][b].isnan().any():
            expected = greedy_walk(case, b)
            assert outcome.token_ids[b, : len(path)].tolist() == expected, f"row {b}: {expected}"
