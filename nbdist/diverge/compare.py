"""``%dist_compare NAME... [--rng] [--atol X --rtol Y]``: what every rank holds under some names, compared entry by
entry by digests, answered in rank sets.

It runs as one ``%%collective`` body on every rank (:func:`body`), in lockstep. Every rank tells the others what it
holds under each name (:class:`Held`: its kind and entries, each with a digest: :mod:`nbdist.diverge.hashing`), as
JSON over tensors through torch.distributed. Each rank then decides alike (:func:`asks`, :func:`decide`, pure): the
groups of ranks that hold equal values, the entries that differ, the first of them. Only that entry's data moves: the
rank of its largest group broadcasts it (:class:`Ask`) and each other rank answers how far it is
(:class:`Probe`: the elements that differ, a few of them, and the largest differences), so the first entry shows
its elements by rank set. With a tolerance, every entry whose digests differ is asked so, to tell close from far.
Every rank prints the same answer (:func:`words`), so the cell's table shows it once.
"""

from __future__ import annotations

import json
import math
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

from ..errors import ConfigError
from ..gathered import gathered
from ..ranksets import ranks_text
from . import hashing
from .hashing import ABSENT, NUMBER, OPAQUE, RNG, STATE, TENSOR, Entry

ELEMENTS_SHOWN = 4  # differing elements shown for the first differing entry
RNG_NAME = "RNG states"  # what --rng compares, as the answer names it
_ARTICLE = {hashing.TENSOR: "a tensor", hashing.MODULE: "a module", hashing.OPTIMIZER: "an optimizer",
            hashing.VALUE: "a value", hashing.DICT: "a dict", hashing.LIST: "a list", RNG: "the generators"}


@dataclass(frozen=True)
class Held:
    """What one rank holds under a name: its ``kind`` (hashing's), its type's name, its entries; ``why`` it could
    not be read as entries (an object of another kind inside)."""

    kind: str
    type: str = ""
    entries: tuple[Entry, ...] = ()
    why: str = ""

    def as_json(self) -> list[Any]:
        return [self.kind, self.type, [e.as_json() for e in self.entries], self.why]

    @classmethod
    def from_json(cls, item: Sequence[Any]) -> Held:
        kind, type_, entries, why = item
        return cls(str(kind), str(type_), tuple(Entry.from_json(e) for e in entries), str(why))


@dataclass(frozen=True)
class Tolerance:
    atol: float = 0.0
    rtol: float = 0.0

    def close(self, a: float, b: float) -> bool:
        return abs(a - b) <= self.atol + self.rtol * abs(b) or a == b or (math.isnan(a) and math.isnan(b))

    def __str__(self) -> str:
        return f"atol={self.atol:g}, rtol={self.rtol:g}"


@dataclass(frozen=True)
class Ask:
    """Entry ``entry`` of ``name``: rank ``source`` (of its largest group) sends it, shaped ``shape`` of ``dtype``;
    the ranks ``compared`` (same shape and dtype, other digest) answer with a :class:`Probe`."""

    name: str
    entry: str
    source: int
    shape: tuple[int, ...]
    dtype: str
    compared: tuple[int, ...]


@dataclass(frozen=True)
class Probe:
    """How far one rank's entry is from the source's: ``differ`` elements out of ``total`` (beyond the tolerance),
    the first of them as (flat index, this rank's value, the source's value), and the largest differences."""

    differ: int
    total: int
    elements: tuple[tuple[int, str, str], ...] = ()
    largest_abs: float = 0.0
    largest_rel: float = 0.0

    def as_json(self) -> list[Any]:
        return [self.differ, self.total, [list(e) for e in self.elements], self.largest_abs, self.largest_rel]

    @classmethod
    def from_json(cls, item: Sequence[Any]) -> Probe:
        differ, total, elements, largest_abs, largest_rel = item
        return cls(int(differ), int(total), tuple((int(i), str(m), str(s)) for i, m, s in elements),
                   float(largest_abs), float(largest_rel))


@dataclass(frozen=True)
class Verdict:
    """What is said of one name: ``lines``, the first its headline; ``alike``: whether every rank holds it alike."""

    name: str
    lines: tuple[str, ...]
    alike: bool
    differing: tuple[str, ...] = field(default=())


# --- deciding, alike on every rank (pure) --------------------------------------------------------------------------

def groups(keys: Mapping[int, Any]) -> list[list[int]]:
    """Ranks grouped by equal ``keys[rank]``: largest group first, then by lowest rank."""
    by: dict[Any, list[int]] = {}
    for rank in sorted(keys):
        by.setdefault(keys[rank], []).append(rank)
    return sorted(by.values(), key=lambda ranks: (-len(ranks), ranks[0]))


def by_ranks(values: Mapping[int, str]) -> str:
    """``{0: "1.0", 1: "1.0", 2: "2.0"}`` -> ``1.0 on ranks 0,1 · 2.0 on rank 2`` (largest group first)."""
    return " · ".join(f"{values[g[0]]} on {ranks_text(g)}" for g in groups(values))


def members(held: Sequence[Held]) -> list[int]:
    """The ranks whose values are compared: those holding the kind most ranks hold (ties: the lowest rank's)."""
    holding = {r: h.kind for r, h in enumerate(held) if h.kind != ABSENT}
    return groups(holding)[0] if holding else []


def entry_order(held: Sequence[Held], ranks: Sequence[int]) -> list[str]:
    """Every entry name any of ``ranks`` holds, in the first rank's order, then the others' new ones."""
    seen: dict[str, None] = {}
    for r in ranks:
        for e in held[r].entries:
            seen.setdefault(e.name, None)
    return list(seen)


def _entry_of(held: Held, name: str) -> Entry | None:
    return next((e for e in held.entries if e.name == name), None)


def _bits_differ(held: Sequence[Held], ranks: Sequence[int], name: str) -> bool:
    seen = {(e.kind, e.digest) if e is not None else None for e in (_entry_of(held[r], name) for r in ranks)}
    return len(seen) > 1


def asks(name: str, held: Sequence[Held], tolerance: Tolerance | None) -> list[Ask]:
    """The entries of ``name`` whose data must be compared element by element: without a tolerance the first
    entry whose digests differ (for its elements), with one every such entry (to tell close from far)."""
    ranks = members(held)
    if not ranks or held[ranks[0]].kind in (OPAQUE, RNG):
        return []
    found = []
    for entry in entry_order(held, ranks):
        if not _bits_differ(held, ranks, entry):
            continue
        ask = _ask(name, entry, held, ranks)
        if ask is not None:
            found.append(ask)
        if tolerance is None:
            break
    return found


def _ask(name: str, entry: str, held: Sequence[Held], ranks: Sequence[int]) -> Ask | None:
    tensors = {r: e for r in ranks if (e := _entry_of(held[r], entry)) is not None and e.kind == TENSOR}
    if not tensors:
        return None
    largest = groups({r: (e.shape, e.dtype, e.digest) for r, e in tensors.items()})[0]
    source = tensors[largest[0]]
    compared = tuple(r for r, e in tensors.items()
                     if (e.shape, e.dtype) == (source.shape, source.dtype) and e.digest != source.digest)
    return Ask(name, entry, largest[0], source.shape, source.dtype, compared) if compared else None


def decide(name: str, held: Sequence[Held], probes: Mapping[str, Mapping[int, Probe]] | None = None,
           tolerance: Tolerance | None = None) -> Verdict:
    """What every rank says of ``name``, from what each holds (``held``, by rank) and the answers to
    :func:`asks` (``probes``: by entry, each compared rank's :class:`Probe`)."""
    probes = probes or {}
    shown = RNG_NAME if held and any(h.kind == RNG for h in held) else name
    ranks = members(held)
    if not ranks:
        return Verdict(name, (f"{shown}: no rank holds it",), False)
    aside = _aside(held, ranks)
    first = held[ranks[0]]
    if first.kind == OPAQUE:
        what = f"a {first.type}" + (f" ({first.why})" if first.why else "")
        return Verdict(name, (f"{shown}: {aside}{what} on {ranks_text(ranks)}: not compared (tensors, modules, "
                              "optimizers, numbers, text, and dicts and lists of them are)",), False)
    order = entry_order(held, ranks)
    differing = [e for e in order if _bits_differ(held, ranks, e)
                 and not (tolerance is not None and _close(held, ranks, e, probes.get(e), tolerance))]
    count = f"{len(order)} entr{'y' if len(order) == 1 else 'ies'}"
    if not differing:
        within = sum(_bits_differ(held, ranks, e) for e in order)
        how = (f"alike within {tolerance} on {ranks_text(ranks)} ({count}, {within} not bit for bit)"
               if within and tolerance is not None else f"alike on {ranks_text(ranks)} ({count})")
        return Verdict(name, (f"{shown}: {aside}{how}",), not aside)
    signature = {r: tuple(_side(held, ranks, r, e, probes.get(e), tolerance) for e in differing) for r in ranks}
    parts = groups(signature)
    lines = [f"{shown}: {aside}differs: {len(parts)} groups, " + " · ".join(ranks_text(g) for g in parts)]
    if len(order) > 1 or order[0]:
        lines.append(f"  {len(differing)} of {count} differ{'s' if len(differing) == 1 else ''}; "
                     f"the first: {differing[0]}")
    shown_entries = differing if first.kind == RNG else differing[:1]  # a generator each: there are few
    for entry in shown_entries:
        lines += ["  " + line for line in _detail(held, ranks, entry or name, entry, probes.get(entry), tolerance)]
    return Verdict(name, tuple(lines), False, tuple(differing))


def _aside(held: Sequence[Held], ranks: Sequence[int]) -> str:
    """``missing on rank 3; a list on rank 2; ``: the ranks left out of the comparison, and why."""
    said = []
    absent = [r for r, h in enumerate(held) if h.kind == ABSENT]
    if absent:
        said.append(f"missing on {ranks_text(absent)}")
    others = {r: h.kind if h.kind != OPAQUE else f"a {h.type}" for r, h in enumerate(held)
              if h.kind != ABSENT and r not in ranks}
    said += [f"{_ARTICLE.get(others[g[0]], others[g[0]])} on {ranks_text(g)}" for g in groups(others)]
    return "".join(f"{s}; " for s in said)


def _close(held: Sequence[Held], ranks: Sequence[int], entry: str, probes: Mapping[int, Probe] | None,
           tolerance: Tolerance) -> bool:
    return all(_side(held, ranks, r, entry, probes, tolerance) == "close" for r in ranks)


def _side(held: Sequence[Held], ranks: Sequence[int], rank: int, entry: str, probes: Mapping[int, Probe] | None,
          tolerance: Tolerance | None) -> Any:
    """Where ``rank`` stands on ``entry``: "close" (within the tolerance of the largest group, or equal to it), else
    what it holds (its digest, or None where it has no such entry)."""
    mine = _entry_of(held[rank], entry)
    if mine is None:
        return None
    if tolerance is None:
        return mine.digest
    reference = _reference(held, ranks, entry)
    if reference is None or mine.digest == reference.digest:
        return "close"
    if mine.kind == NUMBER and reference.kind == NUMBER:
        a, b = _number(mine.shown), _number(reference.shown)
        return "close" if a is not None and b is not None and tolerance.close(a, b) else mine.digest
    if probes is not None and rank in probes:
        return "close" if probes[rank].differ == 0 else mine.digest
    return mine.digest


def _reference(held: Sequence[Held], ranks: Sequence[int], entry: str) -> Entry | None:
    """The entry as the largest group of ``ranks`` holds it (ties: the lowest rank's)."""
    there = {r: e for r in ranks if (e := _entry_of(held[r], entry)) is not None}
    if not there:
        return None
    return there[groups({r: (e.kind, e.shape, e.dtype, e.digest) for r, e in there.items()})[0][0]]


def _number(shown: str | None) -> float | None:
    try:
        return float(shown) if shown is not None else None
    except ValueError:
        return None


def _detail(held: Sequence[Held], ranks: Sequence[int], label: str, entry: str, probes: Mapping[int, Probe] | None,
            tolerance: Tolerance | None) -> list[str]:
    """The first differing entry (shown as ``label``): how it differs by rank set, and its elements where they were
    asked for."""
    there = {r: e for r in ranks if (e := _entry_of(held[r], entry)) is not None}
    lines = []
    missing = [r for r in ranks if r not in there]
    if missing:
        lines.append(f"{label}: missing on {ranks_text(missing)}")
    what = {r: _what(e) for r, e in there.items()}
    kinds = {e.kind for e in there.values()}
    if len(set(what.values())) > 1 and not kinds <= {NUMBER, hashing.TEXT}:
        lines.append(f"{label}: {by_ranks(what)}")
    if kinds <= {NUMBER, hashing.TEXT}:
        lines.append(f"{label}: {by_ranks({r: e.shown or '' for r, e in there.items()})}")
    elif kinds == {STATE}:
        lines.append(f"{label}: states differ: " + " · ".join(ranks_text(g) for g in
                                                              groups({r: e.digest for r, e in there.items()})))
    elif probes:
        lines += _elements(label, there, probes, tolerance)
    elif len(set(what.values())) == 1 and not missing:
        lines.append(f"{label}: {next(iter(what.values()))}")
    return lines


def _what(e: Entry) -> str:
    if e.kind == TENSOR:
        return f"tensor {'x'.join(map(str, e.shape)) or 'scalar'} {e.dtype.removeprefix('torch.')}"
    return {NUMBER: "a number", hashing.TEXT: "text", STATE: "a generator's state"}.get(e.kind, e.kind)


def _elements(label: str, there: Mapping[int, Entry], probes: Mapping[int, Probe],
              tolerance: Tolerance | None) -> list[str]:
    """The elements that differ from the largest group, by rank set, and the largest differences."""
    compared = sorted(probes)
    source = sorted(r for r, e in there.items()
                    if (r not in probes or not probes[r].differ) and _same_tensor(e, there[compared[0]]))
    beyond = f" beyond {tolerance}" if tolerance is not None else ""
    counts = {r: f"{probes[r].differ} of {probes[r].total}" for r in compared if probes[r].differ}
    lines = [f"{label}: {_what(there[compared[0]])}; elements that differ{beyond}: {by_ranks(counts)}"]
    indices = sorted({i for r in compared for i, _, _ in probes[r].elements})[:ELEMENTS_SHOWN]
    shape = there[compared[0]].shape
    for i in indices:
        theirs = {r: next((m for j, m, _ in probes[r].elements if j == i), None) for r in compared}
        reference = next(s for r in compared for j, _, s in probes[r].elements if j == i)
        values = {r: reference for r in source} | {r: v if v is not None else reference for r, v in theirs.items()}
        lines.append(f"  {index_text(i, shape)}: {by_ranks(values)}")
    far_abs = max(compared, key=lambda r: probes[r].largest_abs)
    far_rel = max(compared, key=lambda r: probes[r].largest_rel)
    lines.append(f"  largest difference from {ranks_text(source)}: {probes[far_abs].largest_abs:.6g} "
                 f"({ranks_text([far_abs])}); relative {probes[far_rel].largest_rel:.6g} ({ranks_text([far_rel])})")
    return lines


def _same_tensor(a: Entry, b: Entry) -> bool:
    return a.kind == b.kind == TENSOR and (a.shape, a.dtype) == (b.shape, b.dtype)


def index_text(flat: int, shape: Sequence[int]) -> str:
    """A flat index as the tensor's own: ``index_text(5, (2, 3))`` -> ``[1, 2]``."""
    out = []
    for n in reversed(shape):
        flat, i = divmod(flat, n) if n else (flat, 0)
        out.append(i)
    return "[" + ", ".join(map(str, reversed(out))) + "]"


def words(verdicts: Sequence[Verdict]) -> str:
    return "\n".join(line for v in verdicts for line in v.lines)


# --- the magic's line ------------------------------------------------------------------------------------------------

def command(names: Sequence[str], rng: bool, atol: float | None, rtol: float | None) -> str:
    """The body of ``%dist_compare NAME... [--rng] [--atol X] [--rtol Y]``; refuses (ConfigError) a name that is not a
    dotted name of the namespace, nothing to compare, or a negative tolerance."""
    bad = [n for n in names if not n.split(".")[0].isidentifier()
           or not all(part.isidentifier() or part.isdigit() for part in n.split(".")[1:])]  # net.0: a submodule
    if bad:
        raise ConfigError(f"%dist_compare compares names of the notebook's namespace (a.b for an attribute), not "
                          f"{', '.join(map(repr, bad))}")
    if not names and not rng:
        raise ConfigError("%dist_compare needs a NAME to compare, or --rng")
    if any(t is not None and not t >= 0 for t in (atol, rtol)):
        raise ConfigError("--atol and --rtol take a number of 0 or more")
    tolerance = None if atol is None and rtol is None else (atol or 0.0, rtol or 0.0)
    return body(names, rng, tolerance)


def body(names: Sequence[str], rng: bool, tolerance: tuple[float, float] | None) -> str:
    """The ``%%collective`` body that compares ``names`` (every rank runs the same text)."""
    return (f"__import__('nbdist.diverge.compare', fromlist=['run']).run(get_ipython().user_ns, {list(names)!r}, "
            f"{rng!r}, {tolerance!r})\n")


# --- on a rank -------------------------------------------------------------------------------------------------------

def run(ns: dict[str, Any], names: list[str], rng: bool, tolerance: tuple[float, float] | None) -> None:
    """Compare ``names`` (and the generators with ``rng``) in this rank's namespace ``ns`` with every rank's; prints
    the answer, the same on every rank."""
    import torch.distributed as dist

    here = device(ns, dist.get_backend())
    tol = Tolerance(*tolerance) if tolerance is not None else None
    modules = [v for v in list(ns.values()) if _is_module(v)]
    mine = [held(ns, name, modules) for name in names] + ([rng_held()] if rng else [])
    every = [[Held.from_json(h) for h in json.loads(text)]
             for text in gathered(json.dumps([h.as_json() for h in mine]), here)]
    labels = [*names, RNG_NAME] if rng else list(names)
    by_name = [[theirs[k] for theirs in every] for k in range(len(labels))]
    todo = [ask for k, label in enumerate(labels) for ask in asks(label, by_name[k], tol)]
    answers = [_answer(ns, ask, dist.get_rank(), here, tol, modules) for ask in todo]
    replies = [json.loads(text) for text in gathered(json.dumps(answers), here)]
    probes: dict[str, dict[str, dict[int, Probe]]] = {}
    for k, ask in enumerate(todo):
        probes.setdefault(ask.name, {})[ask.entry] = {r: Probe.from_json(replies[r][k]) for r in ask.compared}
    print(words([decide(label, by_name[k], probes.get(label), tol) for k, label in enumerate(labels)]))


def _is_module(value: Any) -> bool:
    import torch

    return isinstance(value, torch.nn.Module)


def lookup(ns: dict[str, Any], name: str) -> tuple[bool, Any]:
    """``(found, value)`` of a dotted ``name`` in ``ns`` (attributes read with getattr, nothing evaluated)."""
    first, *rest = name.split(".")
    if first not in ns:
        return False, None
    value = ns[first]
    for part in rest:
        if not hasattr(value, part):
            return False, None
        value = getattr(value, part)
    return True, value


def held(ns: dict[str, Any], name: str, modules: Sequence[Any]) -> Held:
    """What this rank holds under ``name``; ``modules``: the namespace's, naming an optimizer's parameters."""
    found, value = lookup(ns, name)
    if not found:
        return Held(ABSENT)
    kind = hashing.kind_of(value)
    if kind == OPAQUE:
        return Held(OPAQUE, type(value).__name__)
    names = hashing.param_names(modules) if kind == hashing.OPTIMIZER else None
    try:
        return Held(kind, type(value).__name__, tuple(hashing.entries(value, names)))
    except TypeError as exc:
        return Held(OPAQUE, type(value).__name__, why=str(exc))


def rng_held() -> Held:
    return Held(RNG, "generators", tuple(hashing.rng_entries()))


def _answer(ns: dict[str, Any], ask: Ask, rank: int, here: Any, tol: Tolerance | None,
            modules: Sequence[Any]) -> list[Any] | None:
    """Take part in ``ask``'s broadcast; a compared rank answers with its :class:`Probe` (as JSON)."""
    import torch
    import torch.distributed as dist

    mine = None
    if rank == ask.source or rank in ask.compared:
        _, value = lookup(ns, ask.name)
        names = hashing.param_names(modules) if hashing.kind_of(value) == hashing.OPTIMIZER else None
        mine = dict(hashing.leaves(value, names))[ask.entry].detach()
    dtype = getattr(torch, ask.dtype.removeprefix("torch."))
    buf = (mine.to(here).contiguous() if rank == ask.source and mine is not None
           else torch.empty(ask.shape, dtype=dtype, device=here))
    dist.broadcast(buf, ask.source)
    if rank not in ask.compared or mine is None:
        return None
    return probe(mine, buf, tol).as_json()


def probe(mine: Any, source: Any, tol: Tolerance | None) -> Probe:
    """How far ``mine`` is from ``source`` (same shape and dtype), element by element."""
    import torch

    a, b = mine.detach().cpu().reshape(-1), source.detach().cpu().reshape(-1)
    wide = torch.complex128 if a.is_complex() else torch.float64
    x, y = a.to(wide), b.to(wide)
    diff = (x - y).abs()
    both_nan = x.isnan() & y.isnan() if not a.is_complex() else torch.zeros_like(diff, dtype=torch.bool)
    diff = torch.where(both_nan | (x == y), torch.zeros_like(diff), diff)
    scale = y.abs()
    rel = torch.where((diff == 0) | (scale == 0), torch.zeros_like(diff), diff / scale)  # none against a zero
    bad = diff > (tol.atol + tol.rtol * scale) if tol is not None else diff != 0
    bad = bad | (diff.isnan() & ~both_nan)
    where = bad.nonzero().reshape(-1)[:ELEMENTS_SHOWN].tolist()
    digits = {torch.float16: 5, torch.bfloat16: 4, torch.float32: 9}.get(a.dtype, 17)
    elements = tuple((int(i), _value_text(a[i].item(), digits), _value_text(b[i].item(), digits)) for i in where)
    return Probe(int(bad.sum()), a.numel(), elements, float(diff.max()) if diff.numel() else 0.0,
                 float(rel.max()) if rel.numel() else 0.0)


def _value_text(v: Any, digits: int) -> str:
    return f"{v:.{digits}g}" if isinstance(v, float) else str(v)


def device(ns: dict[str, Any], backend: str) -> Any:
    """Where this rank's collectives live: the CPU for gloo, else the rank's device (nbdist's ``DEVICE``)."""
    import torch

    return torch.device("cpu") if backend == "gloo" else torch.device(ns.get("DEVICE", "cpu"))
