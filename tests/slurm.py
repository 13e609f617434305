"""A real two-node Slurm cluster on one machine: nodes in network namespaces on a bridge, the controller outside.

Layout for a run id ``ID`` (four hex digits) and a third octet ``X`` picked from it::

    root namespace:  bridge nbdID-sbr 10.251.X.1/24; slurmctld (listening on every address,
                     reached by the nodes at 10.251.X.1); a private munged
    namespace nbds1-ID: lo, nbdIDs1 10.251.X.2/24, hostname nbdn1, its slurmd (node nbdn1, 1 CPU)
    namespace nbds2-ID: lo, nbdIDs2 10.251.X.3/24, hostname nbdn2, its slurmd (node nbdn2, 1 CPU)

Everything the daemons write lives in one temporary folder (configuration, munge key and
socket, state, spools, logs, pid files), and both Slurm ports are picked free: the harness
never touches a system Slurm or munge, nor a second run of itself. Each ``slurmd`` is
started with ``nsenter --net`` and ``unshare --uts --mount`` (not ``ip netns exec``, which
remounts ``/sys``, hides ``/sys/fs/cgroup``, and slurmd 22.05 exits), so it, and every task it
runs, has the node's name as its hostname and an ``/etc/hosts`` where both nodes' names and
the root namespace's hostname resolve to their bridge addresses. In the root namespace the
node names resolve to nothing. No cgroups: processes are tracked through ``/proc``.

Set-up takes about 3.5 s (Debian 12, slurm 22.05, 2 cores): under 1 s to idle nodes (the
network, munged, slurmctld, both slurmds registering), then a first batch job with a step on
both nodes, run to the end, which slurmctld starts only 3 s after it started (later jobs start
within a second of their submission). It needs root, iproute2, util-linux (``nsenter``,
``unshare``, ``setpriv``) and Debian's ``slurmctld slurmd slurm-client munge`` (``.ci/run``
installs them).

Every daemon is stopped by its own pid: :meth:`SlurmCluster.close` undoes everything, also
after a set-up that failed half way. A run killed outright takes its daemons with it (each
gets SIGTERM when the thread that started it dies); the next set-up removes what it left
(:func:`remove_stale_runs`).
"""

from __future__ import annotations

import contextlib
import grp
import json
import os
import pwd
import re
import secrets
import shutil
import signal
import socket
import subprocess
import tempfile
import time
from collections.abc import Callable, Iterable, Iterator
from pathlib import Path

import pytest

from .conftest import pid_gone, skip_or_fail_in_ci
from .netns import Unsupported, _free_octet, _ip
from .netns import skip_reason as netns_skip_reason

NODES = ("nbdn1", "nbdn2")
PARTITION = "nbd"
MUNGE_USER = "munge"
BINARIES = ("slurmctld", "slurmd", "sbatch", "squeue", "scancel", "srun", "sinfo", "munged", "nsenter", "setpriv")
# The caller's own Slurm settings (the tests may run inside a Slurm job) must not reach this cluster.
_FOREIGN_PREFIXES = ("SLURM_", "SBATCH_", "SALLOC_", "SRUN_", "SQUEUE_", "SINFO_", "SCANCEL_", "SCONTROL_")
_LOG_LINES = 25
_DIR_PREFIX = "nbdist-slurm-"

_CONF = """\
ClusterName=nbd{run_id}
SlurmctldHost={ctl_host}({addr})
SlurmctldPort={ctld_port}
SlurmdPort={slurmd_port}
SlurmUser=root
SlurmdUser=root
AuthType=auth/munge
CredType=cred/munge
AuthInfo=socket={munge_socket}
StateSaveLocation={dir}/state
SlurmdSpoolDir={dir}/spool/%n
SlurmctldPidFile={dir}/slurmctld.pid
SlurmdPidFile={dir}/slurmd-%n.pid
SlurmctldLogFile={dir}/slurmctld.log
SlurmdLogFile={dir}/slurmd-%n.log
SlurmctldDebug=info
SlurmdDebug=info
ProctrackType=proctrack/linuxproc
TaskPlugin=task/none
JobAcctGatherType=jobacct_gather/none
AccountingStorageType=accounting_storage/none
JobCompType=jobcomp/none
SwitchType=switch/none
MpiDefault=none
SelectType=select/cons_tres
SelectTypeParameters=CR_CPU
SchedulerType=sched/builtin
SchedulerParameters=batch_sched_delay=0
ReturnToService=2
SlurmdTimeout=10
MessageTimeout=5
KillWait=2
InactiveLimit=0
MailProg=/bin/true
{node_lines}
PartitionName={partition} Nodes={nodes} Default=YES MaxTime=INFINITE State=UP
"""


def skip_reason() -> str | None:
    """Why a Slurm cluster cannot be built here, or None."""
    reason = netns_skip_reason()
    if reason:
        return reason
    missing = [b for b in BINARIES if shutil.which(b) is None]
    if missing:
        return f"not installed: {', '.join(missing)} (apt-get install slurmctld slurmd slurm-client munge)"
    try:
        pwd.getpwnam(MUNGE_USER)
    except KeyError:
        return f"no `{MUNGE_USER}` user to run munged as (Debian's munge package creates it)"
    return None


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("", 0))
        return s.getsockname()[1]


def _tail(path: Path, lines: int = _LOG_LINES) -> str:
    try:
        text = path.read_text(errors="replace")
    except OSError:
        return "(none)"
    return "\n".join(text.splitlines()[-lines:]) or "(empty)"


def _expand_hostlist(text: str) -> list[str]:
    """``nbdn[1-2],other`` as names (squeue's compressed form); "" or ``(null)`` as none."""
    names: list[str] = []
    for prefix, ranges, plain in re.findall(r"([^,\[]+)\[([^\]]*)\]|([^,\[\]]+)", text):
        if plain:
            if plain != "(null)":
                names.append(plain)
            continue
        for part in ranges.split(","):
            lo, _, hi = part.partition("-")
            names += [f"{prefix}{i:0{len(lo)}d}" for i in range(int(lo), int(hi or lo) + 1)]
    return names


def _out_name(daemon: str) -> str:
    """The file of a daemon's stdout and stderr: ``slurmd-nbdn1.out`` for ``slurmd nbdn1``."""
    return f"{daemon.replace(' ', '-')}.out"


def _new_run_id() -> str:
    """Four hex digits no namespace or folder uses yet (a run killed outright leaves both behind)."""
    for _ in range(100):
        run_id = secrets.token_hex(2)
        namespaces, _, _ = _link_names(run_id)
        if not any(Path(f"/run/netns/{ns}").exists() for ns in namespaces) and \
                not any(Path(tempfile.gettempdir()).glob(f"{_DIR_PREFIX}{run_id}-*")):
            return run_id
    raise Unsupported("no free run id: clear out /run/netns and nbdist-slurm-* folders")


def _link_names(run_id: str) -> tuple[tuple[str, str], tuple[str, str], str]:
    """A run's namespaces, their interfaces (each one's bridge end adds ``-br``) and its bridge."""
    return (f"nbds1-{run_id}", f"nbds2-{run_id}"), (f"nbd{run_id}s1", f"nbd{run_id}s2"), f"nbd{run_id}-sbr"


def _stop(proc: subprocess.Popen, grace: float = 5) -> None:
    """SIGTERM, then SIGKILL after ``grace`` s; reaped either way."""
    if proc.poll() is None:
        proc.terminate()
        try:
            proc.wait(timeout=grace)
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.wait(timeout=10)


class SlurmCluster:
    """Two Slurm nodes (network namespaces) and a controller in the root namespace."""

    def __init__(self, net: str = "10.251") -> None:
        self.run_id = _new_run_id()
        self.namespaces, self.ifnames, self.bridge = _link_names(self.run_id)
        self.octet = _free_octet(int(self.run_id, 16), net)
        self.addr = f"{net}.{self.octet}.1"
        self.nodes: tuple[str, str] = NODES
        self.node_addrs: tuple[str, str] = (f"{net}.{self.octet}.2", f"{net}.{self.octet}.3")
        self.dir = Path(tempfile.mkdtemp(prefix=f"{_DIR_PREFIX}{self.run_id}-"))
        (self.dir / "owner").write_text(str(os.getpid()))  # see remove_stale_runs()
        self.conf = self.dir / "slurm.conf"
        self.munge_socket = self.dir / "munge" / "munge.socket"
        self.env: dict[str, str] = {"SLURM_CONF": str(self.conf)}
        self._daemons: list[tuple[str, subprocess.Popen]] = []  # in start order
        self._outputs: list = []  # the daemons' stdout/stderr files
        self._closed = False

    def __repr__(self) -> str:
        nodes = ", ".join(f"{n} {a}" for n, a in zip(self.nodes, self.node_addrs, strict=True))
        return f"<SlurmCluster {self.run_id}: {nodes}, slurmctld {self.addr}, {self.dir}>"

    # --- set-up ------------------------------------------------------------------------------

    def create(self, seconds: float = 30) -> SlurmCluster:
        """Network, munged, slurmctld, both slurmds; return once both nodes are idle and a first job has run.

        :class:`Unsupported` if the network cannot be built here; RuntimeError (with the
        daemons' logs) if a daemon fails. The caller closes the cluster either way.
        """
        remove_stale_runs()
        self._make_network()
        self._start_munge()
        self._write_conf()
        self._start_slurmctld()
        for node, ns in zip(self.nodes, self.namespaces, strict=True):
            self._start_slurmd(node, ns)
        self.wait_idle(seconds)
        self._run_first_job(seconds)
        return self

    def _make_network(self) -> None:
        try:
            for ns in self.namespaces:
                _ip("netns", "add", ns)
            _ip("link", "add", self.bridge, "type", "bridge")
            for ifname in self.ifnames:
                _ip("link", "add", f"{ifname}-br", "type", "veth", "peer", "name", ifname)
        except RuntimeError as exc:
            raise Unsupported(str(exc)) from None
        _ip("addr", "add", f"{self.addr}/24", "dev", self.bridge)
        _ip("link", "set", self.bridge, "up")
        for ns, ifname, addr in zip(self.namespaces, self.ifnames, self.node_addrs, strict=True):
            _ip("link", "set", f"{ifname}-br", "master", self.bridge)
            _ip("link", "set", f"{ifname}-br", "up")
            _ip("link", "set", ifname, "netns", ns)
            _ip("-n", ns, "addr", "add", f"{addr}/24", "dev", ifname)
            _ip("-n", ns, "link", "set", ifname, "up")
            _ip("-n", ns, "link", "set", "lo", "up")

    def _start_munge(self) -> None:
        """A munged of our own (key, socket, pid, log under our folder), run as the munge user."""
        user = pwd.getpwnam(MUNGE_USER)
        self.dir.chmod(0o755)  # munged checks every folder on its paths and must be able to enter them
        folder = self.munge_socket.parent
        folder.mkdir(mode=0o755)
        os.chown(folder, user.pw_uid, user.pw_gid)
        key = folder / "munge.key"
        fd = os.open(key, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o600)
        with os.fdopen(fd, "wb") as f:
            f.write(secrets.token_bytes(1024))
        os.chown(key, user.pw_uid, user.pw_gid)
        cmd = ["munged", "--foreground", f"--socket={self.munge_socket}", f"--key-file={key}",
               f"--pid-file={folder / 'munged.pid'}", f"--log-file={folder / 'munged.log'}",
               f"--seed-file={folder / 'munged.seed'}"]
        self._spawn("munged", cmd, user=user.pw_uid, group=grp.getgrgid(user.pw_gid).gr_gid)
        self._wait_until("munged listening", self.munge_socket.is_socket, 15)

    def _write_conf(self) -> None:
        for sub in ("state", "spool", *(f"spool/{n}" for n in self.nodes)):
            (self.dir / sub).mkdir()
        node_lines = "\n".join(f"NodeName={n} NodeAddr={a} NodeHostname={n} CPUs=1 State=UNKNOWN"
                               for n, a in zip(self.nodes, self.node_addrs, strict=True))
        self.ctld_port, self.slurmd_port = _free_port(), _free_port()  # nodes: fresh namespaces, any port is free
        ctl_host = socket.gethostname().split(".")[0]
        # On the nodes, as on a real cluster, every node's name resolves to its address (the root
        # namespace's /etc/hosts is left alone: there, the node names resolve to nothing).
        (self.dir / "hosts").write_text("127.0.0.1 localhost\n::1 localhost ip6-localhost\n" + "".join(
            f"{a} {n}\n" for n, a in zip((*self.nodes, ctl_host), (*self.node_addrs, self.addr), strict=True)))
        self.conf.write_text(_CONF.format(
            run_id=self.run_id, ctl_host=ctl_host, addr=self.addr,
            ctld_port=self.ctld_port, slurmd_port=self.slurmd_port, munge_socket=self.munge_socket,
            dir=self.dir, node_lines=node_lines, partition=PARTITION, nodes=",".join(self.nodes)))

    def _start_slurmctld(self) -> None:
        self._spawn("slurmctld", ["slurmctld", "-D", "-f", str(self.conf)])
        self._wait_until("slurmctld answering", lambda: self.run("scontrol", "ping").returncode == 0, 15)

    def _start_slurmd(self, node: str, ns: str) -> None:
        """slurmd in ``ns``, with ``node`` as its hostname and our hosts file as ``/etc/hosts`` (in a mount
        namespace of its own, which its jobs inherit); every exec replaces the last, so the pid is slurmd's."""
        cmd = ["nsenter", f"--net=/run/netns/{ns}", "unshare", "--uts", "--mount",
               "sh", "-c", 'mount --bind "$1" /etc/hosts && hostname "$2" && shift 2 && exec "$@"',
               "sh", str(self.dir / "hosts"), node, "slurmd", "-D", "-N", node, "-f", str(self.conf)]
        self._spawn(f"slurmd {node}", cmd)

    def _run_first_job(self, seconds: float) -> None:
        """A batch job with a step on both nodes, run to the end: the whole path works, and the scheduler
        is awake (slurmctld starts no batch job in its first 3 s; later ones start within a second)."""
        job_id = self.sbatch("--job-name=first", "--nodes=2", "--ntasks-per-node=1",
                             f"--output={self.dir}/first-%j.out", "--wrap=srun true")
        self._wait_until(f"the first job ({job_id}) done", lambda: job_id not in self._ids(), seconds, self.queue)
        state = self.check("scontrol", "--oneliner", "show", "job", job_id)
        if "JobState=COMPLETED" not in state:
            raise RuntimeError(f"the first job ({job_id}) failed: {state.strip()}\n{self.logs()}")

    def _spawn(self, name: str, cmd: list[str], **kwargs) -> None:
        """Start a daemon that gets SIGTERM if the thread that started it dies (a test run killed outright)."""
        out = open(self.dir / _out_name(name), "w")  # closed in close()
        self._outputs.append(out)
        env = {k: v for k, v in os.environ.items() if not k.startswith(_FOREIGN_PREFIXES)}
        proc = subprocess.Popen(["setpriv", "--pdeathsig", "TERM", *cmd], stdin=subprocess.DEVNULL, stdout=out,
                                stderr=subprocess.STDOUT, env={**env, **self.env}, cwd=self.dir,
                                start_new_session=True, **kwargs)
        self._daemons.append((name, proc))

    def _wait_until(self, what: str, ready: Callable[[], object], seconds: float,
                    shown: Callable[[], object] | None = None) -> None:
        """Poll ``ready`` until true. RuntimeError if a daemon exits meanwhile; TimeoutError after
        ``seconds``, naming ``what`` and what ``shown()`` returns then. Both carry the logs."""
        deadline = time.monotonic() + seconds
        while not ready():
            self._check_daemons()
            if time.monotonic() > deadline:
                now = f" ({shown()})" if shown else ""
                raise TimeoutError(f"{what}: not within {seconds:g} s{now}\n{self.logs()}")
            time.sleep(0.05)

    def _check_daemons(self) -> None:
        """RuntimeError with the logs if a daemon has exited."""
        dead = [f"{name} (exit {proc.returncode})" for name, proc in self._daemons if proc.poll() is not None]
        if dead:
            raise RuntimeError(f"Slurm daemon exited: {', '.join(dead)}\n{self.logs()}")

    # --- using it --------------------------------------------------------------------------------

    def run(self, *cmd: str, timeout: float = 30) -> subprocess.CompletedProcess[str]:
        """Run a Slurm command (``sbatch``, ``srun``...) in the root namespace against this cluster.

        Output captured as text; not checked. It runs in the cluster's folder, so ``sbatch``'s
        ``slurm-%j.out`` lands there, not in the caller's directory.
        """
        env = {k: v for k, v in os.environ.items() if not k.startswith(_FOREIGN_PREFIXES)}
        return subprocess.run(list(cmd), capture_output=True, text=True, timeout=timeout,
                              env={**env, **self.env}, cwd=self.dir)

    def check(self, *cmd: str, timeout: float = 30) -> str:
        """:meth:`run`, failing with its stderr and the daemons' logs unless it exits 0; its stdout."""
        proc = self.run(*cmd, timeout=timeout)
        if proc.returncode != 0:
            raise RuntimeError(f"`{' '.join(cmd)}` failed ({proc.returncode}): {proc.stderr.strip()}\n{self.logs()}")
        return proc.stdout

    def queue(self) -> list[dict]:
        """squeue's jobs: ``{"id": "7", "state": "RUNNING", "reason": "None", "nodes": ["nbdn1", "nbdn2"]}``."""
        out = self.check("squeue", "--noheader", "--format=%i|%T|%r|%N")
        jobs = []
        for line in out.splitlines():
            if line.strip():
                job_id, state, reason, nodes = line.strip().split("|", 3)
                jobs.append({"id": job_id, "state": state, "reason": reason, "nodes": _expand_hostlist(nodes)})
        return jobs

    def node_states(self) -> dict[str, str]:
        """sinfo's state of each node (``idle``, ``allocated``, ``down*``...)."""
        out = self.check("sinfo", "--noheader", "--Node", "--format=%N %T")
        return dict(line.split() for line in out.splitlines() if line.strip())

    def wait_idle(self, seconds: float = 30) -> None:
        """Until both nodes are idle (sinfo); else TimeoutError, or RuntimeError if a daemon died, with the logs."""
        def idle() -> bool:
            return all(self.node_states().get(n) == "idle" for n in self.nodes)

        self._wait_until("both Slurm nodes idle", idle, seconds, self.node_states)

    def sbatch(self, *options: str) -> str:
        """Submit a batch job (``sbatch --parsable`` with ``options``); its id."""
        return self.check("sbatch", "--parsable", *options).strip().split(";")[0]  # "id" or "id;cluster"

    def occupy(self, seconds: float = 15) -> str:
        """Submit a job that holds both nodes (a sleep) and wait until its script runs; its id."""
        job_id = self.sbatch("--job-name=occupy", "--nodes=2", "--ntasks-per-node=1",
                             f"--output={self.dir}/occupy-%j.out", "--wrap=exec sleep 3600")

        # squeue says RUNNING once the controller has allocated the nodes, a moment before the script starts.
        def running() -> bool:
            return any(j["id"] == job_id and j["state"] == "RUNNING" for j in self.queue()) \
                and bool(self.task_pids(job_id))

        self._wait_until(f"job {job_id} running", running, seconds, self.queue)
        return job_id

    def cancel_all(self, seconds: float = 10) -> None:
        """scancel every job; wait until squeue shows none, else TimeoutError with the logs."""
        ids = self._ids()
        if ids:
            self.check("scancel", *ids)
        self._wait_until("squeue empty after scancel", lambda: not self._ids(), seconds, self.queue)

    def _ids(self) -> list[str]:
        return [j["id"] for j in self.queue()]

    def task_pids(self, job_id: str) -> list[int]:
        """Pids of the job's processes on the nodes: every one whose environment has its ``SLURM_JOB_ID``
        (the batch script, each step's tasks and their children; not slurmstepd). None yet for a
        moment after squeue first shows the job RUNNING."""
        node_nets = {os.stat(f"/run/netns/{ns}").st_ino for ns in self.namespaces}
        wanted = f"SLURM_JOB_ID={job_id}".encode()
        pids = []
        for entry in os.listdir("/proc"):
            if not entry.isdigit():
                continue
            try:
                if os.stat(f"/proc/{entry}/ns/net").st_ino not in node_nets:
                    continue
                with open(f"/proc/{entry}/environ", "rb") as f:
                    if wanted in f.read().split(b"\0"):
                        pids.append(int(entry))
            except OSError:  # gone meanwhile
                continue
        return sorted(pids)

    def logs(self) -> str:
        """Tails of the controller's, the nodes' and munged's logs (and their own output), for failure messages."""
        parts = [f"--- slurmctld.log ---\n{_tail(self.dir / 'slurmctld.log')}"]
        parts += [f"--- slurmd-{n}.log ---\n{_tail(self.dir / f'slurmd-{n}.log')}" for n in self.nodes]
        parts.append(f"--- munged (its output is its log) ---\n{_tail(self.dir / 'munged.out', 10)}")
        # The Slurm daemons' own output repeats their logs, but says why one that exited early did.
        parts += [f"--- {name}'s output (exit {proc.returncode}) ---\n{_tail(self.dir / _out_name(name))}"
                  for name, proc in self._daemons if name != "munged" and proc.poll() is not None]
        return "\n".join(parts)

    # --- tear-down ---------------------------------------------------------------------------

    def close(self) -> None:
        """Cancel the jobs, stop the daemons (by their pids), remove namespaces, links and folder; idempotent.

        RuntimeError afterwards if something had to be forced (jobs that would not go, processes
        left in a namespace) or is still there.
        """
        if self._closed:
            return
        self._closed = True
        errors: list[str] = []
        if self._daemons and all(p.poll() is None for n, p in self._daemons if n in ("slurmctld", "munged")):
            try:
                self.cancel_all()
            except Exception as exc:  # keep tearing down; reported below
                errors.append(f"cancelling jobs: {str(exc).splitlines()[0]}")
        log_tails = self.logs() if errors else ""
        for name, proc in reversed(self._daemons):  # slurmds, then slurmctld, then munged
            if name.startswith("slurmd"):
                _stop(proc)
        killed = _kill_processes_in(self.namespaces, grace=5)  # slurmstepds and tasks outlive slurmd
        if killed:
            errors.append(f"killed processes left in the nodes' namespaces: {killed}")
        for _name, proc in reversed(self._daemons):
            _stop(proc)
        for out in self._outputs:
            out.close()
        for ns, ifname in zip(self.namespaces, self.ifnames, strict=True):
            _ip("netns", "del", ns, check=False)  # takes its veth end, and so the peer, with it
            _ip("link", "del", f"{ifname}-br", check=False)
        _ip("link", "del", self.bridge, check=False)
        shutil.rmtree(self.dir, ignore_errors=True)
        left = self.leftovers()
        if left:
            errors.append(f"left behind: {', '.join(left)}")
        if errors:
            raise RuntimeError("; ".join(errors) + (f"\n{log_tails}" if log_tails else ""))

    def leftovers(self) -> list[str]:
        """Namespaces, links, daemons and the folder of this run that still exist."""
        netns = {line.split()[0] for line in _ip("netns", "list", check=False).stdout.splitlines() if line.strip()}
        links = {link["ifname"] for link in json.loads(_ip("-j", "link", check=False).stdout or "[]")}
        ours = {self.bridge, *self.ifnames, *(f"{i}-br" for i in self.ifnames)}
        left = sorted(netns & set(self.namespaces)) + sorted(links & ours)
        left += [f"{name} (pid {p.pid})" for name, p in self._daemons if p.poll() is None]
        return left + ([str(self.dir)] if self.dir.exists() else [])


def remove_stale_runs() -> list[str]:
    """Undo what runs killed outright left behind (their folders name a dead owner); what was removed.

    Their daemons died with them (see ``SlurmCluster._spawn``), but jobs' slurmstepds and
    tasks outlive slurmd by design: they are killed by pid, found in the run's own namespaces.
    """
    removed = []
    for folder in Path(tempfile.gettempdir()).glob(f"{_DIR_PREFIX}*"):
        try:
            owner = int((folder / "owner").read_text())
        except (OSError, ValueError):
            continue  # not ours, or still being set up
        if Path(f"/proc/{owner}").exists():
            continue
        namespaces, ifnames, bridge = _link_names(folder.name[len(_DIR_PREFIX):].split("-")[0])
        _kill_processes_in(namespaces)
        for ns, ifname in zip(namespaces, ifnames, strict=True):
            _ip("netns", "del", ns, check=False)
            _ip("link", "del", f"{ifname}-br", check=False)
        _ip("link", "del", bridge, check=False)
        shutil.rmtree(folder, ignore_errors=True)
        removed.append(str(folder))
    return removed


def _kill_processes_in(namespaces: Iterable[str], grace: float = 0) -> list[int]:
    """SIGKILL, by pid, what still runs in these network namespaces after ``grace`` s (a job's
    slurmstepd may still be exiting); wait (<= 10 s) until it is gone. The pids killed."""
    def running() -> list[int]:
        return sorted({int(p) for ns in namespaces if Path(f"/run/netns/{ns}").exists()
                       for p in _ip("netns", "pids", ns, check=False).stdout.split() if not pid_gone(int(p))})

    deadline = time.monotonic() + grace
    while (pids := running()) and time.monotonic() < deadline:
        time.sleep(0.05)
    for pid in pids:
        with contextlib.suppress(ProcessLookupError):
            os.kill(pid, signal.SIGKILL)
    deadline = time.monotonic() + 10
    while not all(pid_gone(p) for p in pids) and time.monotonic() < deadline:
        time.sleep(0.05)
    return pids


@contextlib.contextmanager
def built_cluster() -> Iterator[SlurmCluster]:
    """A cluster with both nodes idle, closed on the way out (also when set-up failed half way).

    :class:`Unsupported` with the reason where this machine cannot build one (not root, no slurmd...).
    """
    reason = skip_reason()
    if reason:
        raise Unsupported(reason)
    cluster = SlurmCluster()
    try:
        cluster.create()
        yield cluster
    finally:
        cluster.close()


@pytest.fixture(scope="session")
def slurm_cluster() -> Iterator[SlurmCluster]:
    """One two-node Slurm cluster (see the module's docstring); skipped with the reason where it cannot be
    built, failed instead under CI. Tests share it: leave no jobs behind (:meth:`SlurmCluster.cancel_all`)."""
    with contextlib.ExitStack() as stack:
        try:
            cluster = stack.enter_context(built_cluster())
        except Unsupported as exc:
            skip_or_fail_in_ci(f"Slurm cluster test: {exc}")
        yield cluster
