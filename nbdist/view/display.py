"""Side-by-side, per-rank display: HTML without JavaScript, and a text/plain fallback.

Every rank's text is HTML-escaped (terminal colours become styled spans,
through ansi2html, which escapes the text too). :class:`SideBySide` shows facts
per rank (the world summary, the status): rows identical on every rank are
shown once, marked identical; rows that differ are marked and shown per rank.
A cell's outputs have their own renderer, :mod:`nbdist.view.celltable`.
"""

from __future__ import annotations

import functools
import html
import re
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

from .. import ranksets
from . import notes
from .numbers import fold_alike

# Colours. Where the frontend has a theme (JupyterLab's and Notebook 7's --jp-* variables, light or dark),
# borders, text and the stderr tint take its colours; elsewhere the var()'s fallback applies. Each var()
# follows a plain declaration of the same property, so that a sanitiser which drops var() (JupyterLab's, for
# an untrusted notebook) leaves the plain one in place. Fallbacks are plain values: nh3 mangles a var()
# whose fallback is itself a function (rgba(...)). Tints are translucent, so they suit any background;
# the text keeps the theme's colour (no fallback to black, which a dark frontend without --jp-* would hide).
BORDER_STYLE = "border:1px solid rgba(128,128,128,0.35);border-color:var(--jp-border-color1, #80808059)"
TEXT_STYLE = "color:var(--jp-content-font-color1, inherit)"
TABLE_STYLE = f"border-collapse:collapse;{TEXT_STYLE}"
DIFF_STYLE = "background:rgba(255,170,0,0.15)"  # JupyterLab's warn colours are opaque, and light in both themes
STDERR_STYLE = "background:rgba(255,0,0,0.08);background-color:var(--jp-rendermime-error-background, #ff000014)"
CELL_STYLE = f"text-align:left;vertical-align:top;padding:2px 8px;{BORDER_STYLE}"
FOOTER_PRE = "white-space:pre;font-size:11px;background:none;padding:0"
PRE_STYLE = "margin:0;white-space:pre-wrap;word-break:break-word;font-size:12px;background:none"
# ansi2html's default terminal colours -> those JupyterLab gives the same escapes in a plain cell's output,
# mid-tones that read on its light and its dark theme (ansi2html's dark blue, #0000aa, vanishes on dark).
_JUPYTERLAB_ANSI = dict(zip(
    ("#000316", "#aa0000", "#00aa00", "#aa5500", "#0000aa", "#e850a8", "#00aaaa", "#f5f1de",
     "#7f7f7f", "#ff0000", "#00ff00", "#ffff00", "#5c5cff", "#ff00ff", "#00ffff", "#ffffff"),
    ("#3e424d", "#e75c58", "#00a250", "#ddb62b", "#208ffb", "#d160c4", "#60c6c8", "#c5c1b4",
     "#282c36", "#b22b31", "#007427", "#b27d12", "#0065ca", "#a03196", "#258f8f", "#a1a6b2"), strict=True))
GROUP_ABOVE = 8  # a facts table of more ranks than this shows a column per group of alike ranks
_ANSI_COLOUR = re.compile(r"((?:background-)?color: )(#[0-9a-fA-F]{6})")


@functools.lru_cache(maxsize=1)
def _ansi() -> Any:
    from ansi2html import Ansi2HTMLConverter

    return Ansi2HTMLConverter(inline=True)


def footer_html(footer: str) -> str:
    """A table's footer: each of its lines on a line of its own; an indented line (the tree of a hang report)
    keeps its indentation, in a fixed-width font, so that the tree's branches stay under each other."""
    return "<br>".join(f'<code style="{FOOTER_PRE}">{html.escape(line)}</code>' if line[:1].isspace()
                       else html.escape(line) for line in footer.split("\n"))


def text_html(text: str) -> str:
    """Rank text as HTML: escaped, with terminal colours (ANSI escapes) turned into styled spans."""
    if "\x1b[" not in text:
        return html.escape(text)
    spans = _ansi().convert(text, full=False)  # escapes the text itself; colours become inline styles
    return _ANSI_COLOUR.sub(lambda m: m[1] + _JUPYTERLAB_ANSI.get(m[2].lower(), m[2]), spans)


@dataclass
class Cell:
    """One rank's value in a row: its text, and optionally safe HTML built by nbdist."""

    text: str
    html: str | None = None

    def render(self) -> str:
        if self.html is not None:
            return self.html
        return f'<pre style="{PRE_STYLE}">{text_html(self.text)}</pre>'

    def key(self) -> str:
        """What must be equal on every rank for the row to be shown once: the text and any picture."""
        return self.text if self.html is None else f"{self.text}\0{self.html}"


@dataclass
class SideBySide:
    """A table with one column per rank, in rank order."""

    title: str
    columns: list[str]
    rows: list[tuple[str, list[Cell]]] = field(default_factory=list)
    footer: str = ""
    compare: bool = True  # merge identical rows and mark differing ones
    ranks: list[int] | None = None  # each column's rank (default 0..n-1), for the grouped form of many ranks
    world_size: int | None = None

    def add(self, label: str, cells: list[Cell]) -> None:
        if any(c.text or c.html for c in cells):
            self.rows.append((label, cells))

    def _shown(self) -> SideBySide:
        """Past :data:`GROUP_ABOVE` columns of text, one column per group of alike ranks (``numbers.fold_alike``)."""
        if len(self.columns) <= GROUP_ABOVE or any(c.html is not None for _, cells in self.rows for c in cells):
            return self
        ranks = self.ranks or list(range(len(self.columns)))
        world_size = self.world_size or len(self.columns)
        vectors = [tuple(cells[i].text for _, cells in self.rows) for i in range(len(self.columns))]
        groups = fold_alike(vectors, ranks)
        groups_text = f"{len(groups)} group{'s' if len(groups) > 1 else ''}"
        table = SideBySide(f"{self.title} · {len(ranks)} ranks in {groups_text} of alike columns",
                           [ranksets.name(rs, world_size) for rs, _ in groups], footer=self.footer,
                           compare=self.compare)
        for j, (label, _) in enumerate(self.rows):
            table.rows.append((label, [Cell(fields[j]) for _, fields in groups]))
        return table

    def _same(self, cells: list[Cell]) -> bool:
        return self.compare and len(cells) > 1 and len({c.key() for c in cells}) == 1

    def _repr_html_(self) -> str:
        if (shown := self._shown()) is not self:
            return shown._repr_html_()
        n = len(self.columns)
        head = "".join(f'<th style="{CELL_STYLE}">{html.escape(c)}</th>' for c in self.columns)
        body = []
        for label, cells in self.rows:
            if self._same(cells):
                note = f'<br><small>identical on all {n} ranks</small>'
                body.append(
                    f'<tr><th style="{CELL_STYLE}">{html.escape(label)}{note}</th>'
                    f'<td colspan="{n}" style="{CELL_STYLE}">{cells[0].render()}</td></tr>'
                )
                continue
            marked = self.compare and n > 1
            style = f"{CELL_STYLE};{DIFF_STYLE}" if marked else CELL_STYLE
            note = "<br><small>≠ differs between ranks</small>" if marked else ""
            tds = "".join(f'<td style="{style}">{c.render()}</td>' for c in cells)
            body.append(f'<tr><th style="{style}">{html.escape(label)}{note}</th>{tds}</tr>')
        foot = f"<div><small>{footer_html(self.footer)}</small></div>" if self.footer else ""
        return (
            f'<div class="nbdist"><div><b>{html.escape(self.title)}</b></div>'
            f'<table style="{TABLE_STYLE}"><thead><tr><th style="{CELL_STYLE}"></th>'
            f"{head}</tr></thead><tbody>{''.join(body)}</tbody></table>{foot}</div>"
        )

    def __repr__(self) -> str:
        if (shown := self._shown()) is not self:
            return repr(shown)
        lines = [self.title]
        same = [(label, cells[0]) for label, cells in self.rows if self._same(cells)]
        if same:
            lines.append(f"── all {len(self.columns)} ranks (identical) ──")
            lines += _labelled(same)
        for i, column in enumerate(self.columns):
            own = [(label, cells[i]) for label, cells in self.rows
                   if not self._same(cells) and (cells[i].text or cells[i].html)]
            if not own and same:
                continue
            lines.append(f"── {column} ──")
            marker = " (differs)" if self.compare and len(self.columns) > 1 else ""
            lines += _labelled([(f"{label}{marker}", cell) for label, cell in own])
        if self.footer:
            lines.append(self.footer)
        return "\n".join(lines)

    def _repr_mimebundle_(self, include: Any = None, exclude: Any = None) -> dict[str, str]:
        return {"text/plain": repr(self), "text/html": self._repr_html_()}


def _labelled(items: list[tuple[str, Cell]]) -> list[str]:
    lines = []
    for label, cell in items:
        text = cell.text.rstrip("\n")
        if "\n" in text:
            lines.append(f"{label}:")
            lines += ["  " + line for line in text.split("\n")]
        else:
            lines.append(f"{label}: {text}")
    return lines


def summary_table(title: str, ranks: list[dict[str, Any]], footer: str = "") -> SideBySide:
    """Who is in the world: one column per rank."""
    table = SideBySide(title, [f"rank {i}" for i in range(len(ranks))], footer=footer)
    for label, key in [
        ("host", "host"), ("pid", "pid"), ("backend", "backend"), ("device", "device"),
        ("backend choice", "backend_reason"), ("torch", "torch"), ("nbdist", "nbdist"),
        ("python", "python"),
    ]:
        table.add(label, [Cell(str(info.get(key, ""))) for info in ranks])
    table.add("environment", [Cell("\n".join(info.get("env", []))) for info in ranks])
    return table


def status_table(title: str, rows: list[dict[str, Any]]) -> SideBySide:
    """%dist_status: a column per rank (``rows``: :meth:`nbdist.session.Session.status`'s)."""
    table = SideBySide(title, [f"rank {r['rank']}" for r in rows], compare=False)
    table.add("state", [Cell("left" if r["left"] else "joined") for r in rows])
    table.add("alive", [Cell(notes.alive(r)) for r in rows])
    table.add("last cell", [Cell(notes.last_cell(r)) for r in rows])
    for label in ("backend", "device", "host", "pid"):
        table.add(label, [Cell(str(r.get(label, ""))) for r in rows])
    return table


def workers_table(title: str, rows: list[dict[str, Any]], ranks: list[dict[str, Any]],
                  alive: Callable[[], dict[int, bool]]) -> SideBySide:
    """%dist_workers: a column per worker (``rows``: what the workers say of themselves; ``ranks``: the world's
    registrations). A Slurm task's node and pid are what it registered, its liveness its heartbeat (``alive()``:
    each rank's, read only when there is such a task); a local worker's restarts and exits have rows of their own."""
    rows = [dict(r) for r in rows]
    table = SideBySide(title, [f"rank {r['rank']}" for r in rows], compare=False,
                       ranks=[r["rank"] for r in rows], world_size=len(ranks) or None)
    remote = [r for r in rows if r["pid"] is None and "restarts" not in r and r["rank"] < len(ranks)]
    beating = alive() if remote else {}
    for r in remote:
        r.update(pid=ranks[r["rank"]].get("pid"), node=ranks[r["rank"]].get("host"), joined=True,
                 alive=r["alive"] and beating.get(r["rank"], False))
    if any("node" in r for r in rows):
        table.add("node", [Cell(str(r.get("node", "not joined yet"))) for r in rows])
    table.add("pid", [Cell(str(r["pid"])) for r in rows])
    table.add("state", [Cell(notes.worker_state(r)) for r in rows])
    table.add("device", [Cell(str(ranks[r["rank"]].get("device", "")) if r["rank"] < len(ranks) else "")
                         for r in rows])
    if any("restarts" in r for r in rows):  # local workers: a dead one is started again in its slot
        table.add("restarts", [Cell(r["restarts"]) for r in rows])
        table.add("exits", [Cell("\n".join(r["exits"]) or "none") for r in rows])
    table.add("last lines", [Cell("\n".join(r["log"])) for r in rows])
    return table


@dataclass
class Message:
    """A one-line status shown as plain text (no quotes) and as HTML."""

    text: str

    def __repr__(self) -> str:
        return self.text

    def _repr_mimebundle_(self, include: Any = None, exclude: Any = None) -> dict[str, str]:
        return {"text/plain": self.text, "text/html": f'<div class="nbdist">{html.escape(self.text)}</div>'}


@dataclass
class Source:
    """A cell's source under a title (what a following notebook is about to run)."""

    title: str
    code: str

    def __repr__(self) -> str:
        return f"{self.title}\n{self.code}"

    def _repr_mimebundle_(self, include: Any = None, exclude: Any = None) -> dict[str, str]:
        return {"text/plain": repr(self), "text/html": (
            f'<div class="nbdist">{html.escape(self.title)}</div>'
            f'<pre style="{PRE_STYLE};padding:4px 8px;border-left:3px solid rgba(128,128,128,0.5)">'
            f"{html.escape(self.code)}</pre>")}


@dataclass
class JoinStatus:
    """The live status of a join, updated in place while ranks arrive."""

    status: dict[str, Any]
    address: str

    def _lines(self) -> list[str]:
        s = self.status
        joined = ", ".join(f"{i} ({info.get('host', '?')})" for i, info in sorted(s["joined"].items()))
        missing = ranksets.fold(s["missing"]) or "none"
        if s.get("server"):  # the rendezvous server does not answer yet
            state = (f"waiting for the rendezvous server at {self.address}: {s['server']} "
                     "(rank 0 starts it with %%dist_init)")
        else:
            state = f"{'world formed' if not s['missing'] else 'waiting for ranks'} at {self.address}"
        return [
            f"nbdist: {state} · {len(s['joined'])}/{s['world_size']} joined · {s['elapsed']:.0f} s elapsed",
            *([s["launcher"]] if s.get("launcher") else []),  # who starts the missing ranks: a Slurm job's state
            f"joined: {joined or 'none yet'}",
            f"missing: {missing}",
        ]

    def __repr__(self) -> str:
        return "\n".join(self._lines())

    def _repr_mimebundle_(self, include: Any = None, exclude: Any = None) -> dict[str, str]:
        lines = self._lines()
        body = "<br>".join(html.escape(line) for line in lines[1:])
        return {
            "text/plain": repr(self),
            "text/html": f'<div class="nbdist"><b>{html.escape(lines[0])}</b><br>{body}</div>',
        }
