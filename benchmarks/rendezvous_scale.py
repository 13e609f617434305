"""How nbdist's rendezvous scales with the number of ranks: join, first barrier, barrier rounds.

For each world size (``--sizes``, default 2,4,8,16,32,64) the parent starts a
fresh :class:`nbdist.world.store.Server` on a free loopback port, then spawns that
many worker processes (``multiprocessing``, spawn; no Jupyter kernels). Each
worker imports torch and nbdist first (excluded from every figure) and reports
ready. When the last one is ready the parent notes the *release moment* and
sets an Event. Each worker then does what ``%%dist_init`` does at the store
level (no process group): :func:`nbdist.world.store.connect`, then
:func:`nbdist.world.rendezvous.join` with a registration shaped like
``Session.init``'s (its keys, with values for gloo on loopback), then a
first ``gather.barrier``, then ``--barriers`` (100) more barriers, each timed.
This is repeated ``--repeats`` times (default 3) by the same worker processes,
each time against a fresh server on a fresh port.

Per size it prints the time from the release moment until every rank has
passed the first barrier (the max over ranks; median and worst of the
repeats; also when every rank woke, was connected and had joined), and the
median, p90 and max of one barrier over all ranks' barrier times. Timestamps compare across processes through
CLOCK_MONOTONIC, which is system-wide on Linux. Unless ``--no-profile``, every
store operation of the workers is timed too (a wrapper installed in the worker
processes only), so the table says how many round trips each phase makes and
what one costs.

Target: at 64, join + first barrier <= 2 s after the last process starts.

Run from the repository root::

    .venv/bin/python benchmarks/rendezvous_scale.py
    .venv/bin/python benchmarks/rendezvous_scale.py --sizes 2,8 --barriers 20

Every wait is bounded. Exits 0 when every size ran (target met or not), 1 when
a worker failed or a deadline passed.
"""

from __future__ import annotations

import argparse
import multiprocessing as mp
import os
import queue
import statistics
import sys
import time
from collections import defaultdict
from typing import Any

from _common import begin, figure, load_note, record

TARGET_SIZE = 64
TARGET_S = 2.0
TARGET = "target: at 64: join + first barrier <= 2 s after the last process starts"
HOST = "127.0.0.1"
STORE_OPS = ("set", "get", "add", "compare_set", "wait", "multi_get", "check", "append")
PROFILED = ("connect", "clone", *STORE_OPS)


def now() -> float:
    """A clock shared by every process on this machine."""
    return time.clock_gettime(time.CLOCK_MONOTONIC)


# --- the worker (runs in a spawned process) ----------------------------------------------


def _install_profiler(samples: dict[str, list[float]], phase: list[str]) -> None:
    """Time every store operation in this process (nbdist itself is not changed).

    ``clone`` (a new connection, made by a StoreClient's first ``wait``) is
    timed through ``StoreClient._call``, the one place every store call passes.
    """
    from nbdist.world import store

    def timed(name: str | None, fn: Any) -> Any:
        def wrapper(*args: Any, **kwargs: Any) -> Any:
            op = name or args[1]  # _call(self, what, fn): only its clones, the rest are timed above
            if name is None and op != "clone":
                return fn(*args, **kwargs)
            t0 = time.perf_counter()
            try:
                return fn(*args, **kwargs)
            finally:
                samples[f"{phase[0]}|{op}"].append(time.perf_counter() - t0)

        return wrapper

    for op in STORE_OPS:
        setattr(store.StoreClient, op, timed(op, getattr(store.StoreClient, op)))
    store.StoreClient._call = timed(None, store.StoreClient._call)


def worker(rank: int, size: int, port: Any, releases: list[Any], out: Any, opts: dict[str, Any]) -> None:
    """One rank: import, report ready; per repeat: wait for the release, connect, join, barriers, report."""
    rep = -1
    try:
        import os
        import platform
        import socket
        import uuid

        import torch
        import torch.distributed  # noqa: F401  (loaded before the clock starts, as in a kernel)

        from nbdist import __version__
        from nbdist.world import gather, rendezvous, store

        samples: dict[str, list[float]] = defaultdict(list)
        phase = ["join"]
        if opts["profile"]:
            _install_profiler(samples, phase)
        out.put(("ready", rank, rep, now()))
        for rep, release in enumerate(releases):
            if not release.wait(opts["release_timeout"]):
                out.put(("error", rank, rep, f"not released within {opts['release_timeout']:g} s"))
                return
            samples.clear()
            phase[0] = "join"
            t = {"woke": now()}
            client = store.connect(HOST, port.value, timeout=opts["timeout"])
            t["connected"] = now()
            samples["join|connect"].append(t["connected"] - t["woke"])
            me = {
                "session": uuid.uuid4().hex,
                "rank": rank,
                "host": socket.gethostname(),
                "node": f"{socket.gethostname()}/rendezvous_scale",
                "pid": os.getpid(),
                "nbdist": __version__,
                "torch": torch.__version__,
                "python": platform.python_version(),
                "backend": "gloo",
                "backend_reason": "benchmark (no process group)",
                "device": "cpu",
                "device_chosen": False,
                # what Session.init registers for gloo on loopback (nbdist.backend.envplan), as static values
                "agreed": {"backend": "gloo"},
                "env": ["GLOO_SOCKET_IFNAME=lo  # nbdist"],
            }
            world = rendezvous.join(client, me, size, opts["timeout"])
            t["joined"] = now()
            gather.barrier(world, gather.Gathering("b/0", "bench first barrier", opts["timeout"]))
            t["first_barrier"] = now()
            phase[0] = "barrier"
            barriers = []
            for k in range(1, opts["barriers"] + 1):
                t0 = time.perf_counter()
                gather.barrier(world, gather.Gathering(f"b/{k}", "bench", opts["timeout"]))
                barriers.append(time.perf_counter() - t0)
            client.close()
            ops = {k: list(v) for k, v in samples.items()}
            out.put(("done", rank, rep, {"t": t, "barriers": barriers, "ops": ops}))
    except BaseException as exc:  # reported to the parent, which fails the run
        out.put(("error", rank, rep, f"{type(exc).__name__}: {exc}"))


# --- the parent ------------------------------------------------------------------------


class BenchError(RuntimeError):
    """A worker failed or a deadline passed."""


def pct(values: list[float], q: int) -> float:
    if len(values) < 2:
        return values[0]
    return statistics.quantiles(values, n=100, method="inclusive")[q - 1]


def collect(out: Any, procs: list[Any], kind: str, rep: int, deadline: float, what: str) -> dict[int, Any]:
    """Gather one ``kind`` message of repeat ``rep`` per worker; fail on an error, a death or the deadline."""
    got: dict[int, Any] = {}
    while len(got) < len(procs):
        left = deadline - time.monotonic()
        if left <= 0:
            missing = sorted(set(range(len(procs))) - set(got))
            raise BenchError(f"{what}: deadline passed; no word from rank(s) {_short(missing)}")
        try:
            msg_kind, rank, msg_rep, payload = out.get(timeout=min(0.5, left))
        except queue.Empty:
            dead = [i for i, p in enumerate(procs) if i not in got and p.exitcode not in (None, 0)]
            if dead:
                raise BenchError(f"{what}: worker(s) {_short(dead)} died (exit code "
                                 f"{procs[dead[0]].exitcode})") from None
            continue
        if msg_kind == "error":
            raise BenchError(f"{what}: rank {rank} failed: {payload}")
        if msg_kind == kind and msg_rep == rep:
            got[rank] = payload
    return got


def _short(ranks: list[int]) -> str:
    return ", ".join(map(str, ranks[:10])) + (f" … ({len(ranks)} in all)" if len(ranks) > 10 else "")


def run_size(size: int, args: argparse.Namespace) -> dict[str, Any]:
    """Spawn ``size`` workers once; per repeat a fresh server, a release, and the workers' reports."""
    from nbdist.world.store import Server

    ctx = mp.get_context("spawn")
    out = ctx.Queue()
    releases = [ctx.Event() for _ in range(args.repeats)]
    port = ctx.Value("i", 0)
    opts = {"timeout": args.timeout, "barriers": args.barriers, "profile": args.profile,
            "release_timeout": args.start_timeout + args.repeats * args.run_timeout}
    procs = [ctx.Process(target=worker, args=(r, size, port, releases, out, opts), daemon=True)
             for r in range(size)]
    reps = []
    server: Server | None = Server(HOST, 0)  # a fresh server (and port) for every repeat
    port.value = server.port
    t_spawn = now()
    try:
        for p in procs:
            p.start()
        ready = collect(out, procs, "ready", -1, time.monotonic() + args.start_timeout,
                        f"{size} ranks starting (importing torch)")
        start_s = max(ready.values()) - t_spawn
        for rep, release in enumerate(releases):
            if server is None:
                server = Server(HOST, 0)
                port.value = server.port
            t_release = now()
            release.set()
            done = collect(out, procs, "done", rep, time.monotonic() + args.run_timeout,
                           f"{size} ranks, repeat {rep + 1}")
            server.stop()
            server = None
            reps.append({phase: max(d["t"][phase] for d in done.values()) - t_release
                         for phase in ("woke", "connected", "joined", "first_barrier")}
                        | {"barriers": [b for d in done.values() for b in d["barriers"]],
                           "ops": [d["ops"] for d in done.values()]})
        for p in procs:
            p.join(timeout=10)
    finally:
        for p in procs:
            if p.is_alive():  # only after a failure: the others are still waiting or stuck
                p.terminate()
        for p in procs:
            p.join(timeout=5)
        if server is not None:
            server.stop()
    barriers = [b for r in reps for b in r["barriers"]]
    first = [r["first_barrier"] for r in reps]
    return {
        "size": size,
        "start_s": start_s,
        "phases": {ph: statistics.median(r[ph] for r in reps) for ph in ("woke", "connected", "joined")},
        "first": first,
        "barriers": barriers,
        "barrier_median": statistics.median(barriers),
        "barrier_p90": pct(barriers, 90),
        "barrier_max": max(barriers),
        "ops": [ops for r in reps for ops in r["ops"]],
    }


def print_table(rows: list[dict[str, Any]], args: argparse.Namespace) -> None:
    print(f"\n== rendezvous: seconds after the release (every rank ready), max over ranks; "
          f"{args.repeats} repeat(s) per size ==")
    print(f"{'':>5} {'':>8} {'median of the repeats':^29} {'join + 1st barrier':^17} | {'one barrier, ms':^26}")
    print(f"{'ranks':>5} {'start s':>8} {'woke':>9} {'connected':>9} {'joined':>9} {'median':>8} {'worst':>8} |"
          f" {'median':>8} {'p90':>8} {'max':>8}")
    for r in rows:
        ph = r["phases"]
        print(f"{r['size']:>5} {r['start_s']:>8.1f} {ph['woke']:>9.3f} {ph['connected']:>9.3f} {ph['joined']:>9.3f}"
              f" {statistics.median(r['first']):>8.3f} {max(r['first']):>8.3f} |"
              f" {r['barrier_median'] * 1000:>8.2f} {r['barrier_p90'] * 1000:>8.2f} {r['barrier_max'] * 1000:>8.2f}")
    print(f"(start s: spawn to the last rank ready, importing torch; not counted anywhere else. One barrier: "
          f"{args.barriers} barriers x every rank x every repeat, pooled.)")


def print_profile(rows: list[dict[str, Any]], args: argparse.Namespace) -> None:
    print("\n== store operations, per rank: calls, then median / p90 ms of one call ==")
    print("(connect = store.connect; clone = a new connection, made by a client's first wait; wait = until the keys "
          "are set, so it includes waiting for the slowest rank)")
    for phase, per, title in (("join", 1, "connect .. first barrier passed, per rank"),
                              ("barrier", args.barriers, "one later barrier, per rank")):
        print(f"-- {title} --")
        print(f"{'op':<12}" + "".join(f"{str(r['size']) + ' ranks':>20}" for r in rows))
        for op in PROFILED:
            cells = []
            for r in rows:
                values = [v for ops in r["ops"] for v in ops.get(f"{phase}|{op}", [])]
                if values:
                    calls = len(values) / len(r["ops"]) / per
                    med, p90 = statistics.median(values) * 1000, pct(values, 90) * 1000
                    cells.append(f"{calls:>6.1f} {med:>6.2f}/{p90:<7.2f}")
                else:
                    cells.append("-")
            if any(c != "-" for c in cells):
                print(f"{op:<12}" + "".join(f"{c:>20}" for c in cells))
    print("-- stalls: calls that took >= 1 s (all ranks, all repeats) --")
    for r in rows:
        slow: dict[str, list[float]] = defaultdict(list)
        for ops in r["ops"]:
            for key, values in ops.items():
                slow[key.replace("|", " ")].extend(v for v in values if v >= 1.0)
        text = ", ".join(f"{k} x{len(v)} (~{statistics.median(v):.1f} s)" for k, v in sorted(slow.items()) if v)
        print(f"{r['size']:>5} ranks: {text or 'none'}")


def size_figures(rows: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """The headline figures, for the docs: per size, join + first barrier and one barrier."""
    figures = []
    for r in rows:
        target = {}
        if r["size"] == TARGET_SIZE:
            target = {"target": f"≤ {TARGET_S:g} s", "met": statistics.median(r["first"]) <= TARGET_S}
        figures.append(figure(f"{r['size']} ranks: join + first barrier after the last process starts (max over "
                              "ranks; spread over the repeats)", r["first"], "s", spread="min–max", decimals=3,
                              **target))
        figures.append(figure(f"{r['size']} ranks: one barrier (every rank's, pooled)",
                              [b * 1000 for b in r["barriers"]], "ms"))
    return figures


def parse_args(argv: list[str] | None) -> argparse.Namespace:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--sizes", default="2,4,8,16,32,64", help="comma-separated world sizes (default 2,4,8,16,32,64)")
    p.add_argument("--barriers", type=int, default=100, help="timed barriers after the first (default 100)")
    p.add_argument("--timeout", type=float, default=60.0,
                   help="seconds each connect, join and barrier may take in a worker (default 60)")
    p.add_argument("--start-timeout", type=float, default=600.0,
                   help="seconds for all workers of one size to import torch and report ready (default 600)")
    p.add_argument("--run-timeout", type=float, default=300.0,
                   help="seconds from the release until every worker of one size has finished (default 300)")
    p.add_argument("--repeats", type=int, default=3,
                   help="rendezvous repeats per size, each on a fresh server, same worker processes (default 3)")
    p.add_argument("--no-profile", dest="profile", action="store_false", help="do not time each store operation")
    p.add_argument("--private-hosts", action="store_true",
                   help="run in a private mount namespace whose /etc/hosts names ::ffff:127.0.0.1 and ::1, so that "
                        "torch's reverse lookup of each new store connection answers locally (Linux, root)")
    args = p.parse_args(argv)
    try:
        args.size_list = [int(s) for s in args.sizes.split(",") if s.strip()]
    except ValueError:
        p.error(f"--sizes must be comma-separated integers, not {args.sizes!r}")
    if not args.size_list or min(args.size_list) < 1:
        p.error("--sizes needs at least one size >= 1")
    if args.barriers < 1 or args.repeats < 1:
        p.error("--barriers and --repeats must be at least 1")
    return args


_HOSTS_MARK = "NBDIST_BENCH_PRIVATE_HOSTS"


def reexec_with_private_hosts(argv: list[str]) -> int:
    """Run this script again with a private /etc/hosts (this machine's file is not changed).

    torch formats every new store connection's peer with a reverse lookup; where
    /etc/hosts lacks ``::ffff:127.0.0.1`` the query goes to the resolver, and a
    resolver that drops queries under load stalls each connect by glibc's 5 s.
    """
    import shlex
    import subprocess
    import tempfile

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


def main(argv: list[str] | None = None) -> int:
    args = parse_args(argv)
    if args.private_hosts and not os.environ.get(_HOSTS_MARK):
        return reexec_with_private_hosts(sys.argv[1:] if argv is None else argv)
    private = bool(os.environ.get(_HOSTS_MARK))
    if private:
        print("private /etc/hosts: ::ffff:127.0.0.1 and ::1 resolve locally")
    began = begin()
    print(load_note("at start"), flush=True)
    rows = []
    started = time.monotonic()
    try:
        for size in args.size_list:
            print(f"{size} ranks: spawning workers …", flush=True)
            row = run_size(size, args)
            rows.append(row)
            print(f"{size} ranks: join + first barrier {statistics.median(row['first']):.3f} s median, "
                  f"{max(row['first']):.3f} s worst after the release; barrier median "
                  f"{row['barrier_median'] * 1000:.2f} ms", flush=True)
    except Exception as exc:  # a worker's failure, a deadline, a server that would not start
        print(f"\nrendezvous_scale: FAILED: {type(exc).__name__}: {exc}", file=sys.stderr)
        return 1
    print_table(rows, args)
    if args.profile:
        print_profile(rows, args)
    end_load = load_note("at the end, this benchmark included", judge=False)
    print(f"\n(total run {time.monotonic() - started:.0f} s; {end_load})")
    print(TARGET)
    at = [r for r in rows if r["size"] == TARGET_SIZE]
    if at:
        first = at[0]["first"]
        took = statistics.median(first)
        met = sum(f <= TARGET_S for f in first)
        print(f"  {'met' if took <= TARGET_S else 'NOT met'}: {took:.3f} s median at {TARGET_SIZE} ranks "
              f"(within {TARGET_S:g} s in {met} of {len(first)} repeats; worst {max(first):.3f} s)")
    else:
        print(f"  not measured ({TARGET_SIZE} is not among --sizes)")
    hosts = ("a private /etc/hosts that names `::ffff:127.0.0.1` and `::1`, so torch's reverse lookup of each "
             "store connection answers locally" if private else "this machine's own resolver for torch's reverse "
             "lookup of each store connection")
    record("rendezvous_scale" + ("-private-hosts" if private else ""),
           f"Rendezvous at scale: client processes, no kernels, torch's import excluded; {args.repeats} repeats per "
           f"size on a fresh server, {args.barriers} timed barriers after the first", size_figures(rows), began,
           [f"With {hosts}."])
    return 0


if __name__ == "__main__":
    sys.exit(main())
