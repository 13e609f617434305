"""How long a world on two Slurm nodes takes to form: nbdist's ``--spawn --slurm`` beside ipyparallel's Slurm engines.

Both sides start two remote processes, one on each of the same two Slurm nodes,
submitted with the same sbatch options (``-N 2 --ntasks-per-node 1``, two tasks),
each task started by ``srun`` inside the batch script. The nodes are the two-node
cluster of ``tests/slurm.py`` (``built_cluster()``): two slurmds in network
namespaces on a bridge, slurmctld and everything driven from here in the root
namespace, reached by the nodes at the bridge address ADDR. The script

  1. builds that cluster (about 3 s, not timed) and puts its ``SLURM_CONF`` into
     this process's environment, so every sbatch/squeue/scancel, here and in the
     kernels, talks to it (and to nothing else: the caller's own ``SLURM_*`` and
     ``SBATCH_*`` settings are dropped);
  2. runs, interleaved (nbdist, ipyparallel, nbdist, ...), ``--warmup`` uncounted
     and then ``--runs`` counted rounds of:

     nbdist: a fresh kernel (``nbdist.drive.kernels.Kernel``) and
       ``%load_ext nbdist`` (not timed); then timed, the one cell
       ``%dist_init --spawn 3 --slurm "-N 2 --ntasks-per-node 1" --master-addr ADDR
       --master-port P``, from the execute request until the kernel is idle with
       the cell ``ok``: the notebook is rank 0, one Slurm job of two ``nbdist follow``
       tasks are ranks 1 and 2, and the cell ends once all three joined one
       torch.distributed (gloo) world;
     ipyparallel: ``ipp.Cluster(engines="slurm", n=2)`` built in this process
       (not timed: no process starts), its controller listening on ADDR only
       (``controller_ip``); then timed, ``start_cluster()`` (the controller
       process, ipyparallel's own ``delay`` -- 1 s by default, ``--ipp-delay``
       -- and the sbatch of ``srun python -m ipyparallel.engine``), then
       ``connect_client()`` and ``wait_for_engines(2)``: what
       ``start_and_connect(n=2)`` does, split so both parts are printed.
       ipyparallel's defaults are kept unless asked otherwise: its 1 s
       ``delay``, and its controller's ``HeartMonitor.period`` of 3 s, which
       it waits for before it counts a registered engine (so
       ``wait_for_engines`` waits up to two periods after the engines have
       registered); ``--ipp-delay 0 --ipp-heartbeat-ms 200`` measures it tuned;

     after each timed start, untimed except as noted, a check that the world is
     real and spans both nodes: nbdist runs one ``%%collective`` cell on all three
     ranks (an ``all_reduce`` of each rank's rank + 1, which must give 6, and an
     ``all_gather_object`` of the hostnames, which must name both nodes);
     ipyparallel runs ``view.apply_sync(socket.gethostname)`` on both engines
     (must name both nodes); those cells are timed too and printed, for scale;
  3. tears each run down before the next (not timed): ``%dist_destroy`` and the
     kernel's shutdown; the client closed and ``stop_cluster()``, then any of the
     controller's processes still there killed by id; and waits until the Slurm
     queue is empty and both nodes are idle again, so no run waits for another's
     job to leave;
  4. prints each run's seconds, the median of each side and the ratio of the
     medians nbdist / ipyparallel (target: at most 1.0x), and with ``--json FILE``
     writes the figures there.

What the two sides do in their processes is not the same: nbdist's followers
import torch and join a process group with the notebook (a world that runs
collectives), ipyparallel's engines only register with the controller (no torch,
no process group). ``--ipp-torch`` adds that work to ipyparallel's timed part:
after ``wait_for_engines`` the engines import torch and join one gloo process
group (over a FileStore in the cluster's profile folder), and the check adds an
``all_reduce`` on them. The ipyparallel side does not include starting a
kernel: it is driven from this script's own process, as ``connect_client``
would be from a notebook's. On a busy machine the figures spread: importing
torch on the nodes is most of nbdist's time (the start prints the load average).

Needs root and Debian's ``slurmctld slurmd slurm-client munge`` (as the Slurm
tests); ipyparallel with ``pip install ipyparallel`` (the ``bench`` extra).
Run from the repository root::

    .venv/bin/python benchmarks/cluster_start.py
    .venv/bin/python benchmarks/cluster_start.py --runs 9 --json cluster_start.json
    .venv/bin/python benchmarks/cluster_start.py --ipp-torch --ipp-delay 0 --ipp-heartbeat-ms 200
    .venv/bin/python benchmarks/cluster_start.py --skip ipyparallel

Exits 0 when both sides formed their world in every run (whether or not the
target is met), 1 when either did not (the error is printed; everything started
is stopped and the cluster is taken down), 2 when no Slurm cluster can be built
here (the reason is printed).
"""

from __future__ import annotations

import argparse
import ast
import importlib.metadata
import importlib.util
import json
import logging
import os
import secrets
import shlex
import shutil
import socket
import statistics
import sys
import tempfile
import time
import traceback
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parent.parent
if str(ROOT) not in sys.path:
    sys.path.insert(0, str(ROOT))  # for tests.slurm (the two-node cluster)

from _common import begin, figure, load_note, record  # noqa: E402
from cell_overhead import ANSI, BenchError  # noqa: E402

from nbdist.drive import kernels  # noqa: E402
from nbdist.world import netinfo  # noqa: E402

SIDES = ("nbdist", "ipyparallel")
OPTIONS = "-N 2 --ntasks-per-node 1"  # both sides' sbatch options; each adds --ntasks=2 itself
TASKS = 2
WORLD = TASKS + 1  # nbdist: the notebook and the two tasks
TARGET = 1.0
TARGET_LINE = f"target: nbdist's median at most {TARGET:g}x ipyparallel's"
INSTALL = "pip install ipyparallel"
FOREIGN = ("SLURM_", "SBATCH_", "SALLOC_", "SRUN_", "SQUEUE_", "SINFO_", "SCANCEL_", "SCONTROL_")
MAGICS = "get_ipython().magics_manager.registry['DistMagics']"
JOB = f"{MAGICS}.session.workers.job_id"
# On every rank: each adds rank + 1 (1 + 2 + 3 = 6) and tells its hostname to all.
NBDIST_CHECK = """%%collective
import socket as _cs_socket
_cs_t = torch.tensor([float(dist.get_rank() + 1)])
dist.all_reduce(_cs_t)
_cs_hosts = [None] * dist.get_world_size()
dist.all_gather_object(_cs_hosts, _cs_socket.gethostname())
"""
NBDIST_READ = "(dist.get_world_size(), _cs_t.item(), _cs_hosts)"
# --ipp-torch, on each engine (its `rank` pushed first): a gloo process group of the two engines, as
# vs_peers.py makes one (a FileStore, here in the cluster's profile folder, which the nodes share), gloo
# on the node's one interface that is not loopback (its name does not resolve there).
IPP_TORCH = """\
import os, socket
os.environ["GLOO_SOCKET_IFNAME"] = [n for _, n in socket.if_nameindex() if n != "lo"][0]
import torch, torch.distributed as dist
from datetime import timedelta
dist.init_process_group("gloo", init_method={init!r}, rank=rank, world_size={n}, timeout=timedelta(seconds={t:g}))
"""
IPP_TORCH_CHECK = "t = torch.tensor([float(rank + 1)]); dist.all_reduce(t)"


def version(dist: str) -> str:
    try:
        return importlib.metadata.version(dist)
    except importlib.metadata.PackageNotFoundError:
        return "not installed"


def require_ok(result: kernels.Result, what: str) -> kernels.Result:
    if result.status != "ok":
        detail = f"{result.error['ename']}: {result.error['evalue']}" if result.error else result.status
        raise BenchError(f"{what} failed: {detail}")
    return result


def settle(cluster: Any, seconds: float, what: str) -> float:
    """Wait until the queue is empty and both nodes are idle; the seconds it took. BenchError if not in time."""
    start = time.monotonic()
    deadline = start + seconds
    while True:
        queued = cluster.queue()
        states = cluster.node_states()
        if not queued and all(states.get(n) == "idle" for n in cluster.nodes):
            return time.monotonic() - start
        if time.monotonic() > deadline:
            raise BenchError(f"{what}: after {seconds:g} s the queue still holds {queued}, nodes {states}")
        time.sleep(0.1)


def free_port(host: str) -> int:
    """A port free on ``host`` below the ephemeral range (sockets opened later cannot take it), as the tests pick."""
    port = netinfo.first_free_port((secrets.randbelow(10_000) + 20_000 for _ in range(200)), host)
    if port is None:
        raise BenchError(f"no free port in 20000-29999 on {host}")
    return port


class Side:
    """One of the two: ``once()`` starts, times, checks and stops one world; idempotent ``stop()``."""

    name = ""

    def once(self, cluster: Any, timeout: float) -> dict[str, float]:
        raise NotImplementedError

    def stop(self, cluster: Any | None = None) -> None:
        raise NotImplementedError


class Nbdist(Side):
    name = "nbdist"

    def __init__(self) -> None:
        self.kernel: kernels.Kernel | None = None
        self.job = ""

    def once(self, cluster: Any, timeout: float) -> dict[str, float]:
        self.kernel = k = kernels.Kernel(env=cluster.env)
        require_ok(k.execute("%load_ext nbdist", timeout), "%load_ext nbdist")
        line = (f'%dist_init --spawn {WORLD} --slurm "{OPTIONS}" --master-addr {cluster.addr} '
                f"--master-port {free_port(cluster.addr)} --timeout {timeout:g}")
        start = time.perf_counter()
        result = k.execute(line, timeout + 30)
        formed = time.perf_counter() - start
        got = k.execute("", 30, {"job": JOB})  # known before any check can fail: the tear-down waits for it
        if got.status == "ok" and got.user_expressions.get("job", {}).get("status") == "ok":
            self.job = ast.literal_eval(got.expression("job"))
        require_ok(result, line)
        text = ANSI.sub("", result.text())
        if f"nbdist world · {WORLD} rank(s)" not in text or "drives its workers" not in text:
            raise BenchError(f"{line} did not say that a driven world of {WORLD} formed:\n{text}")
        running = [j for j in cluster.queue() if j["id"] == self.job]
        if not running or running[0]["state"] != "RUNNING" or sorted(running[0]["nodes"]) != sorted(cluster.nodes):
            raise BenchError(f"nbdist's Slurm job {self.job!r} is not running on both nodes: {cluster.queue()}")

        start = time.perf_counter()
        result = k.execute(NBDIST_CHECK, timeout)
        check = time.perf_counter() - start
        require_ok(result, "the %%collective check cell")
        got = require_ok(k.execute("", 30, {"v": NBDIST_READ}), "reading the check's results")
        size, total, hosts = ast.literal_eval(got.expression("v"))
        want = float(sum(range(1, WORLD + 1)))
        if size != WORLD or total != want or sorted(hosts[1:]) != sorted(cluster.nodes):
            raise BenchError(f"nbdist's world is not {WORLD} ranks over both nodes: world size {size}, "
                             f"all_reduce {total} (want {want}), hostnames by rank {hosts}")
        return {"formed": formed, "check": check}

    def stop(self, cluster: Any | None = None) -> None:
        k, self.kernel = self.kernel, None
        if k is not None:
            try:
                r = k.execute("%dist_destroy", 60)
                if r.status != "ok":
                    print(f"warning: %dist_destroy: {r.error}", file=sys.stderr)
            except Exception as exc:  # the kernel goes down next anyway; the job is cancelled below
                print(f"warning: %dist_destroy failed: {exc}", file=sys.stderr)
            finally:
                k.shutdown()
        if cluster is not None and self.job and any(j["id"] == self.job for j in cluster.queue()):
            cluster.run("scancel", self.job)  # %dist_destroy did not; settle() waits for it to leave
        self.job = ""


class Ipyparallel(Side):
    name = "ipyparallel"

    def __init__(self, delay: float | None, heartbeat_ms: int | None, torch_world: bool) -> None:
        self.delay = delay  # None: ipyparallel's own defaults
        self.heartbeat_ms = heartbeat_ms
        self.torch_world = torch_world
        self.cluster: Any = None
        self.client: Any = None
        self.procs: list[Any] = []  # psutil.Process of the controller and its children, for a last-resort kill
        self.dir: str | None = None
        self.job = ""

    def once(self, cluster: Any, timeout: float) -> dict[str, float]:
        import ipyparallel as ipp
        import psutil  # an ipyparallel dependency
        from traitlets.config import Config

        self.dir = tempfile.mkdtemp(prefix="nbdist-cs-ipp-")  # its own profile: ~/.ipython is not touched
        config = Config()
        # The same sbatch options as nbdist's, on sbatch's command line as nbdist passes them; the default
        # template adds --ntasks={n}, --output and `srun python -m ipyparallel.engine` (this interpreter).
        config.SlurmEngineSetLauncher.submit_command = ["sbatch", *shlex.split(OPTIONS)]
        config.SlurmEngineSetLauncher.engine_cmd = [sys.executable, "-m", "ipyparallel.engine"]
        # Its batch script goes to work_dir/batch_file_name, work_dir "." (the caller's folder): keep it in ours.
        config.SlurmEngineSetLauncher.batch_file_name = os.path.join(self.dir, "slurm_engine.sbatch")
        kwargs: dict[str, Any] = {} if self.delay is None else {"delay": self.delay}
        if self.heartbeat_ms is not None:  # the controller counts an engine only once its heart beat
            kwargs["controller_args"] = [f"--HeartMonitor.period={self.heartbeat_ms}"]
        self.cluster = ipp.Cluster(engines="slurm", n=TASKS, profile_dir=self.dir, controller_ip=cluster.addr,
                                   engine_timeout=int(timeout), config=config, log_level=logging.WARNING,
                                   **kwargs)
        start = time.perf_counter()
        self.cluster.start_cluster_sync()
        submitted = time.perf_counter() - start
        self.procs = [psutil.Process(self.cluster.controller.pid)]
        self.job = next(iter(self.cluster.engines.values())).job_id
        self.client = self.cluster.connect_client_sync()
        self.client.wait_for_engines(TASKS, timeout=timeout)
        registered = time.perf_counter() - start
        if self.torch_world:
            for rank, engine in enumerate(sorted(self.client.ids)):
                self.client[engine].push({"rank": rank}, block=True)
            init = "file://" + os.path.join(self.dir, "torch-filestore")
            self.client[:].execute(IPP_TORCH.format(init=init, n=TASKS, t=timeout), block=True)
        formed = time.perf_counter() - start
        running = [j for j in cluster.queue() if j["id"] == self.job]
        if not running or running[0]["state"] != "RUNNING" or sorted(running[0]["nodes"]) != sorted(cluster.nodes):
            raise BenchError(f"ipyparallel's Slurm job {self.job!r} is not running on both nodes: {cluster.queue()}")

        view = self.client[:]
        check_start = time.perf_counter()
        hosts = view.apply_sync(socket.gethostname)
        check = time.perf_counter() - check_start
        if len(self.client.ids) != TASKS or sorted(hosts) != sorted(cluster.nodes):
            raise BenchError(f"ipyparallel: engines {self.client.ids} on hosts {hosts}, want one on each of "
                             f"{cluster.nodes}")
        times = {"formed": formed, "submitted": submitted, "engines": registered - submitted, "check": check}
        if self.torch_world:
            check_start = time.perf_counter()
            self.client[:].execute(IPP_TORCH_CHECK, block=True)
            times["check"] += time.perf_counter() - check_start
            got = [v.tolist() for v in self.client[:].pull("t", block=True)]
            want = [float(sum(range(1, TASKS + 1)))]
            if got != [want] * TASKS:
                raise BenchError(f"ipyparallel: all_reduce on the engines gave {got}, want {want} on each")
            times["torch"] = formed - registered
        return times

    def stop(self, cluster: Any | None = None) -> None:
        if self.client is not None:
            try:
                self.client.close(linger=0)
            except Exception as exc:
                print(f"warning: closing the ipyparallel client failed: {exc}", file=sys.stderr)
            self.client = None
        tree = list(self.procs)
        for proc in self.procs:  # the controller's schedulers, known before their parent goes
            try:
                tree += proc.children(recursive=True)
            except Exception:  # psutil.NoSuchProcess: gone already
                continue
        if self.cluster is not None:
            try:  # scancel of the engines' job and SIGTERM (then SIGKILL) of the controller
                self.cluster.stop_cluster_sync()
            except Exception as exc:
                print(f"warning: stopping the ipyparallel cluster failed: {exc}", file=sys.stderr)
            self.cluster = None
        if tree:
            import psutil

            _, alive = psutil.wait_procs(tree, timeout=5)
            for proc in alive:  # only what this cluster started, by id (psutil checks it is the same one)
                try:
                    proc.kill()
                except psutil.Error:
                    continue
        self.procs = []
        if cluster is not None and self.job and any(j["id"] == self.job for j in cluster.queue()):
            cluster.run("scancel", self.job)
        self.job = ""
        if self.dir is not None:
            shutil.rmtree(self.dir, ignore_errors=True)
            self.dir = None


def median(values: list[float]) -> float:
    return statistics.median(values)


def report(times: dict[str, list[dict[str, float]]], args: argparse.Namespace) -> dict[str, Any]:
    """Print the medians and the ratio; the figures for --json."""
    figures: dict[str, Any] = {}
    print(f"\n== a world on 2 Slurm nodes (sbatch {OPTIONS}, 2 tasks): seconds from start to formed, "
          f"{args.runs} interleaved runs each ==")
    if "ipyparallel" in times:
        delay = "its default 1" if args.ipp_delay is None else f"{args.ipp_delay:g}"
        beat = "its default 3000" if args.ipp_heartbeat_ms is None else str(args.ipp_heartbeat_ms)
        torch_world = ("; its world includes torch and a gloo process group on the engines (--ipp-torch)"
                       if args.ipp_torch else "; engines registered, no torch (nbdist's ranks also import torch and "
                       "join a gloo world)")
        print(f"  (ipyparallel: Cluster.delay {delay} s, controller HeartMonitor.period {beat} ms{torch_world})")
    for side, runs in times.items():
        if not runs:
            continue
        formed = [r["formed"] for r in runs]
        entry = {"formed_s": formed, "median_s": median(formed), "min_s": min(formed), "max_s": max(formed),
                 "check_s": [r["check"] for r in runs], "check_median_s": median([r["check"] for r in runs])}
        line = (f"  {side:<12} median {entry['median_s']:6.2f} s   (min {entry['min_s']:.2f}, "
                f"max {entry['max_s']:.2f})   runs: " + " ".join(f"{v:.2f}" for v in formed))
        if side == "ipyparallel":
            entry["submitted_median_s"] = median([r["submitted"] for r in runs])
            entry["engines_median_s"] = median([r["engines"] for r in runs])
            line += (f"\n  {'':<12} of which start_cluster() {entry['submitted_median_s']:.2f} s, "
                     f"connect_client + wait_for_engines(2) {entry['engines_median_s']:.2f} s")
            if "torch" in runs[0]:
                entry["torch_median_s"] = median([r["torch"] for r in runs])
                line += f", import torch + init_process_group {entry['torch_median_s']:.2f} s"
            line += " (medians)"
        print(line)
        figures[side] = entry
    checks = {"nbdist": "one %%collective all_reduce + all_gather_object on 3 ranks",
              "ipyparallel": "view.apply_sync(socket.gethostname) on 2 engines"
                             + (" + one %px-like all_reduce on them" if args.ipp_torch else "")}
    print("\n  the check after each start (medians):")
    for side, entry in figures.items():
        print(f"  {side:<12} {entry['check_median_s'] * 1000:8.1f} ms  {checks[side]}")
    if "nbdist" in figures and "ipyparallel" in figures:
        ratio = figures["nbdist"]["median_s"] / figures["ipyparallel"]["median_s"]
        figures["ratio"] = ratio
        figures["target_met"] = ratio <= TARGET
        print(f"\n  ratio of medians nbdist / ipyparallel: {ratio:.2f}x  ({TARGET_LINE}: "
              f"{'met' if ratio <= TARGET else 'NOT met'})")
    return figures


def variant(args: argparse.Namespace) -> str:
    """The figures' name: one per kind of comparison, so that each is kept (the README quotes them all)."""
    tuned = args.ipp_delay is not None or args.ipp_heartbeat_ms is not None
    return ("cluster_start" + ("-nbdist-only" if args.skip else "") + ("-ipp-tuned" if tuned else "")
            + ("-ipp-torch" if args.ipp_torch else ""))


def side_figures(times: dict[str, list[dict[str, float]]], figures: dict[str, Any]) -> list[dict[str, Any]]:
    """The headline figures, for the docs: each side's seconds to a formed world, and the ratio."""
    labels = {"nbdist": "nbdist: `%dist_init --spawn 3 --slurm ...` until the world is formed",
              "ipyparallel": "ipyparallel: `start_cluster()` to `wait_for_engines(2)`"}
    rows = [figure(labels[side], [r["formed"] for r in runs], "s", spread="min–max") for side, runs in times.items()
            if runs]
    if "ratio" in figures:
        rows.append(figure("ratio of medians, nbdist / ipyparallel", [], "x", median=figures["ratio"],
                           runs=len(times["nbdist"]), target=f"≤ {TARGET:g}x", met=figures["target_met"]))
    return rows


def parse_args(argv: list[str] | None) -> argparse.Namespace:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0],
                                formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--runs", type=int, default=5, help="counted runs of each side, interleaved (default 5)")
    p.add_argument("--warmup", type=int, default=1, help="uncounted rounds first, of each side (default 1: "
                   "the first start after set-up reads cold files)")
    p.add_argument("--timeout", type=float, default=120.0, help="seconds a world may take to form, and any one "
                   "cell (default 120)")
    p.add_argument("--ipp-delay", type=float, default=None, help="ipyparallel's Cluster.delay, the seconds it "
                   "sleeps between starting the controller and submitting the engines (default: ipyparallel's "
                   "own, 1 s)")
    p.add_argument("--ipp-heartbeat-ms", type=int, default=None, help="ipyparallel's HeartMonitor.period on "
                   "the controller: it counts a registering engine only after a heartbeat, so "
                   "wait_for_engines waits up to two periods (default: ipyparallel's own, 3000 ms)")
    p.add_argument("--ipp-torch", action="store_true", help="ipyparallel's world includes what nbdist's "
                   "has: after wait_for_engines, the engines import torch and join one gloo process group "
                   "(timed; the check adds an all_reduce on them)")
    p.add_argument("--skip", choices=("ipyparallel",),
                   help="measure nbdist only (no ratio)")
    p.add_argument("--json", metavar="FILE", help="also write the figures to FILE as JSON")
    args = p.parse_args(argv)
    if args.runs < 1 or args.warmup < 0 or args.timeout <= 0:
        p.error("--runs must be >= 1, --warmup >= 0, --timeout > 0")
    return args


def main(argv: list[str] | None = None) -> int:
    args = parse_args(argv)
    import tests.conftest  # noqa: F401  first, as pytest loads it: tests.slurm and tests.conftest import each other
    from tests.netns import Unsupported
    from tests.slurm import built_cluster

    sides: list[Side] = [Nbdist()]
    if args.skip != "ipyparallel":
        if importlib.util.find_spec("ipyparallel") is None:
            print(f"ipyparallel is not installed ({INSTALL}); or measure nbdist alone with --skip ipyparallel",
                  file=sys.stderr)
            return 1
        sides.append(Ipyparallel(args.ipp_delay, args.ipp_heartbeat_ms, args.ipp_torch))
    began = begin()
    print(load_note("at start"), flush=True)
    for key in [k for k in os.environ if k.startswith(FOREIGN)]:
        del os.environ[key]  # the caller's own Slurm settings must not reach this cluster
    times: dict[str, list[dict[str, float]]] = {s.name: [] for s in sides}
    failed = slurm = ""
    try:
        with built_cluster() as cluster:
            os.environ.update(cluster.env)  # ipyparallel's sbatch and scancel, and nbdist's kernel, use this cluster
            slurm = cluster.run("sbatch", "--version").stdout.strip() or "unknown"
            print(f"Slurm cluster: nodes {', '.join(cluster.nodes)} at {', '.join(cluster.node_addrs)}, "
                  f"master/controller address {cluster.addr}", flush=True)
            try:
                for round_ in range(args.warmup + args.runs):
                    counted = round_ >= args.warmup
                    for side in sides:
                        label = f"run {round_ - args.warmup + 1}" if counted else f"warm-up {round_ + 1}"
                        try:
                            got = side.once(cluster, args.timeout)
                        except BaseException:
                            side.stop(cluster)  # the finally below waits for the queue to empty
                            raise
                        side.stop(cluster)
                        settled = settle(cluster, 30, f"after {side.name}'s {label}")
                        extra = (f" (start_cluster {got['submitted']:.2f} s + engines {got['engines']:.2f} s"
                                 + (f" + torch world {got['torch']:.2f} s" if "torch" in got else "") + ")"
                                 if "submitted" in got else "")
                        print(f"  {label:<10} {side.name:<12} {got['formed']:6.2f} s{extra}; check "
                              f"{got['check'] * 1000:.0f} ms; queue empty {settled:.1f} s after the stop"
                              + ("" if counted else "  (not counted)"), flush=True)
                        if counted:
                            times[side.name].append(got)
            except BaseException as exc:
                failed = f"{type(exc).__name__}: {exc}"
                raise
            finally:
                for side in sides:
                    try:
                        side.stop(cluster)
                    except Exception as exc:  # keep stopping the others
                        print(f"warning: stopping {side.name} failed: {exc}", file=sys.stderr)
                try:
                    cluster.cancel_all()
                except Exception as exc:
                    print(f"warning: cancelling the jobs left failed: {exc}", file=sys.stderr)
                if failed:
                    print(f"\n--- the Slurm cluster's logs at the failure ---\n{cluster.logs()}", file=sys.stderr)
    except Unsupported as exc:
        print(f"cluster_start: no Slurm cluster can be built here: {exc}", file=sys.stderr)
        return 2
    except Exception as exc:
        traceback.print_exc()
        print(f"\ncluster_start: FAILED, figures void: {failed or f'{type(exc).__name__}: {exc}'}", file=sys.stderr)
        return 1

    figures = report(times, args)
    print("\nversions: " + ", ".join(f"{d} {version(d)}" for d in ("nbdist", "ipyparallel", "torch", "pyzmq")) +
          f", {slurm}")
    print(f"python {sys.version.split()[0]}, {os.cpu_count()} cores")
    print(load_note("at the end, this benchmark included", judge=False))
    if args.json:
        figures.update(runs=args.runs, warmup=args.warmup, sbatch_options=OPTIONS, tasks=TASKS,
                       ipp_delay_s=args.ipp_delay if args.ipp_delay is not None else 1.0,
                       ipp_torch=args.ipp_torch,
                       ipp_heartbeat_ms=args.ipp_heartbeat_ms if args.ipp_heartbeat_ms is not None else 3000,
                       versions={d: version(d) for d in ("nbdist", "ipyparallel", "torch", "pyzmq")},
                       slurm=slurm, cores=os.cpu_count(), load_average_end=os.getloadavg()[0])
        Path(args.json).write_text(json.dumps(figures, indent=2) + "\n")
        print(f"figures written to {args.json}")
    delay = "its default 1 s" if args.ipp_delay is None else f"{args.ipp_delay:g} s"
    beat = "its default 3000 ms" if args.ipp_heartbeat_ms is None else f"{args.ipp_heartbeat_ms} ms"
    engines = ("also import torch and join a gloo world (`--ipp-torch`)" if args.ipp_torch
               else "only register (no torch); nbdist's ranks import torch and join a gloo world")
    notes = [f"ipyparallel {version('ipyparallel')}: `Cluster.delay` {delay}, the controller's `HeartMonitor.period` "
             f"{beat}; its engines {engines}."]
    record(variant(args), f"A world on two Slurm nodes (sbatch `{OPTIONS}`, {TASKS} tasks): seconds from start to "
           f"formed, {args.runs} interleaved runs of each", side_figures(times, figures), began,
           [*([] if args.skip else notes), f"{slurm}, in network namespaces on this machine."])
    return 0


if __name__ == "__main__":
    sys.exit(main())
