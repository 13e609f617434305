"""Output that differs between ranks only in its numbers, drawn once as a template with a summary per number.

Pure. :func:`template` takes the numbers out of a text (``loss = 2.3011`` ->
``loss = ⟨⟩`` and ``["2.3011"]``). Texts of several ranks with the same
template are summarised by :func:`summarise`: each number that differs becomes
``⟨min … max⟩`` in the template, with a line such as

    loss = ⟨2.3011 … 2.3187⟩  8 ranks · median 2.3094 · spread 0.76% · min rank 3 · max rank 6

a strip with one mark per rank (rank order, height by value), and outliers by
a robust z-score (median absolute deviation, |z| > :data:`OUTLIER_Z`).
Equality is never decided here: the caller groups ranks by their exact text,
and only what the display shows is summarised.
"""

from __future__ import annotations

import functools
import html
import math
import re
import statistics
from dataclasses import dataclass

from ..ranksets import ranks_text

# A number standing on its own (not a part of a name such as x2 or a hash such as 3fa9).
NUMBER = re.compile(r"(?<![\w.])[-+]?(?=[.\d])(?:\d+(?:\.\d*)?|\.\d+)(?:[eE][-+]?\d+)?(?![\w])")
_SPLIT = re.compile(f"({NUMBER.pattern})")
SLOT = "\x00"
OUTLIER_Z = 3.5
MAX_SUMMARIES = 6  # numbers summarised line by line; the rest are counted
_BARS = "▁▂▃▄▅▆▇█"
_OUTLIER_COLOUR = "#d9534f"
_MARK_COLOUR = "rgba(128,128,128,0.75)"


@functools.lru_cache(maxsize=4096)  # a table asks for each text's template more than once (grouping, drawing)
def _split(text: str) -> tuple[str, tuple[str, ...]]:
    parts = _SPLIT.split(text)
    if len(parts) == 1:
        return text, ()
    return SLOT.join(parts[0::2]), tuple(parts[1::2])


def template(text: str) -> tuple[str, list[str]]:
    """``text`` with each number replaced by :data:`SLOT`, and the numbers' own text in order."""
    shape, numbers = _split(text)
    return shape, list(numbers)


@dataclass
class Varying:
    """One number that differs across the ranks: its text on each rank (rank order) and what it reads as."""

    prefix: str  # its line's text before it (the other varying numbers as ranges)
    ranks: list[int]
    texts: list[str]
    values: list[float]

    def _extreme_ranks(self, value: float) -> str:
        who = [r for r, v in zip(self.ranks, self.values, strict=True) if v == value]
        return ranks_text(who)

    def outliers(self) -> list[tuple[int, float]]:
        """(rank, robust z) of each value more than :data:`OUTLIER_Z` MADs from the median (inf: the MAD is 0)."""
        med = statistics.median(self.values)
        mad = statistics.median(abs(v - med) for v in self.values)
        out = []
        for r, v in zip(self.ranks, self.values, strict=True):
            if v == med:
                continue
            z = math.inf if mad == 0 else 0.6745 * (v - med) / mad
            if abs(z) > OUTLIER_Z:
                out.append((r, z))
        return out

    def range_text(self) -> str:
        return _range(self.values, self.texts)

    def summary(self) -> str:
        """``loss = ⟨2.3011 … 2.3187⟩  8 ranks · median 2.3094 · spread 0.76% · min rank 3 · max rank 6``."""
        return f"{self.prefix}{self.range_text()}  {self.stats()}"

    def stats(self) -> str:
        """``8 ranks · median 2.3094 · spread 0.76% · min rank 3 · max rank 6``, and outliers."""
        med = statistics.median(self.values)
        low, high = min(self.values), max(self.values)
        spread = f"spread {(high - low) / abs(med) * 100:.2f}%" if med else f"range {_number(high - low, self.texts)}"
        parts = [f"{len(self.ranks)} ranks", f"median {_number(med, self.texts)}",
                 spread, f"min {self._extreme_ranks(low)}", f"max {self._extreme_ranks(high)}"]
        outliers = self.outliers()
        if outliers:
            parts.append("outlier" + ("s" if len(outliers) > 1 else "") + ": " + ", ".join(
                f"rank {r} ({'z ' + format(z, '+.1f') if math.isfinite(z) else 'the others are equal'})"
                for r, z in outliers))
        return " · ".join(parts)

    def _heights(self) -> list[float]:
        low, high = min(self.values), max(self.values)
        return [0.5 if high == low else (v - low) / (high - low) for v in self.values]

    def strip_text(self) -> str:
        """One character per rank, in rank order: its value's height among the others'."""
        return "".join(_BARS[round(h * (len(_BARS) - 1))] for h in self._heights())

    def strip_html(self) -> str:
        """One mark per rank, in rank order (2 px wide: 64 ranks fit in 192 px); outliers in red."""
        outliers = {r for r, _ in self.outliers()}
        marks = []
        for r, text, h in zip(self.ranks, self.texts, self._heights(), strict=True):
            colour = _OUTLIER_COLOUR if r in outliers else _MARK_COLOUR
            marks.append(f'<span title="rank {r}: {html.escape(text)}" style="display:inline-block;width:2px;'
                         f'margin-right:1px;height:{2 + round(h * 12)}px;background:{colour};'
                         f'vertical-align:bottom"></span>')
        return f'<span style="display:inline-block;height:14px;line-height:0">{"".join(marks)}</span>'


def _number(value: float, texts: list[str]) -> str:
    """``value`` written with as many decimals as the ranks' own texts use (one more for a median between two)."""
    if any("e" in t.lower() for t in texts):
        return f"{value:.4g}"
    decimals = max(len(t.partition(".")[2]) for t in texts)
    if decimals == 0 and value != int(value):
        decimals = 1
    return f"{value:.{decimals}f}"


@dataclass
class Summary:
    """The texts of several ranks that differ only in their numbers: one template, the varying numbers."""

    text: str  # the template, each varying number as ⟨min … max⟩, equal numbers as they are
    varying: list[Varying]
    lines_of: list[int]  # the template line of each varying number

    def _lines(self) -> list[tuple[str, Varying | None]]:
        """The template's lines, with a summary of each varying number: (its line, the number) or (line, None).

        A line with one varying number becomes its summary; a line with more is
        followed by one summary per number. Past :data:`MAX_SUMMARIES` numbers,
        the rest are counted at the end.
        """
        lines = self.text.rstrip("\n").split("\n")
        on: dict[int, list[Varying]] = {}
        for v, at in list(zip(self.varying, self.lines_of, strict=True))[:MAX_SUMMARIES]:
            on.setdefault(at, []).append(v)
        out: list[tuple[str, Varying | None]] = []
        for k, line in enumerate(lines):
            numbers = on.get(k, [])
            if len(numbers) == 1:
                out.append((line, numbers[0]))
                continue
            out.append((line, None))
            out += [("    " + v.range_text(), v) for v in numbers]
        if len(self.varying) > MAX_SUMMARIES:
            out.append((f"… and {len(self.varying) - MAX_SUMMARIES} more numbers that differ between ranks", None))
        return out

    def as_text(self) -> str:
        """The template, each varying number summarised beside or below its line, with its strip."""
        return "\n".join(f"{line}  {v.stats()}  {v.strip_text()}" if v else line for line, v in self._lines())

    def as_html(self, pre_style: str) -> str:
        """The template's lines (ranges in bold), each varying number's summary and strip in small type below."""
        rows = []
        for line, v in self._lines():
            rows.append(f'<pre style="{pre_style}">{_marked(line)}</pre>')
            if v is not None:
                rows.append(f'<div style="padding-left:1.5em;opacity:0.85"><small>{html.escape(v.stats())}</small> '
                            f"{v.strip_html()}</div>")
        return "".join(rows)


def _marked(text: str) -> str:
    """The template's text, escaped, with its ranges in bold."""
    return re.sub(r"⟨[^⟩]*⟩", lambda m: f"<b>{m[0]}</b>", html.escape(text))


def _range(values: list[float], texts: tuple[str, ...] | list[str]) -> str:
    """``⟨min … max⟩``, each as its rank wrote it."""
    low, high = min(zip(values, texts, strict=True)), max(zip(values, texts, strict=True))
    return f"⟨{low[1]} … {high[1]}⟩"


def summarise(texts: list[str], ranks: list[int]) -> Summary | None:
    """The ranks' texts as one template with its varying numbers, or None if they differ in more than numbers."""
    shapes = [template(t) for t in texts]
    if len({s for s, _ in shapes}) != 1 or len({t for t in texts}) == 1:
        return None
    shape = shapes[0][0]
    columns = list(zip(*(numbers for _, numbers in shapes), strict=True))
    parts = shape.split(SLOT)
    varying_at: list[int] = []
    values: dict[int, list[float]] = {}
    for i, column in enumerate(columns):
        if len(set(column)) > 1:
            try:
                values[i] = [float(t) for t in column]
            except ValueError:
                return None
            varying_at.append(i)
    out = [parts[0]]
    line, line_at = parts[0].rsplit("\n", 1)[-1], parts[0].count("\n")  # the current line so far, and its number
    varying, lines_of = [], []
    for i, column in enumerate(columns):
        if i in values:
            varying.append(Varying(line, ranks, list(column), values[i]))
            lines_of.append(line_at)
            number = _range(values[i], column)
        else:
            number = column[0]
        after = parts[i + 1]
        out += [number, after]
        if "\n" in after:
            line, line_at = after.rsplit("\n", 1)[-1], line_at + after.count("\n")
        else:
            line += number + after
    text = "".join(out)
    return Summary(text, varying, lines_of)


def fold_alike(vectors: list[tuple[str, ...]], ranks: list[int]) -> list[tuple[list[int], tuple[str, ...]]]:
    """Ranks whose fields are alike (equal once their numbers are taken out), largest group first.

    Each group's field is drawn once: as it is where the members agree, else
    with each number that differs as ``⟨min … max⟩``. For the status tables
    and the dashboard of many ranks, where a row per rank does not read.
    """
    alike: dict[tuple[str, ...], list[int]] = {}
    for at, vector in enumerate(vectors):
        alike.setdefault(tuple(template(v)[0] for v in vector), []).append(at)
    out = []
    for members in alike.values():
        rs = [ranks[i] for i in members]
        fields = []
        for j in range(len(vectors[members[0]])):
            texts = [vectors[i][j] for i in members]
            summary = summarise(texts, rs) if len(set(texts)) > 1 else None
            fields.append(summary.text if summary is not None else texts[0])
        out.append((rs, tuple(fields)))
    out.sort(key=lambda g: (-len(g[0]), g[0][0]))
    return out
