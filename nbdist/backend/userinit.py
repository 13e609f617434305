"""``dist.init_process_group`` called by the notebook's code while this kernel is a rank of a world.

PyTorch's tutorials begin with a ``setup(rank, world_size)`` that sets ``MASTER_ADDR`` and
``MASTER_PORT`` and calls ``dist.init_process_group("gloo", rank=rank, world_size=world_size)``. In
a world nbdist formed, the default group exists already and torch would refuse ("trying to
initialize the default process group twice!"). While the world lasts, torch's function is replaced
by one that compares the call with the world: where the backend, rank and world size agree (an
argument left out agrees; ``init_method``, ``store``, ``timeout`` and the ``MASTER_*`` variables are
not used), the call is one line saying so; where they differ, :class:`InitProcessGroupError` names
the difference. A call after the notebook's code destroyed the group (a tutorial's ``cleanup()``)
gets the world's group back (``restore``, the session's), never a second group of its own.

nbdist's own groups are built with torch's function itself (:func:`real`).
"""

from __future__ import annotations

import functools
import inspect
import sys
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

from ..errors import InitProcessGroupError

NAME = "init_process_group"


def real() -> Callable[..., Any]:
    """torch's own ``init_process_group``, under whatever nbdist put in its place."""
    import torch.distributed as dist

    fn = dist.distributed_c10d.init_process_group
    while hasattr(fn, "__nbdist_original__"):
        fn = fn.__nbdist_original__
    return fn


# --- the decision (pure) ---------------------------------------------------------------
@dataclass(frozen=True)
class Asked:
    """What a call asked for, of what nbdist compares with the world (None: left out)."""

    backend: str | None = None
    rank: Any = None
    world_size: Any = None
    others: bool = False  # it gave other arguments too (init_method, store, timeout...): not used

    def call(self) -> str:
        """The call as a line names it: ``init_process_group('gloo', rank=1, world_size=2)``."""
        given = [repr(self.backend)] if self.backend is not None else []
        given += [f"{k}={v!r}" for k, v in (("rank", self.rank), ("world_size", self.world_size)) if v is not None]
        return f"{NAME}({', '.join(given + (['...'] if self.others else []))})"


@dataclass(frozen=True)
class Formed:
    """The world this kernel is a rank of, as a call is compared with it."""

    backend: str
    rank: int
    world_size: int
    where: str = ""  # this rank in words (host, pid), for the error

    def text(self) -> str:
        return f"rank {self.rank} of a {self.world_size}-rank {self.backend} world"


def asked(params: list[str], args: tuple[Any, ...], kwargs: dict[str, Any]) -> Asked:
    """Read a call's arguments (``params``: torch's parameter names, in order); torch's "not given" is None."""
    bound = dict(zip(params, args, strict=False))
    bound.update(kwargs)
    backend = bound.pop("backend", None)
    rank = bound.pop("rank", -1)
    size = bound.pop("world_size", -1)
    others = any(v not in (None, "", -1) for v in bound.values())
    return Asked(None if backend is None else str(backend), None if _unset(rank) else rank,
                 None if _unset(size) else size, others)


def _unset(value: Any) -> bool:
    return value is None or (isinstance(value, int) and value == -1)


def _backends(text: str) -> set[str]:
    """The backends a backend argument names: ``gloo``, or ``cpu:gloo,cuda:nccl`` (per device type)."""
    return {part.rpartition(":")[2].strip() for part in text.lower().split(",") if part.strip()}


def _number(value: Any) -> int | None:
    try:
        return int(value)
    except (TypeError, ValueError):
        return None


def differences(call: Asked, world: Formed) -> list[str]:
    """How a call differs from the world, in words; empty where it agrees."""
    found = []
    if call.backend is not None and _backends(call.backend) != {world.backend}:
        only = " only" if len(_backends(call.backend)) > 1 else ""
        found.append(f"backend {call.backend}, but the world uses {world.backend}{only}")
    if call.rank is not None and _number(call.rank) != world.rank:
        found.append(f"rank {call.rank}, but this notebook is rank {world.rank}")
    if call.world_size is not None and _number(call.world_size) != world.world_size:
        found.append(f"world_size {call.world_size}, but the world has {world.world_size} ranks")
    return found


def refusal(call: Asked, world: Formed, found: list[str]) -> str:
    """The error's message for a call that differs from the world (``found``: :func:`differences`)."""
    where = f", {world.where}," if world.where else ""
    fix = "Leave those arguments out, or pass the world's (RANK and WORLD_SIZE are in the notebook's namespace)"
    named = _backends(call.backend or "")
    if any(f.startswith("backend") for f in found) and len(named) == 1:
        fix += f"; for {next(iter(named))}, re-run %%dist_init with --backend {next(iter(named))} in every notebook"
    return (f"{call.call()}: {'; '.join(found)}. This notebook{where} is in a {world.world_size}-rank "
            f"{world.backend} world already, formed by %%dist_init. {fix}")


def accepted(call: Asked, world: Formed, note: str | None = None) -> str:
    """The one line a call that agrees with the world prints (``note``: what was done to the group, if anything)."""
    return f"nbdist: {call.call()} ignored: this notebook is already {world.text()}{f'; {note}' if note else ''}"


def decide(call: Asked, world: Formed) -> str | None:
    """None where the call agrees with the world (a no-op); else the error's message."""
    found = differences(call, world)
    return refusal(call, world, found) if found else None


# --- in place while the world lasts --------------------------------------------------------
class UserInit:
    """The session's stand-in for ``init_process_group``, in place from a world's forming until it is left."""

    def __init__(self) -> None:
        self._saved: dict[tuple[Any, str], Callable[..., Any]] = {}
        self.world: Callable[[], Formed] | None = None
        self.restore: Callable[[], str | None] | None = None

    @property
    def installed(self) -> bool:
        return bool(self._saved)

    def install(self, world: Callable[[], Formed], restore: Callable[[], str | None]) -> None:
        """Put the stand-in in place (idempotent). ``world``: the world now; ``restore``: get the world's group
        back if the notebook's code destroyed it, and say how (None: it was there)."""
        self.world, self.restore = world, restore
        if self._saved:
            return
        import torch.distributed as dist

        original = real()
        params = list(inspect.signature(original).parameters)

        @functools.wraps(original)
        def init_process_group(*args: Any, **kwargs: Any) -> None:
            self.called(asked(params, args, kwargs))

        init_process_group.__nbdist_original__ = original  # type: ignore[attr-defined]
        for module in (dist, dist.distributed_c10d):
            self._saved[(module, NAME)] = original
            setattr(module, NAME, init_process_group)

    def uninstall(self) -> None:
        """Put torch's function back where the stand-in still stands (idempotent)."""
        for (module, name), original in self._saved.items():
            if getattr(getattr(module, name, None), "__nbdist_original__", None) is original:
                setattr(module, name, original)
        self._saved.clear()
        self.world = self.restore = None

    def called(self, call: Asked) -> None:
        """The notebook's code called ``init_process_group``: one line, or the error naming the difference."""
        assert self.world is not None and self.restore is not None
        world = self.world()
        message = decide(call, world)
        if message is not None:
            raise InitProcessGroupError(message)
        note = self.restore()
        print(accepted(call, world, note), file=sys.stderr, flush=True)
