"""nbdist's wrappers around ``torch.distributed``, installed once per session.

Each collective and point-to-point function of ``torch.distributed`` is
replaced, for as long as the extension is loaded, by a wrapper that counts the
call on the world's current process group and, while a ``%%collective`` body
runs, hands it to that cell's :class:`~nbdist.cell.fingerprint.Checker` (which
compares it across ranks and watches it). The two functions of
``torch.distributed`` through which DDP's constructor starts collectives from C++
(:data:`OWN`) are wrapped too: not compared, but watched, and refused where a
collective is. The first call of a plain cell asks the session for that cell's
safety net (``on_plain``: a group that can be trusted, and a checker that only
watches, without comparing); calls from other threads, or with no world, go
straight through. Because the wrappers stay, names that user code imports
(``from torch.distributed import all_reduce``) keep working after the cell
that imported them. ``new_group`` is wrapped so that groups made by user code
get the world's process-group timeout unless the call gives one.
"""

from __future__ import annotations

import functools
import inspect
from collections.abc import Callable
from datetime import timedelta
from typing import Any

from ..backend.procgroup import registered
from ..errors import StaleGroupError
from .fingerprint import OPS, group_arg

P2P = ("send", "recv", "isend", "irecv")
WRAPPED = (*OPS, *P2P)
# Where torch's own code (DDP's constructor, its ``_sync_module_states``) starts collectives from C++ through
# ``torch.distributed``: not compared, but refused where a wrapped one is, and marked while they run.
OWN = ("_verify_params_across_processes", "_broadcast_coalesced")


def in_place() -> Collectives | None:
    """The session's wrappers that stand in ``torch.distributed`` now, if any (code run inside a body finds its
    cell's checker through them, as ``%dist_bench`` does)."""
    import torch.distributed as dist

    return getattr(dist.all_reduce, "__nbdist_hooks__", None)


class Collectives:
    """The wrappers of one session: which cell is active, which process group is current."""

    def __init__(self) -> None:
        self.active: Any = None  # the running cell's Checker, if any
        self.on_plain: Callable[[], Any] | None = None  # a plain cell's first collective: its Checker, or None
        self.pg: Any = None  # the world's current procgroup.ProcessGroup, if any
        self.group_timeout: float | None = None
        self.params: dict[str, list[str]] = {}  # op -> its parameter names, in order
        self._saved: dict[tuple[Any, str], Callable[..., Any]] = {}

    @property
    def installed(self) -> bool:
        return bool(self._saved)

    def install(self) -> None:
        """Put the wrappers in place (idempotent)."""
        if self._saved:
            return
        import torch.distributed as dist

        for op in WRAPPED:
            original = getattr(dist, op, None)
            if original is None:
                continue
            self.params[op] = list(inspect.signature(original).parameters)
            self._replace(dist, op, self._wrap(op, original))
        for name in OWN:
            original = getattr(dist, name, None)
            if original is not None:
                self._replace(dist, name, self._wrap_own(name, original))
        for module in (dist, dist.distributed_c10d):  # new_subgroups calls the module's own name
            original = getattr(module, "new_group", None)
            if original is not None:
                self._replace(module, "new_group", self._wrap_new_group(original))

    def uninstall(self) -> None:
        """Put torch's functions back where ours still stand (idempotent); names users kept call through."""
        for (module, name), original in self._saved.items():
            if getattr(getattr(module, name, None), "__nbdist_original__", None) is original:
                setattr(module, name, original)
        self._saved.clear()
        self.active = None
        self.pg = None
        self.on_plain = None

    def _replace(self, module: Any, name: str, wrapper: Callable[..., Any]) -> None:
        self._saved[(module, name)] = wrapper.__nbdist_original__  # type: ignore[attr-defined]
        setattr(module, name, wrapper)

    def _wrap(self, op: str, original: Callable[..., Any]) -> Callable[..., Any]:
        p2p = op in P2P

        @functools.wraps(original)
        def wrapper(*args: Any, **kwargs: Any) -> Any:
            checker = self.active
            if checker is None and self.on_plain is not None:
                checker = self.on_plain()  # the safety net of a plain cell: a group to trust, a watcher
            if checker is not None:
                return checker.call(op, original, args, kwargs, p2p=p2p)
            pg = self.pg
            if pg is not None:
                pg.count(group_arg(self.params[op], args, kwargs), p2p)
            return original(*args, **kwargs)

        wrapper.__nbdist_original__ = original  # type: ignore[attr-defined]
        wrapper.__nbdist_hooks__ = self  # type: ignore[attr-defined]  # see in_place()
        return wrapper

    def _wrap_own(self, name: str, original: Callable[..., Any]) -> Callable[..., Any]:
        @functools.wraps(original)
        def wrapper(*args: Any, **kwargs: Any) -> Any:
            checker = self.active
            if checker is None and self.on_plain is not None:
                checker = self.on_plain()  # as for a wrapped one: refused in a driving notebook, a trusted group
            if checker is None:
                return original(*args, **kwargs)
            if args and not registered(args[0]):
                raise StaleGroupError(f"{name} was called with a process group that is gone: nbdist rebuilt the "
                                      "world's group just now, after a collective failed or was stopped. Run the "
                                      "cell again; a model built before the rebuild must be built again")
            return checker.call_own(name, original, args, kwargs)

        wrapper.__nbdist_original__ = original  # type: ignore[attr-defined]
        return wrapper

    def _wrap_new_group(self, original: Callable[..., Any]) -> Callable[..., Any]:
        @functools.wraps(original)
        def new_group(*args: Any, **kwargs: Any) -> Any:
            if self.group_timeout is not None and len(args) < 2 and kwargs.get("timeout") is None:
                kwargs["timeout"] = timedelta(seconds=self.group_timeout)
            return original(*args, **kwargs)

        new_group.__nbdist_original__ = original  # type: ignore[attr-defined]
        return new_group
