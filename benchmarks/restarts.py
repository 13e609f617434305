"""Kill-and-restart cycles of one spawned worker: how long from the kill to a working world, and whether anything
leaks (issue 47, item 5).

One kernel runs ``%load_ext nbdist`` and ``%dist_init --spawn N --max-restarts K`` (K above the cycles: the
default 3 within 10 minutes would leave the rank down, as it must). Each cycle:

  1. SIGKILL rank 1's worker kernel, as the out-of-memory killer does;
  2. wait until its slot's new kernel has joined (the driving notebook's supervisor starts it), then run a
     ``%%collective`` all_reduce until it works on every rank (a run before the new kernel joined fails at once,
     naming the rank gone); the time from the kill to that working cell is the cycle's figure;
  3. read, on the driving kernel: its resident memory, how many process groups torch's group map holds, how many
     keys the store holds; and count the processes of this world still alive (every process started with this
     world's token: the worker kernels and their pulse processes).

Targets (the issue's): torch's group map does not grow on the survivor; the driving kernel's memory grows by at
most 50 MB over the cycles; no stray process (one worker and its pulse, after every cycle); the store's keys grow
by a constant per cycle at most (printed: keys per cycle, first half and second half alike).

Run from the repository root::

    .venv/bin/python benchmarks/restarts.py
    .venv/bin/python benchmarks/restarts.py --cycles 5

Writes ``docs/figures/restarts.json`` and ``.md``; exits 0 when every target was met, 1 otherwise.
"""

from __future__ import annotations

import argparse
import ast
import itertools
import os
import signal
import statistics
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from benchmarks import _common  # noqa: E402
from nbdist.drive import kernels  # noqa: E402

SESSION = "get_ipython().magics_manager.registry['DistMagics'].session"
SLOT = f"[(w.pid, w.joined, w.down) for w in {SESSION}.workers.workers][0]"
PROBE = "%%collective\nt = torch.ones(1)\ndist.all_reduce(t)\nprint('sum', t.item())\n"
FACTS = ("(int(open('/proc/self/status').read().split('VmRSS:')[1].split()[0]), "
         "len(torch.distributed.distributed_c10d._world.pg_map), "
         f"{SESSION}.world.client.raw().num_keys())")
MEMORY_TARGET_MB = 50.0


def world_processes(token: str) -> int:
    """How many live processes were started with ``token`` as NBDIST_TOKEN (the workers and their pulses)."""
    found = 0
    for entry in os.listdir("/proc"):
        if not entry.isdigit():
            continue
        try:
            with open(f"/proc/{entry}/environ", "rb") as f:
                if f"NBDIST_TOKEN={token}".encode() not in f.read().split(b"\0"):
                    continue
            with open(f"/proc/{entry}/stat") as f:
                if f.read().rsplit(")", 1)[1].split()[0] != "Z":
                    found += 1
        except OSError:
            continue
    return found


def look(k: kernels.Kernel, expression: str) -> object:
    return ast.literal_eval(k.execute("1", user_expressions={"x": expression}, timeout=60).expression("x"))


def until(what: str, ok, within: float = 180.0) -> None:
    deadline = time.monotonic() + within
    while not ok():
        if time.monotonic() > deadline:
            raise TimeoutError(f"{what}: not within {within:g} s")
        time.sleep(0.1)


def cycle(k: kernels.Kernel) -> float:
    """One kill and restart; seconds from the kill to a %%collective that works on every rank."""
    pid, joined, down = look(k, SLOT)
    assert joined and down is None, (pid, joined, down)
    os.kill(pid, signal.SIGKILL)
    killed = time.monotonic()
    until("the worker is started again and joins",
          lambda: (slot := look(k, SLOT))[0] not in (None, pid) and slot[1] and slot[2] is None)
    while True:
        r = k.execute(PROBE, timeout=180)
        if r.status == "ok":
            return time.monotonic() - killed
        if "rank 1" not in str(r.error):
            raise RuntimeError(f"the cell after the restart failed: {r.error}")
        if time.monotonic() - killed > 180:
            raise TimeoutError(f"no working cell within 180 s of the kill: {r.error}")
        time.sleep(0.2)


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--cycles", type=int, default=20, help="kill-and-restart cycles (default 20)")
    parser.add_argument("--ranks", type=int, default=2, help="the world's size (default 2: one worker is killed)")
    args = parser.parse_args()
    began = _common.begin()
    print(_common.load_note("at start"))
    k = kernels.Kernel()
    try:
        assert k.execute("%load_ext nbdist", timeout=60).status == "ok"
        r = k.execute(f"%dist_init --spawn {args.ranks} --max-restarts {args.cycles + 5}", timeout=300)
        assert r.status == "ok", r.error
        r = k.execute(PROBE, timeout=120)
        assert r.status == "ok", r.error
        token = str(look(k, f"{SESSION}.config.token"))  # the workers' NBDIST_TOKEN: how their processes are counted
        base_rss, base_groups, base_keys = look(k, FACTS)
        base_procs = world_processes(token)
        seconds, rows = [], []
        print(f"{'cycle':>5} {'kill to working (s)':>20} {'driver MiB':>11} {'groups':>7} {'keys':>7} {'procs':>6}")
        for n in range(1, args.cycles + 1):
            seconds.append(cycle(k))
            rss, groups, keys = look(k, FACTS)
            procs = world_processes(token)
            rows.append((rss, groups, keys, procs))
            print(f"{n:>5} {seconds[-1]:>20.2f} {rss / 1024:>11.1f} {groups:>7} {keys:>7} {procs:>6}")
    finally:
        k.execute("%dist_destroy", timeout=120)
        k.shutdown()
    grown_mb = (rows[-1][0] - base_rss) / 1024
    groups_grown = max(row[1] for row in rows) - base_groups
    per_cycle = [(b[2] - a[2]) for a, b in itertools.pairwise(rows)]
    half = len(per_cycle) // 2
    steady = not per_cycle or (max(per_cycle) - min(per_cycle) <= max(2, 0.1 * max(per_cycle)))
    strays = max(row[3] for row in rows) - base_procs
    met = grown_mb <= MEMORY_TARGET_MB and groups_grown <= 0 and strays <= 0 and steady
    print(f"kill to a working world: median {statistics.median(seconds):.2f} s (min {min(seconds):.2f}, max "
          f"{max(seconds):.2f}) over {len(seconds)} cycles")
    print(f"driving kernel memory: {grown_mb:+.1f} MB over the cycles (target at most +{MEMORY_TARGET_MB:g})")
    print(f"torch's group map on the survivor: {base_groups} before, at most {base_groups + groups_grown} after "
          f"(target: no growth); store keys: {base_keys} before, {rows[-1][2]} after")
    print(f"store keys per cycle: first half {per_cycle[:half]}, second half {per_cycle[half:]} (target: constant)")
    print(f"processes of the world beyond the {base_procs} before the first kill: {strays} (target: 0)")
    print(_common.load_note("at end"))
    _common.record("restarts", f"{args.cycles} kill-and-restart cycles of one worker, {args.ranks} ranks", [
        _common.figure("kill to a working world", seconds, "s"),
        _common.figure("driving kernel memory growth", [grown_mb], "MB", signed=True, decimals=1,
                       target=f"≤ +{MEMORY_TARGET_MB:g} MB", met=grown_mb <= MEMORY_TARGET_MB),
        _common.figure("torch's group map growth on the survivor", [groups_grown], "groups", decimals=0,
                       signed=True, target="0", met=groups_grown <= 0),
        _common.figure("store keys per cycle", [float(v) for v in per_cycle] or [0.0], "keys", decimals=0,
                       spread="min–max", target="constant", met=steady),
        _common.figure("stray processes", [float(max(strays, 0))], "processes", decimals=0, target="0",
                       met=strays <= 0),
    ], began)
    return 0 if met else 1


if __name__ == "__main__":
    sys.exit(main())
