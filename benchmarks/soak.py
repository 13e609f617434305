"""Soak: random faults and stop presses between normal cells, in every mode; the world must stay in step.

Modes (each on a world of its own, real kernels through jupyter_client, gloo on loopback):

- ``lockstep2``, ``lockstep4``: one kernel per rank, every cell run in every kernel;
- ``driven``: one kernel that ran ``%dist_init --spawn 3`` (two worker kernels follow it);
- ``plain``: two kernels running plain cells that call collectives (no ``%%collective``);
- ``kills``: a driven world (``--spawn 3``, restarts unbounded) whose worker kernels are also killed with SIGKILL,
  in a loop of ``all_reduce`` or between cells: the cell must end on the driver within 10 s (issue 47), and the
  worker must be started again and join before the normal cell (``kill``, ``kill_idle``; not a default mode);
- ``presses``: the acceptance check: the stop button at a random moment on a random rank, during
  loops of ``all_reduce`` in ``%%collective`` cells on two ranks.

Faults, drawn at random: a rank raises before its collective, shapes differ, a rank skips the
collective, the ranks run different cells, the stop button at a random moment on a random rank
(the driver, in a driven world), ``--max-time``, and a stop of every rank (what ``%dist_stop``
sends). After each fault (each press: every ``--check-every`` presses) a normal cell runs on
every rank and must succeed with every rank's output in every table. Counted: hangs (a cell that
did not end within its deadline), worlds out of step (a normal cell after a fault that failed),
outputs lost (a rank's line missing from a table), and the time from a fault to the end of its
cell on the last rank (a press: the time from the press).

    python benchmarks/soak.py --short            # what CI runs (tests/test_soak.py), about a minute
    python benchmarks/soak.py --seeds 1 2 3      # the long version: 3 x 200 presses, 150 faults per mode
    python benchmarks/soak.py --short --fuzz 11  # the same, each store call of every rank delayed at random

``--fuzz SPEC`` sets ``NBDIST_STORE_FUZZ`` (``SEED`` or ``SEED:PROBABILITY:MAX_MS``) in the soak's own
process (its stop of every rank) and so in every kernel it starts, which pass it on to the worker kernels
they spawn: each store operation and wait is then delayed, seeded, with probability 0.35 for 0-50 ms
unless SPEC says otherwise (see ``nbdist.world.store.Fuzzer``). Without it the soak clears the variable.
Prints a table and, with ``--json FILE``, writes the figures; both say whether the run was fuzzed.
"""

from __future__ import annotations

import argparse
import ast
import json
import os
import random
import re
import shutil
import signal
import statistics
import subprocess
import sys
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from _common import begin, figure, record  # noqa: E402

from nbdist import config  # noqa: E402
from nbdist.drive import kernels  # noqa: E402
from nbdist.errors import ConfigError  # noqa: E402
from nbdist.world import netinfo  # noqa: E402

STOP_WITHIN = 2.0  # seconds the stop button may take to end the cell on every rank
KILL_WITHIN = 10.0  # seconds a worker's death may take to end the driver's cell (issue 47)
REJOIN_WITHIN = 120.0  # seconds a killed worker gets to be started again and join
FAULT_DEADLINE = 60.0  # seconds a fault's cell may take to end on every rank (a hang, past it)
NORMAL_DEADLINE = 60.0
AFTER_HANG = 45.0  # seconds a hung cell's reply is still awaited, for what it says
SESSION = "get_ipython().magics_manager.registry['DistMagics'].session"
SLOTS = f"[(w.rank, w.pid, w.joined, w.down) for w in {SESSION}.workers.workers]"  # a driver's worker slots
LOOP = ("%%collective --timeout 60\nimport time\nfor _ in range(2000):\n    t = torch.ones(1)\n"
        "    dist.all_reduce(t)\n    time.sleep(0.002)\n")
PLAIN_LOOP = LOOP.split("\n", 1)[1]  # the same loop in a plain cell


@dataclass
class Figures:
    """What one mode's soak found."""

    mode: str
    faults: int = 0
    hangs: int = 0
    out_of_step: int = 0
    lost: int = 0
    normal_cells: int = 0
    slow: int = 0  # stop presses whose cells took over STOP_WITHIN seconds to end on every rank
    ended: list[float] = field(default_factory=list)  # seconds from a fault (press) to its cells' end
    by_kind: dict[str, int] = field(default_factory=dict)
    notes: list[str] = field(default_factory=list)

    def row(self) -> dict[str, Any]:
        ended = sorted(self.ended)
        return {"mode": self.mode, "faults": self.faults, "hangs": self.hangs, "out_of_step": self.out_of_step,
                "lost": self.lost, "slow_stops": self.slow, "normal_cells": self.normal_cells,
                "median_end_s": round(statistics.median(ended), 3) if ended else None,
                "p90_end_s": round(ended[int(0.9 * (len(ended) - 1))], 3) if ended else None,
                "max_end_s": round(ended[-1], 3) if ended else None, "by_kind": self.by_kind,
                "notes": self.notes[:10]}


    def ended_from(self, cells: list[Cell], since: float, what: str, stop: bool, within: float = STOP_WITHIN) -> bool:
        """Record how long the fault's cells took to end from ``since``; False if one never ended (a hang).
        ``stop``: the fault is one that must end them within ``within`` s (else it counts as slow)."""
        if not wait_all(cells, FAULT_DEADLINE + 5):
            self.hangs += 1
            self.notes.append(f"{what}: a cell never ended")
            return False
        self.ended.append(max(c.ended for c in cells) - since)
        if stop and self.ended[-1] > within:
            self.slow += 1
            self.notes.append(f"{what}: {self.ended[-1]:.2f} s to end")
            for i, c in enumerate(cells):  # which rank ended late, and what its cell said: for its replay
                tail = "" if c.result is None else c.result.text()[-800:]
                print(f"--- slow stop, {self.mode} {what}, kernel {i} ended {c.ended - since:.2f} s after it:\n"
                      f"{tail}", file=sys.stderr, flush=True)
        return True


def _kernel_children(pid: int | None) -> list[int]:
    """The kernels ``pid`` started (a driven world's spawned workers), for their stacks."""
    children: list[str] = []
    for task in Path(f"/proc/{pid}/task").glob("*"):  # a child is listed under the thread that started it
        try:
            children += (task / "children").read_text().split()
        except OSError:
            continue
    found = []
    for child in map(int, children):
        try:
            if b"ipykernel" in Path(f"/proc/{child}/cmdline").read_bytes():
                found.append(child)
        except OSError:
            continue
    return found


def free_port() -> int:
    port = netinfo.first_free_port(random.randrange(20_000, 30_000) for _ in range(200))
    if port is None:
        raise RuntimeError("no free port in 20000-29999")
    return port


class Cell:
    """One cell running in the background in one kernel: its result, or why it has none, and when it ended."""

    def __init__(self, kernel: kernels.Kernel, code: str, deadline: float) -> None:
        self.result: kernels.Result | None = None
        self.error: BaseException | None = None
        self.started, self.ended = time.monotonic(), 0.0

        def run() -> None:
            try:
                # Past the deadline the cell counts as hung, but its reply is still awaited a while: a cell that
                # waited out its --timeout (60 s) then says which wait that was (:meth:`World.hung` prints it).
                self.result = kernel.execute(code, timeout=deadline + AFTER_HANG)
            except BaseException as exc:  # noqa: BLE001 (a timeout: the cell hung)
                self.error = exc
            self.ended = time.monotonic()

        self.thread = threading.Thread(target=run, daemon=True)
        self.thread.start()

    def join(self, seconds: float) -> bool:
        self.thread.join(seconds)
        return not self.thread.is_alive() and self.result is not None


def run_all(ks: list[kernels.Kernel], codes: list[str], deadline: float) -> list[Cell]:
    return [Cell(k, c, deadline) for k, c in zip(ks, codes, strict=True)]


def wait_all(cells: list[Cell], deadline: float) -> bool:
    """Whether every cell ended with a reply within ``deadline`` seconds from now."""
    end = time.monotonic() + deadline
    return all(c.join(max(0.1, end - time.monotonic())) for c in cells)


class World:
    """The kernels of one mode's world and how to run a cell on every rank of it."""

    def __init__(self, mode: str) -> None:
        self.mode = mode
        self.port = free_port()
        n = {"lockstep2": 2, "lockstep4": 4, "driven": 1, "kills": 1, "plain": 2, "presses": 2}[mode]
        self.kernels = kernels.start(n)
        self.ranks = 3 if mode in ("driven", "kills") else n
        self.checks = 0
        self.killed: int | None = None  # the worker kernel the last fault killed
        for r in kernels.execute_all(self.kernels, "%load_ext nbdist", timeout=60):
            assert r.status == "ok", r.error
        self.token: str | None = None
        if mode in ("driven", "kills"):
            restarts = " --max-restarts 100000" if mode == "kills" else ""
            r = self.kernels[0].execute(f"%dist_init --spawn 3 --master-port {self.port}{restarts}", timeout=180,
                                        user_expressions={"t": f"{SESSION}.config.token"})
            assert r.status == "ok", r.error
            self.token = ast.literal_eval(r.expression("t"))  # read now: a busy kernel answers only after its cell
        else:
            lines = [f"%%dist_init --rank {i} --world-size {n} --master-addr 127.0.0.1 --master-port {self.port}"
                     for i in range(n)]
            for r in kernels.execute_all(self.kernels, lines, timeout=180):
                assert r.status == "ok", r.error

    def close(self) -> None:
        for k in reversed(self.kernels):
            k.shutdown()

    def where(self, mark: str) -> None:
        """Where every rank is (``nbdist where``), printed to stderr: what a hang report needs to be replayed."""
        command = [sys.executable, "-m", "nbdist", "where", "--master-addr", "127.0.0.1", "--master-port",
                   str(self.port), "--threads"]
        env = {**os.environ, **({"NBDIST_TOKEN": self.token} if self.token else {})}
        try:
            done = subprocess.run(command, capture_output=True, text=True, timeout=60, env=env)
            print(f"--- where every rank was when {mark} hung ({self.mode}):\n{done.stdout}{done.stderr}",
                  file=sys.stderr, flush=True)
        except subprocess.TimeoutExpired:
            print(f"--- nbdist where did not answer within 60 s ({self.mode}, {mark})", file=sys.stderr, flush=True)

    def hung(self, cells: list[Cell], what: str) -> None:
        """A fault's cells did not all end: where every rank is, then (once they end, or did not in AFTER_HANG)
        which ended how and what each said, printed to stderr."""
        self.where(what)
        self.native(what)
        wait_all(cells, AFTER_HANG)
        for i, c in enumerate(cells):
            state = ("still running" if c.result is None and c.error is None
                     else f"ended: {c.error!r}" if c.result is None
                     else f"ended after {c.ended - c.started:.1f} s: {c.result.status} "
                          f"{(c.result.error or {}).get('evalue', '')}")
            tail = "" if c.result is None else re.sub(r"\x1b\[[0-9;]*m", "", c.result.text())[-6000:]
            print(f"--- {what}, kernel {i}: {state}\n{tail}", file=sys.stderr, flush=True)

    def native(self, what: str) -> None:
        """Every kernel's threads as py-spy sees them, native frames too: a rank that holds the GIL, or whose
        heartbeat thread cannot run, does not answer ``nbdist where``."""
        spy = shutil.which("py-spy") or str(Path(sys.executable).with_name("py-spy"))
        pids = [(str(i), getattr(k.manager.provisioner, "pid", None)) for i, k in enumerate(self.kernels)]
        pids += [(f"{i}'s worker", child) for i, pid in pids for child in _kernel_children(pid)]
        for i, pid in pids:
            try:
                done = subprocess.run([spy, "dump", "--native", "--pid", str(pid)], capture_output=True, text=True,
                                      timeout=60)
                print(f"--- py-spy, {what}, kernel {i} (pid {pid}):\n{done.stdout[:9000]}{done.stderr[-1000:]}",
                      file=sys.stderr, flush=True)
            except (OSError, subprocess.TimeoutExpired) as exc:
                print(f"--- py-spy, {what}, kernel {i}: {exc}", file=sys.stderr, flush=True)

    def interrupt(self, which: int) -> None:
        self.kernels[which].interrupt()

    def workers(self) -> list[int]:
        """The pids of the driving kernel's worker kernels now (from /proc: the driver may be busy in a cell)."""
        return _kernel_children(getattr(self.kernels[0].manager.provisioner, "pid", None))

    def kill_worker(self, rng: random.Random) -> int | None:
        """SIGKILL one worker kernel, drawn at random; its pid (None if there was none to kill)."""
        pids = self.workers()
        if not pids:
            return None
        pid = rng.choice(pids)
        os.kill(pid, signal.SIGKILL)
        return pid

    def rejoined(self, killed: int, figures: Figures) -> bool:
        """Wait until every worker slot holds a live kernel other than ``killed`` that joined, as the driver's
        supervisor restarts it; False (noted) if not within REJOIN_WITHIN s, or a slot was left down."""
        deadline = time.monotonic() + REJOIN_WITHIN
        slots: list[Any] = []
        while time.monotonic() < deadline:
            r = self.kernels[0].execute("1", user_expressions={"s": SLOTS}, timeout=30)
            slots = ast.literal_eval(r.expression("s"))
            if any(down is not None for _, _, _, down in slots):
                break
            if all(pid not in (None, killed) and joined for _, pid, joined, _ in slots):
                return True
            time.sleep(0.3)
        figures.out_of_step += 1
        figures.notes.append(f"worker {killed} was not started again and joined: {slots}")
        return False

    def normal(self, figures: Figures) -> bool:
        """A normal cell on every rank: True if it ran everywhere with every rank's line in every table."""
        self.checks += 1
        mark = f"soak{self.checks}"
        if self.mode == "plain":
            code = (f"t = torch.ones(1)\ndist.all_reduce(t)\nprint('{mark}', RANK, int(t.item()))\n")
        else:
            code = (f"%%collective --timeout 60\nt = torch.ones(1)\ndist.all_reduce(t)\n"
                    f"print('{mark}', RANK, int(t.item()))\n")
        cells = run_all(self.kernels, [code] * len(self.kernels), NORMAL_DEADLINE)
        figures.normal_cells += 1
        if not wait_all(cells, NORMAL_DEADLINE + 5):
            figures.hangs += 1
            figures.notes.append(f"normal cell {mark} hung")
            self.hung(cells, mark)
            return False
        if any(c.result.status != "ok" for c in cells):
            figures.out_of_step += 1
            errors = [c.result.error for c in cells if c.result.status != "ok"]
            figures.notes.append(f"normal cell {mark} failed after the fault: {errors[0]}")
            return False
        for i, c in enumerate(cells):
            text = c.result.text()
            # A %%collective's table holds every rank's line; a plain cell shows its own rank's only.
            for rank in ([i] if self.mode == "plain" else range(self.ranks)):
                if f"{mark} {rank} {self.ranks}" not in text:
                    figures.lost += 1
                    figures.notes.append(f"normal cell {mark}: rank {rank}'s line missing")
        return True


# --- faults ---------------------------------------------------------------------------------------------
def _collective(body: str, flags: str = "--timeout 30") -> str:
    return f"%%collective {flags}\n{body}"


def fault_cells(kind: str, world: World, rng: random.Random) -> tuple[list[str], Callable[[], None] | None]:
    """The cells of one fault for every kernel of ``world``, and what to do while they run (a press), if anything."""
    n, who = world.ranks, rng.randrange(world.ranks)
    same = len(world.kernels) == 1 or kind != "different"
    if kind == "raise":
        body = f"if RANK == {who}:\n    raise ValueError('soak')\nt = torch.ones(1)\ndist.all_reduce(t)\n"
    elif kind == "shape":
        body = f"t = torch.ones(2 if RANK == {who} else 3)\ndist.all_reduce(t)\n"
    elif kind == "skip":
        body = f"t = torch.ones(1)\nif RANK != {who}:\n    dist.all_reduce(t)\n"
    elif kind == "different":
        return [_collective(f"x = {i} + 1\n") for i in range(len(world.kernels))], None
    elif kind == "max_time":
        return [_collective(PLAIN_LOOP, "--timeout 30 --max-time 0.5")] * len(world.kernels), None
    elif kind in ("stop", "dist_stop"):
        delay = rng.uniform(0.05, 0.6)
        target = 0 if world.mode == "driven" else rng.randrange(len(world.kernels))

        def press() -> None:
            time.sleep(delay)
            if kind == "stop":
                world.interrupt(target)
            else:
                stop_everyone(world)

        return [LOOP] * len(world.kernels), press
    elif kind == "kill":
        delay = rng.uniform(0.05, 1.0)

        def kill() -> None:
            time.sleep(delay)
            world.killed = world.kill_worker(rng)

        return [LOOP] * len(world.kernels), kill
    else:
        raise ValueError(kind)
    assert same and n
    return [_collective(body)] * len(world.kernels), None


def stop_everyone(world: World) -> None:
    """What %dist_stop and nbdist stop send: a stop of every rank's running cell."""
    from nbdist.cell.guard import request_stop
    from nbdist.world.counters import current_round
    from nbdist.world.store import connect

    client = connect("127.0.0.1", world.port, token=world.token)
    try:
        request_stop(client, current_round(client), "the soak")
    finally:
        client.close()


def plain_fault(kind: str, world: World, rng: random.Random, figures: Figures) -> None:
    """Plain cells: the stop button in a loop of collectives; a rank that never joins, stopped after a moment."""
    who = rng.randrange(2)
    if kind == "stop":
        cells = run_all(world.kernels, [PLAIN_LOOP] * 2, FAULT_DEADLINE)
        time.sleep(rng.uniform(0.05, 0.6))
        pressed = time.monotonic()
        world.interrupt(who)
    else:  # "skip": one rank runs a cell without the collective; the one that waits is stopped
        codes = ["t = torch.ones(1)\ndist.all_reduce(t)\n", "x = 1\n"]
        if who == 1:
            codes.reverse()
        cells = run_all(world.kernels, codes, FAULT_DEADLINE)
        time.sleep(0.5)
        pressed = time.monotonic()
        world.interrupt(who)
    figures.ended_from(cells, pressed, f"plain {kind}", stop=True)


def soak_mode(mode: str, count: int, seed: int, check_every: int = 5) -> Figures:
    """``count`` faults (presses) in a fresh world of ``mode``; returns what was found."""
    rng = random.Random(seed)
    figures = Figures(mode)
    world = World(mode)
    try:
        if mode == "presses":
            for press in range(count):
                cells = run_all(world.kernels, [LOOP] * 2, FAULT_DEADLINE)
                time.sleep(rng.uniform(0.05, 0.6))
                pressed = time.monotonic()
                world.interrupt(rng.randrange(2))
                figures.faults += 1
                if not figures.ended_from(cells, pressed, f"press {press}", stop=True):
                    world.hung(cells, f"press {press}")
                    break
                if (press + 1) % check_every == 0 and not world.normal(figures):
                    break
            return figures
        kinds = (["stop", "skip"] if mode == "plain" else ["kill", "kill_idle", "raise", "stop"] if mode == "kills" else
                 ["raise", "shape", "skip", "stop", "max_time", "dist_stop"] + (["different"] if mode != "driven"
                                                                                 else []))
        for _ in range(count):
            kind = rng.choice(kinds)
            figures.faults += 1
            figures.by_kind[kind] = figures.by_kind.get(kind, 0) + 1
            world.killed = None
            if mode == "plain":
                plain_fault(kind, world, rng, figures)
            elif kind == "kill_idle":
                time.sleep(rng.uniform(0.0, 1.0))
                world.killed = world.kill_worker(rng)
            else:
                codes, during = fault_cells(kind, world, rng)
                started = time.monotonic()
                cells = run_all(world.kernels, codes, FAULT_DEADLINE)
                if during is not None:
                    during()
                    started = time.monotonic()
                if not figures.ended_from(cells, started, kind, stop=kind in ("stop", "dist_stop", "kill"),
                                          within=KILL_WITHIN if kind == "kill" else STOP_WITHIN):
                    world.hung(cells, f"fault {figures.faults} ({kind})")
                    break
            if world.killed is not None and not world.rejoined(world.killed, figures):
                break
            if not world.normal(figures):
                if figures.hangs:
                    break
                if not world.normal(figures):  # a second failure in a row: the world is out of step for good
                    figures.notes.append("two normal cells in a row failed: stopping this mode")
                    break
        return figures
    finally:
        world.close()


def fuzz_spec(text: str) -> config.StoreFuzz:
    """``--fuzz``'s value, as ``NBDIST_STORE_FUZZ`` takes it."""
    try:
        fuzz = config.parse_store_fuzz(text, "--fuzz")
    except ConfigError as exc:
        raise argparse.ArgumentTypeError(str(exc)) from None
    if fuzz is None:
        raise argparse.ArgumentTypeError("--fuzz needs SEED or SEED:PROBABILITY:MAX_MS (e.g. 11)")
    return fuzz


def fuzz_everything(fuzz: config.StoreFuzz | None) -> None:
    """Set (or clear) ``NBDIST_STORE_FUZZ`` here, for every kernel the soak starts and the workers they spawn."""
    if fuzz is None:
        os.environ.pop(config.FUZZ_VARIABLE, None)
    else:
        os.environ[config.FUZZ_VARIABLE] = fuzz.spec


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--modes", nargs="+", default=["presses", "lockstep2", "lockstep4", "driven", "plain"],
                        help="modes to run (default: all but kills; kills: workers killed and restarted)")
    parser.add_argument("--faults", type=int, default=150, help="faults per mode (default 150)")
    parser.add_argument("--presses", type=int, default=200, help="stop presses per seed (default 200)")
    parser.add_argument("--seeds", type=int, nargs="+", default=[335], help="seeds (default 335)")
    parser.add_argument("--check-every", type=int, default=5, help="presses between normal cells (default 5)")
    parser.add_argument("--short", action="store_true", help="CI's version: 12 presses, 4 faults per mode")
    parser.add_argument("--json", default=None, metavar="FILE", help="write the figures here")
    parser.add_argument(
        "--fuzz",
        type=fuzz_spec,
        default=None,
        metavar="SPEC",
        help="schedule fuzzing: set NBDIST_STORE_FUZZ=SPEC (SEED or SEED:PROBABILITY:MAX_MS, e.g. 11 or 11:0.35:50) "
        "in every kernel and worker (default: off, the variable cleared)",
    )
    args = parser.parse_args(argv)
    if args.short:
        args.faults, args.presses, args.seeds = 4, 12, args.seeds[:1]
    fuzz = args.fuzz.spec if args.fuzz else None
    fuzz_everything(args.fuzz)
    print(f"store fuzz: {fuzz or 'off'}", flush=True)
    started = time.monotonic()
    began = begin()
    rows = []
    figures = []
    for mode in args.modes:
        for seed in (args.seeds if mode == "presses" else args.seeds[:1]):
            f = soak_mode(mode, args.presses if mode == "presses" else args.faults, seed, args.check_every)
            row = {**f.row(), "seed": seed, "fuzz": fuzz}
            rows.append(row)
            print(json.dumps(row), flush=True)
            figures.append(soak_figure(f, seed, fuzz))
    summary = {"rows": rows, "seconds": round(time.monotonic() - started, 1), "load": os.getloadavg()[0],
               "date": time.strftime("%Y-%m-%d"), "machine": f"{os.cpu_count()} cores", "fuzz": fuzz}
    if args.json:
        Path(args.json).write_text(json.dumps(summary, indent=1))
    print(f"store fuzz: {fuzz or 'off'}")
    print(f"{'mode':<10} {'seed':>5} {'faults':>6} {'hangs':>5} {'out of step':>11} {'lost':>4} {'slow stops':>10} "
          f"{'median end':>10} {'p90 end':>8} {'max end':>8}")
    for r in rows:
        print(f"{r['mode']:<10} {r['seed']:>5} {r['faults']:>6} {r['hangs']:>5} {r['out_of_step']:>11} "
              f"{r['lost']:>4} {r['slow_stops']:>10} {r['median_end_s']!s:>10} {r['p90_end_s']!s:>8} "
              f"{r['max_end_s']!s:>8}")
        for note in r["notes"]:
            print(f"    {r['mode']}: {note}")
    bad = any(r["hangs"] or r["out_of_step"] or r["lost"] or r["slow_stops"] for r in rows)
    if not args.short:  # the short soak is CI's test, not the figure the docs show
        notes = [f"Store fuzz {fuzz} ({config.FUZZ_VARIABLE}) in every kernel."] if fuzz else []
        record("soak", f"The soak: random faults and stop presses between normal cells (every {args.check_every}th "
               "press followed by a normal cell on every rank)", figures, began, notes)
    return 1 if bad else 0


def soak_figure(f: Figures, seed: int, fuzz: str | None = None) -> dict[str, Any]:
    """One mode's headline figure, for the docs: seconds from a fault to the end of its cell, and what went wrong."""
    counts = f"hangs {f.hangs}, worlds out of step {f.out_of_step}, outputs lost {f.lost}, stops over 2 s {f.slow}"
    fuzzed = f", store fuzz {fuzz}" if fuzz else ""
    if f.mode == "kills":
        counts += f" (a kill's: over {KILL_WITHIN:g} s)"
    return figure(f"{f.mode}, seed {seed}{fuzzed}: fault to end of cell ({f.faults} faults; {counts})", f.ended, "s",
                  median=None if f.ended else float("nan"),
                  spread="min–max", target="no hang, none out of step, nothing lost, no slow stop",
                  met=not (f.hangs or f.out_of_step or f.lost or f.slow))


if __name__ == "__main__":
    signal.signal(signal.SIGTERM, lambda *_: sys.exit(143))  # kernels are shut down by soak_mode's finally
    sys.exit(main())
