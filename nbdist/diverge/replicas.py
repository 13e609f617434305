"""``nbdist.check_replicas(model, optimizer=None, every=1)``: inside a training loop, whether every rank's replica
is still the same, by digests, with one small collective.

Each call is a step of that model's loop (counted per model). At the first call and every ``every``-th after it, each
rank digests the model's parameters and buffers and the optimizer's state into one 64-bit digest
(:func:`nbdist.diverge.hashing.quick`: summed where the tensors live, no copy of them), and all ranks gather
``[step, entries, digest]`` (one ``all_gather_into_tensor`` of three numbers each). Equal on every rank: it returns.
Else every rank digests its entries one by one (:func:`nbdist.diverge.hashing.entries`) and gathers those digests
(names and hashes, no data) to name the first entry that differs and the ranks holding each value
(:func:`nbdist.diverge.compare.decide`), and raises :class:`~nbdist.errors.ReplicasDifferError` on every rank.
"""

from __future__ import annotations

import functools
import json
import weakref
from typing import Any

from ..errors import ConfigError, ReplicasDifferError
from ..gathered import gathered
from ..ranksets import ranks_text
from . import compare, hashing
from .compare import Held
from .hashing import MODULE, Entry

# Calls so far, by the model's id: the model (weakly) and its count, a list counted up in place. A loop's nine calls in
# ten only count, and this costs a third of a WeakKeyDictionary's lookup and store (two new weak references a call).
_STEPS: dict[int, tuple[weakref.ref[Any], list[int]]] = {}


def check_replicas(model: Any, optimizer: Any = None, every: int = 1) -> None:
    """Raise :class:`~nbdist.errors.ReplicasDifferError` if ``model`` (and ``optimizer``'s state) differs between
    the ranks of the world, checked at this model's first call and every ``every``-th after."""
    if not isinstance(every, int) or every < 1:
        raise ConfigError(f"check_replicas: every takes a whole number of steps, 1 or more, not {every!r}")
    count = _counted(model)
    count[0] += 1
    step = count[0]
    if (step - 1) % every:
        return
    import torch.distributed as dist

    leaves = replica_leaves(model, optimizer)
    _compare(step, leaves, gathered_on(dist.get_backend(), leaves))


def _counted(model: Any) -> list[int]:
    """The count of ``model``'s calls, held while the model lives (a new count for a model not seen before)."""
    held = _STEPS.get(id(model))
    if held is not None and held[0]() is model:
        return held[1]
    key = id(model)
    try:
        ref = weakref.ref(model, functools.partial(_forget, _STEPS, key))
    except TypeError:  # a plain dict or list: nothing tells its calls apart from another one's with its id
        raise ConfigError(f"check_replicas counts its calls per model, and a {type(model).__name__} cannot be "
                          "followed from call to call: pass the module (or a tensor), or compare a state dict "
                          "once with %dist_compare") from None
    count = [0]
    _STEPS[key] = (ref, count)
    return count


def _forget(steps: dict[int, Any], key: int, _: object) -> None:
    """A counted model is gone: its count goes with it (``steps`` held by the callback, which may come late)."""
    steps.pop(key, None)


def replica_leaves(model: Any, optimizer: Any = None) -> list[tuple[str, Any]]:
    """What is compared, by name: the model's parameters and buffers, then ``optimizer.``'s state by the model's
    parameter names."""
    import torch

    found = list(hashing.leaves(model))
    if optimizer is not None:
        if isinstance(model, torch.nn.Module):  # its leaves are its parameters by name (each once): no second walk
            names: dict[int, str] = {}
            for name, leaf in found:
                names.setdefault(id(leaf), name)
        else:
            names = hashing.param_names([model])
        found += [(f"optimizer.{name}", leaf) for name, leaf in hashing.leaves(optimizer, names)]
    return found


def gathered_on(backend: str, leaves: list[tuple[str, Any]]) -> Any:
    """The device the check's numbers are gathered on: the CPU for gloo, else the first tensor's (a model's first
    parameter; the CPU where no leaf is a tensor). What is checked may be any value :func:`hashing.leaves` walks:
    a tensor or a state dict has no ``parameters()``."""
    import torch

    if backend == "gloo":
        return torch.device("cpu")
    first = next((leaf for _, leaf in leaves if isinstance(leaf, torch.Tensor)), None)
    return first.device if first is not None else torch.device("cpu")


def _compare(step: int, leaves: list[tuple[str, Any]], here: Any) -> None:
    import torch
    import torch.distributed as dist

    mine = torch.tensor([step, len(leaves), hashing.quick(leaves)], dtype=torch.int64, device=here)
    n = dist.get_world_size()
    every = torch.empty(3 * n, dtype=torch.int64, device=here)
    gather = getattr(dist, "all_gather_single", None) or dist.all_gather_into_tensor  # the new name from torch 2.13
    gather(every, mine)
    rows = every.reshape(n, 3).cpu().tolist()
    if all(row == rows[0] for row in rows):
        return
    steps = {r: row[0] for r, row in enumerate(rows)}
    if len(set(steps.values())) > 1:
        said = compare.by_ranks({r: f"step {s}" for r, s in steps.items()})
        raise ReplicasDifferError(step, "the number of check_replicas calls", said)
    found = [hashing.entry(name, leaf) for name, leaf in leaves]
    texts = gathered(json.dumps([e.as_json() for e in found]), here)
    held = [Held(MODULE, "", tuple(Entry.from_json(e) for e in json.loads(text))) for text in texts]
    verdict = compare.decide("model", held)
    first = verdict.differing[0] if verdict.differing else "the model"
    there = {r: e.digest for r, h in enumerate(held) if (e := _entry(h, first)) is not None}
    parts = compare.groups(there)
    missing = [r for r in range(n) if r not in there]
    said = " · ".join(ranks_text(g) for g in parts) + (f" · missing on {ranks_text(missing)}" if missing else "")
    raise ReplicasDifferError(step, first, said, max(1, len(verdict.differing)))


def _entry(held: Held, name: str) -> Entry | None:
    return next((e for e in held.entries if e.name == name), None)
