"""The %%collective protocol for one cell on one rank.

1. Publish this rank's source, flags and process-group state; meet the others
   (barrier "in"). The last to arrive decides for everyone: refuse (the
   sources or flags differ), rebuild the process group first (a rank cannot
   trust it), or go.
2. Refuse, on every rank, if told to.
3. Rebuild the process group if told to (every rank at the same point).
4. Run the body with a :class:`~nbdist.watch.CellWatch` beside it and its
   collectives checked (:mod:`nbdist.fingerprint`).
5. Publish the capture, this rank's process-group state and any failure;
   meet again (barrier "out"); read everyone's capture. If the ranks' states
   show the group can no longer be trusted, it is rebuilt at the next cell.
"""

from __future__ import annotations

import difflib
import hashlib
import json
import traceback
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

from . import capture, errors, procgroup
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
REBUILD = "go:rebuild:"
# Errors that follow from a stop elsewhere (a refused or cut collective), not from this rank's own code.
_CONSEQUENCES = ("PeerFailedError", "DistBackendError", "DistNetworkError", "DistError")
_CUT_SIGNS = ("Connection closed by peer", "Connection reset by peer", "Broken pipe")


@dataclass
class Outcome:
    """What a cell produced on every rank, why it was cut short (if it was), and what the group needs."""

    number: int
    captures: list[dict[str, Any] | None]
    reason: dict[str, Any] | None = None
    rebuilt: str | None = None  # why the process group was rebuilt before this cell
    distrusted: str | None = None  # why it will be rebuilt at the next cell
    holders: list[str] = field(default_factory=list)  # names that hold the old group


def _flags_text(flags: dict[str, Any]) -> str:
    words = [f"--{k.replace('_', '-')}" for k, v in sorted(flags.items()) if v]
    return " ".join(words) or "no flags"


def start_verdict(world: World, cell: str) -> str:
    """What the last rank to arrive at a cell decides for every rank: "refused:…", "go:rebuild:…" or "go"."""
    keys = [world.key(f"{cell}/src/{i}") for i in range(world.world_size)]
    records = [json.loads(t) for t in world.client.multi_get(keys)]
    flags: dict[str, list[int]] = {}
    for i, rec in enumerate(records):
        flags.setdefault(_flags_text(rec["flags"]), []).append(i)
    if len(flags) > 1:
        who = "; ".join(f"rank(s) {', '.join(map(str, r))}: {text}" for text, r in flags.items())
        return ("refused:the ranks ran %%collective with different flags, which change how the cell runs "
                f"({who}); nothing ran. Use the same %%collective line in every notebook")
    if not records[0]["flags"].get("allow_different"):
        refusal = compare_sources(records)
        if refusal is not None:
            return f"refused:{refusal}"
    why = procgroup.verdict({i: rec["pg"] for i, rec in enumerate(records)})
    return f"{REBUILD}{why}" if why else "go"


def compare_sources(records: list[dict[str, Any]]) -> str | None:
    """Why the ranks may not run this cell (they entered it with different code), or None."""
    groups: dict[str, list[int]] = {}
    for i, rec in enumerate(records):
        groups.setdefault(rec["hash"], []).append(i)
    if len(groups) == 1:
        return None
    (first, *others) = groups.values()
    parts = []
    for ranks in others:
        diff = difflib.unified_diff(
            records[first[0]]["code"].splitlines(), records[ranks[0]]["code"].splitlines(),
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
    params: dict[str, list[str]],
    activate: Callable[[Checker | None], None],
    rebuild: Callable[[str], None],
    check: bool = True,
    same_code: bool = True,
    entered: Callable[[], None] | None = None,
) -> Outcome:
    """Run ``source`` on this rank in lockstep with the others (see the module docstring).

    ``activate`` hands the cell's checker to nbdist's wrappers (None when the
    body ends); ``rebuild(tag)`` rebuilds the process group on this rank.
    Whatever ends this rank's part early (the stop button anywhere in it, an
    error of nbdist's own) closes the cell's barriers, so no rank waits for it.
    ``entered`` is called once the cell has its turn (see :func:`abandon`).
    """
    n, cell = world.next_name("cell")
    try:
        if entered is not None:
            entered()
        return _run(world, n, cell, shell, source, timeout, watch_client, params, activate, rebuild, check, same_code)
    except StoreConnectionError:
        raise  # nobody can be told
    except BaseException as exc:
        interrupted = isinstance(exc, KeyboardInterrupt)
        try:
            close(world, cell, "interrupted its cell" if interrupted else f"stopped: {exc}", interrupted)
        except StoreConnectionError as lost:
            exc.add_note(f"(the other ranks could not be told: {lost})")
        raise


def close(world: World, cell: str, reason: str, interrupted: bool = False) -> None:
    """End this rank's part in ``cell`` early: the others stop waiting for it, with ``reason``."""
    publish_failure(world.client, world, cell, {"rank": world.rank, "message": f"{world.describe(world.rank)} {reason}",
                                                "kind": "interrupted" if interrupted else "error"})
    for barrier in ("in", "out"):
        world.close_barrier(f"{cell}/{barrier}", reason)


def abandon(world: World, reason: str, interrupted: bool = False) -> None:
    """A %%collective that failed before it reached the protocol still takes its turn, closed, so none waits."""
    _, cell = world.next_name("cell")
    close(world, cell, reason, interrupted)


def _run(world: World, n: int, cell: str, shell: Any, source: str, timeout: float, watch_client: StoreClient,
         params: dict[str, list[str]], activate: Callable[[Checker | None], None], rebuild: Callable[[str], None],
         check: bool, same_code: bool) -> Outcome:
    label = f"%%collective #{n}"
    digest = hashlib.sha256(source.encode()).hexdigest()
    state = world.pg.state() if world.pg is not None else {"ok": False, "why": "it has no process group yet"}
    world.client.set_json(world.key(f"{cell}/src/{world.rank}"), {
        "hash": digest, "code": source[:MAX_SOURCE_CHARS], "pg": state,
        "flags": {"no_check": not check, "allow_different": not same_code},
    })
    try:
        opened = world.barrier(f"{cell}/in", timeout, f"{label} (start)", verdict=lambda: start_verdict(world, cell))
    except BarrierRefused as exc:
        raise CellMismatchError(str(exc)) from None
    rebuilt = opened.removeprefix(REBUILD) if opened.startswith(REBUILD) else None
    if rebuilt is not None:
        rebuild(f"{n}")
    world.note(f"running {label}", cell=n)
    checker = Checker(world, cell, timeout, params, compare=check, on_tick=lambda: raise_if_failed(world, cell))
    with CellWatch(world, watch_client, cell, checker, label) as watch:
        activate(checker)
        try:
            cap = capture.run_cell(shell, source)
        finally:
            activate(None)
    reason = watch.reason
    try:
        record = _record(world, cap, checker, watch)
    except Exception as exc:  # nbdist's own bookkeeping failed: this rank's error, published at once
        record = _capture_failure(world, cap, exc)
    if reason is not None and reason.get("kind") == "server":
        # Nobody can be told and no barrier can be met: end now, with this rank's own column.
        if world.pg is not None:
            world.pg.distrust("the rendezvous server went away")
        failure = StoreConnectionError(reason.get("message", "the rendezvous server went away"))
        mine = [record if i == world.rank else None for i in range(world.world_size)]
        failure.outcome = Outcome(n, mine, reason, rebuilt)  # type: ignore[attr-defined]
        raise failure
    error = record["error"]
    if error is not None and reason is None:
        kind = "interrupted" if error.get("interrupted") else "error"
        message = (f"{world.describe(world.rank)} interrupted its cell" if kind == "interrupted"
                   else f"{world.describe(world.rank)} raised {error['ename']}: {error['evalue']}")
        first = publish_failure(world.client, world, cell, {"rank": world.rank, "kind": kind, "message": message})
        if first["rank"] != world.rank:
            reason = first  # another rank failed first
    if reason is not None and reason.get("rank") != world.rank:
        if error is not None:
            error["consequence"] = _is_consequence(error, checker)
        if error is None or error["consequence"]:
            record["cancelled"] = reason.get("message", "")
    world.client.set(world.key(f"{cell}/out/{world.rank}"), fit(record))
    keys = [world.key(f"{cell}/out/{i}") for i in range(world.world_size)]
    try:
        world.barrier(f"{cell}/out", timeout, f"{label} (end)")
    except (NbdistError, KeyboardInterrupt) as exc:
        if world.pg is not None:
            world.pg.distrust(f"the end of {label} was not reached by every rank")
        exc.outcome = Outcome(n, [world.client.get_json_if(k) for k in keys], reason, rebuilt)  # type: ignore[attr-defined]
        raise
    world.note(f"finished {label}", cell=n)
    outcome = Outcome(n, [json.loads(t) for t in world.client.multi_get(keys)], reason, rebuilt)
    distrusted = procgroup.verdict({i: (c or {}).get("pg") for i, c in enumerate(outcome.captures)})
    if distrusted is not None:
        if world.pg is not None:
            world.pg.distrust(distrusted)
        outcome.distrusted = distrusted
        outcome.holders = procgroup.holders(shell.user_ns)
    elif rebuilt is not None:
        outcome.holders = procgroup.holders(shell.user_ns)
    return outcome


def _record(world: World, cap: dict[str, Any], checker: Checker, watch: CellWatch) -> dict[str, Any]:
    """What this rank publishes about its cell: the capture, its collectives, its group's state."""
    record = {**cap, "rank": world.rank, "collectives": dict(checker.counts)}
    if watch.interrupted and record["error"] is not None:
        record["error"]["interrupted"] = True
    record["pg"] = world.pg.state() if world.pg is not None else {"ok": False, "why": "no process group"}
    fit(record)  # raises here, inside the guard, if anything cannot be published
    return record


def _is_consequence(error: dict[str, Any], checker: Checker) -> bool:
    """Whether an error followed from the cell being stopped (a refused or cut collective)."""
    if error["ename"] in _CONSEQUENCES or checker.failed_inside:
        return True
    return any(sign in str(error.get("evalue", "")) for sign in _CUT_SIGNS)


def _capture_failure(world: World, cap: dict[str, Any], exc: BaseException) -> dict[str, Any]:
    """A record for a rank whose capture could not be published, keeping what text it could."""
    text = "".join(traceback.format_exception(type(exc), exc, exc.__traceback__))
    record = {
        "stdout": str(cap.get("stdout", "")), "stderr": str(cap.get("stderr", "")), "result": None,
        "displays": [], "wall": float(cap.get("wall", 0.0)), "rank": world.rank, "collectives": {},
        "error": {"ename": "CaptureError", "evalue": f"nbdist could not capture this rank's output: {exc}",
                  "traceback": capture.truncate(text)},
        "pg": {"ok": False, "why": "its capture failed"},
    }
    json.dumps(record)
    return record


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
    if own and not own.get("consequence"):
        return _own_error(world, own)
    reason = outcome.reason
    if reason is not None and reason.get("rank") != world.rank:
        origin = reason.get("rank", -1)
        cause = (captures[origin] or {}).get("error") if 0 <= origin < len(captures) else None
        if cause and errors.by_name(cause["ename"]) is not None and not cause.get("consequence"):
            return errors.by_name(cause["ename"])(cause["evalue"])  # the same error on every rank
        kinds = {"lost": PeerLostError, "server": StoreConnectionError}
        return kinds.get(reason.get("kind"), PeerFailedError)(
            f"{reason['message']} (this rank's cell was stopped; its column shows where)"
        )
    if own:
        return _own_error(world, own)
    failed = [(i, c["error"]) for i, c in enumerate(captures) if c and c.get("error")]
    if not failed:
        return None
    if any(e.get("interrupted") for _, e in failed):
        who = ", ".join(world.describe(i) for i, e in failed if e.get("interrupted"))
        return PeerFailedError(f"{who} interrupted its cell")
    named = [e for _, e in failed if errors.by_name(e["ename"]) is not None and not e.get("consequence")]
    if named:
        return errors.by_name(named[0]["ename"])(named[0]["evalue"])
    names = "; ".join(f"{world.describe(i)} raised {e['ename']}: {e['evalue']}" for i, e in failed)
    return CollectiveError(f"{names} (traceback in its column above)")


def _own_error(world: World, own: dict[str, Any]) -> BaseException:
    cls = errors.by_name(own["ename"])
    if cls is not None:
        return cls(own["evalue"])  # nbdist's own error: the same class on every rank
    return CollectiveError(f"{world.describe(world.rank)} raised {own['ename']}: {own['evalue']}", own["traceback"])
