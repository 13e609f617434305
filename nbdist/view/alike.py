"""When two ranks' errors are one: the same text once what is each rank's own is taken out.

A traceback from every rank names its kernel's temporary file of the cell (``/tmp/ipykernel_<pid>/<n>.py``),
and nbdist's own messages name the rank they come from (``rank 3 (vm, pid 4242) was still running ...``) and
say how long or since when as each rank saw it (``no heartbeat for 6 s``, ``idle since 12:03:04``). :func:`key`
takes out exactly these: the pid in the cell's file name, the phrase that names the text's own rank, the times in
nbdist's own wording (:data:`TIMES`) and clock times. Anything else stays: another rank named, a differing number
(a user's ``after 5 s`` too), a different line are different errors. :func:`merge` writes a group's one text, its
own-rank phrase written for the group (``each of ranks 0-6 (vm, pids 11, 12, 13, 14, …)``) and each time that
differs as the members' range (``no heartbeat for 5–7 s``).

Pure: text in, text out (the same for a piece's text and for its escaped HTML).
"""

from __future__ import annotations

import re
from collections.abc import Sequence

from .. import ranksets

# nbdist's own words for a rank (World.describe): "rank 3 (vm, pid 4242)", or "(?, pid ?)" when not known.
_RANK_PHRASE = re.compile(r"\brank (\d+) \(([^,()\n]*), pid (\d+|\?)\)")
_BY = "by "  # "stopped by rank 0 (vm, pid 100) with %dist_stop": whoever did it, the same on every rank
_CELL_FILE = re.compile(r"([/\\])ipykernel_\d+([/\\])")  # ipykernel's <tmp>/ipykernel_<pid>/<hash>.py
_OWN = "\0its own rank\0"
_TIME = "\0a time\0"
# The times each rank saw for itself: the value alone, its words kept. nbdist's own durations, as its writers
# word them (a change there must change this), and any clock time. A bare "5 s" may be the user's: not here.
TIMES = re.compile(
    r"(?<=no heartbeat for )\d+(?= s\b)"  # world/liveness.py: "rank 3 (...) stopped responding: no heartbeat for 6 s"
    r"|(?<=, )\d+(?= s ago\b)"  # world/notes.py, a missing rank in a wait's message: "last: running cell 4, 5 s ago"
    # a clock time, alone (notes.py's "idle since 12:03:04") or in a date (a log line's timestamp)
    r"|\b(?:\d{4}-\d\d-\d\d[T ])?(?:[01]?\d|2[0-3]):[0-5]\d:[0-5]\d(?:[.,]\d+)?\b")
_CLOCK = re.compile(r"(\d+):(\d+):(\d+)(?:[.,](\d+))?$")
PIDS_SHOWN = 4  # a group's pids listed, then "…"
HOSTS_SHOWN = 3  # a group's hosts listed, else counted


def key(text: str, rank: int) -> str:
    """``text`` with the cell file's pid, the phrase naming ``rank`` itself and nbdist's times taken out: equal keys,
    one group."""
    text = _CELL_FILE.sub(r"\1ipykernel_\2", text)
    text = _RANK_PHRASE.sub(lambda m: _OWN if _own(m, rank) else m[0], text)
    return TIMES.sub(_TIME, text)


def merge(texts: Sequence[str], ranks: Sequence[int]) -> str:
    """One text for the group whose members (``ranks``, in order) wrote ``texts`` of equal :func:`key`: the first
    member's, each phrase that names its own rank written for the whole group, each time that differs written as
    the members' range (:func:`_times`). Texts that are equal, or that differ only in a cell file's name, give the
    first as it is."""
    first = texts[0]
    if len(texts) < 2 or all(text == first for text in texts[1:]):
        return first
    merged = _times(texts)
    found = [next((m for m in _RANK_PHRASE.finditer(text) if _own(m, rank)), None)
             for text, rank in zip(texts, ranks, strict=True)]
    own = [m for m in found if m is not None]
    if found[0] is None:  # no phrase names the first member: nothing to write for the group
        return merged
    hosts = list(dict.fromkeys(m[2] for m in own))
    pids = [m[3] for m in own]
    host = ", ".join(hosts) if len(hosts) <= HOSTS_SHOWN else f"{len(hosts)} hosts"
    pid = ", ".join(pids[:PIDS_SHOWN]) + (", …" if len(pids) > PIDS_SHOWN else "")
    phrase = f"each of {ranksets.ranks_text(ranks)} ({host}, pids {pid})"
    return _RANK_PHRASE.sub(lambda m: phrase if _own(m, ranks[0]) else m[0], merged)


def _own(m: re.Match[str], rank: int) -> bool:
    """Whether the phrase ``m`` names the text's own ``rank``: its number, and not after "by", which names whoever
    did something to every rank (rank 0's own "stopped by rank 0 (…)" is every rank's)."""
    return int(m[1]) == rank and m.string[max(0, m.start() - len(_BY)):m.start()] != _BY


def _times(texts: Sequence[str]) -> str:
    """The first text with each of its :data:`TIMES` written for all the texts: the value where they agree, else
    their range, earliest to latest (``no heartbeat for 5–7 s``, ``idle since 12:03:04–12:03:09``).

    A range, rather than the first member's value marked as its own: it is true of every member, and the sentence
    keeps nbdist's words around it. Texts whose times do not pair up one to one give the first as it is."""
    found = [TIMES.findall(text) for text in texts]
    if not found[0] or any(len(times) != len(found[0]) for times in found[1:]):
        return texts[0]
    each = iter(zip(*found, strict=True))
    return TIMES.sub(lambda m: _span(next(each)), texts[0])


def _span(values: Sequence[str]) -> str:
    low, high = min(values, key=_order), max(values, key=_order)
    if _order(low) == _order(high):
        return values[0]
    day, _ = _order(high)
    return f"{low}–{high.removeprefix(day) if day == _order(low)[0] else high}"  # one day: said once


def _order(value: str) -> tuple[str, float]:
    """A time's place in time: (its date, as written, or ""; its seconds, into the day for a clock time)."""
    clock = _CLOCK.search(value)
    if clock is None:
        return "", float(value)
    h, m, s, fraction = clock.groups()
    return value[:clock.start()], int(h) * 3600 + int(m) * 60 + float(f"{s}.{fraction or 0}")
