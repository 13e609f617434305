"""``%dist_where``'s report: the merged stack tree, the Flight Recorder per group, and who did not answer (pure).

The ranks are named by rank sets throughout, as the many-rank view names its
groups, so the report is as long as the number of different places, not
the number of ranks.
"""

from __future__ import annotations

from typing import Any

from .. import ranksets
from . import recorder, stacks


def text(answers: dict[int, Any], silent: dict[int, str], world_size: int, describe: Any,
         native: bool = False, threads: bool = False, seconds: float = 0.0) -> str:
    """The report. ``answers``: rank -> :class:`nbdist.debug.where.Answer`; ``silent``: rank -> why no answer;
    ``describe(rank)``: ``rank 3 (host, pid 12)``."""
    heard = sorted(answers)
    lines = [f"nbdist where · {world_size} rank(s) · {len(heard)} answered in {seconds:.1f} s"]
    lines += ["", "Python stacks" + (" of every thread" if threads else " of the cell's thread (--threads: every "
                                      "thread)") + (", with native frames (py-spy)" if native else "") + ":"]
    tree = stacks.merge({r: answers[r].threads for r in heard})
    lines += ["  " + line for line in stacks.render(tree, world_size)] or ["  (none)"]
    lines += ["", "Flight Recorder (torch's analyser), per process group:"]
    dumps = {r: answers[r].recorder for r in heard}
    findings = recorder.analyse(dumps)
    for finding in findings:
        lines.append(f"  {finding.line(world_size)}" + ("" if finding.by == "torch" or not finding.parted
                                                         else " (nbdist's matcher)"))
    off: dict[str, list[int]] = {}
    for r in heard:
        why = dumps[r].get("off")
        if why:
            off.setdefault(why, []).append(r)
    for why, ranks in off.items():
        lines.append(f"  {ranksets.name(ranks, world_size)}: {why}")
    if not findings and not off:
        lines.append("  (no groups)")
    if native:
        missing: dict[str, list[int]] = {}
        for r in heard:
            if answers[r].native:
                missing.setdefault(answers[r].native, []).append(r)
        for why, ranks in missing.items():
            lines.append(f"Native frames missing on {ranksets.name(ranks, world_size)}: {why}; their Python "
                         "frames are shown")
    if silent:
        lines.append("")
        by_reason: dict[str, list[int]] = {}
        for r, why in sorted(silent.items()):
            by_reason.setdefault(why, []).append(r)
        for why, ranks in by_reason.items():
            who = ", ".join(describe(r) for r in ranks[:4]) + (f" and {len(ranks) - 4} more" if len(ranks) > 4 else "")
            lines.append(f"Not heard from {ranksets.name(ranks, world_size)}: {why} ({who}). A rank whose Python "
                         "is inside one long call that holds the GIL cannot answer; %dist_status says whether it "
                         "lives")
    return "\n".join(lines)
