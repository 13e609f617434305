"""The live table: a %%collective cell's table published early, updated in place while the cell runs.

Every half second, from 0.5 s into the body, each rank publishes what its
body produced so far (its :class:`~nbdist.cell.outputlog.OutputLog`, its first and
latest :data:`LIVE_LINES` lines: a flood shows its ends) and its state
under ``<cell>/live/<rank>``, when either changed, and counts it
(``live/n``; the first time it also lists itself in ``live/ranks``). A notebook
that shows the table reads that count every half second, and only when it
moved, the list and every listed part (one ``multi_get``): a constant number of
store operations, whatever the world's size. It updates one display in its own
notebook, by display id, when the table changed, at most :data:`LIVE_RATE` bytes a
second (:func:`next_show`). The table is the one
:func:`~nbdist.view.celltable.cell_table` draws at the end, with a state row
per rank; the final table replaces it. A cell that ends within 0.5 s
publishes nothing early. "running N s" is counted on this
notebook's clock from its own start of the body, which every rank begins
within moments of the others (they leave the start barrier together).
"""

from __future__ import annotations

import logging
import re
import sys
import time
import uuid
from collections.abc import Callable
from dataclasses import replace
from typing import Any

from ..errors import NbdistError
from ..view.celltable import cell_table
from ..view.shrink import fit
from ..view.tracebacks import is_cell
from ..world import keys
from ..world.capture_record import Capture
from ..world.records import LivePart, MalformedRecord
from ..world.world import World
from .outputlog import OutputLog

log = logging.getLogger(__name__)

LIVE_AFTER = 0.5  # seconds into the body before the first live table
LIVE_EVERY = 0.5  # at most this often, per notebook
LIVE_BYTES = 512 * 1024  # a rank's live record is cut to this; the final one may be larger
LIVE_LINES = 100  # lines of a rank's output the live table shows: its first and its latest (a flood's ends)
LIVE_CHARS = 16 * 1024  # characters of it, likewise
LIVE_RATE = 100_000  # bytes per second at most that the live table sends its notebook's front end


def next_show(now: float, sent: int) -> float:
    """When this notebook may update its live table again, having just sent ``sent`` bytes at ``now``: every
    :data:`LIVE_EVERY` s at most, and no more than :data:`LIVE_RATE` bytes a second (a large table waits longer)."""
    return now + max(LIVE_EVERY, sent / LIVE_RATE)


def cell_line(thread: int | None) -> int | None:
    """The line of the notebook cell that ``thread`` (the kernel's main thread) runs now, innermost; None: none."""
    frame = sys._current_frames().get(thread) if thread is not None else None  # noqa: SLF001 (a sample, as py-spy)
    while frame is not None:
        if is_cell(frame.f_code.co_filename):
            return frame.f_lineno
        frame = frame.f_back
    return None


def where(inside: tuple[str, float] | None, line: int | None) -> str:
    """Where a running body is: ``waits in all_reduce #12 at cell line 8 for 3 s``, ``at cell line 5``."""
    at = f" at cell line {line}" if line is not None else ""
    if inside is not None:
        what = _COLLECTIVE.sub(r"\2 #\1", inside[0])
        held = time.monotonic() - inside[1]
        return f"waits in {what}{at}" + (f" for {held:.0f} s" if held >= 1 else "")
    return at.lstrip()


_COLLECTIVE = re.compile(r"collective #(\d+) \((\w+)\)")


def _state(part: LivePart | None, running_for: float, sampled: str = "") -> str:
    """A rank's state as this notebook shows it; ``sampled``: whether its place moved between two samples."""
    if part is None or part.state == "running":
        place = "" if part is None else part.where
        if not place:
            return f"running {running_for:.0f} s"
        return f"running {running_for:.0f} s, {place}{sampled if not place.startswith('waits') else ''}"
    if part.state == "failed":
        return f"failed after {part.wall:.1f} s: {part.why}".rstrip(": ")
    return f"finished in {part.wall:.1f} s, waiting for the others"


class LiveTable:
    """This rank's part of a cell's live table: publishes its own state, shows everyone's."""

    def __init__(self, world: World, cell: str, title: str, output: OutputLog, publisher: Any,
                 enabled: bool = True, view: str | None = None, show: tuple[int, ...] | None = None,
                 place: Callable[[], str] | None = None) -> None:
        self.world, self.cell, self.title, self.output, self.publisher = world, cell, title, output, publisher
        self.view, self.show = view, None if show is None else list(show)  # how the table is drawn
        self.place = place  # where this rank's body is now (sampled each tick): see :func:`where`
        self._places: dict[int, tuple[str, float]] = {}  # rank -> (its place, since when here, sampled)
        self.enabled = enabled  # off (--no-live): this notebook neither publishes nor shows a live table
        self.started = time.monotonic()
        self.display_id: str | None = None  # set once the first live table is shown
        self._next = self.started + LIVE_AFTER
        self._mine = LivePart("running", [])  # its outputs are taken as it is published
        self._sent: tuple[int, str, str] = (-1, "", "")  # (output changes, state, where) last published
        self._listed = False  # whether this rank is in the cell's list of ranks that published a part
        self._count = 0  # the count of parts published, as this notebook last read it
        self._others: dict[int, LivePart] = {}  # the other ranks' parts, as last read
        self._shown = ""
        self._show_after = 0.0  # this notebook's next update of its table, no sooner (:func:`next_show`)

    def _key(self, rank: int) -> str:
        return self.world.key(keys.live(self.cell, rank))

    def finish(self, capture: Capture) -> None:
        """The body ended on this rank: say so at once, if the others may be watching."""
        error = capture.error
        self._mine = LivePart("failed" if error else "finished", [], wall=capture.wall,
                              why=error.ename if error else "")
        if self.enabled and (self.display_id is not None or time.monotonic() >= self._next):
            self._publish(force=True)

    def tick(self) -> None:
        """Called every poll slice, by the watcher during the body and by the end barrier after it."""
        now = time.monotonic()
        if now < self._next or not self.enabled:
            return
        self._next = now + LIVE_EVERY
        try:
            self._publish()
            self._show(now)
        except NbdistError as exc:  # the store is going away: the watcher and the barriers say so
            log.debug("live table not updated: %s", exc)

    def _publish(self, force: bool = False) -> None:
        if self._mine.state == "running" and self.place is not None:
            self._mine = replace(self._mine, where=self.place())
        sent = (self.output.changes, self._mine.state, self._mine.where)
        if sent == self._sent and not force:
            return
        self._sent = sent
        part = replace(self._mine, outputs=self._outputs())
        world = self.world
        world.client.set(self._key(world.rank), fit(part.as_dict(), LIVE_BYTES))
        if not self._listed:  # listed after its part is in: a reader reads listed parts only, all at once
            world.client.append(world.key(keys.live_ranks(self.cell)), f"{world.rank},")
            self._listed = True
        count = world.client.add(world.key(keys.live_count(self.cell)), 1)
        if count == self._count + 1:  # nobody else published since this notebook last read theirs: nothing to read
            self._count = count

    def _outputs(self) -> list[dict[str, Any]]:
        """This rank's output as the live table shows it: the head and the latest lines of the same log."""
        return self.output.snapshot(lines=LIVE_LINES, chars=LIVE_CHARS)

    def _read_others(self) -> dict[int, LivePart]:
        """The other ranks' parts: read again only when the count of parts published moved since the last look."""
        world = self.world
        count = world.client.add(world.key(keys.live_count(self.cell)), 0)
        if count == self._count:
            return self._others
        self._count = count
        listed = world.client.get_if(world.key(keys.live_ranks(self.cell))) or ""
        ranks = sorted(({int(w) for w in listed.split(",") if w.strip().isdigit()} & set(range(world.world_size)))
                       - {world.rank})
        texts = world.client.multi_get([self._key(i) for i in ranks]) if ranks else []
        others = {}
        for i, text in zip(ranks, texts, strict=True):
            try:
                others[i] = LivePart.from_json(text)
            except MalformedRecord:  # anyone can write into the store: not a part, so not shown
                continue
        self._others = others
        return others

    def _sampled(self, rank: int, part: LivePart | None, now: float) -> str:
        """Whether ``rank``'s place (its cell line, its output) changed between this notebook's samples, 0.5 s apart:
        `` (moving)``, `` (there for 3 s)``, or "" when first seen."""
        place = "\0" if part is None else f"{part.where}\0{len(str(part.outputs))}"
        seen = self._places.get(rank)
        if seen is None or seen[0] != place:
            self._places[rank] = (place, now)
            return "" if seen is None else " (moving)"
        return f" (there for {now - seen[1]:.0f} s)"

    def _show(self, now: float) -> None:
        if self.publisher is None or now < self._show_after:  # no front end: it publishes its part, draws nothing
            return
        world = self.world
        others = self._read_others()
        parts: list[LivePart | None] = [  # None: not published yet (still running)
            replace(self._mine, outputs=self._outputs()) if i == world.rank else others.get(i)
            for i in range(world.world_size)]
        captures = [Capture(outputs=[] if p is None else p.outputs, result=None, error=None, wall=0.0) for p in parts]
        states = [_state(p, now - self.started, self._sampled(i, p, now)) for i, p in enumerate(parts)]
        table = cell_table(self.title, world.registrations(), captures, states, view=self.view, show=self.show)
        bundle = table._repr_mimebundle_()
        if bundle["text/html"] == self._shown:
            return
        self._shown = bundle["text/html"]
        self._show_after = next_show(now, sum(len(v) for v in bundle.values() if isinstance(v, str)))
        first = self.display_id is None
        if first:
            self.display_id = uuid.uuid4().hex
        self.publisher.publish(data=bundle, metadata={}, transient={"display_id": self.display_id}, update=not first)
