"""``%dist_sync NAME...``: copy what a survivor holds under some names to the ranks that lack it (a rank whose kernel
was started again), through torch.distributed, never the store.

It runs as one ``%%collective`` body on every rank (:func:`body`), in lockstep. Every rank first tells the others
what it holds under each name (:class:`Held`: its kind, a digest of its value, what a copy needs to know of its
shape), then each rank decides alike from all of them (:func:`plan`, pure): where from, where to, or why not.
Tensors, and the tensors of a module's state, are broadcast as tensors; an optimizer's state and a plain value
are saved with ``torch.save`` and broadcast as bytes, and read with ``torch.load(weights_only=True)``, which takes
tensors, numbers, text and their lists, tuples and dicts, and nothing else: no rank loads another's objects
(what each rank holds is told as JSON). A value that differs between the ranks that keep it is rank-specific state
(a rank's shard of the data, its seed): it is not copied, and the rank says so. So is a value of another kind, and
a module or optimizer that the receiving rank has none of to load the state into (the cell that made it comes back
with ``%dist_replay``).
"""

from __future__ import annotations

import hashlib
import io
import json
import keyword
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

from .. import ranksets
from ..errors import ConfigError
from ..gathered import gathered
from ..ranksets import ranks_text

ABSENT = "absent"
TENSOR, MODULE, OPTIMIZER, VALUE, OPAQUE = "tensor", "module", "optimizer", "value", "opaque"
PLAIN = "only tensors, numbers, text and their lists, tuples and dicts go to another rank"
LOADS = (MODULE, OPTIMIZER)  # kinds whose state is loaded into the receiving rank's own object


@dataclass(frozen=True)
class Held:
    """What one rank holds under a name: its ``kind``, a ``digest`` of its value (equal values, equal digests,
    wherever they live), and what a copy must know of it (``meta``: a tensor's shape, dtype, device type and
    whether it requires grad; a module's state keys, each with its shape and dtype; an unpicklable value's type)."""

    kind: str
    digest: str = ""
    meta: tuple[Any, ...] = ()


@dataclass(frozen=True)
class Copy:
    """``name``, of ``kind``, goes from rank ``source`` to the ranks ``to``; ``meta``: the source's."""

    name: str
    kind: str
    source: int
    to: tuple[int, ...]
    meta: tuple[Any, ...]


@dataclass(frozen=True)
class NotCopied:
    name: str
    why: str


def plan(name: str, held: Sequence[Held], source: int | None, to: Sequence[int] | None) -> Copy | NotCopied:
    """What every rank does with ``name``, from what each holds (``held``, by rank). ``source``: --from (None: the
    lowest rank that keeps it); ``to``: --to (None: the ranks that lack it)."""
    holders = [i for i, h in enumerate(held) if h.kind != ABSENT]
    if not holders:
        return NotCopied(name, "no rank holds it")
    targets = list(to) if to is not None else [i for i, h in enumerate(held) if h.kind == ABSENT]
    if not targets:
        return NotCopied(name, "every rank holds it (--to RANKS copies it over theirs)")
    keepers = [i for i in holders if i not in targets]
    if source is not None:
        if source in targets:
            return NotCopied(name, f"rank {source} is one it would be copied to")
        if source not in holders:
            return NotCopied(name, f"rank {source} does not hold it")
    if not keepers:
        return NotCopied(name, f"only {ranks_text(targets)}, where it would go, hold{'s' if len(targets) == 1 else ''} "
                               "it")
    digests: dict[str, list[int]] = {}
    for i in keepers:
        digests.setdefault(held[i].digest or f"{held[i].kind}:{i}", []).append(i)
    if len(digests) > 1:
        groups = "; ".join(ranks_text(ranks) for ranks in digests.values())
        return NotCopied(name, f"the ranks that keep it hold different values ({groups}): rank-specific state "
                               "is not copied")
    src = source if source is not None else keepers[0]
    what = held[src]
    if what.kind == OPAQUE:
        return NotCopied(name, f"it is {what.meta[0] if what.meta else 'an object'}: {PLAIN}")
    if what.kind in LOADS:
        for t in targets:
            if held[t].kind != what.kind:
                return NotCopied(name, f"rank {t} has no {what.kind} named {name} to load its state into: create "
                                       "it there first (%dist_replay runs again the cell that made it)")
            if what.kind == MODULE and _keys(held[t].meta) != _keys(what.meta):
                return NotCopied(name, f"rank {t}'s module {name} has other parameters than rank {src}'s")
    return Copy(name, what.kind, src, tuple(targets), what.meta)


def _keys(meta: tuple[Any, ...]) -> list[str]:
    return [entry[0] for entry in meta]


def said(step: Copy | NotCopied, rank: int) -> str | None:
    """What ``rank`` says of ``step``, if anything (a rank with no part in a copy says nothing)."""
    if isinstance(step, NotCopied):
        return f"{step.name}: not copied: {step.why}"
    if rank in step.to:
        return f"{step.name}: copied from rank {step.source} ({describe(step)})"
    if rank == step.source:
        return f"{step.name}: sent to {ranks_text(step.to)}"
    return None


def describe(step: Copy) -> str:
    if step.kind == TENSOR:
        shape, dtype = step.meta[:2]
        return f"tensor {'x'.join(map(str, shape)) or 'scalar'} {dtype.removeprefix('torch.')}"
    if step.kind == MODULE:
        return f"module state, {len(step.meta)} tensor(s)"
    return "optimizer state" if step.kind == OPTIMIZER else "value"


# --- on a rank ----------------------------------------------------------------------------------------------------

def command(names: Sequence[str], source: str | None, to: str | None, world_size: int,
            restarted: Sequence[int] = ()) -> str:
    """The body of ``%dist_sync NAME... [--from RANK] [--to RANKS]`` in a world of ``world_size``; without --to, the
    ``restarted`` ranks (workers started again since they died), else every rank that lacks a name. A name that is
    not one, or a rank not in the world, is refused (ConfigError)."""
    bad = [name for name in names if not name.isidentifier() or keyword.iskeyword(name)]
    if bad:
        raise ConfigError(f"%dist_sync copies names of the notebook's namespace, not {', '.join(map(repr, bad))}")
    src = None
    if source is not None:
        try:
            ranks = ranksets.parse(source, world_size)
        except ValueError as exc:
            raise ConfigError(f"--from: {exc}") from None
        if len(ranks) != 1:
            raise ConfigError(f"--from takes one rank, not {source!r}")
        src = ranks[0]
    try:
        targets = ranksets.parse(to, world_size) if to is not None else (sorted(restarted) or None)
    except ValueError as exc:
        raise ConfigError(f"--to: {exc}") from None
    return body(names, src, targets)


def body(names: Sequence[str], source: int | None, to: Sequence[int] | None) -> str:
    """The ``%%collective`` body that syncs ``names`` (every rank runs the same text)."""
    return (f"__import__('nbdist.heal.sync', fromlist=['run']).run(get_ipython().user_ns, {list(names)!r}, "
            f"{source!r}, {None if to is None else list(to)!r})\n")


def run(ns: dict[str, Any], names: list[str], source: int | None, to: list[int] | None) -> None:
    """Sync ``names`` in this rank's namespace ``ns`` with the others (see the module docstring); prints what it
    did here."""
    import torch.distributed as dist

    rank, here = dist.get_rank(), device(ns, dist.get_backend())
    mine = [held(ns, name) for name in names]
    every = [[Held(h[0], h[1], _tuples(h[2])) for h in json.loads(text)]
             for text in gathered(json.dumps([[h.kind, h.digest, list(h.meta)] for h in mine]), here)]
    for k, name in enumerate(names):
        step = plan(name, [theirs[k] for theirs in every], source, to)
        if isinstance(step, Copy):
            _copy(ns, step, rank, here)
        words = said(step, rank)
        if words is not None:
            print(words)


def held(ns: dict[str, Any], name: str) -> Held:
    """What this rank holds under ``name``."""
    import torch

    if name not in ns:
        return Held(ABSENT)
    value = ns[name]
    try:
        if isinstance(value, torch.Tensor):
            return Held(TENSOR, digest(value), (tuple(value.shape), str(value.dtype), value.device.type,
                                                value.requires_grad))
        if isinstance(value, torch.nn.Module):
            state = value.state_dict()
            return Held(MODULE, digest(state), tuple((key, tuple(t.shape), str(t.dtype)) for key, t in state.items()))
        if isinstance(value, torch.optim.Optimizer):
            state = value.state_dict()
            return Held(OPTIMIZER, digest(state)) if plain(state) else Held(OPAQUE, meta=("an optimizer of state "
                                                                                         "of another kind",))
        if plain(value):
            return Held(VALUE, digest(value))
    except (TypeError, AttributeError, RuntimeError):  # a state that cannot be read as tensors and plain values
        pass
    return Held(OPAQUE, meta=(f"a {type(value).__name__}",))


def plain(value: Any) -> bool:
    """Whether ``value`` is what ``torch.load(weights_only=True)`` reads back: tensors, numbers, text, bytes, None,
    and lists, tuples and dicts of them (keys text or numbers)."""
    import torch

    if value is None or isinstance(value, (bool, int, float, complex, str, bytes, torch.Tensor, torch.dtype)):
        return True
    if isinstance(value, (list, tuple)):
        return type(value) in (list, tuple, torch.Size) and all(plain(v) for v in value)
    if isinstance(value, dict):
        return all(isinstance(k, (str, int)) and plain(v) for k, v in value.items())
    return False


def _tuples(value: Any) -> Any:
    """JSON's lists back as the tuples :class:`Held`'s meta holds."""
    return tuple(_tuples(v) for v in value) if isinstance(value, list) else value


def digest(value: Any) -> str:
    """A digest of ``value`` that equal values share on any rank and device: tensors by dtype, shape and bytes,
    dicts, lists and tuples by their items, anything else (:func:`plain`'s scalars) by its type and repr."""
    h = hashlib.sha256()
    _feed(h, value)
    return h.hexdigest()


def _feed(h: Any, value: Any) -> None:
    import torch

    if isinstance(value, torch.Tensor):
        t = value.detach().cpu().contiguous()
        h.update(f"T{t.dtype}{tuple(t.shape)}".encode())
        h.update(t.reshape(-1).view(torch.uint8).numpy().tobytes() if t.numel() else b"")
    elif isinstance(value, dict):
        h.update(f"D{len(value)}".encode())
        for key in sorted(value, key=repr):
            _feed(h, key)
            _feed(h, value[key])
    elif isinstance(value, (list, tuple)):
        h.update(f"L{type(value).__name__}{len(value)}".encode())
        for item in value:
            _feed(h, item)
    else:
        h.update(f"S{type(value).__name__}:{value!r}".encode())


def device(ns: dict[str, Any], backend: str) -> Any:
    """Where this rank's broadcasts live: the CPU for gloo, else the rank's device (nbdist's ``DEVICE``)."""
    import torch

    return torch.device("cpu") if backend == "gloo" else torch.device(ns.get("DEVICE", "cpu"))


def _copy(ns: dict[str, Any], step: Copy, rank: int, here: Any) -> None:
    import torch
    import torch.distributed as dist

    receives, sends = rank in step.to, rank == step.source

    def sent(value: Any, shape: tuple[int, ...], dtype: str) -> Any:
        buf = (value.detach().to(here).contiguous() if sends
               else torch.empty(shape, dtype=getattr(torch, dtype.removeprefix("torch.")), device=here))
        dist.broadcast(buf, step.source)
        return buf

    if step.kind == TENSOR:
        shape, dtype, kind, grad = step.meta
        got = sent(ns[step.name] if sends else None, shape, dtype)
        if receives:
            got = got.cpu() if kind == "cpu" else got
            ns[step.name] = got.requires_grad_(True) if grad else got
    elif step.kind == MODULE:
        state = ns[step.name].state_dict() if sends else {}
        got = {key: sent(state.get(key), shape, dtype) for key, shape, dtype in step.meta}
        if receives:
            ns[step.name].load_state_dict(got)
    else:
        data = None
        if sends:
            buffer = io.BytesIO()
            torch.save(ns[step.name].state_dict() if step.kind == OPTIMIZER else ns[step.name], buffer)
            data = buffer.getvalue()
        sent_bytes = broadcast_bytes(data, step.source, here)
        got = torch.load(io.BytesIO(sent_bytes), weights_only=True)  # tensors and plain values only: no object
        if receives:
            if step.kind == OPTIMIZER:
                ns[step.name].load_state_dict(got)
            else:
                ns[step.name] = got


def broadcast_bytes(data: bytes | None, source: int, here: Any) -> bytes:
    """``data`` from rank ``source`` to every rank, as a tensor of bytes over the process group (on ``here``)."""
    import torch
    import torch.distributed as dist

    size = torch.tensor([0 if data is None else len(data)], dtype=torch.int64, device=here)
    dist.broadcast(size, source)
    buf = (torch.frombuffer(bytearray(data), dtype=torch.uint8).to(here) if data is not None
           else torch.empty(int(size.item()), dtype=torch.uint8, device=here))
    dist.broadcast(buf, source)
    return bytes(buf.cpu().numpy().tobytes())
