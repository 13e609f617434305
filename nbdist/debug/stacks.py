"""Every rank's Python stacks, merged into one tree whose branches are labelled with rank sets.

A rank samples its own threads (:func:`capture`, from a background thread, as
py-spy would: ``sys._current_frames``) into plain records; the asker merges
every rank's records (:func:`merge`) and draws the tree (:func:`render`).
A frame of the notebook cell reads ``cell line 5: dist.all_reduce(t)``; the
frames of IPython and nbdist around a cell are left out (counted). Where
ranks part, each branch is headed by its rank set (``ranks 0-5,7 (7)``,
``rank 6``), largest first, as LLNL's STAT labels its merged trees, so the
tree stays as short as the number of different places, at 8 ranks or 64.
"""

from __future__ import annotations

import linecache
import os
import sys
import sysconfig
import threading
from collections.abc import Iterable
from dataclasses import dataclass, field
from types import FrameType
from typing import Any

from .. import ranksets
from ..view.tracebacks import is_cell

LABEL_TEXT = 80  # characters of a cell line's code shown in the tree
OUTER_FRAMES = 6  # frames kept of a thread that runs no cell and no nbdist code (innermost first)
_PACKAGE_DIR = os.path.realpath(os.path.dirname(os.path.dirname(__file__)))  # nbdist/
_STDLIB_DIR = os.path.realpath(sysconfig.get_paths()["stdlib"])
CELL, PYTHON, NATIVE, GAP = "cell", "py", "native", "gap"
NBDIST_RUN = 6  # a run of this many of nbdist's own frames or more shows its first and last three only


def short_path(path: str) -> str:
    """A file as a reader recognises it: ``torch/distributed/distributed_c10d.py``, ``nbdist/cell/cells.py``."""
    if path.startswith("<"):
        return path
    parts = path.split(os.sep)
    for marker in ("site-packages", "dist-packages"):
        if marker in parts:
            return "/".join(parts[len(parts) - parts[::-1].index(marker):])
    real = os.path.realpath(path)
    for base, name in ((_PACKAGE_DIR, "nbdist"), (_STDLIB_DIR, "")):
        if real.startswith(base + os.sep):
            return "/".join(filter(None, [name, os.path.relpath(real, base)]))
    return "/".join(parts[-2:])


@dataclass(frozen=True)
class Frame:
    """One frame as the tree shows it; ``kind`` is "cell", "py" or "native"."""

    file: str
    line: int
    func: str
    kind: str = PYTHON
    text: str = ""

    def label(self) -> str:
        if self.kind == GAP:
            return self.func
        if self.kind == CELL:
            inside = "" if self.func == "<module>" else f" in {self.func}()"
            text = self.text if len(self.text) <= LABEL_TEXT else self.text[: LABEL_TEXT - 1] + "…"
            return f"cell line {self.line}{inside}" + (f": {text}" if text else "")
        where = f"{self.file}:{self.line}" if self.line else self.file
        return f"{self.func}  ({where}){'  [native]' if self.kind == NATIVE else ''}"

    def record(self) -> list[Any]:
        return [self.file, self.line, self.func, self.kind, self.text]

    @classmethod
    def from_record(cls, record: list[Any]) -> Frame:
        file, line, func, kind, text = record
        return cls(str(file), int(line), str(func), str(kind), str(text))


def frame_of(filename: str, line: int, func: str, kind: str | None = None) -> Frame:
    """A frame from a file name as Python or py-spy gives it (a cell's text read from linecache)."""
    if is_cell(filename):
        return Frame("cell", line, func, CELL, linecache.getline(filename, line).strip())
    return Frame(short_path(filename), line, func, kind or PYTHON)


def trim(frames: list[Frame], internal: Iterable[bool]) -> tuple[list[Frame], int]:
    """The frames worth showing (outermost first) and how many outer ones were left out.

    From the cell's body: the outermost cell frame with no frame of nbdist (``internal``) between it and the
    innermost cell frame (a %%collective's body runs inside nbdist, below the cell line that calls the magic);
    else from the outermost frame of nbdist, as when a rank waits at a cell's end barrier; else the innermost few.
    """
    inside = list(internal)
    cells = [i for i, f in enumerate(frames) if f.kind == CELL]
    if cells:
        start = cells[-1]
        while start > 0 and not inside[start - 1]:
            start -= 1
        start = next(i for i in cells if i >= start)
    else:
        start = next((i for i, own in enumerate(inside) if own), max(0, len(frames) - OUTER_FRAMES))
    return frames[start:], start


IDLE = "no cell runs (the kernel waits for one)"


def _thread_record(name: str, main: bool, frames: list[Frame], internal: list[bool]) -> dict[str, Any]:
    if main and not any(internal) and all(f.kind != CELL for f in frames):
        return {"name": name, "main": main, "skipped": 0, "frames": [], "idle": True}
    kept, skipped = trim(frames, internal)
    kept = shorten(kept, internal[skipped:])
    return {"name": name, "main": main, "skipped": skipped, "frames": [f.record() for f in kept]}


def shorten(frames: list[Frame], internal: list[bool]) -> list[Frame]:
    """Each run of :data:`NBDIST_RUN` or more of nbdist's own frames as its first frame, ``… N frames of nbdist``
    and its last three (where nbdist waits, and on what)."""
    out: list[Frame] = []
    i = 0
    while i < len(frames):
        j = i
        while j < len(frames) and internal[j]:
            j += 1
        if j - i >= NBDIST_RUN:
            out += [frames[i], Frame("", 0, f"… {j - i - 4} frames of nbdist", GAP), *frames[j - 3:j]]
            i = j
        else:
            out.append(frames[i])
            i += 1
    return out


def capture(threads: bool = False, skip: Iterable[int] = ()) -> list[dict[str, Any]]:
    """This process's main thread (the cell's), and with ``threads`` the others, as records (no nbdist threads)."""
    main = threading.main_thread().ident
    names = {t.ident: t.name for t in threading.enumerate()}
    leave_out = set(skip)
    found: list[dict[str, Any]] = []
    for ident, top in sys._current_frames().items():  # noqa: SLF001 (a sample, as py-spy takes)
        name = names.get(ident, f"thread {ident}")
        if ident in leave_out or (ident != main and (not threads or name.startswith("nbdist-"))):
            continue
        frames, internal = [], []
        frame: FrameType | None = top
        while frame is not None:
            code = frame.f_code
            frames.append(frame_of(code.co_filename, frame.f_lineno or 0, code.co_name))
            internal.append(os.path.realpath(code.co_filename).startswith(_PACKAGE_DIR + os.sep))
            frame = frame.f_back
        frames.reverse()
        internal.reverse()
        found.append(_thread_record(name, ident == main, frames, internal))
    found.sort(key=lambda t: (not t["main"], t["name"]))
    return found


def from_pyspy(threads: list[dict[str, Any]], pid: int, want_all: bool) -> list[dict[str, Any]]:
    """``py-spy dump --json`` of this process as :func:`capture`'s records (native frames marked)."""
    main_tid = pid  # the main thread's OS id is the process id
    found = []
    for thread in threads:
        main = thread.get("os_thread_id") == main_tid or thread.get("thread_name") == "MainThread"
        name = str(thread.get("thread_name") or f"thread {thread.get('thread_id')}")
        if not main and (not want_all or name.startswith("nbdist-")):
            continue
        frames, internal = [], []
        for f in reversed(thread.get("frames") or []):  # py-spy lists the innermost first
            filename = str(f.get("filename") or "")
            native = f.get("module") is not None or not filename.endswith(".py")
            frames.append(frame_of(filename, int(f.get("line") or 0), str(f.get("name") or "?"),
                                   NATIVE if native else PYTHON))
            internal.append(not native and os.path.realpath(filename).startswith(_PACKAGE_DIR + os.sep))
        found.append(_thread_record(name, main, frames, internal))
    found.sort(key=lambda t: (not t["main"], t["name"]))
    return found


# --- the merged tree (pure) ----------------------------------------------------------------------

@dataclass
class Node:
    """A frame shared by ``ranks``; its children are the next frames, in the order first seen."""

    label: str
    ranks: set[int] = field(default_factory=set)
    children: dict[str, Node] = field(default_factory=dict)
    counts: list[int] = field(default_factory=list)  # the outer frames left out, where this node stands for them

    def text(self) -> str:
        if self.label != _SKIPPED:
            return self.label
        low, high = min(self.counts), max(self.counts)
        return f"… {low}{'' if low == high else f'-{high}'} outer frame(s) of IPython, nbdist or Python"


_SKIPPED = "\0skipped"  # one node for the left-out outer frames, however many each rank left out


def merge(per_rank: dict[int, list[dict[str, Any]]]) -> Node:
    """One tree of every rank's thread records; the root's children are threads ("the cell's thread", ...)."""
    root = Node("")
    for rank in sorted(per_rank):
        for thread in per_rank[rank]:
            head = "the cell's thread (main)" if thread["main"] else f"thread {thread['name']}"
            path = [head]
            if thread.get("idle"):
                path.append(IDLE)
            if thread.get("skipped"):
                path.append(_SKIPPED)
            path += [Frame.from_record(f).label() for f in thread["frames"]]
            node = root
            node.ranks.add(rank)
            for label in path:
                node = node.children.setdefault(label, Node(label))
                node.ranks.add(rank)
                if label == _SKIPPED:
                    node.counts.append(int(thread["skipped"]))
    return root


def _branches(node: Node) -> list[tuple[set[int], Node | None]]:
    ended = node.ranks - set().union(*(kid.ranks for kid in node.children.values()))
    found: list[tuple[set[int], Node | None]] = [(kid.ranks, kid) for kid in node.children.values()]
    if ended:
        found.append((ended, None))
    found.sort(key=lambda b: (-len(b[0]), min(b[0])))
    return found


def _chain(node: Node, prefix: str, world_size: int) -> list[str]:
    lines = []
    while True:
        lines.append(prefix + node.text())
        branches = _branches(node)
        if len(branches) == 1 and branches[0][1] is not None:
            node = branches[0][1]
            continue
        break
    if len(branches) == 1:  # every rank of this chain is innermost here
        return lines
    for i, (ranks, kid) in enumerate(branches):
        last = i == len(branches) - 1
        name = ranksets.name(ranks, world_size)
        lines.append(f"{prefix}{'└─' if last else '├─'} {name}{'' if kid is not None else ': here (innermost)'}")
        if kid is not None:
            lines += _chain(kid, prefix + ("   " if last else "│  "), world_size)
    return lines


def render(root: Node, world_size: int) -> list[str]:
    """The tree as text lines: each thread headed by the ranks it was seen on, branches by their rank sets."""
    lines = []
    for head in sorted(root.children.values(), key=lambda n: (not n.label.startswith("the cell's"), n.label)):
        lines.append(f"{head.label} · {ranksets.name(head.ranks, world_size)}")
        branches = _branches(head)
        if len(branches) == 1 and branches[0][1] is not None:
            lines += _chain(branches[0][1], "  ", world_size)
            continue
        for i, (ranks, kid) in enumerate(branches):
            last = i == len(branches) - 1
            lines.append(f"  {'└─' if last else '├─'} {ranksets.name(ranks, world_size)}"
                         f"{'' if kid is not None else ': no frames'}")
            if kid is not None:
                lines += _chain(kid, "  " + ("   " if last else "│  "), world_size)
    return lines
