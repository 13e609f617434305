"""How the magics declare and read their flags: IPython's decorators, typed, and flag values checked.

``magic_arguments``' decorators are untyped, and ``line_magic``'s (and the others') say "a function, or a
decorator" for a bare use that returns the function; under these the magics stay typed for ``mypy --strict``.
At run time they are IPython's own. A flag value that does not check out is a ``UsageError``: one line, no
traceback.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import TYPE_CHECKING, Any, TypeVar

from IPython.core.error import UsageError

from . import config
from .cell import cells
from .errors import ConfigError

if TYPE_CHECKING:
    _Magic = TypeVar("_Magic", bound=Callable[..., Any])

    def magic_arguments() -> Callable[[_Magic], _Magic]: ...
    def argument(*args: Any, **kwargs: Any) -> Callable[[_Magic], _Magic]: ...
    def line_magic(func: _Magic) -> _Magic: ...
    def cell_magic(func: _Magic) -> _Magic: ...
    def line_cell_magic(func: _Magic) -> _Magic: ...
else:
    from IPython.core.magic import cell_magic, line_cell_magic, line_magic
    from IPython.core.magic_arguments import argument, magic_arguments

__all__ = ["argument", "cell_flags", "cell_magic", "line_cell_magic", "line_magic", "magic_arguments", "seconds"]


def seconds(name: str, value: Any) -> float:
    """A flag's value in seconds, checked (positive)."""
    try:
        return config.positive_seconds(name, value)
    except ConfigError as exc:
        raise UsageError(str(exc)) from None


def cell_flags(args: Any, world_size: int | None) -> cells.Flags:
    """A ``%%collective`` line's flags, checked (``world_size``: the world's, for --ranks and --show; None: none
    joined)."""
    return cells.Flags(seconds("--timeout", args.timeout), check=not args.no_check, same_code=not args.allow_different,
                       max_time=None if args.max_time is None else seconds("--max-time", args.max_time),
                       live=not args.no_live, trace=args.trace, ranks=cells.rank_set(args.ranks, world_size),
                       view=args.view, show=cells.rank_set(args.show, world_size, "--show"),
                       **_divergence(args, world_size))


def _divergence(args: Any, world_size: int | None) -> dict[str, Any]:
    """``--find-divergence [--replicas SET]``, checked: the comparison is a collective of every rank after the
    body, so every rank runs the body, and a replica set has two ranks at least."""
    if not args.find_divergence:
        if args.replicas is not None:
            raise UsageError("--replicas says which ranks --find-divergence compares: give --find-divergence too")
        return {}
    if args.ranks is not None:
        raise UsageError("--find-divergence compares the operations of every rank: it does not go with --ranks "
                         "(--replicas SET says which ranks must agree)")
    replicas = cells.rank_set(args.replicas, world_size, "--replicas")
    if replicas is not None and len(set(replicas)) < 2:
        raise UsageError("--replicas: name two ranks at least, e.g. 0,1")
    return {"find_divergence": True, "replicas": replicas}
