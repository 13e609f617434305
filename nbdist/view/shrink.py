"""A rank's cell record, shrunk to fit one store value, saying what was dropped and why.

The store refuses values over 8 MiB; nbdist keeps each rank's record under
:data:`~nbdist.config.MAX_VALUE_BYTES`. Rich forms go first, largest first:
a dropped image or HTML leaves its text form and a note in the bundle
(``nbdist/dropped``), which the table shows in the rank's column. Then long
text is cut, then outputs themselves. Nothing disappears without a note.
"""

from __future__ import annotations

import json
from typing import Any

from ..config import MAX_VALUE_BYTES

DROPPED = "nbdist/dropped"
SHORT_TEXT = 2000  # characters each text keeps when even the text forms are too large


def _size(n: int) -> str:
    return f"{n / 1e6:.1f} MB" if n >= 1e6 else f"{n / 1e3:.0f} kB"


def _bundles(record: dict[str, Any]) -> list[dict[str, Any]]:
    bundles = [o["data"] for o in record.get("outputs", []) if o.get("kind") == "display" and o.get("data")]
    return bundles + ([record["result"]] if record.get("result") else [])


def fit(record: dict[str, Any], limit: int | None = None) -> str:
    """``record`` as JSON of at most ``limit`` bytes (default: the store's cap for one value)."""
    limit = MAX_VALUE_BYTES if limit is None else limit
    text = json.dumps(record)
    if len(text) <= limit:
        return text
    record = json.loads(text)  # a copy to shrink
    why = f"this rank's output was over nbdist's {_size(limit)} limit per cell"
    rich = sorted(((len(v), mime, b) for b in _bundles(record) for mime, v in b.items()
                   if mime not in ("text/plain", DROPPED) and isinstance(v, str)), key=lambda x: -x[0])
    excess = len(text) - limit
    for size, mime, bundle in rich:
        if excess <= 0:
            break
        del bundle[mime]
        note = f"[{mime}, {_size(size)}, not shown: {why}]"
        bundle[DROPPED] = f"{bundle[DROPPED]} {note}" if bundle.get(DROPPED) else note
        excess -= size
    text = json.dumps(record)
    if len(text) <= limit:
        return text
    for out in record.get("outputs", []):  # the text forms themselves are too long
        if isinstance(out.get("text"), str) and len(out["text"]) > SHORT_TEXT:
            cut = len(out["text"]) - SHORT_TEXT
            out["text"] = out["text"][:SHORT_TEXT] + f"\n… [{cut:,} characters not shown: {why}]"
    for bundle in _bundles(record):
        plain = bundle.get("text/plain")
        if isinstance(plain, str) and len(plain) > SHORT_TEXT:
            bundle["text/plain"] = plain[:SHORT_TEXT] + f"\n… [not shown: {why}]"
    text = json.dumps(record)
    if len(text) <= limit:
        return text
    n = len(record.get("outputs", []))
    record["outputs"] = [{"kind": "note", "text": f"[{n} outputs not shown: {why}]"}]
    if record.get("result"):
        record["result"] = {"text/plain": f"[not shown: {why}]"}
    return json.dumps(record)
