"""Whether this rank started a collective since a moment, by torch's own count: seen by nbdist's wrappers or not.

torch's own code starts collectives from C++ (DDP's backward, FSDP, functional
collectives) where nbdist's wrappers never see them. Each process group's
backend numbers every collective it starts, from Python or from C++
(``ProcessGroup._get_sequence_number_for_group``): a plain cell's watcher
compares those numbers with the ones the cell began with, so it knows that the
cell used the group (a stop then cuts it, a failure distrusts it) and, in a
driving notebook, that a collective began that the followers will never join.
Reading them is a call into C++ per group, with no lock a running collective
holds; the watcher thread reads them while the body waits in C++.

torch's Flight Recorder (``torch._C._distributed_c10d._dump_fr_trace_json``,
gloo included in torch 2.13) tells the same and which collective is in flight
(``retired``), but its record is a JSON text of every recent collective: too
much to parse ten times a second, so :func:`pending` reads it only to name one.
"""

from __future__ import annotations

import json
import logging
from typing import Any

log = logging.getLogger(__name__)


def counts() -> dict[Any, int]:
    """Every group this process has, with the number of collectives its backend started so far."""
    import torch.distributed as dist

    if not dist.is_available() or not dist.is_initialized():
        return {}
    out = {}
    for group in list(getattr(dist.distributed_c10d._world, "pg_names", {})):
        try:
            out[group] = int(group._get_sequence_number_for_group())
        except (AttributeError, RuntimeError):
            continue  # a backend that does not count
    return out


class Since:
    """The groups' counts at one moment (a cell's start); :meth:`moved` says whether a collective started since."""

    def __init__(self) -> None:
        self.at = counts()

    def moved(self) -> bool:
        return any(n > self.at.get(group, 0) for group, n in counts().items())


def pending() -> list[str]:
    """The collectives torch's Flight Recorder holds as started and not completed (``gloo:all_gather``), if any."""
    try:
        import torch

        dump = torch._C._distributed_c10d._dump_fr_trace_json  # type: ignore[attr-defined]  # torch 2.13's, untyped
        text = dump(includeCollectives=True, onlyActive=True)
        entries = json.loads(text).get("entries", [])
    except (AttributeError, RuntimeError, TypeError, ValueError) as exc:
        log.debug("no flight record: %s", exc)
        return []
    return [str(e.get("profiling_name", "a collective")) for e in entries if not e.get("retired", True)]
