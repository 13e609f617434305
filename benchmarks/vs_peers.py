"""What a cell on all ranks costs in nbdist and in its peers, measured side by side on this machine.

Two ranks (engines, workers), gloo on CPU, everything on loopback. The script

  1. starts one plain kernel (the baseline) and, for each system not skipped,
     what a user of it would have: nbdist's two kernels in one world
     (``%load_ext nbdist``, ``%%dist_init``), ipyparallel's local cluster
     (``ipp.Cluster(n=2)``, started here through its Python API) plus one
     kernel that holds an ``ipp.Client`` and runs ``%%px``, and one kernel
     with ``%load_ext nbdistributed`` and ``%dist_init -n 2``, then waits until
     its workers answer (a cell sent before they connect is lost);
  2. times from the client, as ``cell_overhead.py`` does (an execute request
     through :mod:`nbdist.drive.kernels` until every kernel involved is idle):
     (a) a plain cell ``x = 1`` in one kernel, (b) ``x = 1`` on all ranks
     (``%%collective`` / ``%%px`` / ``%%distributed``), (c) a small
     all_reduce on all ranks, ``t = torch.ones(4); dist.all_reduce(t)``,
     and (a') a plain ``x = 1`` in both nbdist kernels at once, the baseline
     ``cell_overhead.py`` uses;
     every cell kind of every system runs once per round, the order rotated
     round by round, after uncounted warm-up rounds;
  3. checks that every all_reduce really ran (each rank holds 2.0s);
  4. prints median and p90 per cell, the overhead over (a) (difference of
     medians, median of the per-round paired differences, ratio of medians),
     start-up times (single runs) and the versions measured;
  5. stops everything in ``finally`` blocks: kernels, the cluster, workers.

The peers are optional: a missing one is reported with how to install it
(``pip install ipyparallel nbdistributed``) and the rest is still measured.
Every connection is to 127.0.0.1: kernels talk over ipc, gloo uses ``lo``,
ipyparallel's controller listens on 127.0.0.1 and its engines' process group
meets in a FileStore. nbdistributed binds its coordinator socket on all
interfaces; here it is bound to 127.0.0.1 (a wrapper on zmq's ``bind`` in
that one kernel, which does not change the timing). Its workers' torch store
(``env://``) still listens on all interfaces, as torch makes it.

Run from the repository root::

    .venv/bin/python benchmarks/vs_peers.py
    .venv/bin/python benchmarks/vs_peers.py --runs 100 --skip nbdistributed

Exits 0 when every system that is installed and not skipped was measured,
1 when one failed (its error is printed; the others are still measured).
"""

from __future__ import annotations

import argparse
import ast
import importlib.metadata
import importlib.util
import logging
import os
import re
import shutil
import signal
import statistics
import sys
import tempfile
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

from _common import begin, figure, load_note, record
from cell_overhead import BenchError, form_world, free_port, median_ms, p90_ms

from nbdist.drive import kernels

INSTALL = "pip install ipyparallel nbdistributed"
SYSTEMS = ("nbdist", "ipyparallel", "nbdistributed")
TRIVIAL = "x = 1"
ALLREDUCE = "t = torch.ones(4); dist.all_reduce(t)"
WANT = [2.0] * 4  # what t holds on every rank after the all_reduce at 2 ranks
WORLD = 2


@dataclass
class Cell:
    """One kind of timed cell: ``run(timeout)`` executes it once and returns the client's wall time."""

    key: str
    label: str
    system: str
    run: Callable[[float], float]


def bounded(fn: Callable[[], Any], seconds: float, what: str) -> Any:
    """Call ``fn`` in a thread; raise TimeoutError if it has not returned within ``seconds``."""
    box: dict[str, Any] = {}

    def target() -> None:
        try:
            box["value"] = fn()
        except BaseException as exc:  # re-raised in the caller's thread
            box["error"] = exc

    thread = threading.Thread(target=target, name=f"vs_peers: {what}", daemon=True)
    thread.start()
    thread.join(seconds)
    if thread.is_alive():
        raise TimeoutError(f"{what} took longer than {seconds:g} s")
    if "error" in box:
        raise box["error"]
    return box.get("value")


def require_ok(result: kernels.Result, what: str) -> kernels.Result:
    if result.status != "ok":
        detail = f"{result.error['ename']}: {result.error['evalue']}" if result.error else result.status
        raise BenchError(f"{what} failed: {detail}")
    return result


def timed(kernel: kernels.Kernel, code: str, what: str, timeout: float,
          judge: Callable[[kernels.Result], None] | None = None) -> float:
    """Wall time of one execute request, sent to idle: what a user waits for after Run."""
    start = time.perf_counter()
    result = kernel.execute(code, timeout)
    elapsed = time.perf_counter() - start
    require_ok(result, what)
    if judge is not None:
        judge(result)
    return elapsed


def shutdown_all(ks: list[kernels.Kernel]) -> None:
    for k in reversed(ks):  # nbdist: rank 0 hosts the server, stop it last
        try:
            k.shutdown()
        except Exception as exc:  # keep shutting the others down
            print(f"warning: kernel shutdown failed: {exc}", file=sys.stderr)


def version(dist: str) -> str:
    try:
        return importlib.metadata.version(dist)
    except importlib.metadata.PackageNotFoundError:
        return "not installed"


class System:
    """One thing measured: started once, timed cell by cell, checked, stopped (idempotently)."""

    name = ""
    how = ""

    def __init__(self) -> None:
        self.startup: list[tuple[str, float]] = []  # (what, seconds): single runs

    def start(self, timeout: float) -> None:
        raise NotImplementedError

    def cells(self) -> list[Cell]:
        raise NotImplementedError

    def verify(self, timeout: float) -> None:
        """Check that the all_reduce cells really reduced."""

    def stop(self) -> None:
        raise NotImplementedError


class Plain(System):
    name = "plain"
    how = "one kernel (jupyter_client via nbdist.drive.kernels, ipc transport) running x = 1"

    def __init__(self) -> None:
        super().__init__()
        self.kernel: kernels.Kernel | None = None

    def start(self, timeout: float) -> None:
        self.kernel = kernels.Kernel()

    def cells(self) -> list[Cell]:
        assert self.kernel is not None
        k = self.kernel
        return [Cell("plain", "(a) plain cell  x = 1, one kernel", self.name,
                     lambda t: timed(k, TRIVIAL, "plain x = 1", t))]

    def stop(self) -> None:
        if self.kernel is not None:
            shutdown_all([self.kernel])
            self.kernel = None


class Nbdist(System):
    name = "nbdist"
    how = ("2 kernels in one world (%load_ext nbdist; %%dist_init on 127.0.0.1); each cell is sent to both "
           "kernels at once (nbdist.drive.kernels.execute_all), timed until both are idle, as cell_overhead.py does")

    def __init__(self) -> None:
        super().__init__()
        self.kernels: list[kernels.Kernel] = []

    def start(self, timeout: float) -> None:
        t0 = time.perf_counter()
        self.kernels = kernels.start(WORLD)
        t1 = time.perf_counter()
        form_world(self.kernels, free_port(), timeout)
        self.startup = [("start 2 kernels", t1 - t0), ("%load_ext + %%dist_init", time.perf_counter() - t1)]

    def _all(self, code: str, what: str, timeout: float) -> float:
        start = time.perf_counter()
        results = kernels.execute_all(self.kernels, code, timeout=timeout)
        elapsed = time.perf_counter() - start
        for rank, r in enumerate(results):
            require_ok(r, f"rank {rank}: {what}")
        return elapsed

    def cells(self) -> list[Cell]:
        return [
            Cell("nbdist-plain", "(a') plain cell  x = 1, both nbdist kernels", self.name,
                 lambda t: self._all(TRIVIAL, "plain x = 1", t)),
            Cell("nbdist-trivial", "(b) nbdist %%collective  x = 1", self.name,
                 lambda t: self._all(f"%%collective\n{TRIVIAL}", "%%collective x = 1", t)),
            Cell("nbdist-allreduce", "(c) nbdist %%collective  all_reduce", self.name,
                 lambda t: self._all(f"%%collective\n{ALLREDUCE}", "%%collective all_reduce", t)),
        ]

    def verify(self, timeout: float) -> None:
        got = kernels.execute_all(self.kernels, "pass", timeout=timeout, user_expressions={"t": "t.tolist()"})
        for rank, r in enumerate(got):
            value = ast.literal_eval(require_ok(r, "reading t").expression("t"))
            if value != WANT:
                raise BenchError(f"nbdist rank {rank}: all_reduce gave {value}, expected {WANT}")

    def stop(self) -> None:
        shutdown_all(self.kernels)
        self.kernels = []


# Runs in the ipyparallel driver kernel: what a user types to reach a running cluster and give
# each engine its rank and a process group. The store is a FileStore, so nothing but gloo listens.
IPP_SETUP = """\
import ipyparallel as ipp
rc = ipp.Client({url!r}, timeout=30)
rc.wait_for_engines({n}, timeout={timeout:g})
for _rank, _engine in enumerate(sorted(rc.ids)):
    rc[_engine].push({{"rank": _rank, "world_size": {n}}}, block=True)
rc[:].execute(
    "import torch, torch.distributed as dist\\n"
    "from datetime import timedelta\\n"
    "dist.init_process_group('gloo', init_method={init!r}, rank=rank, world_size=world_size, "
    "timeout=timedelta(seconds={timeout:g}))",
    block=False,
).get(timeout={timeout:g})
assert "px" in get_ipython().magics_manager.magics["cell"], "%%px was not registered"
"""


class Ipyparallel(System):
    name = "ipyparallel"
    how = ("a local cluster started by this script (ipp.Cluster(n=2), controller on 127.0.0.1, "
           "engines' process group over a FileStore, GLOO_SOCKET_IFNAME=lo); %%px cells run in one real "
           "kernel that holds an ipp.Client, as a notebook user does; timed until that kernel is idle")

    def __init__(self) -> None:
        super().__init__()
        self.cluster: Any = None
        self.kernel: kernels.Kernel | None = None
        self.procs: list[Any] = []  # psutil.Process of the controller and engines, for a last-resort kill
        self.dir: str | None = None

    def start(self, timeout: float) -> None:
        import ipyparallel as ipp
        import psutil  # an ipyparallel dependency
        from traitlets.config import Config

        self.dir = tempfile.mkdtemp(prefix="nbdist-vs-ipp-")  # its own profile: ~/.ipython is not touched
        config = Config()
        config.LocalEngineSetLauncher.environment = {"GLOO_SOCKET_IFNAME": "lo"}
        t0 = time.perf_counter()
        self.cluster = ipp.Cluster(n=WORLD, profile_dir=self.dir, controller_ip="127.0.0.1", config=config,
                                   log_level=logging.WARNING)
        bounded(self.cluster.start_cluster_sync, timeout, "starting the ipyparallel cluster")
        launchers = [self.cluster.controller] + [
            launcher for engines in self.cluster.engines.values() for launcher in engines.launchers.values()]
        self.procs = [psutil.Process(launcher.pid) for launcher in launchers if getattr(launcher, "pid", None)]
        t1 = time.perf_counter()
        self.kernel = kernels.Kernel()
        url = os.path.join(self.dir, "security", f"ipcontroller-{self.cluster.cluster_id}-client.json")
        init = "file://" + os.path.join(self.dir, "torch-filestore")
        code = IPP_SETUP.format(url=url, n=WORLD, timeout=timeout, init=init)
        t2 = time.perf_counter()
        require_ok(self.kernel.execute(code, timeout * 2 + 30), "connecting to the cluster and init_process_group")
        self.startup = [("ipp.Cluster(n=2).start_cluster_sync()", t1 - t0),
                        ("ipp.Client + wait_for_engines + init_process_group", time.perf_counter() - t2)]

    def cells(self) -> list[Cell]:
        assert self.kernel is not None
        k = self.kernel
        return [
            Cell("ipp-trivial", "(b) ipyparallel %%px  x = 1", self.name,
                 lambda t: timed(k, f"%%px\n{TRIVIAL}", "%%px x = 1", t)),
            Cell("ipp-allreduce", "(c) ipyparallel %%px  all_reduce", self.name,
                 lambda t: timed(k, f"%%px\n{ALLREDUCE}", "%%px all_reduce", t)),
        ]

    def verify(self, timeout: float) -> None:
        assert self.kernel is not None
        pull = "[v.tolist() for v in rc[:].pull('t', block=True)]"
        got = require_ok(self.kernel.execute("pass", timeout, {"t": pull}), "pulling t from the engines")
        values = ast.literal_eval(got.expression("t"))
        if values != [WANT] * WORLD:
            raise BenchError(f"ipyparallel: all_reduce gave {values}, expected {WANT} on each engine")

    def stop(self) -> None:
        if self.kernel is not None:
            try:
                self.kernel.execute("rc.close(linger=0)", 30)
            except Exception as exc:  # the kernel goes down next anyway
                print(f"warning: closing the ipyparallel client failed: {exc}", file=sys.stderr)
            shutdown_all([self.kernel])
            self.kernel = None
        # The controller's schedulers and the engines' nannies, known before their parents go.
        tree = list(self.procs)
        for proc in self.procs:
            try:
                tree += proc.children(recursive=True)
            except Exception:  # psutil.NoSuchProcess: already gone
                continue
        if self.cluster is not None:
            try:  # its own staged stop: SIGTERM, then SIGKILL after a grace period
                bounded(self.cluster.stop_cluster_sync, 60, "stopping the ipyparallel cluster")
            except Exception as exc:
                print(f"warning: stopping the ipyparallel cluster failed: {exc}", file=sys.stderr)
            self.cluster = None
        if tree:
            import psutil

            _, alive = psutil.wait_procs(tree, timeout=5)
            for proc in alive:  # only processes this cluster started, by id (psutil checks it is the same one)
                try:
                    proc.kill()
                except psutil.Error:
                    continue
        self.procs = []
        if self.dir is not None:
            shutil.rmtree(self.dir, ignore_errors=True)
            self.dir = None


# nbdistributed binds its coordinator's ROUTER socket on tcp://*; keep it on loopback. This wraps
# zmq's bind in this one kernel only; the kernel's own sockets are already bound (ipc).
NBD_LOOPBACK = """\
import zmq as _vs_zmq
_vs_bind = _vs_zmq.Socket.bind
def _vs_loopback_bind(self, addr):
    return _vs_bind(self, addr.replace("tcp://*:", "tcp://127.0.0.1:", 1))
_vs_zmq.Socket.bind = _vs_loopback_bind
"""
NBD_MAGIC = 'get_ipython().magics_manager.registry["DistributedMagic"]'
NBD_PIDS = f"[p.pid for p in {NBD_MAGIC}._process_manager.processes]"
# Stops the workers nbdistributed started, through its own ProcessManager (SIGTERM, then SIGKILL).
# Not %dist_shutdown or %dist_reset: those run host-wide `pkill -f` patterns. A user expression,
# because after %dist_init nbdistributed sends every plain cell to its workers.
NBD_STOP = f"{NBD_MAGIC}._process_manager.shutdown() if {NBD_MAGIC}._process_manager else None"
# Its coordinator drops what it sends before a worker has connected (zmq ROUTER), and the workers
# connect only after importing torch and joining their group, which can outlast %dist_init's
# fixed 2 s sleep: a first cell sent at once is lost and fails after 30 s. So wait, as a user
# would, until both workers answer a status request (its own request, sent the way %dist_status does).
NBD_READY = f"len({NBD_MAGIC}._comm_manager.send_to_all('get_status', {{}}, timeout=1.0))"
NBD_FAILED = ("❌ Error on Rank", "Error executing distributed code", "No distributed workers running",
              "Failed to start distributed workers")


def nbd_judge(result: kernels.Result) -> None:
    """nbdistributed prints its errors and lets the cell succeed: read the text."""
    text = result.text()
    for marker in NBD_FAILED:
        if marker in text:
            raise BenchError(f"nbdistributed printed {marker!r}: {text.strip()[-300:]}")


class Nbdistributed(System):
    name = "nbdistributed"
    how = ("%load_ext nbdistributed and %dist_init -n 2 in one real kernel (it starts 2 worker "
           "processes; GLOO_SOCKET_IFNAME=lo, its coordinator bound to 127.0.0.1); %%distributed cells "
           "run in that kernel, timed until it is idle")

    def __init__(self) -> None:
        super().__init__()
        self.kernel: kernels.Kernel | None = None
        self.worker_pids: list[int] = []

    def start(self, timeout: float) -> None:
        # Its workers are started as `python worker.py` from PATH: put this interpreter first.
        path = os.path.dirname(sys.executable) + os.pathsep + os.environ.get("PATH", "")
        t0 = time.perf_counter()
        self.kernel = kernels.Kernel(env={"PATH": path, "GLOO_SOCKET_IFNAME": "lo"})
        require_ok(self.kernel.execute(NBD_LOOPBACK, timeout), "binding nbdistributed to loopback")
        require_ok(self.kernel.execute("%load_ext nbdistributed", timeout), "%load_ext nbdistributed")
        t1 = time.perf_counter()
        result = require_ok(self.kernel.execute(f"%dist_init -n {WORLD}", timeout + 30), "%dist_init")
        elapsed = time.perf_counter() - t1
        try:  # known before anything can fail, for the sweep in stop()
            got = require_ok(self.kernel.execute("", timeout, {"pids": NBD_PIDS}), "reading worker pids")
            self.worker_pids = ast.literal_eval(got.expression("pids"))
        finally:
            nbd_judge(result)
        if "Successfully started" not in result.text():
            raise BenchError(f"nbdistributed: %dist_init did not start its workers:\n{result.text()}")
        t2 = time.perf_counter()
        deadline = t2 + timeout
        while True:
            got = self.kernel.execute("", timeout, {"ready": NBD_READY})
            if got.user_expressions["ready"].get("status") == "ok":
                break
            if time.perf_counter() > deadline:
                raise BenchError(f"nbdistributed: its workers did not answer within {timeout:g} s")
        self.startup = [("start 1 kernel + %load_ext", t1 - t0), ("%dist_init -n 2", elapsed),
                        ("then until both workers answer", time.perf_counter() - t2)]

    def cells(self) -> list[Cell]:
        assert self.kernel is not None
        k = self.kernel
        return [
            Cell("nbd-trivial", "(b) nbdistributed %%distributed  x = 1", self.name,
                 lambda t: timed(k, f"%%distributed\n{TRIVIAL}", "%%distributed x = 1", t, nbd_judge)),
            Cell("nbd-allreduce", "(c) nbdistributed %%distributed  all_reduce", self.name,
                 lambda t: timed(k, f"%%distributed\n{ALLREDUCE}", "%%distributed all_reduce", t, nbd_judge)),
        ]

    def verify(self, timeout: float) -> None:
        assert self.kernel is not None
        result = require_ok(self.kernel.execute("%%distributed\nt.tolist()", timeout), "reading t")
        nbd_judge(result)
        found = result.text().count(repr(WANT))
        if found != WORLD:
            raise BenchError(f"nbdistributed: {found} of {WORLD} workers showed t == {WANT}:\n{result.text()}")

    def stop(self) -> None:
        if self.kernel is not None:
            try:
                require_ok(self.kernel.execute("", 30, {"stop": NBD_STOP}), "stopping its workers").expression("stop")
            except Exception as exc:  # the sweep below ends what is left
                print(f"warning: stopping nbdistributed's workers failed: {exc}", file=sys.stderr)
            shutdown_all([self.kernel])
            self.kernel = None
        for pid in self.worker_pids:  # by id, and only if it still is one of its workers
            try:
                with open(f"/proc/{pid}/cmdline", "rb") as f:
                    if b"nbdistributed" in f.read():
                        os.kill(pid, signal.SIGKILL)
            except OSError:  # gone already
                continue
        self.worker_pids = []


def available(args: argparse.Namespace) -> tuple[list[System], list[str]]:
    """The systems to measure, and a line for each peer that is missing."""
    systems: list[System] = [Plain()]
    missing = []
    for name, cls in (("nbdist", Nbdist), ("ipyparallel", Ipyparallel), ("nbdistributed", Nbdistributed)):
        if name in args.skip:
            missing.append(f"{name}: skipped (--skip)")
            continue
        if importlib.util.find_spec(name) is None:
            missing.append(f"{name}: not installed, not measured (install the peers with: {INSTALL})")
            continue
        systems.append(cls())
    return systems, missing


def verify_all(systems: list[System], timeout: float, failed: dict[str, str], what: str) -> None:
    """Check that each system not failed yet really ran its cells; one whose check fails goes to ``failed``."""
    for system in systems:
        if system.name not in failed:
            try:
                system.verify(timeout)
            except Exception as exc:
                failed[system.name] = f"{what}: {type(exc).__name__}: {exc}"
                print(f"FAILED {system.name} {failed[system.name]}", file=sys.stderr, flush=True)


def stop_all(systems: list[System]) -> None:
    """Stop ``systems``, the last started first; one that fails to stop is said, and the others still stopped."""
    for system in reversed(systems):
        try:
            system.stop()
        except Exception as exc:  # keep stopping the others
            print(f"warning: stopping {system.name} failed: {exc}", file=sys.stderr)


def time_rounds(systems: list[System], args: argparse.Namespace, failed: dict[str, str]) -> dict[str, list[float]]:
    """Every cell kind once per round, the order rotated each round; a system that fails drops out."""
    cells = [c for s in systems if s.name not in failed for c in s.cells()]
    times: dict[str, list[float]] = {c.key: [] for c in cells}
    for round_ in range(args.warmup + args.runs):
        shift = round_ % len(cells)
        for cell in cells[shift:] + cells[:shift]:
            if cell.system in failed:
                continue
            try:
                elapsed = cell.run(args.timeout)
            except Exception as exc:  # a failed or timed-out cell: that system's figures are void
                failed[cell.system] = f"{cell.label}, round {round_}: {type(exc).__name__}: {exc}"
                print(f"FAILED {failed[cell.system]}", file=sys.stderr, flush=True)
                continue
            if round_ >= args.warmup:
                times[cell.key].append(elapsed)
    return times


def report(systems: list[System], times: dict[str, list[float]], failed: dict[str, str], runs: int) -> None:
    labels = {c.key: c.label for s in systems if s.name not in failed for c in s.cells()}
    plain = times.get("plain", [])
    base = median_ms(plain)
    print(f"\n== {WORLD} ranks, gloo, CPU: client wall time, execute request -> idle "
          f"({runs} interleaved runs each) ==")
    print(f"{'cell':<46} {'median ms':>10} {'p90 ms':>9} {'over (a) ms':>12} {'paired ms':>10} {'ratio':>7}")
    for key, label in labels.items():
        values = times[key]
        if len(values) < 2:
            continue
        row = f"{label:<46} {median_ms(values):>10.2f} {p90_ms(values):>9.2f}"
        if key != "plain":
            pairs = list(zip(plain, values, strict=False))  # equal unless (a) failed
            paired = statistics.median(b - a for a, b in pairs) * 1000
            row += f" {median_ms(values) - base:>+12.2f} {paired:>+10.2f} {median_ms(values) / base:>6.1f}x"
        print(row)
    print("(over (a): difference of medians; paired: median of per-round differences; ratio: median / median of (a))")

    def med(key: str) -> float | None:
        return median_ms(times[key]) if len(times.get(key, [])) >= 2 else None

    print("\nsummary, medians (over (a): median of the cell minus median of (a)):")
    for what, suffix in (("trivial cell on 2 ranks", "trivial"), ("small all_reduce cell", "allreduce")):
        print(f"  {what}:")
        ours = med(f"nbdist-{suffix}")
        for name, prefix in (("nbdist", "nbdist"), ("ipyparallel", "ipp"), ("nbdistributed", "nbd")):
            m = med(f"{prefix}-{suffix}")
            if m is None:
                print(f"    {name:<14} not measured")
                continue
            line = f"    {name:<14} {m:7.1f} ms, {m - base:+7.1f} ms over (a), {m / base:5.1f}x (a)"
            if prefix != "nbdist" and ours is not None:
                line += f", {m / ours:4.1f}x nbdist's"
            print(line)
    pair, ours = med("nbdist-plain"), med("nbdist-trivial")
    if pair is not None and ours is not None:
        print(f"  nbdist's trivial %%collective over (a'), a plain cell in the same two kernels: {ours - pair:+.1f} ms "
              "(what cell_overhead.py reports; the rest of its overhead over (a) is driving two kernels at once)")


def cell_figures(systems: list[System], times: dict[str, list[float]], failed: dict[str, str]) -> list[dict[str, Any]]:
    """The headline figures, for the docs: each cell kind, and its overhead over the plain cell (a)."""
    plain = times.get("plain", [])
    rows = []
    for cell in (c for s in systems if s.name not in failed for c in s.cells()):
        values = [v * 1000 for v in times.get(cell.key, [])]
        if len(values) < 2:
            continue
        label = re.sub(r"(%%\w+)", r"`\1`", " ".join(cell.label.split()))
        rows.append(figure(label, values, "ms"))
        if cell.key != "plain" and len(plain) >= 2:
            paired = [(b - a) * 1000 for a, b in zip(plain, times[cell.key], strict=False)]
            rows.append(figure(f"{label}, over (a) (difference of medians; spread of the paired differences)", paired,
                               "ms", median=median_ms(times[cell.key]) - median_ms(plain), signed=True))
    return rows


def parse_args(argv: list[str] | None) -> argparse.Namespace:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--runs", type=int, default=30, help="counted runs per cell kind (default 30)")
    p.add_argument("--warmup", type=int, default=3, help="uncounted warm-up rounds (default 3)")
    p.add_argument("--timeout", type=float, default=60.0, help="seconds any one cell or start-up step may take "
                   "(default 60)")
    p.add_argument("--skip", default="", help=f"comma-separated systems not to measure: {', '.join(SYSTEMS)}")
    args = p.parse_args(argv)
    args.skip = {s.strip() for s in args.skip.split(",") if s.strip()}
    if args.skip - set(SYSTEMS):
        p.error(f"--skip knows {', '.join(SYSTEMS)}, not {', '.join(sorted(args.skip - set(SYSTEMS)))}")
    if args.runs < 2 or args.warmup < 0 or args.timeout <= 0:
        p.error("--runs must be >= 2, --warmup >= 0, --timeout > 0")
    return args


def main(argv: list[str] | None = None) -> int:
    args = parse_args(argv)
    began = begin()
    print(load_note("at start"), flush=True)
    systems, missing = available(args)
    for line in missing:
        print(line, flush=True)
    failed: dict[str, str] = {}
    started: list[System] = []
    try:
        for system in systems:
            print(f"starting {system.name} ...", flush=True)
            started.append(system)
            try:
                system.start(args.timeout)
            except Exception as exc:  # not measured; the others still are
                failed[system.name] = f"start-up: {type(exc).__name__}: {exc}"
                print(f"FAILED {system.name} {failed[system.name]}", file=sys.stderr, flush=True)
                system.stop()
        if "plain" in failed:
            print("vs_peers: the baseline kernel did not start; nothing to compare", file=sys.stderr)
            return 1
        times = time_rounds(started, args, failed)
        verify_all(started, args.timeout, failed, "check of the all_reduce result")
        report(started, times, failed, args.runs)
        figures = cell_figures(started, times, failed)
    finally:
        stop_all(started)

    print("\nstart-up (single runs, for scale only):")
    for system in started:
        for what, seconds in system.startup:
            print(f"  {system.name:<14} {what:<52} {seconds:>6.1f} s")
    print("\nhow each was driven:")
    for system in started:
        print(f"  {system.name}: {system.how}")
    print("\nversions: " + ", ".join(f"{d} {version(d)}" for d in
                                     ("nbdist", "ipyparallel", "nbdistributed", "torch", "ipykernel",
                                      "jupyter_client", "pyzmq")))
    print(f"python {sys.version.split()[0]}, {os.cpu_count()} cores")
    print(load_note("at the end, this benchmark included", judge=False))
    for line in missing:
        print(line)
    for name, why in failed.items():
        print(f"{name}: FAILED, figures void: {why}")
    if failed:
        return 1
    record("vs_peers", f"A cell on {WORLD} ranks in nbdist and in its peers (client wall time until every kernel "
           f"involved is idle; {args.runs} interleaved runs per kind)", figures, began,
           [*missing, "versions: " + ", ".join(f"{d} {version(d)}" for d in ("ipyparallel", "nbdistributed"))])
    return 0


if __name__ == "__main__":
    sys.exit(main())
