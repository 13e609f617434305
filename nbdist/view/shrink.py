"""A rank's cell record, shrunk to fit one store value, saying what was dropped and why.

The store refuses values over 8 MiB; nbdist keeps each rank's record under
:data:`~nbdist.config.MAX_VALUE_BYTES`. Rich forms go first, largest first:
a dropped image or HTML leaves its text form and a note in the bundle
(``nbdist/dropped``), which the table shows in the rank's column. Then long
text is cut, then outputs themselves. Nothing disappears without a note.
"""

from __future__ import annotations

import json
from dataclasses import dataclass
from typing import Any

from ..config import MAX_VALUE_BYTES

DROPPED = "nbdist/dropped"
SHORT_TEXT = 2000  # characters each text keeps when even the text forms are too large


def _size(n: int) -> str:
    return f"{n / 1e6:.1f} MB" if n >= 1e6 else f"{n / 1e3:.0f} kB"


def _plural(n: int, what: str) -> str:
    return f"{n:,} {what}" + ("" if n == 1 else "s")


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


@dataclass(frozen=True)
class Left:
    """What a rank's output left out between its head and its tail: lines, characters (of those lines, and of
    lines too long to keep), displays."""

    lines: int = 0
    chars: int = 0
    displays: int = 0

    def __add__(self, other: Left) -> Left:
        return Left(self.lines + other.lines, self.chars + other.chars, self.displays + other.displays)

    def __bool__(self) -> bool:
        return bool(self.lines or self.chars or self.displays)

    def note(self, whole: str = "") -> dict[str, Any]:
        """The note between head and tail: ``… [19,600 lines (590 kB) not shown: output truncated; …] …``."""
        if self.lines:
            parts = [_plural(self.lines, "line") + (f" ({_size(self.chars)})" if self.chars >= 1000 else "")]
        else:
            parts = [f"{self.chars:,} characters"] if self.chars else []
        if self.displays:
            parts.append(_plural(self.displays, "display"))
        more = f"; {whole}" if whole else ""
        return {"kind": "note", "text": f"… [{' and '.join(parts)} not shown: output truncated{more}] …"}



def _take(outs: list[dict[str, Any]], lines: int, chars: int,
          from_end: bool = False) -> tuple[list[dict[str, Any]], list[dict[str, Any]]]:
    """Up to ``lines`` lines and ``chars`` characters from the start (or the end) of ``outs``: (taken, the rest),
    each in order. A display or a note counts as a line; a line longer than the room keeps its start (its end)."""
    seq = list(reversed(outs)) if from_end else list(outs)
    taken: list[dict[str, Any]] = []
    rest: list[dict[str, Any]] = []
    for i, out in enumerate(seq):
        if lines <= 0 or chars <= 0:
            rest = seq[i:]
            break
        if out.get("kind") not in ("stdout", "stderr"):
            taken.append(out)
            lines -= 1
            continue
        pieces = str(out["text"]).splitlines(keepends=True)
        if from_end:
            pieces.reverse()
        k = used = 0
        while k < len(pieces) and k < lines and used < chars:
            used += len(pieces[k])
            k += 1
        if used > chars:  # the last line taken is longer than the room: cut within it
            over, line = used - chars, pieces[k - 1]
            pieces[k - 1 : k] = [line[over:], line[:over]] if from_end else [line[: len(line) - over],
                                                                                 line[len(line) - over :]]
            used = chars
        kept, left = pieces[:k], pieces[k:]
        if from_end:
            kept.reverse()
            left.reverse()
        if kept:
            taken.append({**out, "text": "".join(kept)})
        lines, chars = lines - k, chars - used
        if left:
            rest = [{**out, "text": "".join(left)}, *seq[i + 1 :]]
            break
    if from_end:
        taken.reverse()
        rest.reverse()
    return taken, rest


def count(outs: list[dict[str, Any]]) -> Left:
    """The lines, characters and displays in ``outs`` (notes are not output)."""
    lines = chars = displays = 0
    for out in outs:
        if out.get("kind") in ("stdout", "stderr"):
            text = str(out["text"])
            lines += text.count("\n")  # a piece of a line cut at both ends counts by its characters
            chars += len(text)
        elif out.get("kind") == "display":
            displays += 1
    return Left(lines, chars, displays)


def joined(outputs: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """Adjacent text of the same stream as one output (a head run and its tail continuation); empty text dropped."""
    result: list[dict[str, Any]] = []
    for out in outputs:
        if out["kind"] in ("stdout", "stderr") and not out.get("text"):
            continue
        if result and out["kind"] in ("stdout", "stderr") and result[-1]["kind"] == out["kind"]:
            result[-1] = {**result[-1], "text": result[-1]["text"] + out["text"]}
        else:
            result.append(out)
    return result


def head_tail(head: list[dict[str, Any]], tail: list[dict[str, Any]], left: Left, lines: int, chars: int,
              whole: str = "") -> list[dict[str, Any]]:
    """A rank's outputs as a table shows them: the first ``lines // 2`` lines of ``head`` and the last of ``tail``
    (within ``chars // 2`` characters each), with one note between that counts what was left out (``left``, which
    the log left out between ``head`` and ``tail`` already, and what this cut) and says where the ``whole`` output
    is. Nothing left out: no note."""
    shown_head, rest = _take(head, (lines + 1) // 2, (chars + 1) // 2)
    shown_tail, middle = _take([*rest, *tail], lines // 2, chars // 2, from_end=True)
    cut = left + count(middle)
    return joined([*shown_head, *([cut.note(whole)] if cut else []), *shown_tail])
