"""When two ranks' errors are one: the same text once what is each rank's own is taken out.

A traceback from every rank names its kernel's temporary file of the cell (``/tmp/ipykernel_<pid>/<n>.py``),
and nbdist's own messages name the rank they come from (``rank 3 (vm, pid 4242) was still running ...``).
:func:`key` takes out exactly these: the pid in the cell's file name, and the phrase that names the text's own
rank. Anything else stays: another rank named, a differing number, a different line are different errors.
:func:`merge` writes a group's one text, its own-rank phrase written for the group:
``each of ranks 0-6 (vm, pids 11, 12, 13, 14, …)``.

Pure: text in, text out (the same for a piece's text and for its escaped HTML).
"""

from __future__ import annotations

import re
from collections.abc import Sequence

from .. import ranksets

# nbdist's own words for a rank (World.describe): "rank 3 (vm, pid 4242)", or "(?, pid ?)" when not known.
_RANK_PHRASE = re.compile(r"\brank (\d+) \(([^,()\n]*), pid (\d+|\?)\)")
_CELL_FILE = re.compile(r"([/\\])ipykernel_\d+([/\\])")  # ipykernel's <tmp>/ipykernel_<pid>/<hash>.py
_OWN = "\0its own rank\0"
PIDS_SHOWN = 4  # a group's pids listed, then "…"
HOSTS_SHOWN = 3  # a group's hosts listed, else counted


def key(text: str, rank: int) -> str:
    """``text`` with the cell file's pid and the phrase naming ``rank`` itself taken out: equal keys, one group."""
    text = _CELL_FILE.sub(r"\1ipykernel_\2", text)
    return _RANK_PHRASE.sub(lambda m: _OWN if int(m[1]) == rank else m[0], text)


def merge(texts: Sequence[str], ranks: Sequence[int]) -> str:
    """One text for the group whose members (``ranks``, in order) wrote ``texts`` of equal :func:`key`: the first
    member's, each phrase that names its own rank written for the whole group. Texts that are equal, or that
    differ only in a cell file's name, give the first as it is."""
    first = texts[0]
    if len(texts) < 2 or all(text == first for text in texts[1:]):
        return first
    found = [next((m for m in _RANK_PHRASE.finditer(text) if int(m[1]) == rank), None)
             for text, rank in zip(texts, ranks, strict=True)]
    own = [m for m in found if m is not None]
    if found[0] is None:  # no phrase names the first member: nothing to write for the group
        return first
    hosts = list(dict.fromkeys(m[2] for m in own))
    pids = [m[3] for m in own]
    host = ", ".join(hosts) if len(hosts) <= HOSTS_SHOWN else f"{len(hosts)} hosts"
    pid = ", ".join(pids[:PIDS_SHOWN]) + (", …" if len(pids) > PIDS_SHOWN else "")
    phrase = f"each of {ranksets.ranks_text(ranks)} ({host}, pids {pid})"
    return _RANK_PHRASE.sub(lambda m: phrase if int(m[1]) == ranks[0] else m[0], first)
