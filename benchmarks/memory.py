"""Each rank's memory, how it grows with the world, and the two example notebooks under binder's limits (issue 50,
item 4).

For each world size N (default 2, 4, 8), one fresh kernel is measured step by step, then drives N ranks:

  1. the kernel as started (ipykernel, nothing imported);
  2. after ``import torch, torch.distributed``;
  3. after ``%load_ext nbdist`` (nbdist imported, no world);
  4. after ``%dist_init --spawn N`` and one ``%%collective`` all_reduce (the world formed, its gloo group made):
     the driving kernel (rank 0), each worker kernel (ranks 1 to N-1, started by the driving kernel), and each
     rank's pulse (the small heartbeat process a rank runs, ``nbdist.world.pulse``); these are every process the
     world has (the driving kernel's descendants).

Each process's memory is read from ``/proc/PID/smaps_rollup``: RSS (what ``top`` shows), PSS (pages shared by
several processes divided among them: sums over processes do not count shared libraries twice) and USS (the
process's private pages). The world's total is the PSS summed over all its processes.

Then ``examples/two_notebooks/`` run as two peers through ``nbdist run``, as a user on mybinder.org would run them
(1 CPU; 1 to 2 GB; a kernel above 2 GB is restarted): pinned to one CPU inside a fresh memory cgroup of 2 GiB with
no swap, holding the runner, both kernels and their pulses (``tests/limits.py``, as ``tests/test_binder_limits.py``
does in CI). Its wall time and the cgroup's high-water mark are the figures; the target is a high-water mark below
the limit and no OOM kill. Needs root for the cgroup (``--no-binder`` leaves that part out).

Run from the repository root::

    .venv/bin/python benchmarks/memory.py
    .venv/bin/python benchmarks/memory.py --sizes 2,4 --binder-runs 1

Writes ``docs/figures/memory.json`` and ``.md``; exits 0 when every target was met, 1 otherwise.
"""

from __future__ import annotations

import argparse
import os
import sys
from dataclasses import dataclass
from pathlib import Path
from tempfile import TemporaryDirectory
from typing import Any

import nbformat

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from benchmarks import _common  # noqa: E402
from nbdist.drive import kernels  # noqa: E402
from nbdist.measure import plain_torch  # noqa: E402
from tests.limits import BINDER_MEMORY, MemoryCgroup, Unsupported, run_limited  # noqa: E402

ROOT = Path(__file__).resolve().parent.parent
NOTEBOOKS = [ROOT / "examples" / "two_notebooks" / f"rank{r}.ipynb" for r in (0, 1)]
PROBE = "%%collective\nt = torch.ones(1)\ndist.all_reduce(t)\nprint('sum', t.item())\n"
MiB = 2**20


@dataclass(frozen=True)
class Memory:
    """One process's memory, in MiB."""

    rss: float
    pss: float
    uss: float


def memory(pid: int) -> Memory:
    fields: dict[str, int] = {}
    for line in Path(f"/proc/{pid}/smaps_rollup").read_text().splitlines()[1:]:
        key, value = line.split(":", 1)
        fields[key] = int(value.split()[0])  # kB
    return Memory(fields["Rss"] / 1024, fields["Pss"] / 1024,
                  (fields["Private_Clean"] + fields["Private_Dirty"]) / 1024)


def _children() -> dict[int, list[int]]:
    children: dict[int, list[int]] = {}
    for entry in os.listdir("/proc"):
        if entry.isdigit():
            try:
                stat = Path(f"/proc/{entry}/stat").read_text()
            except OSError:
                continue
            ppid = int(stat.rsplit(")", 1)[1].split()[1])
            children.setdefault(ppid, []).append(int(entry))
    return children


def _cmdline(pid: int) -> str:
    return Path(f"/proc/{pid}/cmdline").read_bytes().replace(b"\0", b" ").decode(errors="replace")


@dataclass(frozen=True)
class World:
    """The processes of one driven world, by kind, and their memory."""

    driver: Memory
    workers: list[Memory]
    pulses: list[Memory]
    others: list[str]  # any other descendant (none is expected): its command line

    @property
    def total_pss(self) -> float:
        return self.driver.pss + sum(m.pss for m in self.workers) + sum(m.pss for m in self.pulses)


def world(driver: int) -> World:
    """Every descendant of the driving kernel, sorted into worker kernels and pulses."""
    children = _children()
    workers, pulses, others, todo = [], [], [], list(children.get(driver, []))
    while todo:
        pid = todo.pop()
        todo += children.get(pid, [])
        line = _cmdline(pid)
        if "nbdist.world.pulse" in line:
            pulses.append(memory(pid))
        elif "ipykernel" in line:
            workers.append(memory(pid))
        else:
            others.append(line)
    return World(memory(driver), workers, pulses, others)


def ok(result: kernels.Result, what: str) -> kernels.Result:
    if result.status != "ok":
        raise RuntimeError(f"{what} failed: {result.error}")
    return result


def one_world(n: int) -> tuple[list[Memory], World]:
    """A fresh kernel measured as it starts, imports torch, loads nbdist; then the world of ``n`` it drives."""
    k = kernels.Kernel()
    try:
        pid = int(ok(k.execute("1", user_expressions={"p": "__import__('os').getpid()"}), "pid").expression("p"))
        steps = [memory(pid)]
        ok(k.execute("import torch, torch.distributed", timeout=120), "import torch")
        steps.append(memory(pid))
        ok(k.execute("%load_ext nbdist", timeout=60), "%load_ext nbdist")
        steps.append(memory(pid))
        ok(k.execute(f"%dist_init --spawn {n}", timeout=600), f"%dist_init --spawn {n}")
        ok(k.execute(PROBE, timeout=300), "a %%collective all_reduce")
        formed = world(pid)
        return steps, formed
    finally:
        try:
            k.execute("%dist_destroy", timeout=120)
        finally:
            k.shutdown()


class HighWater:
    """Each process's own high-water mark (``VmHWM``) in a cgroup, by kind, sampled while the run lasts."""

    def __init__(self) -> None:
        self.seen: dict[int, tuple[str, float]] = {}  # pid -> (kind, VmHWM in MiB)

    def __call__(self, group: MemoryCgroup) -> None:
        for pid in group.pids():
            try:
                line = _cmdline(pid)
                status = Path(f"/proc/{pid}/status").read_text()
            except OSError:  # gone since the list was read
                continue
            if "VmHWM:" not in status:
                continue
            kind = ("pulse" if "nbdist.world.pulse" in line else "kernel" if "ipykernel" in line
                    else "runner" if "nbdist run" in line else "other")
            self.seen[pid] = (kind, int(status.split("VmHWM:")[1].split()[0]) / 1024)

    def of(self, kind: str) -> list[float]:
        return [mb for k, mb in self.seen.values() if k == kind]


def binder_runs(runs: int) -> tuple[list[float], list[float], int, str, HighWater]:
    """The two example notebooks under binder's limits, ``runs`` times: seconds, peaks (MiB), OOM kills, setting,
    and the processes' own high-water marks over every run."""
    seconds, peaks, kills, setting, high = [], [], 0, "", HighWater()
    for i in range(runs):
        with TemporaryDirectory(prefix="nbdist-binder-") as out:
            usage = run_limited([sys.executable, "-m", "nbdist", "run", *map(str, NOTEBOOKS), "--out", out],
                                limit=BINDER_MEMORY, timeout=600, cwd=ROOT, watch=high)
        if usage.returncode != 0:
            raise RuntimeError(f"the two notebooks failed under binder's limits:\n{usage.stdout}\n{usage.stderr}")
        seconds.append(usage.seconds)
        peaks.append(usage.peak_mb)
        kills += usage.oom_kills
        setting = (f"a cgroup {usage.cgroup} memory limit of {usage.limit_bytes / 2**30:g} GiB, swap "
                   f"{'off' if usage.swap_limited else 'not limited'}, pinned to CPU {usage.cpus[0]}")
        print(f"binder run {i + 1}: {usage.seconds:.1f} s, high-water mark {usage.peak_mb:,.0f} MiB, "
              f"{usage.oom_kills} OOM kills ({setting})")
    print(f"their processes' own high-water marks (VmHWM, MiB): kernels {[round(v) for v in high.of('kernel')]}, "
          f"pulses {[round(v) for v in high.of('pulse')]}, runner {[round(v) for v in high.of('runner')]}, "
          f"other {[round(v) for v in high.of('other')]}")
    return seconds, peaks, kills, setting, high


HWM = "\n_nbdist_hwm = int(open('/proc/self/status').read().split('VmHWM:')[1].split()[0]) / 1024\n"


def plain_torch_high_water() -> list[float]:
    """The example's four ``%%collective`` cells on 2 plain torch processes (no kernel, no nbdist): each one's VmHWM."""
    nb = nbformat.read(NOTEBOOKS[0], as_version=4)
    bodies = [c.source.split("\n", 1)[1] for c in nb.cells
              if c.cell_type == "code" and c.source.startswith("%%collective")]
    values = plain_torch.run("\n".join(bodies) + HWM, 2, ("_nbdist_hwm",))
    return [float(v["_nbdist_hwm"]) for v in values]


def mib(what: str, samples: list[float], **keywords: Any) -> dict[str, Any]:
    """A figure in MiB, whole unless ``decimals`` says otherwise, its spread min–max (over runs, sizes or ranks)."""
    return _common.figure(what, samples, "MiB", spread="min–max", **{"decimals": 0, **keywords})


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--sizes", default="2,4,8", help="world sizes, comma-separated (default 2,4,8)")
    parser.add_argument("--binder-runs", type=int, default=3, help="runs of the two notebooks under binder's limits")
    parser.add_argument("--no-binder", action="store_true", help="leave out the runs under binder's limits")
    args = parser.parse_args()
    sizes = [int(s) for s in args.sizes.split(",")]
    began = _common.begin()
    print(_common.load_note("at start"))

    steps: list[list[Memory]] = []
    worlds: dict[int, World] = {}
    for n in sizes:
        s, w = one_world(n)
        steps.append(s)
        worlds[n] = w
        print(f"world of {n}: driving kernel PSS {w.driver.pss:.0f} MiB (RSS {w.driver.rss:.0f}); worker kernels "
              f"PSS {[round(m.pss) for m in w.workers]}; pulses PSS {[round(m.pss) for m in w.pulses]}; "
              f"the world's PSS {w.total_pss:.0f} MiB" + (f"; other processes: {w.others}" if w.others else ""))
        if len(w.workers) != n - 1 or len(w.pulses) != n or w.others:
            raise RuntimeError(f"world of {n}: expected {n - 1} worker kernels and {n} pulses, found {w}")
    rows = []
    for i, label in enumerate(("kernel as started", "kernel with torch imported",
                               "kernel with torch and nbdist imported")):
        rows.append(mib(f"{label}, PSS", [s[i].pss for s in steps]))
        rows.append(mib(f"{label}, RSS", [s[i].rss for s in steps]))
    torch_mb = [s[1].pss - s[0].pss for s in steps]
    nbdist_mb = [s[2].pss - s[1].pss for s in steps]
    rows.append(mib("torch's import (PSS added)", torch_mb))
    rows.append(mib("nbdist's import (PSS added)", nbdist_mb))
    for n, w in worlds.items():
        rows += [
            mib(f"{n} ranks: the driving kernel (rank 0), PSS", [w.driver.pss]),
            mib(f"{n} ranks: the world formed, added to the driving kernel (PSS)",
                [w.driver.pss - steps[sizes.index(n)][2].pss], signed=True),
            mib(f"{n} ranks: each worker kernel, PSS", [m.pss for m in w.workers]),
            mib(f"{n} ranks: each worker kernel, RSS", [m.rss for m in w.workers]),
            mib(f"{n} ranks: each pulse (heartbeat process), PSS", [m.pss for m in w.pulses], decimals=1),
            mib(f"{n} ranks: each pulse, RSS", [m.rss for m in w.pulses], decimals=1),
            mib(f"{n} ranks: the whole world, PSS summed", [w.total_pss]),
        ]
    if len(sizes) >= 2:
        a, b = min(sizes), max(sizes)
        per_rank = (worlds[b].total_pss - worlds[a].total_pss) / (b - a)
        rows.append(mib(f"each added rank, {a} to {b} ranks (PSS summed)", [per_rank]))
    notes = []
    met = True
    if not args.no_binder and args.binder_runs > 0:
        try:
            seconds, peaks, kills, setting, high = binder_runs(args.binder_runs)
            plain = plain_torch_high_water()
            print(f"the same cells in plain torch processes: high-water marks {[round(v) for v in plain]} MiB")
        except Unsupported as exc:
            print(f"binder's limits cannot be set here ({exc}): that part is left out")
            notes.append(f"The runs under binder's limits were left out: {exc}.")
        else:
            under = max(peaks) < BINDER_MEMORY / MiB
            met = under and kills == 0
            rows += [
                _common.figure("the two example notebooks under binder's limits: wall time", seconds, "s",
                               spread="min–max", decimals=1),
                mib("… the cgroup's high-water mark", peaks, target=f"< {BINDER_MEMORY / MiB:,.0f} MiB", met=under),
                _common.figure("… OOM kills", [float(kills)], "", spread="min–max", decimals=0, runs=len(peaks),
                               target="0", met=kills == 0),
                mib("… each kernel's own high-water mark (VmHWM)", high.of("kernel")),
                mib("… each pulse's own high-water mark", high.of("pulse"), decimals=1),
                mib("… the runner's own high-water mark (`nbdist run`, nbclient)", high.of("runner")),
                mib("the same four cells in 2 plain torch processes (no kernel, no nbdist): each one's "
                    "high-water mark", plain),
            ]
            notes.append(f"Binder's limits: `nbdist run` of `examples/two_notebooks/` (the runner, both kernels and "
                         f"their pulses) in {setting}; the high-water mark counts anonymous memory and the page "
                         "cache the run is first to bring in.")
    notes.append("PSS divides pages shared between processes among them (so sums count a shared library once); "
                 "RSS counts them in every process. Spreads are min–max: over the world sizes (the kernel's "
                 "steps), the ranks of one world, or the runs under binder's limits and their processes.")
    print(_common.load_note("at end"))
    _common.record("memory", "Each rank's memory, the world's growth, and binder's limits", rows, began, notes)
    return 0 if met else 1


if __name__ == "__main__":
    sys.exit(main())
