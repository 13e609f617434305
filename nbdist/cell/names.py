"""What a kernel that took over a rank's slot lacks: the names of a notebook's namespace, sent with a ``NameError``.

A rank whose kernel was started again (or whose person started it again) has a new namespace, and its first cells
fail with ``NameError`` for what the survivors hold. Such a rank sends the names it holds with that error
(:func:`holding`, in :class:`~nbdist.world.capture_record.Raised`'s ``held``: only then, so a cell costs nothing
more), and a notebook that survived says which of its own names that rank lacks (:func:`lacking`).
"""

from __future__ import annotations

import dataclasses
from collections.abc import Callable, Iterable, Mapping
from typing import Any

from ..world.capture_record import Raised
from .cells import Body, Ran

HELD_MAX = 500  # names sent with one error, at most
LISTED = 8  # names a message lists; then "and N more"
IPYTHON_OWN = frozenset({"In", "Out", "exit", "quit", "get_ipython"})


def user_names(ns: Mapping[str, Any], hidden: Iterable[str] = ()) -> list[str]:
    """The names a person made in namespace ``ns``: not IPython's own (``hidden``: its ``user_ns_hidden``), nor
    ``_``-prefixed ones (IPython's output history, private names)."""
    skip = IPYTHON_OWN | set(hidden)
    return sorted(n for n in ns if not n.startswith("_") and n not in skip)


def with_held(error: Raised | None, names: list[str]) -> Raised | None:
    """``error`` carrying the ``names`` this rank holds, if it is a ``NameError``; else ``error`` as it is."""
    if error is None or error.ename != "NameError":
        return error
    return dataclasses.replace(error, held=names[:HELD_MAX])


def holding(run_body: Callable[[Body], Ran], names: Callable[[], list[str]]) -> Callable[[Body], Ran]:
    """``run_body``, its ``NameError`` carrying ``names()`` (asked for only then)."""
    def body(b: Body) -> Ran:
        cap, reason, interrupted = run_body(b)
        if cap.error is None or cap.error.ename != "NameError":
            return cap, reason, interrupted
        return dataclasses.replace(cap, error=with_held(cap.error, names())), reason, interrupted

    return body


def lacking(error: Raised, ours: Iterable[str] | Callable[[], Iterable[str]]) -> str:
    """What a notebook that survived adds to a rank's ``NameError`` sent with the names it holds: which of ``ours``
    it lacks, and how to bring them ("" for an error without them). ``ours`` may be a callable: asked only then."""
    if error.held is None:
        return ""
    missing = sorted(set(ours() if callable(ours) else ours) - set(error.held))
    if not missing:
        return " (its kernel is new: it holds every name this notebook holds)"
    listed = ", ".join(missing[:LISTED]) + (f", and {len(missing) - LISTED} more" if len(missing) > LISTED else "")
    return (f" (its kernel is new, and it lacks {len(missing)} name{'' if len(missing) == 1 else 's'} this notebook "
            f"holds: {listed}; %dist_replay runs again the cells that made them, %dist_sync NAME... copies state)")
