"""One rank's cell output in the order it was produced, bounded, as a notebook would show it.

Stream text and displays are kept in one list of items, interleaved as they
came. Consecutive text of one stream is one item. A carriage return rewinds
the current line, as a terminal and Jupyter do, so a progress bar keeps only
its latest state. The log keeps its head and its latest tail within a budget
of lines, characters and items, and counts what it left out in between
(:class:`nbdist.view.shrink.Left`). Writers are the kernel's main thread;
:meth:`OutputLog.snapshot` may be called from a watcher thread while the cell runs.

A write costs little (a ``print`` in a loop is a teaching classic): it is
appended to a pending batch, and the batch is split into lines, collapsed and
trimmed as a whole once it holds :data:`BATCH` characters, or when someone
looks. A log given a :class:`Spill` hands it the whole text too, from the
moment the log first leaves something out (what came before included): see
:mod:`nbdist.cell.wholeoutput`.
"""

from __future__ import annotations

import re
import threading
from collections import deque
from collections.abc import Callable
from typing import Any, Protocol

from ..config import MAX_FIELD_CHARS
from ..view.shrink import Left, head_tail, joined

MAX_ITEMS = 200  # outputs kept per cell and rank (head and tail), beyond which the middle is dropped
MAX_LINES = 500  # lines kept per cell and rank (head and tail): a table column of a flood shows its ends
BATCH = 32 * 1024  # characters written before the pending text is split into lines and trimmed
_REWOUND = re.compile(r"[^\n]*\r(?=[^\n])")  # text a later carriage return overwrote, on the same line


def collapse(text: str) -> str:
    """``text`` as a terminal would leave it: each carriage return erases its line so far."""
    text = text.replace("\r\n", "\n")
    return _REWOUND.sub("", text) if "\r" in text else text


class Spill(Protocol):
    """Where the whole output goes once the log leaves something out (a file of this rank's, for its cell)."""

    def write(self, text: str) -> None: ...

    def flush(self) -> None: ...


class _Stream:
    """One run of text from one stream: finished lines, and the line still being written."""

    def __init__(self, name: str) -> None:
        self.name = name
        self.lines: deque[str] = deque()
        self.line = ""
        self.chars = 0

    def text(self) -> str:
        return "".join(self.lines) + self.line.rstrip("\r")  # a bar that ended with "\r" shows its last state

    def as_output(self) -> dict[str, Any]:
        return {"kind": self.name, "text": self.text()}


class _Display:
    def __init__(self, data: dict[str, str], display_id: str | None) -> None:
        self.data, self.display_id, self.chars = data, display_id, 0

    def as_output(self) -> dict[str, Any]:
        return {"kind": "display", "data": self.data}


class OutputLog:
    """What a rank's cell printed and displayed, in order, within ``limit`` characters, ``items`` outputs and
    ``lines`` lines; ``spill()`` (if given) opens where the whole of it goes once that is not all of it, and
    ``whole`` says where that is, in the note between head and tail."""

    def __init__(self, limit: int = 2 * MAX_FIELD_CHARS, items: int = MAX_ITEMS, lines: int = MAX_LINES) -> None:
        self._half_chars, self._half_items = max(1, limit // 2), max(1, items // 2)
        self._head_lines_max, self._tail_lines_max = (lines + 1) // 2, max(1, lines // 2)
        self._lock = threading.Lock()
        self.spill: Callable[[], Spill] | None = None
        self.whole = ""
        self._sink: Spill | None = None
        self.clear()

    def clear(self) -> None:
        """Forget everything (a rank's ``clear_output()``); what went to the spill stays there."""
        with self._lock:
            self._pending: list[tuple[str, str]] = []
            self._pending_chars = 0
            self._raw: list[str] | None = [] if self._sink is None else None  # the whole text until it spills
            self._head: list[_Stream | _Display] = []
            self._head_chars = self._head_lines = 0
            self._head_full = False
            self._tail: deque[_Stream | _Display] = deque()
            self._tail_chars = self._tail_lines = 0
            self._left = Left()
            self.changes = 0  # bumped on every write: a reader can tell whether anything is new

    def write(self, name: str, text: str) -> None:
        """Stream text ("stdout" or "stderr")."""
        if not text:
            return
        with self._lock:
            self.changes += 1
            self._pending.append((name, text))
            self._pending_chars += len(text)
            if self._pending_chars > BATCH:
                self._flush()

    def display(self, data: dict[str, str], display_id: str | None = None, update: bool = False) -> None:
        """A display (a mime bundle); ``update`` replaces the earlier display with the same id, in place."""
        with self._lock:
            self._flush()
            self.changes += 1
            if update and display_id is not None:
                for item in (*self._head, *self._tail):
                    if isinstance(item, _Display) and item.display_id == display_id:
                        item.data = data
                        return
                return  # a notebook ignores an update of a display it does not show
            self._whole(f"{data.get('text/plain', '[a display]')}\n")
            self._add(_Display(data, display_id))
            self._trim()
            self._spill_if_cut()

    def _flush(self) -> None:
        """Take the pending writes in: each run of one stream as one piece of text, left pending until it is in.
        A stop (KeyboardInterrupt) that lands meanwhile leaves the runs not yet in for the next flush: one it cut
        half way may come twice, none is lost."""
        pending, i = self._pending, 0
        try:
            while i < len(pending):
                name, j = pending[i][0], i + 1
                while j < len(pending) and pending[j][0] == name:
                    j += 1
                text = "".join(t for _, t in pending[i:j])
                self._whole(text)
                self._take(name, text)
                i = j
        finally:
            del pending[:i]  # the runs that are in
            self._pending_chars = sum(len(t) for _, t in pending)
        if i:
            self._spill_if_cut()

    def _whole(self, text: str) -> None:
        if self._sink is not None:
            self._sink.write(text)
        elif self._raw is not None and self.spill is not None:
            self._raw.append(text)

    def _spill_if_cut(self) -> None:
        """Open the spill the first time the log leaves something out, and give it everything so far."""
        if self._sink is None and self.spill is not None and self._left:
            self._sink = self.spill()
            self._sink.write("".join(self._raw or []))
            self._raw = None

    def _take(self, name: str, text: str) -> None:
        last = self._tail[-1] if self._tail else (self._head[-1] if self._head and not self._head_full else None)
        if not isinstance(last, _Stream) or last.name != name:
            last = _Stream(name)
            self._add(last)
        in_head = not self._tail or last is not self._tail[-1]
        old, last.line = last.line, ""  # the unfinished line is taken again, with what follows it
        last.chars -= len(old)
        if in_head:
            self._head_chars -= len(old)
        else:
            self._tail_chars -= len(old)
        text = old + text
        text = collapse(text) if "\r" in text else text
        parts = text.split("\n")
        partial = parts.pop()
        if in_head:
            parts, partial = self._into_head(last, parts, partial)
            if not self._head_full:
                return
            last = _Stream(name)
            self._tail.append(last)
        self._into_tail(last, parts, partial)
        self._trim()

    def _into_head(self, item: _Stream, parts: list[str], partial: str) -> tuple[list[str], str]:
        """Keep in the head what fits there; return the lines and the unfinished line that do not."""
        room = self._half_chars - self._head_chars
        n = 0
        while n < len(parts) and self._head_lines < self._head_lines_max:
            line = parts[n] + "\n"
            if len(line) > room:  # a line too long for the head: its start here, the rest in the tail
                item.lines.append(line[:room])
                parts[n] = line[room:-1]
                self._add_head(item, room, 1)
                self._head_full = True
                return parts[n:], partial
            item.lines.append(line)
            self._add_head(item, len(line), 1)
            room -= len(line)
            n += 1
        if n < len(parts) or self._head_lines >= self._head_lines_max:
            self._head_full = True
            return parts[n:], partial
        item.line, partial = partial[:room], partial[room:]
        self._add_head(item, len(item.line), 0)
        self._head_full = bool(partial)
        return [], partial

    def _add_head(self, item: _Stream, chars: int, lines: int) -> None:
        item.chars += chars
        self._head_chars += chars
        self._head_lines += lines

    def _into_tail(self, item: _Stream, parts: list[str], partial: str) -> None:
        keep = self._tail_lines_max
        if len(parts) > keep:  # a batch longer than the tail: what it pushes out is left out at once
            gone = parts[: len(parts) - keep]
            parts = parts[len(parts) - keep :]
            self._left += Left(len(gone) + len(item.lines), sum(map(len, gone)) + len(gone) + item.chars)
            self._tail_chars -= item.chars
            self._tail_lines -= len(item.lines)
            item.lines.clear()
            item.chars = 0
        lines = [p + "\n" for p in parts]
        added = sum(map(len, lines)) + len(partial)
        item.lines.extend(lines)
        item.line = partial
        item.chars += added
        self._tail_chars += added
        self._tail_lines += len(lines)

    def _add(self, item: _Stream | _Display) -> None:
        if not self._head_full and len(self._head) < self._half_items:
            self._head.append(item)
        else:
            self._head_full = True
            self._tail.append(item)

    def _trim(self) -> None:
        tail = self._tail
        while tail and (len(tail) > self._half_items or self._tail_lines > self._tail_lines_max
                        or self._tail_chars > self._half_chars):
            first = tail[0]
            if len(tail) > 1 and (isinstance(first, _Display) or len(tail) > self._half_items or not first.lines):
                tail.popleft()
                if isinstance(first, _Display):
                    self._left += Left(displays=1)
                    continue
                self._tail_chars -= first.chars
                self._tail_lines -= len(first.lines)
                self._left += Left(len(first.lines), first.chars)
            elif isinstance(first, _Display):
                break
            elif first.lines:
                line = first.lines.popleft()
                first.chars -= len(line)
                self._tail_chars -= len(line)
                self._tail_lines -= 1
                self._left += Left(1, len(line))
            else:  # one unfinished line longer than the tail: keep its end
                excess = self._tail_chars - self._half_chars
                first.line = first.line[excess:]
                first.chars -= excess
                self._tail_chars -= excess
                self._left += Left(chars=excess)
                break

    def snapshot(self, lines: int | None = None, chars: int | None = None) -> list[dict[str, Any]]:
        """The outputs so far, in order, with a note where the middle was left out; ``lines`` and ``chars``: at most
        so many of each, head and tail (the live table's narrower view of the same log)."""
        with self._lock:
            self._flush()
            if self._sink is not None:
                self._sink.flush()
            head = [item.as_output() for item in self._head]
            tail = [item.as_output() for item in self._tail]
            left = self._left
        if lines is None and chars is None:
            return joined([*head, *([left.note(self.whole)] if left else []), *tail])
        return head_tail(head, tail, left, lines or 2 * MAX_LINES, chars or 2 * self._half_chars, self.whole)


class StreamWriter:
    """What ``sys.stdout``/``sys.stderr`` write to during a cell: one stream of an :class:`OutputLog`."""

    def __init__(self, log: OutputLog, name: str) -> None:
        self.log, self.name = log, name
        self.write_to = log.write

    def write(self, text: str) -> int:
        self.write_to(self.name, text)
        return len(text)
