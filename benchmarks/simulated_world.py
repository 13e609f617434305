"""A simulated world of hundreds of ranks: nbdist's real turn code against one real ``TCPStore``, with no kernels.

Issue 50, item 3. Each simulated rank is a thread running what the interleaving explorer runs for a rank
(``tests/explore/kernel.py``: a real :class:`nbdist.session.Session` with no IPython, no body and a process
group every rank trusts), but in real time, with no gates and no scheduler: its ``%%collective`` is
``pre_run_cell``, :meth:`Session.collective` (the turn, the start meeting, an empty body, each rank's capture
published, the end meeting, the records read as :mod:`nbdist.cell.ending` reads them) and ``post_run_cell``.
Every rank has its own connection to the store (:func:`nbdist.world.store.connect`), and its waits clone a
second one, as in a kernel.

For each world size N (``--world-sizes``, default 2 16 64 256 512 1024; with ``--shows all`` 1024 would move
hundreds of MB a cell: the recorded peers' figures stop at 256):

- a fresh :class:`nbdist.world.store.Server` (libuv, loopback) in a process of its own, whose CPU time is read
  from ``/proc/PID/task/*/schedstat`` (nanoseconds; the libuv loop is one thread of it);
- the world is formed in the store as the explorer forms it (``tests/explore/explorer.py``, ``execute``): each
  rank's registration, the size, who joined, the turn counter; no rendezvous is timed;
- one process that writes every rank's heartbeat once a second, as each rank's pulse process would, on a
  connection that no :class:`StoreClient` wraps (the counts leave the beats out, as they leave out a real
  pulse's);
- ``--hosts`` processes (default 2, one a core) each run N/hosts rank threads; each rank connects, and makes its
  waits' connection, at set-up. Two costs of hosting hundreds of ranks in one process, which a rank's own
  process would not pay, are left out: each connection's scan of the process's descriptors
  (``bound_connections``), and those connections made by every rank at once in the first cell;
- ``--warmup`` cells (default 2), then ``--cells`` (default 10) trivial cells. The parent starts each cell on
  every rank at once (a message to each host, whose threads wait on one event) and waits for every rank to end
  it. ``--peer-look S`` makes a waiting rank look at its peers' heartbeats every S seconds instead of nbdist's 1.

Per cell: the latency, from the first rank's ``pre_run_cell`` to the last rank's ``post_run_cell`` (clocks
compared through CLOCK_MONOTONIC, system-wide on Linux); the store operations and bytes every rank's
``StoreClient`` counted (:data:`nbdist.world.store.COUNTS`, summed over the host processes; ``get`` is one
operation there and two round trips on the wire); the server's CPU; the host processes' CPU (what the ranks'
Python spent: on 2 cores this, not the server, bounds the latency at large N). ``--shows one`` (default): only
rank 0 shows the cell's table and reads every record (a world driven from one notebook, whose workers show
none; they run the same turn code, not a follower's cell distribution); ``--shows all``: every rank does (peer
notebooks, as the explorer's ranks do), and the figures are ``simulated_world-peers``.

Run from the repository root::

    .venv/bin/python benchmarks/simulated_world.py
    .venv/bin/python benchmarks/simulated_world.py --world-sizes 2 16 --cells 5 --no-record
    .venv/bin/python benchmarks/simulated_world.py --plot-only   # redraw the figure from the JSON

It writes ``docs/figures/simulated_world.json`` and ``.md`` and plots the figures against N in
``docs/figures/simulated_world.svg`` (matplotlib, without pyplot; ``-peers`` for ``--shows all``). As root it
runs itself again with a private ``/etc/hosts`` (``--system-resolver`` keeps this machine's). Exits 0 when every
size was measured, 1 when a rank failed or a deadline passed.
"""

from __future__ import annotations

import argparse
import faulthandler
import glob
import json
import multiprocessing as mp
import os
import queue
import resource
import signal
import statistics
import sys
import threading
import time
from pathlib import Path
from types import SimpleNamespace
from typing import Any

from _common import FIGURES, ROOT, begin, figure, load_note, record

HOST = "127.0.0.1"
NAME = "simulated_world"
BODY = "x = 1"
TIMEOUT = 600.0  # every meeting's --timeout, s: a large world on 2 cores is slow, not stuck
FDS_PER_RANK = 3  # its connection and its waits' one in the host process, and the server's end (another process)


def now() -> float:
    """A clock shared by every process on this machine."""
    return time.clock_gettime(time.CLOCK_MONOTONIC)


def session_of(rounds: int, rank: int) -> str:
    """The kernel session a simulated rank registers under."""
    return f"sim-{rounds}-{rank}"


def raise_fd_limit(need: int) -> int:
    """Raise this process's soft limit on open files to ``need`` if the hard limit allows; the soft limit after."""
    soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
    if soft < need:
        soft = need if hard == resource.RLIM_INFINITY else min(need, hard)
        resource.setrlimit(resource.RLIMIT_NOFILE, (soft, hard))
    return soft


def orphan_guard() -> None:
    """End this child process if its parent dies (a killed benchmark leaves no server or host behind)."""
    parent = os.getppid()

    def watch() -> None:
        while os.getppid() == parent:
            time.sleep(0.5)
        os._exit(1)

    threading.Thread(target=watch, name="sim-orphan-guard", daemon=True).start()


_HOSTS_MARK = "NBDIST_BENCH_PRIVATE_HOSTS"


def reexec_with_private_hosts(argv: list[str]) -> int | None:
    """Run this script again with a private /etc/hosts (as ``rendezvous_scale.py --private-hosts`` does; this
    machine's file is not changed); None where that cannot be done (not root, no ``unshare``).

    The server formats every new connection's peer with a reverse lookup in its one loop thread; where /etc/hosts
    lacks ``::ffff:127.0.0.1`` the query goes to the resolver, and one that drops queries under load stalls the
    server by glibc's 5 s per connection: hundreds of connections would take many minutes.
    """
    import shlex
    import shutil
    import subprocess
    import tempfile

    if os.geteuid() != 0 or shutil.which("unshare") is None:
        return None
    hosts = tempfile.NamedTemporaryFile("w", suffix=".hosts", delete=False)
    with open("/etc/hosts") as f:
        hosts.write(f.read())
    hosts.write("\n::ffff:127.0.0.1 localhost\n::1 localhost\n")
    hosts.close()
    command = " ".join(shlex.quote(a) for a in [sys.executable, os.path.abspath(__file__), *argv])
    script = f"mount --bind {shlex.quote(hosts.name)} /etc/hosts && exec {command}"
    try:
        return subprocess.call(["unshare", "-m", "sh", "-c", script], env={**os.environ, _HOSTS_MARK: "1"})
    finally:
        os.unlink(hosts.name)


def task_cpu(pid: int) -> float:
    """Seconds of CPU every thread of process ``pid`` has run (``/proc/PID/task/*/schedstat``, nanoseconds)."""
    total = 0
    for path in glob.glob(f"/proc/{pid}/task/*/schedstat"):
        try:
            with open(path) as f:
                total += int(f.read().split()[0])
        except (OSError, ValueError, IndexError):
            continue  # a thread that ended meanwhile
    return total / 1e9


# --- the server (a process of its own) ---------------------------------------------------------------------


def serve(ports: Any, stop: Any, fds: int) -> None:
    """Run one rendezvous server until ``stop`` is set; its port goes to ``ports``."""
    from nbdist.world.store import Server

    orphan_guard()
    raise_fd_limit(fds)
    server = Server(HOST, 0)
    ports.put(server.port)
    try:
        stop.wait()
    finally:
        server.stop()


# --- a host: one process, many rank threads ----------------------------------------------------------------


class Hooks:
    """What the explorer's :class:`tests.explore.kernel.Kernel` asks of its harness, without a scheduler: the
    meetings' timeout, and where the stop buttons would be wired (nothing presses them here)."""

    def __init__(self, timeout: float) -> None:
        self.timeout = timeout

    def on_stop(self, button: Any) -> None:
        return None

    def on_sent_stop(self, stopper: Any) -> None:
        return None


def _collective(kernel: Any, shows: bool) -> None:
    """One ``%%collective`` from ``pre_run_cell`` to ``post_run_cell``, as the explorer's kernel runs it
    (``Kernel.collective``), with ``shows_table`` as asked; raises what the cell ended with."""
    from nbdist.cell import cellerror, cells
    from tests.explore.kernel import post_run_cell

    session = kernel.session
    info = SimpleNamespace(raw_cell=f"%%collective\n{BODY}")
    with post_run_cell():
        session.before_cell(info)

    def run() -> None:
        outcome = session.collective(BODY, cells.Flags(kernel.timeout, live=False), shows_table=shows)
        error = cellerror.error_for(session.world, outcome)
        if error is not None:
            raise error

    kernel._until_post_run_cell(info, run)


def beat(port: int, ranks: list[tuple[int, str]], stop: Any) -> None:
    """Each rank's heartbeat once a second, as its pulse process writes it (:class:`nbdist.world.pulse.Beat`), from
    a process of its own (a thread among a thousand rank threads would starve, and every rank would look dead), at
    a higher priority where it may (as root: at 1,024 ranks, two cores full of rank threads delayed its beats 6 s
    and the ranks called 16 live peers dead), in one ``multi_set`` a second, on one connection that no
    :class:`StoreClient` wraps (a pulse's beats are not counted either)."""
    from nbdist.config import HEARTBEAT_INTERVAL
    from nbdist.world import keys
    from nbdist.world.pulse import Beat
    from nbdist.world.store import PREFIX, connect

    orphan_guard()
    try:  # a thousand pulses are a thousand processes, each ready at once: this one stands for them all
        os.nice(-10)
    except PermissionError:
        pass
    client = connect(HOST, port)
    raw, n, pid = client.raw(), 0, os.getpid()
    names = [PREFIX + keys.heartbeat(session) for _, session in ranks]
    try:
        while not stop.is_set():
            n += 1
            now = time.time()
            raw.multi_set(names, [Beat(n, now, pid=pid, pulse=pid, rank=rank).to_json() for rank, _ in ranks])
            stop.wait(HEARTBEAT_INTERVAL)
    finally:
        client.close()


def host(index: int, port: int, rounds: int, size: int, mine: list[int], shows: str, peer_look: float | None,
         commands: Any, out: Any) -> None:
    """Run the ranks ``mine`` of a world of ``size`` in threads; one cell per "go" from the parent, reported back.
    ``peer_look``: seconds between a waiting rank's looks at its peers' heartbeats (None: nbdist's)."""
    try:
        orphan_guard()
        faulthandler.register(signal.SIGUSR1, all_threads=True)  # kill -USR1: where 100 threads are, to stderr
        from nbdist.world import store

        # Each new connection scans every descriptor of its process for its socket, to bound its sends
        # (bound_connections, TCP_USER_TIMEOUT: on loopback nothing is ever unacknowledged). A rank's process holds a
        # few dozen; a host of 512 ranks, a thousand or two, and the scans made a 1,024-rank world's first cell take
        # minutes here. Left out in the hosts.
        store.bound_connections = lambda *_, **__: 0  # type: ignore[assignment]
        if peer_look is not None:
            from nbdist.world import checks

            checks.HEARTBEAT_INTERVAL = peer_look  # type: ignore[misc]  # only Checks.peers reads it there
        raise_fd_limit(FDS_PER_RANK * len(mine) + 256)
        threading.stack_size(512 * 1024)  # a thousand threads or two: keep their stacks small
        from nbdist.world import keys
        from nbdist.world.records import Registration
        from nbdist.world.store import COUNTS, StoreCounts, connect
        from nbdist.world.world import World
        from tests.explore.kernel import Kernel, Trusted

        infos = [Registration(session=session_of(rounds, i), rank=i, host="h", pid=100 + i, keeps_beat=True)
                 for i in range(size)]
        kernels = []
        for i in mine:
            client = connect(HOST, port)
            client.wait([keys.SERVER], 60.0)  # its waits' connection and thread, made now rather than all at once
            world = World(client, rounds, i, size, infos[i], infos)
            world.last_turn = 0  # just joined: step 1 is this round's first (as the explorer's execute leaves it)
            kernels.append(Kernel(world, Hooks(TIMEOUT)))  # type: ignore[arg-type]
            world.pg = Trusted(world.gen)
        go: list[threading.Event] = []
        done = threading.Semaphore(0)
        times: dict[int, dict[int, tuple[float, float, str | None]]] = {}

        def rank(k: Any) -> None:
            r = k.world.rank
            for c in range(len(go)):
                go[c].wait()
                t0, error = now(), None
                try:
                    _collective(k, shows == "all" or r == 0)
                except BaseException as exc:  # reported to the parent, which fails the run
                    error = f"{type(exc).__name__}: {exc}"
                times[c][r] = (t0, now(), error)
                done.release()

        out.put(("ready", index, len(mine)))
        cells = commands.get()
        go = [threading.Event() for _ in range(cells)]
        for c in range(cells):
            times[c] = {}
        threads = [threading.Thread(target=rank, args=(k,), name=f"sim-rank-{k.world.rank}", daemon=True)
                   for k in kernels]
        for t in threads:
            t.start()
        for c in range(cells):
            if commands.get() != ("go", c):
                raise RuntimeError(f"host {index}: expected cell {c}")
            counts, cpu = COUNTS.snapshot(), time.process_time()
            go[c].set()
            for _ in mine:
                done.acquire()
            moved = StoreCounts.delta(counts, COUNTS.snapshot())
            out.put(("done", index, c, {"times": times[c], "counts": moved, "cpu": time.process_time() - cpu,
                                        "threads": threading.active_count()}))
        for k in kernels:
            k.world.client.close()
    except BaseException as exc:  # reported to the parent, which fails the run
        import traceback

        out.put(("error", index, -1, f"{type(exc).__name__}: {exc}\n{traceback.format_exc()}"))


# --- the parent --------------------------------------------------------------------------------------------


class SimError(RuntimeError):
    """A rank failed, a process died, or a deadline passed."""


def _get(out: Any, procs: list[Any], deadline: float, what: str) -> tuple[Any, ...]:
    while True:
        left = deadline - time.monotonic()
        if left <= 0:
            raise SimError(f"{what}: deadline passed")
        try:
            msg = out.get(timeout=min(0.5, left))
        except queue.Empty:
            dead = [p for p in procs if p.exitcode not in (None, 0)]
            if dead:
                raise SimError(f"{what}: a process died (exit code {dead[0].exitcode})") from None
            continue
        if msg[0] == "error":
            raise SimError(f"{what}: host {msg[1]} failed: {msg[3]}")
        return tuple(msg)


def form(port: int, rounds: int, size: int) -> None:
    """The world formed in the store, as the explorer's ``execute`` leaves a round before its ranks run."""
    from nbdist.world import keys
    from nbdist.world.counters import TURN
    from nbdist.world.records import Registration
    from nbdist.world.store import connect

    control = connect(HOST, port)
    try:
        control.set("round", str(rounds))
        key = lambda name: keys.in_round(rounds, name)  # noqa: E731
        for i in range(size):
            info = Registration(session=session_of(rounds, i), rank=i, host="h", pid=100 + i, keeps_beat=True)
            control.set(key(keys.rank(i)), info.to_json())
        for name, value in ((keys.SIZE, str(size)), (keys.JOINED, "".join(f"{i}," for i in range(size))),
                            (keys.READY, "1")):
            control.set(key(name), value)
        control.add(key(keys.COUNT), size)
        control.add(key(TURN), 0)
    finally:
        control.close()


def run_size(size: int, args: argparse.Namespace) -> dict[str, Any]:
    """One world of ``size`` ranks on a fresh server: its cells, measured."""
    ctx = mp.get_context("spawn")
    hosts = max(1, min(args.hosts, size))
    ports, stop_server, out = ctx.Queue(), ctx.Event(), ctx.Queue()
    server = ctx.Process(target=serve, args=(ports, stop_server, FDS_PER_RANK * size + 256), daemon=True)
    procs: list[Any] = [server]
    server.start()
    try:
        port = ports.get(timeout=120)
        form(port, 1, size)
        beats = ctx.Process(target=beat, args=(port, [(i, session_of(1, i)) for i in range(size)], stop_server),
                            daemon=True)
        procs.append(beats)
        beats.start()
        cells = args.warmup + args.cells
        commands = [ctx.Queue() for _ in range(hosts)]
        for h in range(hosts):
            mine = list(range(h, size, hosts))
            procs.append(ctx.Process(target=host, daemon=True,
                                     args=(h, port, 1, size, mine, args.shows, args.peer_look, commands[h], out)))
            procs[-1].start()
        t_setup = time.monotonic()
        for _ in range(hosts):
            _get(out, procs, time.monotonic() + args.deadline, f"{size} ranks: connecting")
        setup = time.monotonic() - t_setup
        print(f"  {size} ranks connected in {setup:.1f} s", flush=True)
        for q in commands:
            q.put(cells)
        per_cell = []
        for c in range(cells):
            cpu = task_cpu(server.pid)
            for q in commands:
                q.put(("go", c))
            reports = [_get(out, procs, time.monotonic() + args.deadline, f"{size} ranks: cell {c}")[3]
                       for _ in range(hosts)]
            server_cpu = task_cpu(server.pid) - cpu
            spans = [t for rep in reports for t in rep["times"].values()]
            errors = [e for _, _, e in spans if e]
            if errors:
                raise SimError(f"{size} ranks: cell {c}: {len(errors)} rank(s) failed, e.g. {errors[0]}")
            ops = sum(rep["counts"]["ops"] for rep in reports)
            moved = sum(rep["counts"]["sent"] + rep["counts"]["received"] for rep in reports)
            kinds: dict[str, list[int]] = {}
            for rep in reports:
                for what, k in rep["counts"]["kinds"].items():
                    kinds[what] = [a + b for a, b in zip(kinds.get(what, [0, 0, 0]), k, strict=True)]
            per_cell.append({"latency": max(e for _, e, _ in spans) - min(s for s, _, _ in spans),
                             "ops": ops, "bytes": moved, "server_cpu": server_cpu,
                             "hosts_cpu": sum(rep["cpu"] for rep in reports), "kinds": kinds,
                             "threads": sum(rep["threads"] for rep in reports)})
            last = per_cell[-1]
            print(f"  {size} ranks, cell {c + 1} of {cells}{' (warm-up)' if c < args.warmup else ''}: "
                  f"{last['latency'] * 1e3:.0f} ms, {ops} operations, {moved / 1e3:.0f} kB", flush=True)
        return {"size": size, "hosts": hosts, "setup_s": setup, "first": per_cell[0], "cells": per_cell[args.warmup:]}
    finally:
        stop_server.set()
        for p in reversed(procs):  # the hosts and the beats before the server
            p.join(5)
            if p.is_alive():
                p.kill()
                p.join(5)


def summarize(result: dict[str, Any]) -> dict[str, Any]:
    """Per size: the medians (and p90 of the latency) over its measured cells."""
    cells, n = result["cells"], result["size"]

    def med(key: str) -> float:
        return statistics.median(c[key] for c in cells)

    lat = sorted(c["latency"] for c in cells)
    p90 = statistics.quantiles(lat, n=10, method="inclusive")[-1] if len(lat) > 1 else lat[0]
    first = result["first"]
    return {"size": n, "hosts": result["hosts"], "cells": len(cells), "setup_s": round(result["setup_s"], 2),
            "first_latency_ms": first["latency"] * 1e3, "first_ops": first["ops"], "first_bytes": first["bytes"],
            "latency_ms": med("latency") * 1e3, "latency_p90_ms": p90 * 1e3,
            "ops": med("ops"), "ops_per_rank": med("ops") / n,
            "bytes": med("bytes"), "bytes_per_rank": med("bytes") / n,
            "server_cpu_ms": med("server_cpu") * 1e3, "hosts_cpu_ms": med("hosts_cpu") * 1e3,
            "hosts_cpu_per_rank_ms": med("hosts_cpu") * 1e3 / n, "threads": cells[-1]["threads"],
            "kinds": cells[len(cells) // 2]["kinds"]}


def rows_of(results: list[dict[str, Any]], summaries: list[dict[str, Any]]) -> list[dict[str, Any]]:
    rows = []
    for r, s in zip(results, summaries, strict=True):
        n, cells = s["size"], r["cells"]
        rows += [
            figure(f"{n} ranks: latency per cell (first start to last end)", [c["latency"] * 1e3 for c in cells],
                   "ms", decimals=1),
            figure(f"{n} ranks: store operations per cell, all ranks", [c["ops"] for c in cells], "", decimals=0),
            figure(f"{n} ranks: store operations per rank per cell", [c["ops"] / n for c in cells], "", decimals=1),
            figure(f"{n} ranks: bytes per cell, all ranks", [c["bytes"] / 1e3 for c in cells], "kB", decimals=1),
            figure(f"{n} ranks: bytes per rank per cell", [c["bytes"] / n for c in cells], "B", decimals=0),
            figure(f"{n} ranks: server CPU per cell", [c["server_cpu"] * 1e3 for c in cells], "ms", decimals=1),
            figure(f"{n} ranks: ranks' CPU per rank per cell (host processes)",
                   [c["hosts_cpu"] * 1e3 / n for c in cells], "ms", decimals=2),
            figure(f"{n} ranks: the world's first cell: latency", [r["first"]["latency"] * 1e3], "ms", decimals=1),
            figure(f"{n} ranks: the world's first cell: store operations, all ranks", [r["first"]["ops"]], "",
                   decimals=0),
        ]
    return rows


def plot(data: dict[str, Any], path: Path) -> None:
    """The figures against the world size, log-log, in three panels (matplotlib without pyplot)."""
    from matplotlib.figure import Figure

    sims = data["sizes"]
    n = [s["size"] for s in sims]
    fig = Figure(figsize=(11, 3.6), layout="constrained")
    axes = fig.subplots(1, 3)
    panels = [
        ("latency per cell (ms)", [("median", "latency_ms"), ("p90", "latency_p90_ms")]),
        ("store traffic per cell", [("operations, all ranks", "ops"), ("kB, all ranks", "kB"),
                                    ("bytes per rank", "bytes_per_rank")]),
        ("CPU per cell (ms)", [("the server's process", "server_cpu_ms"), ("all ranks (host processes)",
                                                                            "hosts_cpu_ms")]),
    ]
    for ax, (title, lines) in zip(axes, panels, strict=True):
        for label, key in lines:
            ys = [s["bytes"] / 1e3 if key == "kB" else s[key] for s in sims]
            ax.plot(n, ys, marker="o", label=label)
        ax.set_xscale("log", base=2)
        ax.set_xticks(n, [str(v) for v in n])
        ax.minorticks_off()
        ax.set_yscale("log")
        ax.set_xlabel("ranks")
        ax.set_title(title, fontsize=10)
        ax.grid(True, which="major", alpha=0.3)
        ax.legend(fontsize=8)
    fig.suptitle(f"A simulated world (shows {data['shows']}): one TCPStore, {data['machine']}", fontsize=9)
    fig.savefig(path, format="svg", metadata={"Date": None})


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--world-sizes", type=int, nargs="+", default=[2, 16, 64, 256, 512, 1024])
    parser.add_argument("--cells", type=int, default=10, help="measured cells per size")
    parser.add_argument("--warmup", type=int, default=2, help="cells before them, not measured")
    parser.add_argument("--hosts", type=int, default=2, help="processes that run the rank threads")
    parser.add_argument("--shows", choices=("one", "all"), default="one",
                        help="which ranks show the table: rank 0 (a driven world; figures simulated_world) or every "
                             "rank (peer notebooks; figures simulated_world-peers)")
    parser.add_argument("--peer-look", type=float, default=None, metavar="S",
                        help="seconds between a waiting rank's looks at its peers' heartbeats (default: nbdist's, "
                             "1 s); at 512 ranks on 2 cores every rank's look each second costs more CPU than "
                             "the machine has")
    parser.add_argument("--deadline", type=float, default=600.0, help="seconds a cell or the set-up may take")
    parser.add_argument("--system-resolver", action="store_true",
                        help="keep this machine's /etc/hosts (by default, as root, the script runs again with a "
                             "private one that names ::ffff:127.0.0.1, so no connection waits on the resolver)")
    parser.add_argument("--no-record", action="store_true", help="print only; write no figures")
    parser.add_argument("--plot-only", action="store_true", help="redraw the SVG from the recorded JSON")
    args = parser.parse_args()
    signal.signal(signal.SIGTERM, lambda *_: sys.exit(143))  # stop the server and hosts on the way out
    name = NAME + ("-peers" if args.shows == "all" else "")
    svg, data_path = FIGURES / f"{name}.svg", FIGURES / f"{name}.json"
    if args.plot_only:
        plot(json.loads(data_path.read_text())["plot"], svg)
        return 0
    if not args.system_resolver and not os.environ.get(_HOSTS_MARK):
        code = reexec_with_private_hosts(sys.argv[1:])
        if code is not None:
            return code
        print("not root or no unshare: this machine's /etc/hosts and resolver are used")
    private = bool(os.environ.get(_HOSTS_MARK))
    if private:
        print("private /etc/hosts: ::ffff:127.0.0.1 and ::1 resolve locally")
    began = begin()
    print(load_note("at start"))
    results, summaries = [], []
    for size in args.world_sizes:
        try:
            result = run_size(size, args)
        except SimError as exc:
            print(f"FAILED: {exc}", file=sys.stderr)
            return 1
        results.append(result)
        s = summarize(result)
        summaries.append(s)
        print(f"{size:5d} ranks ({s['hosts']} hosts, {s['threads']} threads, set-up {s['setup_s']:.1f} s): "
              f"latency {s['latency_ms']:.1f} ms (p90 {s['latency_p90_ms']:.1f}); "
              f"{s['ops']:.0f} ops ({s['ops_per_rank']:.1f}/rank), {s['bytes'] / 1e3:.1f} kB "
              f"({s['bytes_per_rank']:.0f} B/rank); server CPU {s['server_cpu_ms']:.1f} ms; "
              f"ranks' CPU {s['hosts_cpu_ms']:.0f} ms ({s['hosts_cpu_per_rank_ms']:.2f}/rank); first cell "
              f"{s['first_latency_ms']:.0f} ms, {s['first_ops']} ops; {load_note('now')}",
              flush=True)
        top = sorted(s["kinds"].items(), key=lambda kv: -kv[1][0])[:6]
        print("       ops by kind (ops, bytes sent, received): "
              + ", ".join(f"{k} {v[0]}/{v[1]}/{v[2]}" for k, v in top), flush=True)
    end_note = load_note("at the end")
    print(end_note)
    if args.no_record:
        return 0
    notes = [
        f"Every rank a thread running nbdist's real turn code (the explorer's kernel, in real time), {args.hosts} "
        f"host processes, one libuv TCPStore server in a process of its own, loopback; --shows {args.shows}; "
        f"{args.cells} measured cells per size after {args.warmup} warm-up cells"
        + ("" if args.peer_look is None else f"; a waiting rank looked at its peers' heartbeats every "
           f"{args.peer_look:g} s (nbdist: every 1 s)") + ". Latency: first rank's "
        "pre_run_cell to the last rank's post_run_cell. Operations and bytes: every rank's StoreClient "
        "(nbdist.world.store.COUNTS; heartbeats, one a second per rank, not counted). Server CPU: every thread "
        "of the server's process (/proc schedstat), beats included."
        + (" A private /etc/hosts named ::ffff:127.0.0.1, so the server's reverse lookup of each new connection "
           "answered locally." if private else " This machine's own resolver answered the server's reverse lookups."),
        f"{end_note}.",
    ]
    title = "every rank shows the table (peers)" if args.shows == "all" else "rank 0 shows the table (driven)"
    record(name, f"A simulated world, {title}: one trivial cell, by world size", rows_of(results, summaries),
           began, notes)
    plot_data = {"shows": args.shows, "machine": f"{os.cpu_count()} cores, {args.hosts} host processes",
                 "sizes": [{k: v for k, v in s.items() if k != "kinds"} for s in summaries]}
    stored = json.loads(data_path.read_text())
    stored["plot"] = plot_data
    data_path.write_text(json.dumps(stored, indent=1, ensure_ascii=False) + "\n")
    plot(plot_data, svg)
    print(f"plot written to {svg.relative_to(ROOT)}")
    return 0


if __name__ == "__main__":
    sys.path.insert(0, str(ROOT))  # tests.explore, which holds the explorer's kernel
    sys.exit(main())
