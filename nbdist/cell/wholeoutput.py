"""A rank's whole output of a cell, kept on its own disk once its table column leaves some of it out.

The table shows each rank's head and latest lines (:mod:`nbdist.cell.outputlog`). The first time a
cell's log leaves something out, it opens this rank's file for the cell and writes everything from
the start; from then on each batch it takes in. The file is this rank's, on this rank's host, in a
private folder of this kernel's (``<tmp>/nbdist-output-<uid>/<pid>/``): at most :data:`CELL_BYTES` a
cell (what comes after is counted, not kept, and the record says so) and :data:`KERNEL_BYTES` in all
(the oldest cells' files go first). The capture record names the file, its host and its size
(``kept``); ``nbdist.rank_output(k, full=True)`` reads it where that host's disk is this notebook's
(a driven world's workers, peers on one machine), and elsewhere asks rank k for it through the store
(:mod:`nbdist.cell.wholeask`). ``%dist_destroy`` and the kernel's exit remove the folder.
"""

from __future__ import annotations

import contextlib
import logging
import os
import shutil
import socket
import tempfile
from collections.abc import Callable
from dataclasses import replace
from pathlib import Path
from typing import Any

log = logging.getLogger(__name__)

CELL_BYTES = 64 * 1024 * 1024  # a rank's whole output of one cell kept on disk, at most
KERNEL_BYTES = 512 * 1024 * 1024  # every kept cell of this kernel together, at most: the oldest go first


def folder(pid: int | None = None) -> Path:
    """This kernel's folder of kept outputs."""
    uid = os.getuid() if hasattr(os, "getuid") else 0
    return Path(tempfile.gettempdir()) / f"nbdist-output-{uid}" / str(os.getpid() if pid is None else pid)


class WholeFile:
    """One rank's whole output of one cell, written as it comes, up to ``cap`` characters."""

    def __init__(self, path: Path, cap: int = CELL_BYTES) -> None:
        self.path, self.cap = path, cap
        self.chars = self.lines = self.written = 0
        self._file = open(path, "w", encoding="utf-8", errors="replace")  # noqa: SIM115 (closed by close())

    def write(self, text: str) -> None:
        self.chars += len(text)
        self.lines += text.count("\n")
        room = self.cap - self.written
        if room > 0 and not self._file.closed:
            self._file.write(text[:room])
            self.written += min(room, len(text))

    def flush(self) -> None:
        if not self._file.closed:
            self._file.flush()

    def close(self) -> None:
        self._file.close()

    def record(self) -> dict[str, Any]:
        """What the capture record says of it (``kept``)."""
        record: dict[str, Any] = {"path": str(self.path), "host": socket.gethostname(), "chars": self.chars,
                                  "lines": self.lines}
        if self.written < self.chars:
            record["capped"] = (f"only its first {self.cap // (1024 * 1024)} MB were kept on disk "
                                f"({self.chars - self.written:,} characters more were not)")
        return record


class Keeper:
    """This kernel's kept outputs: one file per cell, the newest open; a budget for all of them."""

    def __init__(self, root: Path | None = None, cell_cap: int = CELL_BYTES, total_cap: int = KERNEL_BYTES) -> None:
        self.root = folder() if root is None else root
        self.cell_cap, self.total_cap = cell_cap, total_cap
        self.current: WholeFile | None = None

    def open(self, cell: str, rank: int) -> WholeFile:
        """A new file for ``cell`` on ``rank`` (the previous one is closed; the oldest go while over budget)."""
        self._close()
        if not self.root.exists():  # the first file of this kernel: the folders of killed kernels go
            remove_dead(self.root.parent)
        self.root.mkdir(parents=True, exist_ok=True, mode=0o700)
        self._prune(self.total_cap - self.cell_cap)
        self.current = WholeFile(self.root / f"{cell.replace('/', '-')}-rank{rank}.txt", self.cell_cap)
        return self.current

    def _prune(self, budget: int) -> None:
        files = sorted(self.root.glob("*.txt"), key=lambda p: p.stat().st_mtime)
        total = sum(p.stat().st_size for p in files)
        for path in files:
            if total <= budget:
                break
            total -= path.stat().st_size
            path.unlink(missing_ok=True)

    def _close(self) -> None:
        if self.current is not None:
            self.current.close()
            self.current = None

    def clear(self) -> None:
        """Remove every kept output of this kernel (``%dist_destroy``, the kernel's exit); idempotent."""
        self._close()
        shutil.rmtree(self.root, ignore_errors=True)

    def body(self, run_body: Callable[[Any], Any]) -> Callable[[Any], Any]:
        """``run_body`` (:func:`nbdist.cell.cells.watched_body`), its log spilling whole into this rank's file for
        the cell once its table leaves some out, and its capture naming that file (``kept``)."""
        def body(b: Any) -> Any:
            self._close()
            rank = b.world.rank
            b.output.spill = lambda: self.open(b.cell, rank)
            b.output.whole = f"the whole output: nbdist.rank_output({rank}, full=True)"
            cap, reason, interrupted = run_body(b)
            kept = self.current
            if kept is not None:
                kept.flush()
                cap = replace(cap, kept=kept.record())
            return cap, reason, interrupted
        return body


class WholeOutput(str):
    """A rank's whole output of a cell, as text; shown short (printing it shows it all)."""

    rank: int

    def __new__(cls, text: str, rank: int) -> WholeOutput:
        self = super().__new__(cls, text)
        self.rank = rank
        return self

    def __repr__(self) -> str:
        lines = self.count("\n") + (0 if not self or self.endswith("\n") else 1)
        return (f"<rank {self.rank}'s whole output: {lines:,} lines, {len(self):,} characters; "
                "print() it, or .splitlines()>")

    def _repr_pretty_(self, p: Any, cycle: bool) -> None:
        p.text(repr(self))


class Elsewhere(LookupError):
    """The kept file is on another host's disk (``path``): ask that rank for it (:mod:`nbdist.cell.wholeask`)."""

    def __init__(self, message: str, path: str) -> None:
        super().__init__(message)
        self.path = path


def read(capture: Any, rank: int, where: str) -> WholeOutput:
    """Rank ``rank``'s whole output of the cell ``capture`` records, read from its kept file, or from the
    record itself when nothing was left out; ``where``: the rank, as messages name it. Raises ``LookupError``
    saying why it cannot be read here (:class:`Elsewhere`: the file is on another host)."""
    if capture is None:
        raise LookupError(f"{where} sent no record of this cell")
    kept = capture.kept
    if kept is None:  # nothing was left out: the record is the whole output
        return WholeOutput("".join(o["text"] for o in capture.outputs if o["kind"] in ("stdout", "stderr")), rank)
    host, here = kept["host"], socket.gethostname()
    if host != here:
        raise Elsewhere(f"{where} keeps its whole output of this cell on its own host, {host}, at {kept['path']} "
                        f"({kept['lines']:,} lines); this notebook runs on {here}", kept["path"])
    try:
        with open(kept["path"], encoding="utf-8", errors="replace") as f:
            text = f.read()
    except FileNotFoundError:
        raise LookupError(f"{where}'s whole output of this cell is no longer kept ({kept['path']} was removed: the "
                          "rank left the world, or newer cells needed the room)") from None
    return finished(text, kept, rank)


def finished(text: str, kept: dict[str, Any], rank: int) -> WholeOutput:
    """A kept file's text as ``rank_output`` returns it: saying so at its end when the file was capped."""
    if kept.get("capped"):
        text += f"\n[nbdist: {kept['capped']}]\n"
    return WholeOutput(text, rank)


def remove_dead(root: Path | None = None) -> None:
    """Remove the folders of kernels that are gone (killed before they could clean up)."""
    base = folder().parent if root is None else root
    for path in base.glob("*") if base.is_dir() else []:
        if path.name.isdigit() and not _alive(int(path.name)):
            shutil.rmtree(path, ignore_errors=True)


def _alive(pid: int) -> bool:
    with contextlib.suppress(PermissionError):
        try:
            os.kill(pid, 0)
        except ProcessLookupError:
            return False
    return True
