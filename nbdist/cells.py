"""The %%collective protocol for one cell on one rank.

1. Publish this rank's source; meet the others (barrier "in").
2. Refuse, on every rank, if the sources differ (unless allowed).
3. (Re)build the process group if this generation has none.
4. Run the body with a :class:`~nbdist.watch.CellWatch` beside it and the
   collectives fingerprinted (:mod:`nbdist.fingerprint`).
5. Publish the capture and any failure; meet again (barrier "out"); read everyone's capture.
"""

from __future__ import annotations

import difflib
import hashlib
import json
from dataclasses import dataclass
from typing import Any

from . import capture
from .config import MAX_VALUE_BYTES
from .errors import (
    CellMismatchError,
    CollectiveError,
    NbdistError,
    PeerFailedError,
    PeerLostError,
    StoreConnectionError,
)
from .fingerprint import Checker, raise_if_failed
from .store import StoreClient
from .watch import CellWatch, publish_failure
from .world import BarrierRefused, World

MAX_SOURCE_CHARS = 64 * 1024


@dataclass
class Outcome:
    """What a cell produced on every rank, and why it was cut short, if it was."""

    number: int
    captures: list[dict[str, Any] | None]
    reason: dict[str, Any] | None = None


def compare_sources(world: World, cell: str) -> str | None:
    """Why the ranks may not run this cell (they entered it with different code), or None."""
    keys = [world.key(f"{cell}/src/{i}") for i in range(world.world_size)]
    sources = [json.loads(t) for t in world.client.multi_get(keys)]
    groups: dict[str, list[int]] = {}
    for i, src in enumerate(sources):
        groups.setdefault(src["hash"], []).append(i)
    if len(groups) == 1:
        return None
    (first, *others) = groups.values()
    parts = []
    for ranks in others:
        diff = difflib.unified_diff(
            sources[first[0]]["code"].splitlines(), sources[ranks[0]]["code"].splitlines(),
            f"rank(s) {', '.join(map(str, first))}", f"rank(s) {', '.join(map(str, ranks))}", lineterm="", n=1,
        )
        parts.append("\n".join(diff))
    who = "; ".join(f"rank(s) {', '.join(map(str, r))} ran version {k + 1}" for k, r in enumerate(groups.values()))
    return (
        f"the ranks entered this %%collective with different code ({who}); nothing ran. "
        "Run the same cell in every notebook, or use %%collective --allow-different on purpose.\n"
        + "\n".join(parts)
    )


def run(
    world: World,
    shell: Any,
    source: str,
    timeout: float,
    watch_client: StoreClient,
    ensure_process_group: Any,
    check: bool = True,
    same_code: bool = True,
) -> Outcome:
    """Run ``source`` on this rank in lockstep with the others (see the module docstring)."""
    n, cell = world.next_name("cell")
    label = f"%%collective #{n}"
    digest = hashlib.sha256(source.encode()).hexdigest()
    world.client.set_json(world.key(f"{cell}/src/{world.rank}"),
                          {"hash": digest, "code": source[:MAX_SOURCE_CHARS]})
    try:
        world.barrier(f"{cell}/in", timeout, f"{label} (start)",
                      verdict=(lambda: compare_sources(world, cell)) if same_code else None)
    except BarrierRefused as exc:
        raise CellMismatchError(str(exc)) from None
    ensure_process_group()
    world.note(f"running {label}", cell=n)
    with CellWatch(world, watch_client, cell) as watch:
        checker = Checker(world, cell, timeout, compare=check, on_tick=lambda: raise_if_failed(world, cell))
        with checker:
            cap = capture.run_cell(shell, source)
    cap["rank"] = world.rank
    cap["collectives"] = checker.count
    if watch.interrupted and cap["error"] is not None:
        cap["error"]["interrupted"] = True
    reason = watch.reason
    if reason is None and cap["error"] is not None:
        error = cap["error"]
        kind = "interrupted" if error.get("interrupted") else "error"
        message = (f"{world.describe(world.rank)} interrupted its cell" if kind == "interrupted"
                   else f"{world.describe(world.rank)} raised {error['ename']}: {error['evalue']}")
        first = publish_failure(world.client, world, cell, {"rank": world.rank, "kind": kind, "message": message})
        if first["rank"] != world.rank:
            reason = first  # another rank failed first; this rank's error followed from it
    if reason is not None:
        cap["cancelled"] = reason.get("message", "")
    world.client.set(world.key(f"{cell}/out/{world.rank}"), fit(cap))
    keys = [world.key(f"{cell}/out/{i}") for i in range(world.world_size)]
    try:
        world.barrier(f"{cell}/out", timeout, f"{label} (end)")
    except (NbdistError, KeyboardInterrupt) as exc:
        exc.outcome = Outcome(n, [world.client.get_json_if(k) for k in keys], reason)  # type: ignore[attr-defined]
        raise
    world.note(f"finished {label}", cell=n)
    return Outcome(n, [json.loads(t) for t in world.client.multi_get(keys)], reason)


def fit(cap: dict[str, Any], limit: int | None = None) -> str:
    """The capture as JSON, shrunk below the store's value limit."""
    limit = MAX_VALUE_BYTES if limit is None else limit
    text = json.dumps(cap)
    if len(text) <= limit:
        return text
    cap = {**cap, "displays": [{"text/plain": d.get("text/plain", "[image]")} for d in cap["displays"]]}
    text = json.dumps(cap)
    if len(text) <= limit:
        return text
    cap["displays"] = [{"text/plain": f"[{len(cap['displays'])} display outputs dropped: too large]"}]
    return json.dumps(cap)


def error_for(world: World, outcome: Outcome) -> BaseException | None:
    """The error this rank's cell must end with, if any (after the table is shown)."""
    captures = outcome.captures
    own = (captures[world.rank] or {}).get("error")
    if own and own.get("interrupted"):
        return KeyboardInterrupt()
    reason = outcome.reason
    if reason is not None and reason.get("rank") != world.rank:
        kinds = {"lost": PeerLostError, "server": StoreConnectionError}
        return kinds.get(reason.get("kind"), PeerFailedError)(
            f"{reason['message']} (this rank's cell was stopped; its column shows where)"
        )
    if own:
        return CollectiveError(f"{world.describe(world.rank)} raised {own['ename']}: {own['evalue']}",
                               own["traceback"])
    failed = [(i, c["error"]) for i, c in enumerate(captures) if c and c.get("error")]
    if not failed:
        return None
    if any(e.get("interrupted") for _, e in failed):
        who = ", ".join(world.describe(i) for i, e in failed if e.get("interrupted"))
        return PeerFailedError(f"{who} interrupted its cell")
    names = "; ".join(f"{world.describe(i)} raised {e['ename']}: {e['evalue']}" for i, e in failed)
    return CollectiveError(f"{names} (traceback in its column above)")
