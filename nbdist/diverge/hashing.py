"""What a rank holds under a name, as entries with digests: equal values give equal digests on any rank and device.

A value is walked into :class:`Entry` items, each named as a person would write it (:func:`entry_name`): a
tensor is one entry; a module's parameters and buffers are entries by name (``fc2.bias``); an optimizer's state
by the name of its parameter (``state['fc1.weight'].exp_avg``, the names taken from a module that holds those
parameters) and its groups' settings (``param_groups[0].lr``); a dict, list or tuple by its items
(``['lr']``, ``[1]``), nested; a number, text or None is one entry that carries its value (short enough to
send). The random generators (:func:`rng_entries`) are entries too. Only these summaries leave the rank; a
tensor's data is read here, to be digested.
"""

from __future__ import annotations

import hashlib
import weakref
from collections.abc import Iterator, Sequence
from dataclasses import dataclass
from typing import Any

# What a name holds, as a whole
TENSOR, MODULE, OPTIMIZER, VALUE, DICT, LIST, RNG, ABSENT, OPAQUE = (
    "tensor", "module", "optimizer", "value", "dict", "list", "rng", "absent", "opaque")
# What an entry holds
NUMBER, TEXT, STATE = "number", "text", "state"  # STATE: bytes compared by digest alone (a generator's state)
SHOWN_AT_MOST = 80  # characters of a number's or text's repr carried in its entry

Step = tuple[str, Any]  # ("attr", "fc2.bias"), ("key", "lr"), ("index", 0)


@dataclass(frozen=True)
class Entry:
    """One comparable piece of what a rank holds: its ``name``, what it is (``kind``: tensor, number, text, state),
    a tensor's ``shape`` and ``dtype``, the ``digest`` of its value, and a number's or text's ``shown`` repr."""

    name: str
    kind: str
    digest: str
    shape: tuple[int, ...] = ()
    dtype: str = ""
    shown: str | None = None

    def as_json(self) -> list[Any]:
        return [self.name, self.kind, self.digest, list(self.shape), self.dtype, self.shown]

    @classmethod
    def from_json(cls, item: Sequence[Any]) -> Entry:
        name, kind, digest, shape, dtype, shown = item
        return cls(str(name), str(kind), str(digest), tuple(int(n) for n in shape), str(dtype),
                   None if shown is None else str(shown))


def entry_name(path: Sequence[Step]) -> str:
    """``[("attr", "state"), ("key", "fc1.weight"), ("attr", "exp_avg")]`` -> ``state['fc1.weight'].exp_avg``."""
    out = ""
    for kind, part in path:
        if kind == "attr":
            out += f".{part}" if out else str(part)
        else:
            out += f"[{part!r}]"
    return out


def digest_bytes(data: Any) -> str:
    """The digest of raw bytes (a buffer), 16 hex digits: enough to tell values apart, short to send."""
    return hashlib.sha256(data).hexdigest()[:16]


def tensor_digest(t: Any) -> str:
    """A tensor's digest by dtype, shape and bytes (read on the CPU; a device's tensor is copied there first)."""
    import torch

    t = t.detach()
    if t.device.type != "cpu":
        t = t.cpu()
    t = t.contiguous()
    h = hashlib.sha256(f"{t.dtype}{tuple(t.shape)}".encode())
    if t.numel():
        h.update(memoryview(t.reshape(-1).view(torch.uint8).numpy()))
    return h.hexdigest()[:16]


def quick(leaves: Sequence[tuple[str, Any]]) -> int:
    """One signed 64-bit digest of named leaves (:func:`leaves`), cheaper than their entries': each tensor's bytes,
    as 32-bit words, weighted by fixed odd numbers and summed where the tensor lives (:func:`_word_sum`); only those
    sums, one number per tensor, come to the CPU, with the names, shapes, dtypes and values. Equal leaves give equal
    digests on any rank (whatever the device's number); it is not meant to be kept or shown, only compared within
    one check (:func:`nbdist.check_replicas`)."""
    import torch

    layout: list[tuple[str, Any, Any]] = []  # what is said of each leaf: names, dtypes, shapes, values' reprs
    sums = []
    kept_views, tensor = _SUMMED, torch.Tensor
    with torch.no_grad():
        for name, leaf in leaves:
            if isinstance(leaf, tensor):
                dtype, shape = leaf.dtype, leaf.shape
                layout.append((name, dtype, shape))
                kept = kept_views.get(id(leaf))
                if (kept is None or not _alive(kept[0], leaf) or kept[1] != leaf.data_ptr() or kept[2] != dtype
                        or kept[3] != shape):
                    sums.append(_leaf_sum(leaf, dtype, shape))
                else:  # a tensor checked before (see _SUMMED), its data where it was: its words and weights kept
                    sums.append(_word_sum(kept[5], kept[4]))
            else:
                layout.append((name, type(leaf).__name__, repr(leaf)))
    h = hashlib.sha256(_layout_digest(tuple(layout)))
    if sums:
        try:
            joined = torch.stack(sums)
        except RuntimeError:  # a model split across devices
            joined = torch.stack([s.cpu() for s in sums])
        h.update(joined.cpu().numpy().tobytes())
    return int(h.hexdigest()[:16], 16) - (1 << 63)


# By a tensor's id: the tensor (weakly), where its data lay, its dtype and shape, and its words and their weights,
# made once for a tensor that a loop checks again (its words a view of its data, which steps change in place)
_SUMMED: dict[int, tuple[weakref.ref[Any], int, Any, Any, Any, Any]] = {}


def _alive(ref: weakref.ref[Any], leaf: Any) -> bool:
    """Whether ``ref`` is ``leaf`` still (not another tensor that came to have a dead one's id)."""
    return ref() is leaf


def _leaf_sum(leaf: Any, dtype: Any, shape: Any) -> Any:
    """:func:`_word_sum` of ``leaf``'s words, seen for the first time (or its data moved, as ``p.data = ...`` moves
    it): its words and weights are kept for the next check where its words are a view of its data (:data:`_SUMMED`;
    :func:`quick` reuses them while the tensor is alive, its data where it was, its dtype and shape the same)."""
    words = _words(leaf)
    weights = _weights(words.numel(), words.device)
    try:
        where = leaf.data_ptr() if leaf.numel() and words.data_ptr() == leaf.data_ptr() else None
    except (RuntimeError, NotImplementedError):  # a tensor without plain storage (sparse, a subclass)
        where = None
    if where is not None:  # its words are a view of its data: later steps show in them
        if len(_SUMMED) >= 4096:  # many tensors checked once: keep the latest
            _SUMMED.clear()
        _SUMMED[id(leaf)] = (weakref.ref(leaf), where, dtype, shape, words, weights)
    return _word_sum(weights, words)


_LAYOUTS: dict[tuple[tuple[str, Any, Any], ...], bytes] = {}  # a layout's digest, by the layout (a loop's is one)


def _layout_digest(layout: tuple[tuple[str, Any, Any], ...]) -> bytes:
    """The digest of what :func:`quick` says of its leaves besides their data, made once per layout: writing it
    (a repr of every name, dtype and shape) costs more than the data's sums of a small model."""
    found = _LAYOUTS.get(layout)
    if found is None:
        if len(_LAYOUTS) >= 64:  # many models or changing values: keep the latest few
            _LAYOUTS.clear()
        found = _LAYOUTS[layout] = hashlib.sha256(repr(layout).encode()).digest()
    return found


def _words(t: Any) -> Any:
    """``t``'s bytes as a flat run of 32-bit words (one word per byte where its size is not a multiple of 4); a
    view where ``t`` is contiguous."""
    import torch

    flat = t.reshape(-1)
    if flat.element_size() == 4:
        return flat.view(torch.int32)
    raw = flat.view(torch.uint8)
    return raw.view(torch.int32) if raw.numel() % 4 == 0 else raw.to(torch.int32)


_WEIGHTS: dict[Any, Any] = {}  # by device: fixed odd 32-bit weights, as many as the longest tensor seen
_FIRST: dict[tuple[Any, int], Any] = {}  # by (device, n): the first n of them (a view, made once)


def _weights(n: int, device: Any) -> Any:
    """The first ``n`` fixed odd 32-bit weights on ``device``: the same numbers on every rank and machine."""
    import torch

    weights = _FIRST.get((device, n))
    if weights is None:
        every = _WEIGHTS.get(device)
        if every is None or every.numel() < n:
            made = torch.Generator().manual_seed(0x6E6264697374)  # the same numbers on every rank and machine
            drawn = torch.randint(-(1 << 31), 1 << 31, (max(n, 1 << 16),), generator=made, dtype=torch.int64)
            every = _WEIGHTS[device] = (drawn.to(torch.int32) | 1).to(device)
            _FIRST.clear()  # views of the weights left behind
            _SUMMED.clear()
        weights = _FIRST[(device, n)] = every[:n]
    return weights


def _word_sum(weights: Any, words: Any) -> Any:
    """Each word times its weight (:func:`_weights`), summed with wrap-around: one int32 number on ``words``'
    device. A word changed changes it (the weights are odd); two words swapped change it unless their difference
    times the difference of their weights is a multiple of 2**32. Compared within one check, which the next check
    repeats: a difference missed once (about one chance in 4 billion for random values) is caught at the next."""
    import torch

    try:
        return torch.dot(weights, words)
    except (RuntimeError, NotImplementedError):  # a device without an integer dot: the same sum (it wraps alike)
        return (weights * words).sum(dtype=torch.int32)


def kind_of(value: Any) -> str:
    import torch

    if isinstance(value, torch.Tensor):
        return TENSOR
    if isinstance(value, torch.nn.Module):
        return MODULE
    if isinstance(value, torch.optim.Optimizer):
        return OPTIMIZER
    if isinstance(value, dict):
        return DICT
    if isinstance(value, (list, tuple)):
        return LIST
    if value is None or isinstance(value, (bool, int, float, complex, str)):
        return VALUE
    return OPAQUE


def entries(value: Any, names: dict[int, str] | None = None) -> list[Entry]:
    """``value`` as its entries (see the module docstring); ``names``: a parameter's name by ``id``, for an
    optimizer's state (:func:`param_names`). Raises TypeError for something that holds an object of another kind."""
    return [entry(name, leaf) for name, leaf in leaves(value, names)]


def leaves(value: Any, names: dict[int, str] | None = None) -> Iterator[tuple[str, Any]]:
    """``value``'s entries as ``(name, what it holds)``: a tensor, a number, text, None or a dtype."""
    return _walk(value, "", names or {})


def entry(name: str, leaf: Any) -> Entry:
    """The entry of one named leaf (:func:`leaves`), its digest read on the CPU."""
    import torch

    if isinstance(leaf, torch.Tensor):
        return Entry(name, TENSOR, tensor_digest(leaf), tuple(leaf.shape), str(leaf.dtype))
    text = str(leaf) if isinstance(leaf, torch.dtype) else repr(leaf)
    what = TEXT if isinstance(leaf, (str, torch.dtype)) else NUMBER
    return Entry(name, what, digest_bytes(f"{type(leaf).__name__}:{text}".encode()),
                 shown=text if len(text) <= SHOWN_AT_MOST else text[:SHOWN_AT_MOST - 1] + "…")


_PLAIN = frozenset({bool, int, float, str, type(None)})  # values (:data:`VALUE`) by their exact type


def _walk(value: Any, name: str, names: dict[int, str]) -> Iterator[tuple[str, Any]]:
    """``value``'s leaves under ``name`` (as :func:`entry_name` writes a path; built as it goes, once per step)."""
    import torch

    if type(value) in _PLAIN:  # most of an optimizer's settings: a leaf, without asking what else it could be
        yield name, value
        return
    kind = kind_of(value)
    if kind in (TENSOR, VALUE) or isinstance(value, torch.dtype):
        yield name, value
    elif kind == MODULE:  # its parameters and buffers are tensors: leaves, named without a walk of each
        for part, t in [*value.named_parameters(), *value.named_buffers()]:
            yield _attr(name, part), t
    elif kind == OPTIMIZER:
        yield from _optimizer(value, name, names)
    elif kind == DICT:
        for key, item in value.items():
            yield from _walk(item, f"{name}[{key!r}]", names)
    elif kind == LIST:
        for i, item in enumerate(value):
            yield from _walk(item, f"{name}[{i!r}]", names)
    else:
        raise TypeError(f"{name or 'it'} is a {type(value).__name__}")


def _attr(name: str, part: str) -> str:
    return f"{name}.{part}" if name else part


def _optimizer(opt: Any, name: str, names: dict[int, str]) -> Iterator[tuple[str, Any]]:
    import torch

    state_at = _attr(name, "state")
    for p, state in opt.state.items():
        held = names.get(id(p))
        at = f"{state_at}[{held if held is not None else _position(opt, p)!r}]"
        for key in sorted(state, key=str):
            item = state[key]
            if isinstance(item, torch.Tensor):  # most of a state: a leaf, without a walk of its own
                yield _attr(at, key), item
            else:
                yield from _walk(item, _attr(at, key), names)
    groups_at = _attr(name, "param_groups")
    for i, group in enumerate(opt.param_groups):
        for key in sorted(group, key=str):
            if key != "params":
                yield from _walk(group[key], f"{groups_at}[{i!r}].{key}", names)


def _position(opt: Any, p: Any) -> int:
    """A parameter's number in the optimizer's state_dict, where no module names it."""
    flat = [q for group in opt.param_groups for q in group["params"]]
    return next(i for i, q in enumerate(flat) if q is p)


def param_names(modules: Sequence[Any]) -> dict[int, str]:
    """Each parameter's name by ``id``, from ``modules`` (the first to name it wins, then the shortest name: a
    module before its DDP wrapper's ``module.`` names)."""
    found: dict[int, str] = {}
    for m in modules:
        for name, p in m.named_parameters():
            if id(p) not in found or len(name) < len(found[id(p)]):
                found[id(p)] = name
    return found


def rng_entries() -> list[Entry]:
    """The random generators' states as entries: torch's CPU generator (and its seed), each CUDA or NPU device's
    where there is one, Python's ``random`` and numpy's where it is imported."""
    import random

    import torch

    found = [Entry("torch.initial_seed", NUMBER, digest_bytes(str(torch.initial_seed()).encode()),
                   shown=str(torch.initial_seed())),
             Entry("torch", STATE, tensor_digest(torch.get_rng_state()))]
    for device in ("cuda", "npu"):
        module: Any = getattr(torch, device, None)
        try:
            count = module.device_count() if module is not None and module.is_available() else 0
            found += [Entry(f"{device}:{i}", STATE, tensor_digest(module.get_rng_state(i))) for i in range(count)]
        except (RuntimeError, AttributeError):  # a device module without generators here: nothing to compare
            pass
    found.append(Entry("random", STATE, digest_bytes(repr(random.getstate()).encode())))
    try:
        import numpy
    except ImportError:  # no numpy here: no generator of its own to compare
        return found
    state: Any = numpy.random.get_state()
    name, keys, pos, has_gauss, cached = state
    found.append(Entry("numpy", STATE, digest_bytes(f"{name}{keys.tobytes()!r}{pos}{has_gauss}{cached}".encode())))
    return found
