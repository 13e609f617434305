"""Rank sets as people write them: ``0-3,5`` for ranks 0, 1, 2, 3 and 5 (pdsh's and ClusterShell's folding).

Pure, and part of the shared base, so that every layer writes ranks the same way. :func:`fold` writes a set
of ranks in its shortest ranged form, :func:`parse` reads one back (``parse(fold(s)) == sorted(set(s))``),
:func:`ranks_text` names a set in a sentence (``rank 3``, ``ranks 0-2,5``) and :func:`who_said` says which
ranks said what (``ranks 0-2: 4; rank 3: 5``): every message that names ranks goes through these two.
:func:`header` names a group of ranks for a column: ``ranks 0-3,5 (5)``, ``rank 6``, ``all 8 ranks``,
``all but rank 6``, cut after about :data:`CUT_AT` characters with ``…`` (:func:`header` returns the whole
name too, for the title and the text form).
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping

CUT_AT = 20  # characters of a folded set shown in a column's heading before "…"


def fold(ranks: Iterable[int]) -> str:
    """``[0, 1, 2, 3, 5]`` -> ``"0-3,5"``; two in a row stay a list (``"4,5"``), as ClusterShell writes them."""
    parts: list[str] = []
    run: list[int] = []
    for r in sorted(set(ranks)):
        if run and r == run[-1] + 1:
            run.append(r)
            continue
        parts += _run_text(run)
        run = [r]
    parts += _run_text(run)
    return ",".join(parts)


def _run_text(run: list[int]) -> list[str]:
    if len(run) >= 3:
        return [f"{run[0]}-{run[-1]}"]
    return [str(r) for r in run]


def ranks_text(ranks: Iterable[int]) -> str:
    """``rank 3``, ``ranks 0-2,5``: a set of ranks in a sentence (``no rank`` for none)."""
    ranks = sorted(set(ranks))
    if not ranks:
        return "no rank"
    return f"rank {ranks[0]}" if len(ranks) == 1 else f"ranks {fold(ranks)}"


def who_said(groups: Mapping[str, Iterable[int]]) -> str:
    """``{"4": [0, 1, 2], "5": [3]}`` -> ``"ranks 0-2: 4; rank 3: 5"``: which ranks said what, in the groups' order."""
    return "; ".join(f"{ranks_text(ranks)}: {said}" for said, ranks in groups.items())


def parse(text: str, world_size: int | None = None) -> list[int]:
    """``"0-3,5"`` -> ``[0, 1, 2, 3, 5]``; raises ValueError, saying what is wrong, for a malformed set.

    With ``world_size``, every rank must be below it; ``all`` is every rank.
    """
    text = text.strip()
    if world_size is not None and text == "all":
        return list(range(world_size))
    ranks: set[int] = set()
    for part in text.split(","):
        part = part.strip()
        low, dash, high = part.partition("-")
        try:
            first = int(low)
            last = int(high) if dash else first
        except ValueError:
            raise ValueError(f"{text!r} is not a rank set: write ranks and ranges such as 0-3,5") from None
        if first < 0 or last < first:
            raise ValueError(f"{text!r} is not a rank set: {part!r} is not a range of ranks (low-high, from 0)")
        ranks.update(range(first, last + 1))
    if world_size is not None and max(ranks) >= world_size:
        raise ValueError(f"rank set {text!r} names rank {max(ranks)}, but this world's ranks are 0-{world_size - 1}")
    return sorted(ranks)


def name(ranks: Iterable[int], world_size: int) -> str:
    """The whole name of a group of ranks: ``ranks 0-3,5 (5)``, ``rank 6``, ``all 8 ranks``, ``all but rank 6``."""
    ranks = sorted(set(ranks))
    if len(ranks) == 1:
        return f"rank {ranks[0]}"
    if world_size > 1 and len(ranks) == world_size:
        return f"all {world_size} ranks"
    others = sorted(set(range(world_size)) - set(ranks))
    if others and len(others) <= 2 and len(ranks) > len(others):
        return f"all but rank{'s' if len(others) > 1 else ''} {fold(others)}"
    return f"ranks {fold(ranks)} ({len(ranks)})"


def header(ranks: Iterable[int], world_size: int) -> tuple[str, str]:
    """(short, whole): a column's heading, its folded set cut after about :data:`CUT_AT` characters; the whole name."""
    ranks = sorted(set(ranks))
    whole = name(ranks, world_size)
    if not whole.startswith("ranks "):
        return whole, whole
    folded = fold(ranks)
    if len(folded) <= CUT_AT:
        return whole, whole
    cut = folded.rfind(",", 0, CUT_AT)
    return f"ranks {folded[:cut if cut > 0 else CUT_AT]}… ({len(ranks)})", whole
