"""A cell's aligned table drawn by groups of ranks: one column per group whose output is equal, for many ranks.

Pure. The rows are :mod:`nbdist.view.celltable`'s, aligned as ever; here a
column stands for the ranks whose pieces are alike in every differing row:
equal in every MIME type, or equal once their numbers are taken out (then the
column shows a template and a summary per number, :mod:`nbdist.view.numbers`;
two different numbers are never shown as one), with the same error (type,
message and frames once what names each rank itself is taken out,
:mod:`nbdist.view.alike`) and the same state. Groups are ordered largest
first, then by lowest rank, and named by their folded rank set
(:mod:`nbdist.ranksets`).

Past :data:`EXPANDED` groups, the reference group (the best outcome, then the
largest, then the lowest rank) is shown in full and every other group as a
unified diff against it, changed lines marked; the groups past the first
:data:`EXPANDED` are one click away, under ``… N more groups``.
"""

from __future__ import annotations

import difflib
import html
import itertools
import re
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any, Protocol, TypeVar

from .. import ranksets
from . import alike
from .display import CELL_STYLE, DIFF_STYLE, PRE_STYLE, TABLE_STYLE, footer_html
from .numbers import summarise


# The table, its rows and pieces are :mod:`nbdist.view.celltable`'s (which imports this module): what is read
# of them here.
class _Piece(Protocol):
    @property
    def kind(self) -> str: ...
    @property
    def text(self) -> str: ...
    @property
    def html(self) -> str: ...
    @property
    def key(self) -> str: ...
    @property
    def group(self) -> str: ...


class _Row(Protocol):
    @property
    def label(self) -> str: ...
    @property
    def same(self) -> _Piece | None: ...
    @property
    def per_rank(self) -> Sequence[Sequence[_Piece]]: ...


class _Table(Protocol):
    @property
    def title(self) -> str: ...
    @property
    def rows(self) -> Sequence[_Row]: ...
    @property
    def footer(self) -> str: ...
    @property
    def ranks(self) -> Sequence[int]: ...
    @property
    def hosts(self) -> Sequence[str]: ...
    @property
    def walls(self) -> Sequence[float | None]: ...
    @property
    def world_size(self) -> int: ...
    @property
    def drawn(self) -> dict[Any, Any]: ...  # this module's work, kept for the table's second form
    def all_ranks(self) -> str: ...


_SomeRow = TypeVar("_SomeRow", bound=_Row)

EXPANDED = 4  # groups shown as columns; the rest are behind "… N more groups"
DIFF_LINES = 40  # lines of a group's diff shown per row
PER_RANK_DETAILS = 16  # up to this many shown ranks, each rank's own column is one click away in the table
_ADDED = "background:rgba(0,160,0,0.15)"
_REMOVED = "background:rgba(255,0,0,0.12)"
_OUTCOME_ORDER = {"": 0, "error": 1, "stopped": 2}


@dataclass
class Group:
    """Ranks alike in every differing row (``members``: their column positions in the table)."""

    members: list[int]
    ranks: list[int]
    outcome: str  # "", "error" or "stopped": the worst a member's column holds

    def names(self, world_size: int) -> tuple[str, str]:
        return ranksets.header(self.ranks, world_size)


def _outcome(table: _Table, column: int) -> str:
    kinds = {p.kind for row in table.rows if row.same is None for p in row.per_rank[column]}
    return "stopped" if "stopped" in kinds else "error" if "error" in kinds else ""


def groups(table: _Table) -> list[Group]:
    """The table's columns grouped, largest group first, then by lowest rank."""
    if "groups" not in table.drawn:
        table.drawn["groups"] = _groups(table)
    found: list[Group] = table.drawn["groups"]
    return found


def _groups(table: _Table) -> list[Group]:
    alike: dict[tuple[tuple[str, ...], ...], list[int]] = {}
    for column in range(len(table.ranks)):
        key = tuple(tuple(p.group for p in row.per_rank[column]) for row in table.rows if row.same is None)
        alike.setdefault(key, []).append(column)
    found = [Group(cols, [table.ranks[c] for c in cols], _outcome(table, cols[0])) for cols in alike.values()]
    found.sort(key=lambda g: (-len(g.members), g.ranks[0]))
    if len(found) > EXPANDED:
        # The reference first: the best outcome, then the largest, then the lowest rank. Then a group that
        # failed, so that no error is hidden behind "… more groups"; then the rest, largest first.
        reference = min(found, key=lambda g: (_OUTCOME_ORDER[g.outcome], -len(g.members), g.ranks[0]))
        found.remove(reference)
        found.sort(key=lambda g: (not g.outcome, -len(g.members), g.ranks[0]))
        found.insert(0, reference)
    return found


@dataclass
class Drawn:
    """What one group shows in one row: text and safe HTML."""

    text: str
    html: str
    numbers: bool = False  # the members differ in numbers only, summarised
    shape: str = ""  # what a diff compares: the text, numbers that differ as ⟨min … max⟩ without their summaries

    def __post_init__(self) -> None:
        self.shape = self.shape or self.text


def _pre(text: str, style: str = "") -> str:
    return f'<pre style="{PRE_STYLE}{";" + style if style else ""}">{html.escape(text)}</pre>'


def draw(table: _Table, row: _Row, group: Group) -> Drawn:
    """The group's pieces in ``row``: the first member's, or a template with number summaries where they differ."""
    key = (id(row), group.ranks[0])
    if key not in table.drawn:
        table.drawn[key] = _draw(row, group)
    drawn: Drawn = table.drawn[key]
    return drawn


def _draw(row: _Row, group: Group) -> Drawn:
    columns = [row.per_rank[c] for c in group.members]
    first = columns[0]
    if all([p.key for p in col] == [p.key for p in first] for col in columns[1:]):
        return Drawn("\n".join(p.text.rstrip("\n") for p in first), "".join(p.html for p in first))
    texts, parts, shapes, numbers = [], [], [], False
    for i, piece in enumerate(first):
        own = [col[i] for col in columns]
        varies = piece.kind not in ("error", "stopped", "state") and len({p.key for p in own}) > 1
        summary = summarise([p.text for p in own], group.ranks) if varies else None
        if summary is None:  # equal here, or an alike error: the first member's, its own rank written as the group's
            fault = piece.kind in ("error", "stopped")
            texts.append((alike.merge([p.text for p in own], group.ranks) if fault else piece.text).rstrip("\n"))
            shapes.append(texts[-1])
            parts.append(alike.merge([p.html for p in own], group.ranks) if fault else piece.html)
            continue
        numbers = True
        texts.append(summary.as_text())
        shapes.append(summary.text.rstrip("\n"))
        parts.append(summary.as_html(PRE_STYLE))
    return Drawn("\n".join(texts), "".join(parts), numbers, "\n".join(shapes))


def against(table: _Table, row: _Row, reference: Group, group: Group) -> Drawn:
    """``group``'s pieces in ``row`` as a diff against ``reference``'s (kept: both forms of the table show it)."""
    key = (id(row), group.ranks[0], "diff")
    if key not in table.drawn:
        table.drawn[key] = diff(draw(table, row, reference), draw(table, row, group))
    drawn: Drawn = table.drawn[key]
    return drawn


def diff(reference: Drawn, own: Drawn) -> Drawn:
    """``own`` as a unified diff against the reference group's text, changed lines marked (the first
    :data:`DIFF_LINES` lines of it; the rest are counted)."""
    if not own.shape and not reference.shape:
        return own
    changes = difflib.unified_diff(reference.shape.splitlines(), own.shape.splitlines(), lineterm="", n=1)
    lines = list(itertools.islice(changes, DIFF_LINES + 2))[2:]
    if not lines:
        return Drawn("(as the reference group)", "<small><i>as the reference group</i></small>")
    more = sum(1 for _ in changes)
    if more:
        lines.append(f"… {more} more lines of the diff (a rank's whole output: nbdist.rank_output(k))")
    parts = []
    for mark, run in itertools.groupby(lines, key=lambda line: line[:1]):
        style = _ADDED if mark == "+" else _REMOVED if mark == "-" else "opacity:0.6"
        parts.append(f'<div style="{style}">{html.escape(chr(10).join(run))}</div>')
    body = f'<pre style="{PRE_STYLE}">{"".join(parts)}</pre>'
    return Drawn("\n".join(lines), f"<small>diff against the reference group</small>{body}")


def _diffable(row: _Row) -> bool:
    """Whether a group's pieces in ``row`` read best as a diff against the reference's (an error reads in full)."""
    return not any(p.kind in ("error", "stopped") for pieces in row.per_rank for p in pieces)


def _heading(table: _Table, group: Group) -> tuple[str, str]:
    short, whole = group.names(table.world_size)
    hosts = sorted({table.hosts[c] for c in group.members})
    if len(set(table.hosts)) > 1:
        where = f" · host {hosts[0]}" if len(hosts) == 1 else f" · {len(hosts)} hosts"
        short, whole = short + where, whole + where
    walls = sorted(w for c in group.members if (w := table.walls[c]) is not None)
    if walls:
        low, high = _seconds(walls[0]), _seconds(walls[-1])
        same_unit = low.split()[1] == high.split()[1]
        span = low if low == high else f"{low.split()[0]}–{high}" if same_unit else f"{low}–{high}"
        short, whole = f"{short} · {span}", f"{whole} · {span}"
    return short, whole


def _seconds(s: float) -> str:
    return f"{s * 1000:.1f} ms" if s < 1 else f"{s:.2f} s"


def _states(table: _Table, row: _Row) -> str:
    """The state row as one line: ``running 34 s: ranks 0-6 · waiting for the others: rank 7``.

    When some ranks wait in one collective, the running ranks that do not are
    said not to have reached it (``… at cell line 5: rank 6, which has not reached all_reduce #12``).
    """
    by: dict[str, list[int]] = {}
    for column, pieces in enumerate(row.per_rank):
        for p in pieces:
            by.setdefault(p.group.removeprefix("state\0"), []).append(table.ranks[column])
    waited = {m[1] for kind in by if (m := _WAITS_IN.search(kind))}
    shown = sorted(by.items(), key=lambda kv: (-len(kv[1]), kv[1][0]))
    parts = []
    for state, ranks in shown:
        part = f"{state}: {ranksets.name(ranks, table.world_size)}"
        if len(waited) == 1 and state.startswith("running") and not _WAITS_IN.search(state):
            part += f", which {'has' if len(ranks) == 1 else 'have'} not reached {next(iter(waited))}"
        parts.append(part)
    return " · ".join(parts)


_WAITS_IN = re.compile(r"waits in (\S+ #\d+)")


def to_html(table: _Table) -> str:
    found = groups(table)
    shown, hidden = found[:EXPANDED], found[EXPANDED:]
    by_diff = len(found) > EXPANDED
    n = len(shown)
    head = "".join(f'<th style="{CELL_STYLE}" title="{html.escape(whole)}">{html.escape(short)}</th>'
                   for short, whole in (_heading(table, g) for g in shown))
    body = []
    for row in table.rows:
        if row.same is not None:
            note = f"<br><small>identical on {table.all_ranks()}</small>"
            body.append(f'<tr><th style="{CELL_STYLE}">{html.escape(row.label)}{note}</th>'
                        f'<td colspan="{n}" style="{CELL_STYLE}">{row.same.html}</td></tr>')
            continue
        if row.label == "state":
            body.append(f'<tr><th style="{CELL_STYLE}">state</th>'
                        f'<td colspan="{n}" style="{CELL_STYLE}">{_pre(_states(table, row))}</td></tr>')
            continue
        drawn = [draw(table, row, g) for g in shown]
        if not any(d.text for d in drawn):
            continue  # only hidden groups have this row
        cells = [drawn[0]] + [against(table, row, shown[0], g) if by_diff and _diffable(row) else d
                              for g, d in zip(shown[1:], drawn[1:], strict=True)]
        numbers = any(d.numbers for d in drawn)
        note = ("≠ differs between ranks" if len(found) > 1 else "≠ numbers differ between ranks") \
            if len(found) > 1 or numbers else ""
        style = f"{CELL_STYLE};{DIFF_STYLE}" if note else CELL_STYLE
        tds = "".join(f'<td style="{style}">{c.html}</td>' for c in cells)
        body.append(f'<tr><th style="{style}">{html.escape(row.label)}'
                    f'{"<br><small>" + note + "</small>" if note else ""}</th>{tds}</tr>')
    more = _more_html(table, hidden, found) if hidden else ""
    foot = f"<div><small>{footer_html(table.footer)}</small></div>" if table.footer else ""
    return (f'<div class="nbdist"><div><b>{html.escape(table.title)}</b></div>'
            f'<table style="{TABLE_STYLE}"><thead><tr><th style="{CELL_STYLE}"></th>'
            f"{head}</tr></thead><tbody>{''.join(body)}</tbody></table>{more}{_per_rank_html(table)}"
            f"<div><small>{html.escape(_hint(table))}</small></div>{foot}</div>")


def _more_html(table: _Table, hidden: list[Group], found: list[Group]) -> str:
    ranks = ranksets.fold(r for g in hidden for r in g.ranks)
    parts = []
    for group in hidden:
        _, whole = _heading(table, group)
        rows = []
        for row in table.rows:
            if row.same is None and row.label != "state":
                own = draw(table, row, group)
                d = against(table, row, found[0], group) if _diffable(row) else own
                rows.append(f'<tr><th style="{CELL_STYLE}">{html.escape(row.label)}</th>'
                            f'<td style="{CELL_STYLE}">{d.html}</td></tr>')
        parts.append(f'<div><b><small>{html.escape(whole)}</small></b></div>'
                     f'<table style="{TABLE_STYLE}"><tbody>{"".join(rows)}</tbody></table>')
    return (f"<details><summary><small>… {len(hidden)} more groups (ranks {html.escape(ranks)})</small></summary>"
            f"{''.join(parts)}</details>")


def _per_rank_html(table: _Table) -> str:
    """A "show rank k" per rank (up to :data:`PER_RANK_DETAILS` ranks): that rank's whole column."""
    if len(table.ranks) > PER_RANK_DETAILS:
        return ""
    parts = []
    for column, rank in enumerate(table.ranks):
        own = "".join((row.same.html if row.same is not None else "".join(p.html for p in row.per_rank[column]))
                      for row in table.rows)
        parts.append(f'<details style="display:inline-block;vertical-align:top;margin-right:6px">'
                     f'<summary><small>show rank {rank}</small></summary>{own}</details>')
    return f"<div>{''.join(parts)}</div>"


def _hint(table: _Table) -> str:
    example = table.ranks[-1]
    return (f"{len(table.ranks)} ranks shown in groups of equal output. One rank's own column: "
            f"nbdist.rank_output({example}) (this notebook's last cell), or %%collective --show {example}; "
            "one column per rank: %%collective --view ranks")


def to_text(table: _Table) -> str:
    """The text form, in the table's order; every group's whole rank set, every group beyond the first shown."""
    found = groups(table)
    by_diff = len(found) > EXPANDED
    lines = [table.title]
    for shared, run in runs(table.rows):
        if shared:
            lines.append(f"── {table.all_ranks()} (identical) ──")
            lines += [labelled(row.label, row.same.text) for row in run if row.same is not None]
            continue
        states = [row for row in run if row.label == "state"]
        run = [row for row in run if row.label != "state"]
        for k, group in enumerate(found if run else []):
            drawn = [(row.label, draw(table, row, group)) for row in run]
            if k and by_diff:
                drawn = [(label, against(table, row, found[0], group) if _diffable(row) else d)
                         for row, (label, d) in zip(run, drawn, strict=True)]
            marker = " (diff against the reference)" if k and by_diff else ""
            lines.append(f"── {_heading(table, group)[1]}{marker} ──")
            lines += [labelled(label, d.text) for label, d in drawn if d.text]
        lines += [labelled("state", _states(table, row)) for row in states]
    lines.append(_hint(table))
    if table.footer:
        lines.append(table.footer)
    return "\n".join(lines)


def runs(rows: Sequence[_SomeRow]) -> list[tuple[bool, list[_SomeRow]]]:
    """The rows in runs of shared rows (True) and differing ones (False), in order, as the text forms list them."""
    return [(shared, list(run)) for shared, run in itertools.groupby(rows, key=lambda row: row.same is not None)]


def labelled(label: str, text: str) -> str:
    text = text.rstrip("\n")
    if "\n" not in text:
        return f"{label}: {text}"
    return "\n".join([f"{label}:", *("  " + line for line in text.split("\n"))])


def choose(view: str | None, table: _Table, width: int = 360) -> bool:
    """Whether to draw ``table`` by groups: asked for, or (auto) more than 4 ranks, or columns wider than ``width``."""
    if view in ("ranks", "groups"):
        return view == "groups" and len(table.ranks) > 1
    if len(table.ranks) > 4:
        return True
    widths = [max([len(line) for row in table.rows if row.same is None for p in row.per_rank[c]
                   for line in p.text.splitlines()] or [0]) for c in range(len(table.ranks))]
    return len(table.ranks) > 1 and sum(min(w, 120) + 12 for w in widths) > width

