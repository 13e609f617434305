"""One rank's cell output in the order it was produced, bounded, as a notebook would show it.

Stream text and displays are kept in one list of items, interleaved as they
came. Consecutive text of one stream is one item. A carriage return rewinds
the current line, as a terminal and Jupyter do, so a progress bar keeps only
its latest state. The log keeps its head and its latest tail within a budget
of characters and of items, and says what it dropped in between. Writers are
the kernel's main thread; :meth:`OutputLog.snapshot` may be called from a
watcher thread while the cell runs.
"""

from __future__ import annotations

import re
import threading
from collections import deque
from typing import Any

from ..config import MAX_FIELD_CHARS

MAX_ITEMS = 200  # outputs kept per cell and rank (head and tail), beyond which the middle is dropped
_REWOUND = re.compile(r"[^\n]*\r(?=[^\n])")  # text a later carriage return overwrote, on the same line


def collapse(text: str) -> str:
    """``text`` as a terminal would leave it: each carriage return erases its line so far."""
    text = text.replace("\r\n", "\n")
    return _REWOUND.sub("", text) if "\r" in text else text


class _Stream:
    """One run of text from one stream: finished lines, and the line still being written."""

    def __init__(self, name: str) -> None:
        self.name = name
        self.parts: list[str] = []
        self.line = ""
        self.chars = 0

    def append(self, text: str) -> int:
        """Add text; returns the change in kept characters (negative when a carriage return rewound)."""
        before = self.chars
        text = self.line + text
        cut = text.rfind("\n")
        if cut >= 0:
            done = collapse(text[: cut + 1])
            self.parts.append(done)
            self.chars += len(done) - len(self.line)
            text = text[cut + 1 :]
            self.line = ""
        else:
            self.chars -= len(self.line)
        self.line = collapse(text)
        self.chars += len(self.line)
        return self.chars - before

    def text(self) -> str:
        return "".join(self.parts) + self.line.rstrip("\r")  # a bar that ended with "\r" shows its last state

    def split(self, keep: int) -> _Stream:
        """Keep the first ``keep`` characters here; return the rest as a new run."""
        whole = self.text()
        self.parts, self.line, self.chars = [whole[:keep]], "", keep
        rest = _Stream(self.name)
        rest.append(whole[keep:])
        return rest

    def trim_left(self, excess: int) -> None:
        whole = self.text()[excess:]
        self.parts, self.line, self.chars = [], "", 0
        self.append(whole)

    def as_output(self) -> dict[str, Any]:
        return {"kind": self.name, "text": self.text()}


class _Display:
    def __init__(self, data: dict[str, str], display_id: str | None) -> None:
        self.data, self.display_id, self.chars = data, display_id, 0

    def as_output(self) -> dict[str, Any]:
        return {"kind": "display", "data": self.data}


class OutputLog:
    """What a rank's cell printed and displayed, in order, within ``limit`` characters and ``items`` outputs."""

    def __init__(self, limit: int = 2 * MAX_FIELD_CHARS, items: int = MAX_ITEMS) -> None:
        self._half_chars, self._half_items = max(1, limit // 2), max(1, items // 2)
        self._lock = threading.Lock()
        self.clear()

    def clear(self) -> None:
        """Forget everything (a rank's ``clear_output()``)."""
        with self._lock:
            self._head: list[_Stream | _Display] = []
            self._head_chars = 0
            self._head_full = False
            self._tail: deque[_Stream | _Display] = deque()
            self._tail_chars = 0
            self._dropped_chars = 0
            self._dropped_items = 0
            self.changes = 0  # bumped on every write: a reader can tell whether anything is new

    def write(self, name: str, text: str) -> None:
        """Stream text ("stdout" or "stderr")."""
        if not text:
            return
        with self._lock:
            self.changes += 1
            last = self._tail[-1] if self._tail else (self._head[-1] if self._head and not self._head_full else None)
            if not isinstance(last, _Stream) or last.name != name:
                last = _Stream(name)
                self._add(last)
            delta = last.append(text)
            if self._tail and last is self._tail[-1]:
                self._tail_chars += delta
            else:
                self._head_chars += delta
                if self._head_chars > self._half_chars:
                    rest = last.split(last.chars - (self._head_chars - self._half_chars))
                    self._head_chars = self._half_chars
                    self._head_full = True
                    self._tail.append(rest)
                    self._tail_chars += rest.chars
            self._trim()

    def display(self, data: dict[str, str], display_id: str | None = None, update: bool = False) -> None:
        """A display (a mime bundle); ``update`` replaces the earlier display with the same id, in place."""
        with self._lock:
            self.changes += 1
            if update and display_id is not None:
                for item in (*self._head, *self._tail):
                    if isinstance(item, _Display) and item.display_id == display_id:
                        item.data = data
                        return
                return  # a notebook ignores an update of a display it does not show
            self._add(_Display(data, display_id))
            self._trim()

    def _add(self, item: _Stream | _Display) -> None:
        if not self._head_full and len(self._head) < self._half_items:
            self._head.append(item)
        else:
            self._head_full = True
            self._tail.append(item)

    def _trim(self) -> None:
        while len(self._tail) > self._half_items or (self._tail_chars > self._half_chars and len(self._tail) > 1):
            item = self._tail.popleft()
            self._tail_chars -= item.chars
            self._dropped_chars += item.chars
            self._dropped_items += isinstance(item, _Display)
        if self._tail_chars > self._half_chars:
            (item,) = self._tail
            if isinstance(item, _Stream):  # it is: displays count no characters
                excess = self._tail_chars - self._half_chars
                item.trim_left(excess)
                self._tail_chars = item.chars
                self._dropped_chars += excess

    def snapshot(self) -> list[dict[str, Any]]:
        """The outputs so far, in order, with a note where the middle was dropped."""
        with self._lock:
            outputs = [item.as_output() for item in self._head]
            if self._dropped_chars or self._dropped_items:
                parts = [f"{self._dropped_chars:,} characters"] if self._dropped_chars else []
                if self._dropped_items:
                    parts.append(f"{self._dropped_items:,} displays")
                outputs.append({"kind": "note",
                                "text": f"… [{' and '.join(parts)} not shown: output truncated] …"})
            outputs += [item.as_output() for item in self._tail]
        return _joined(outputs)


def _joined(outputs: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """Adjacent text of the same stream as one output (a head run and its tail continuation)."""
    joined: list[dict[str, Any]] = []
    for out in outputs:
        if not out.get("text") and out["kind"] in ("stdout", "stderr"):
            continue
        if joined and out["kind"] in ("stdout", "stderr") and joined[-1]["kind"] == out["kind"]:
            joined[-1] = {**joined[-1], "text": joined[-1]["text"] + out["text"]}
        else:
            joined.append(out)
    return joined


class StreamWriter:
    """What ``sys.stdout``/``sys.stderr`` write to during a cell: one stream of an :class:`OutputLog`."""

    def __init__(self, log: OutputLog, name: str) -> None:
        self.log, self.name = log, name

    def write(self, text: str) -> int:
        self.log.write(self.name, text)
        return len(text)
