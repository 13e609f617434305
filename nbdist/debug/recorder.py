"""torch's Flight Recorder on every rank: what each group's collectives were, and where the ranks part.

torch 2.13 records every process group's collectives, gloo's too, in a ring of
the last ``TORCH_FR_BUFFER_SIZE`` (default 2000; 0 turns it off) per process,
read with ``torch._C._distributed_c10d._dump_fr_trace_json`` (NCCL's with ``_dump_nccl_trace_json``, and
HCCL's, where torch_npu is imported, with ``torch_npu._C._distributed_c10d._dump_hccl_trace_json``, on when
``TORCH_HCCL_TRACE_BUFFER_SIZE`` is set). A rank takes its
dump (:func:`capture`) keeping only its live groups' entries: nbdist builds its
group afresh at each rebuild, under the same name, whose collective numbers
start again at 1, so only each group's latest run of entries counts (its
backend's sequence number says how many). gloo writes no group members into
the dump; the rank adds them from ``torch.distributed``'s own tables.

The asker matches every rank's dump (:func:`analyse`) with torch's own
analyser, ``torch.distributed.flight_recorder``'s ``build_db`` (what
``torchfrtrace`` runs), and falls back to :func:`match`, a small matcher of
the same rules, if torch's cannot run. For each group: the last collective
every member completed, and the first one where members differ or are missing.
"""

from __future__ import annotations

import argparse
import json
import logging
import os
import sys
from dataclasses import dataclass, field
from typing import Any

from .. import ranksets
from ..ranksets import ranks_text

log = logging.getLogger(__name__)

KEEP = 64  # a group's latest entries a rank sends (the ring holds up to 2000)
# torch's dumps: gloo's (and any backend's on CPU events), and NCCL's own recorder on a CUDA build (not tested
# here: no GPU on this project's machines).
DUMPS = ("_dump_fr_trace_json", "_dump_nccl_trace_json")
# torch_npu's own recorder of HCCL's collectives (ProcessGroupHCCL's TraceUtils; the same JSON form); not
# tested on an NPU here: no NPU on this project's machines.
NPU_DUMP = "_dump_hccl_trace_json"


def _live_groups() -> dict[str, dict[str, Any]]:
    """This process's live groups: name -> {"desc", "ranks" (global), "seq" (collectives issued so far)}."""
    import torch
    import torch.distributed as dist
    from torch.distributed import distributed_c10d as c10d

    if not dist.is_available() or not dist.is_initialized():
        return {}
    world = c10d._world  # noqa: SLF001 (torch's own table of groups, as its debug handlers read it)
    found = {}
    for pg in list(world.pg_map):
        name = world.pg_names.get(pg)
        if name is None:
            continue
        seq = None
        for device in ("cpu", "cuda", "npu"):
            try:
                backend = pg._get_backend(torch.device(device))  # noqa: SLF001
                seq = int(backend._get_sequence_number_for_group())  # type: ignore[attr-defined]  # not in the stub
                break
            except (RuntimeError, AttributeError, ValueError):
                continue
        found[str(name)] = {"desc": str(getattr(pg, "group_desc", "") or ""),
                            "ranks": sorted(int(r) for r in world.pg_group_ranks.get(pg, {})), "seq": seq}
    return found


def _npu_readers() -> list[Any]:
    """torch_npu's HCCL recorder, where torch_npu is imported (nbdist never imports it here: see
    :mod:`nbdist.backend.ascend`)."""
    npu = sys.modules.get("torch_npu")
    c10d = getattr(getattr(npu, "_C", None), "_distributed_c10d", None)
    read = getattr(c10d, NPU_DUMP, None)
    return [read] if read is not None else []


def latest_run(entries: list[dict[str, Any]], seq: int | None) -> list[dict[str, Any]]:
    """A group's entries (in record order) of its latest incarnation: after the last time its collective
    numbers started again; none if its backend has issued fewer collectives than the last entry's number
    (that entry is an earlier group's of the same name)."""
    start = 0
    last = 0
    for i, e in enumerate(entries):
        if e.get("is_p2p"):
            continue
        n = int(e.get("collective_seq_id") or 0)
        if n <= last:
            start = i
        last = n
    run = entries[start:]
    if seq is not None and run and max(int(e.get("collective_seq_id") or 0) for e in run) > seq:
        return []
    return run


def capture() -> dict[str, Any]:
    """This rank's Flight Recorder, its live groups' latest entries only; ``{"off": why}`` where there is none."""
    try:
        import torch
    except ImportError:
        return {"off": "torch is not imported"}
    size = os.environ.get("TORCH_FR_BUFFER_SIZE", os.environ.get("TORCH_NCCL_TRACE_BUFFER_SIZE"))
    if size is not None and size.strip() == "0":
        return {"off": "the Flight Recorder is off here (TORCH_FR_BUFFER_SIZE=0)"}
    groups = _live_groups()
    if not groups:
        return {"off": "no process group on this rank"}
    c10d = torch._C._distributed_c10d  # noqa: SLF001
    readers = [getattr(c10d, name) for name in DUMPS if hasattr(c10d, name)] + _npu_readers()
    if not readers:
        return {"off": f"torch {torch.__version__} has no Flight Recorder dump"}
    by_group: dict[str, list[dict[str, Any]]] = {}
    version = ""
    for read in readers:
        try:
            raw = read(includeCollectives=True, onlyActive=False)
        except (RuntimeError, TypeError) as exc:  # NCCL's or HCCL's recorder on a build or group that has none
            log.debug("nbdist: %s: %s", getattr(read, "__name__", "a Flight Recorder dump"), exc)
            continue
        dump = json.loads(raw.decode() if isinstance(raw, bytes) else raw)
        version = version or str(dump.get("version", ""))
        for e in dump.get("entries") or []:
            by_group.setdefault(str((e.get("process_group") or ["", ""])[0]), []).append(e)
    entries = []
    for name, info in groups.items():
        run = latest_run(by_group.get(name, []), info["seq"])[-KEEP:]
        entries += [{**{k: v for k, v in e.items() if k != "frames"}, "group": name} for e in run]
    entries.sort(key=lambda e: e["record_id"])
    return {"version": version, "groups": groups, "entries": entries}


# --- matching (pure, on the records every rank sent) ---------------------------------------------

@dataclass
class Finding:
    """One group's state across its members."""

    group: str
    desc: str
    ranks: list[int]
    last_done: str | None = None  # the last collective every member completed, "all_reduce #3"
    parted: str | None = None  # the first collective where members differ or are missing, in words
    entered: list[int] = field(default_factory=list)
    missing: list[int] = field(default_factory=list)
    unheard: list[int] = field(default_factory=list)  # members that sent no dump
    by: str = "torch"  # whose matcher found ``parted``: torch's analyser, or nbdist's own

    def title(self, world_size: int) -> str:
        if self.desc == "default_pg":
            return "the default group"
        named = f"group {self.group}" + (f" ({self.desc})" if self.desc not in ("", "undefined") else "")
        members = self.ranks
        return named + (f" of {ranksets.name(members, world_size)}" if len(members) != world_size
                        else f" of all {world_size} ranks")

    def line(self, world_size: int) -> str:
        done = (f"last completed on every member: {self.last_done}" if self.last_done
                else "none completed on every member")
        parted = f"{self.parted}; " if self.parted else "in step; "
        unheard = f"; no dump from {ranksets.name(self.unheard, world_size)}" if self.unheard else ""
        return f"{self.title(world_size)}: {parted}{done}{unheard}"


def op_name(entry: dict[str, Any]) -> str:
    """``gloo:all_reduce`` -> ``all_reduce``, with its number in the group: ``all_reduce #14``."""
    name = str(entry.get("profiling_name") or "?").rpartition(":")[2]
    number = entry.get("p2p_seq_id") if entry.get("is_p2p") else entry.get("collective_seq_id")
    return f"{name} #{number}"


def _shape(entry: dict[str, Any]) -> str:
    dtypes = entry.get("input_dtypes") or []
    return f"sizes {entry.get('input_sizes')}" + (f" {','.join(map(str, dtypes))}" if dtypes else "")


def _groups(dumps: dict[int, dict[str, Any]]) -> dict[str, dict[str, Any]]:
    found: dict[str, dict[str, Any]] = {}
    for rank in sorted(dumps):
        for name, info in (dumps[rank].get("groups") or {}).items():
            found.setdefault(name, {"desc": info.get("desc", ""), "ranks": list(info.get("ranks") or [])})
    return found


def _collectives(dump: dict[str, Any], group: str) -> list[dict[str, Any]]:
    return [e for e in dump.get("entries") or [] if e.get("group") == group and not e.get("is_p2p")]


def _last_done(dumps: dict[int, dict[str, Any]], group: str, members: list[int]) -> str | None:
    """The last collective of ``group`` that every member that sent a dump completed: retired, or followed by a
    later one of the same group on that rank (torch retires a gloo entry a moment after it completes)."""
    done: list[int] = []
    names: dict[int, dict[str, Any]] = {}
    for rank in members:
        if rank not in dumps:
            continue
        mine = _collectives(dumps[rank], group)
        last = max((int(e["collective_seq_id"]) for e in mine), default=0)
        finished = [e for e in mine if e.get("retired") or int(e["collective_seq_id"]) < last]
        done.append(max((int(e["collective_seq_id"]) for e in finished), default=0))
        names.update({int(e["collective_seq_id"]): e for e in finished})
    if not done or min(done) == 0:
        return None
    entry = names.get(min(done))
    return op_name(entry) if entry else f"#{min(done)}"


def match(dumps: dict[int, dict[str, Any]]) -> list[Finding]:
    """nbdist's own matcher: per group, the first collective number where a member is missing or differs."""
    findings = []
    for name, info in _groups(dumps).items():
        members = info["ranks"]
        heard = [r for r in members if r in dumps]
        finding = Finding(name, info["desc"], members, _last_done(dumps, name, members), by="nbdist",
                          unheard=[r for r in members if r not in dumps])
        per_rank = {r: {int(e["collective_seq_id"]): e for e in _collectives(dumps[r], name)} for r in heard}
        numbers = sorted(set().union(*(set(v) for v in per_rank.values()))) if per_rank else []
        for n in numbers:
            have = [r for r in heard if n in per_rank[r]]
            if len(have) < len(heard):
                first = per_rank[have[0]][n]
                finding.entered, finding.missing = have, [r for r in heard if r not in have]
                finding.parted = (f"{op_name(first)} ({_shape(first)}): {_entered(have, finding.missing)}")
                break
            kinds: dict[tuple[str, str], list[int]] = {}
            for r in have:
                kinds.setdefault(_kind(per_rank[r][n]), []).append(r)
            if len(kinds) > 1:
                finding.entered = have
                finding.parted = f"#{n} differs: " + "; ".join(
                    f"{ranks_text(rs)} called {op_name(per_rank[rs[0]][n])} ({_shape(per_rank[rs[0]][n])})"
                    for rs in kinds.values())
                break
        findings.append(finding)
    return findings


def _kind(entry: dict[str, Any]) -> tuple[str, str]:
    return str(entry.get("profiling_name")), json.dumps(entry.get("input_sizes"))


def _entered(entered: list[int], missing: list[int]) -> str:
    return f"{ranks_text(entered)} entered, {ranks_text(missing)} missing"


def torch_findings(dumps: dict[int, dict[str, Any]]) -> list[Finding]:
    """The same, by torch's own analyser (``build_db``); raises whatever it raises."""
    from torch.distributed.flight_recorder.components import builder

    details = {}
    for rank, dump in sorted(dumps.items()):
        # record ids are per process: renumbered so that torch's alignment of the ranks' rings keeps everything
        entries = [{**e, "record_id": i, "process_group": [e["group"], dump["groups"][e["group"]]["desc"]],
                    "frames": []} for i, e in enumerate(dump.get("entries") or [])]
        config = {name: {"name": name, "desc": g["desc"], "ranks": str(list(g["ranks"]))}
                  for name, g in dump["groups"].items()}
        details[str(rank)] = {"rank": rank, "version": dump["version"], "pg_config": config, "entries": entries}
    version = next(iter(details.values()))["version"]
    args = argparse.Namespace(verbose=False, just_print_entries=False, allow_incomplete_ranks=True, mismatch_cap=10)
    quiet = logging.getLogger("Flight Recorder")  # torch's analyser prints what it finds; nbdist says it instead
    level, quiet.disabled = quiet.disabled, True
    try:
        db = builder.build_db(details, args, version)
    finally:
        quiet.disabled = level
    found = {}
    groups = _groups(dumps)
    for name, info in groups.items():
        members = info["ranks"]
        found[name] = Finding(name, info["desc"], members, _last_done(dumps, name, members),
                              unheard=[r for r in members if r not in dumps])
    for c in db.collectives:
        name = str(c.group_id)
        finding = found.get(name)
        if finding is None or finding.parted is not None:
            continue
        what = f"{c.collective_name.rpartition(':')[2]} #{c.collective_seq_id}"
        if c.missing_ranks:
            missing = sorted(c.missing_ranks)
            finding.entered = sorted(set(c.expected_ranks) - set(missing))
            finding.missing = missing
            finding.parted = (f"{what} (sizes {c.input_sizes}): "
                              f"{_entered(finding.entered, missing)}")
        elif not c.pass_check:
            others = c.mismatch_collectives or {}
            alike = sorted(set(c.expected_ranks) - set(others))
            calls = [(alike, c)] if alike else []
            calls += [([r], o) for r, o in sorted(others.items())]
            finding.entered = sorted(c.expected_ranks)
            finding.parted = f"#{c.collective_seq_id} differs: " + "; ".join(
                f"{ranks_text(rs)} called {o.collective_name.rpartition(':')[2]} #{o.collective_seq_id} "
                f"(sizes {o.input_sizes})" for rs, o in calls if rs)
    return list(found.values())


def align(dumps: dict[int, dict[str, Any]]) -> dict[int, dict[str, Any]]:
    """The dumps with each group's entries from the same collective number on every rank: each rank sends its
    latest :data:`KEEP`, so a rank one collective behind the others sends one more at the front."""
    floors: dict[str, int] = {}
    for dump in dumps.values():
        firsts: dict[str, int] = {}
        for e in dump.get("entries") or []:
            if not e.get("is_p2p"):
                firsts.setdefault(e["group"], int(e["collective_seq_id"]))
        for group, first in firsts.items():
            floors[group] = max(floors.get(group, 0), first)
    return {rank: {**dump, "entries": [e for e in dump.get("entries") or []
                                       if e.get("is_p2p") or int(e["collective_seq_id"]) >= floors.get(e["group"], 0)]}
            for rank, dump in dumps.items()}


def analyse(dumps: dict[int, dict[str, Any]]) -> list[Finding]:
    """Per group, by torch's analyser where it runs, else by :func:`match`."""
    usable = align({r: d for r, d in dumps.items() if "groups" in d})
    if not usable:
        return []
    try:
        return torch_findings(usable)
    except Exception as exc:  # torch's analyser is internal and asserts freely: fall back, and say why in the log
        log.info("torch's Flight Recorder analyser failed (%s: %s); nbdist's own matcher is used",
                 type(exc).__name__, exc)
        return match(usable)
