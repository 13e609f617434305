"""Cheap checks of repeated collectives: a rolling fingerprint per group, compared after the fact.

A ``%%collective`` body compares the first call of each kind (the same op,
shapes, dtypes, devices, root and reduce op, on the same group) across ranks
before it runs (:meth:`nbdist.cell.fingerprint.Checker.agree`: a round trip to the
store). A later call of a kind already agreed on costs no round trip: its
fingerprint's checksum is folded into the group's :class:`History`, a rolling
hash with the run-length list of the checksums behind it. The ranks compare
what they folded

- when a call takes longer than a wait slice (a collective that hangs because
  the ranks issued different ones: each publishes what it called there),
- and at the end of the body, in the records every rank publishes anyway
  (:func:`end_mismatch`), which names the first collective that differed.

Everything here is pure, except that ``quick_key`` reads tensors' metadata.
"""

from __future__ import annotations

import json
import zlib
from typing import Any

MASK = (1 << 64) - 1
MULTIPLIER = 1_000_003
MAX_RUNS = 512  # run-length entries kept per group and cell; beyond them only the rolling hash is compared


def checksum(fp: dict[str, Any]) -> int:
    """A fingerprint's checksum, the same on every rank for equal fingerprints."""
    return zlib.crc32(json.dumps(fp, sort_keys=True).encode())


def _key(value: Any, tensor: Any) -> Any:
    if isinstance(value, tensor):
        return (value.shape, value.dtype, value.device)
    if isinstance(value, list | tuple):
        return tuple([_key(v, tensor) for v in value])
    try:
        hash(value)
    except TypeError:
        return repr(value)
    return value


def quick_key(op: str, args: tuple[Any, ...], kwargs: dict[str, Any], tensor: type) -> tuple[Any, ...]:
    """This rank's cache key for a call: equal keys have equal fingerprints (the reverse need not hold).

    ``tensor``: ``torch.Tensor`` (passed in: this module does not import torch).
    """
    key: list[Any] = [op]
    for value in args:
        key.append(_key(value, tensor))
    for name, value in kwargs.items():
        key.append(name)
        key.append(_key(value, tensor))
    return tuple(key)


class History:
    """The collectives one rank issued on one group in one cell: their count, rolling hash and runs."""

    __slots__ = ("n", "h", "runs", "truncated")

    def __init__(self) -> None:
        self.n = 0
        self.h = 0
        self.runs: list[list[int]] = []  # [checksum, how many in a row]
        self.truncated = False

    def add(self, crc: int) -> None:
        self.n += 1
        self.h = (self.h * MULTIPLIER + crc) & MASK
        runs = self.runs
        if runs and runs[-1][0] == crc:
            runs[-1][1] += 1
        elif len(runs) < MAX_RUNS:
            runs.append([crc, 1])
        else:
            self.truncated = True

    def record(self) -> dict[str, Any]:
        return {"n": self.n, "h": self.h, "runs": self.runs, "truncated": self.truncated}


def summary(histories: dict[str, History], sigs: dict[int, dict[str, Any]]) -> dict[str, Any]:
    """What a rank publishes at the end of its body (JSON-ready): per group its history, and the fingerprints."""
    used = {crc for hist in histories.values() for crc, _ in hist.runs}
    return {"groups": {name: hist.record() for name, hist in histories.items()},
            "sigs": {str(crc): fp for crc, fp in sigs.items() if crc in used}}


def _first_difference(runs: dict[int, list[list[int]]]) -> tuple[int, dict[int, int]] | None:
    """The first position (1-based) where the ranks' run lists differ, and each rank's checksum there."""
    cursors = {rank: [0, 0] for rank in runs}  # (index into runs, offset within that run)
    position = 0
    while True:
        position += 1
        here: dict[int, int] = {}
        for rank, cur in cursors.items():
            rlist = runs[rank]
            while cur[0] < len(rlist) and cur[1] >= rlist[cur[0]][1]:
                cur[0], cur[1] = cur[0] + 1, 0
            if cur[0] >= len(rlist):
                return None  # a list ran out: the kept part agrees
            here[rank] = rlist[cur[0]][0]
            cur[1] += 1
        if len(set(here.values())) > 1:
            return position, here


def end_mismatch(checks: dict[int, dict[str, Any]], describe: Any) -> str | None:
    """Why the ranks' collectives did not match, read from every rank's published checks (None: they did).

    ``checks``: each rank's :func:`summary`; ``describe(fps)``: the differing fields of
    fingerprints by rank, in words (:func:`nbdist.cell.fingerprint.differences`).
    """
    names = sorted({name for c in checks.values() for name in c.get("groups", {})})
    for name in names:
        hists = {rank: c["groups"][name] for rank, c in checks.items() if name in c.get("groups", {})}
        if len({(h["n"], h["h"]) for h in hists.values()}) == 1:
            continue
        where = "" if name == "0" else f" on group {name}"
        found = _first_difference({rank: h["runs"] for rank, h in hists.items()})
        if found is None:
            counts = "; ".join(f"rank {rank}: {h['n']}" for rank, h in sorted(hists.items()))
            return (f"the ranks' collectives{where} in this cell did not match ({counts} collective(s); "
                    "the difference lies beyond what was kept). They ran; their results may be wrong")
        position, crcs = found
        fps = {rank: checks[rank]["sigs"].get(str(crc), {"op": "?"}) for rank, crc in crcs.items()}
        ops = sorted({fp.get("op", "?") for fp in fps.values()})
        problems = describe(fps)
        return (f"collective #{position} ({', '.join(ops)}){where} of this cell did not match across ranks: "
                f"{'; '.join(problems)}. It ran, so its results may be wrong (nbdist compares a kind of call "
                "it has seen before in this cell after it runs, and every new kind before): fix the cell so every "
                "rank issues the same collectives")
    return None
