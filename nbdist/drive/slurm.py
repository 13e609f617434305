"""Followers on a Slurm cluster: ``%dist_init --spawn N --slurm "OPTIONS"``.

The notebook is rank 0; one Slurm job of N-1 tasks runs ``nbdist follow`` on
the nodes Slurm gives it (:mod:`nbdist.drive.headless`), each task rank
``SLURM_PROCID + 1``, its device the task's ``SLURM_LOCALID``. Only Slurm's
own commands are used (``sbatch``, ``squeue``, ``scancel``), so nothing new is
installed. The job is one more way to start the followers of ``--spawn``: the
same join, the same follow loop, the same worker table (``%dist_workers``).

The master address, port and token reach the tasks in their environment
(sbatch passes the submitting environment on), never on a command line. The
tasks' output goes to files in a folder under the home directory, which the
nodes of most clusters share; ``%dist_workers`` shows their last lines where
this machine sees that folder.

A task whose process dies is started again (:mod:`nbdist.drive.supervisor`, as for local workers) as a new step
of the same job on its node: ``srun --jobid=JOB --nodelist=NODE --ntasks=1 --overlap``, with the same rank,
device index (its first ``SLURM_LOCALID``), flags and environment, its output added to the same file. How it ended
is what srun says (run with ``-v``: the job's output for its first step, the restart's own srun for later ones;
:mod:`nbdist.drive.srunlog`), which needs that folder too.
"""

from __future__ import annotations

import collections
import itertools
import logging
import os
import shlex
import shutil
import subprocess
import sys
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

from ..config import WORKER_VARIABLE
from ..errors import ConfigError, WorkerError
from ..world.store import StoreClient
from . import restarts, srunlog
from .supervisor import Ending, Slot, Supervisor

log = logging.getLogger(__name__)

COMMANDS = ("sbatch", "squeue", "scancel")
SUBMIT_WAIT = 10.0  # seconds sbatch gets to answer
QUEUE_EVERY = 1.0  # seconds between looks at the job's state while the world forms
CANCEL_WAIT = 10.0  # seconds for a cancelled job to leave the queue
ENDED = ("COMPLETED", "FAILED", "CANCELLED", "TIMEOUT", "NODE_FAIL", "PREEMPTED", "BOOT_FAIL", "DEADLINE",
         "OUT_OF_MEMORY", "SPECIAL_EXIT")
# sbatch options that --spawn N sets itself: the number of tasks is N-1, one per follower.
OWN_OPTIONS = ("-n", "--ntasks", "--output", "-o", "--parsable", "--wrap")
LOG_LINES = 12
STEP_WAIT = 5.0  # seconds a restart's srun gets to end once its job is cancelled, before it is killed
AFTER_DOWN = "%dist_init --spawn N --slurm OPTIONS again submits a new job (every rank's variables are lost)"
# What a follower must not inherit from the notebook: its own rank settings.
NOTEBOOK_OWN = ("RANK", "WORLD_SIZE", "LOCAL_RANK", "MASTER_ADDR", "MASTER_PORT", "DEVICE_ID", "NBDIST_RUN")


def check_options(options: str) -> list[str]:
    """The sbatch options as words; raise ConfigError for ones --spawn sets itself or that do not parse."""
    options = options.strip()
    if len(options) > 1 and options[0] == options[-1] and options[0] in "\"'":
        options = options[1:-1]  # IPython's magic arguments keep the quotes around a value
    try:
        words = shlex.split(options)
    except ValueError as exc:
        raise ConfigError(f"--slurm {options!r} does not parse as sbatch options: {exc}") from None
    for word in words:
        name = word.split("=", 1)[0]
        if name in OWN_OPTIONS or (name.startswith("-n") and not name.startswith("--") and name != "-N"
                                   and len(name) > 2 and name[2:].isdigit()):
            raise ConfigError(f"--slurm: leave out {name}: --spawn N sets the job's tasks (N-1, one per follower) "
                              "and its output files")
    return words


def missing_commands() -> list[str]:
    return [name for name in COMMANDS if shutil.which(name) is None]


@dataclass
class Task(Slot):
    """One follower task of the job, as this notebook sees it: its slot, and the process that holds it now."""

    log: str = ""  # its output file (a restart adds to it)
    since: int = 0  # where in it its current process's output begins
    place: srunlog.Place | None = None  # where its current process runs, once it said so
    localid: int = 0  # its first process's SLURM_LOCALID: its device index, kept across restarts
    ended: srunlog.TaskEnd | None = None  # its end, as the job's srun said (its first process)
    step: subprocess.Popen[bytes] | None = None  # the srun of a restart (None: its process is of the job's step)
    step_err: str = ""  # where that srun says how the task ended
    notes: collections.deque[str] = field(default_factory=lambda: collections.deque(maxlen=LOG_LINES))

    def note(self, text: str) -> None:
        self.notes.append(text)

    def log_tail(self, n: int = LOG_LINES) -> list[str]:
        """Its last ``n`` lines (nbdist's own task lines left out), then nbdist's notes about it."""
        return [*self.output_tail(n), *self.notes][-n:]

    def output_tail(self, n: int, since: int = 0) -> list[str]:
        """The last ``n`` lines of its output file from byte ``since`` on (not its task lines, nor blank ones)."""
        try:
            with open(self.log, "rb") as f:
                f.seek(since)
                lines = (line.decode(errors="replace").rstrip("\n") for line in f)
                return list(collections.deque((line for line in lines
                                               if line.strip() and not line.startswith(srunlog.MARK)), maxlen=n))
        except OSError:
            return []

    def own_lines(self) -> list[str]:
        """What its current process wrote so far (read while it starts: a few lines)."""
        try:
            with open(self.log, "rb") as f:
                f.seek(self.since)
                return f.read().decode(errors="replace").splitlines()
        except OSError:
            return []


@dataclass
class JobState:
    state: str = "SUBMITTED"
    reason: str = ""
    nodes: str = ""

    def __str__(self) -> str:
        reason = f": {self.reason}" if self.reason and self.reason != "None" else ""
        return f"{self.state.lower()}{reason}"


class SlurmJob(Supervisor[Task]):
    """The Slurm job that runs ranks 1..N-1 as ``nbdist follow`` tasks (the followers of one ``--spawn``), under the
    supervisor that starts a dead task again as a step of its own on its node."""

    after_down = AFTER_DOWN

    def __init__(self, world_size: int, master_addr: str, master_port: int, token: str, init_flags: str,
                 options: list[str], max_restarts: int = restarts.DEFAULT_MAX) -> None:
        super().__init__(max_restarts)
        self.world_size, self.master_addr, self.master_port, self.token = world_size, master_addr, master_port, token
        self.init_flags = init_flags  # the %dist_init flags the followers take too (backend, timeouts, --env)
        self.options = options
        self.job_id = ""
        self.folder = ""
        self.tasks: list[Task] = []
        self.last = JobState()
        self._looked = 0.0
        self._env: dict[str, str] = {}  # the tasks' environment, as sbatch got it (a restart gets it too)
        self._read = 0  # how far the job's output (its srun's) has been read
        self._restarts = itertools.count(1)

    def slots(self) -> list[Task]:
        return self.tasks

    def _follow(self, *flags: str) -> list[str]:
        """The command of one task: its line saying where it runs, then ``nbdist follow`` in its place."""
        return ["/bin/sh", "-c", srunlog.WRAPPER, "sh", sys.executable, "-u", "-m", "nbdist", "follow", *flags,
                *shlex.split(self.init_flags)]

    # --- the interface of nbdist.drive.workers.Workers ----------------------------------
    def start(self) -> None:
        """Submit the job (within SUBMIT_WAIT s); raise WorkerError with sbatch's own one-line reason. Then watch
        its tasks."""
        self.folder = os.path.join(os.path.expanduser("~"), ".nbdist", "slurm", f"{os.getpid()}-{time.time_ns()}")
        os.makedirs(self.folder, exist_ok=True)
        self.tasks = [Task(rank, log=os.path.join(self.folder, f"task-{rank - 1}.log"))
                      for rank in range(1, self.world_size)]
        script = os.path.join(self.folder, "job.sh")
        follow = self._follow("--world-size", str(self.world_size), "--rank-offset", "1")
        with open(script, "w") as f:  # srun -v: it says how each task ended, also one that exited with 0
            f.write("#!/bin/sh\n# nbdist: the followers of a notebook's %dist_init --spawn --slurm\n"
                    f"exec srun -v --output={shlex.quote(os.path.join(self.folder, 'task-%t.log'))} "
                    f"{shlex.join(follow)}\n")
        # A notebook that itself runs in a Slurm job has that job's SLURM_* variables: not the new job's.
        env = {k: v for k, v in os.environ.items()
               if k not in NOTEBOOK_OWN and (not k.startswith("SLURM_") or k == "SLURM_CONF")}
        env.update(NBDIST_MASTER_ADDR=self.master_addr, NBDIST_MASTER_PORT=str(self.master_port),
                   NBDIST_TOKEN=self.token)
        env[WORKER_VARIABLE] = "1"  # a spawned rank: this notebook says how it ended, and starts it again
        self._env = env
        command = ["sbatch", "--parsable", f"--job-name=nbdist-{self.master_port}", f"--ntasks={self.world_size - 1}",
                   f"--output={os.path.join(self.folder, 'job-%j.log')}", *self.options, script]
        try:
            proc = subprocess.run(command, env=env, capture_output=True, text=True, timeout=SUBMIT_WAIT)
        except subprocess.TimeoutExpired:
            self._remove_folder()
            raise WorkerError(f"sbatch did not answer within {SUBMIT_WAIT:g} s: is slurmctld up? (squeue tells)") \
                from None
        except OSError as exc:
            self._remove_folder()
            raise WorkerError(f"sbatch could not run: {exc}") from None
        if proc.returncode != 0:
            self._remove_folder()
            raise WorkerError(f"sbatch refused the job: {_first_error(proc.stderr or proc.stdout)} "
                              f"(options: {shlex.join(self.options) or 'none'})")
        self.job_id = proc.stdout.strip().split(";")[0]
        self.last = JobState("PENDING", "submitted")
        self._watch()

    def note(self) -> str:
        """A line for the join status: the job and its state (``job 123 pending: Resources``)."""
        return f"Slurm job {self.job_id} {self.last}" + (f" on {self.last.nodes}" if self.last.nodes else "")

    def check(self) -> None:
        """Look at the job (at most every QUEUE_EVERY s); raise WorkerError if it ended, or one of its tasks did,
        before the world formed."""
        for t in self.tasks:
            if t.ended is not None and not t.joined:
                end = self._ending(t, t.ended)
                lines = " | ".join(t.output_tail(4))
                raise WorkerError(f"rank {t.rank} (Slurm job {self.job_id}, node {t.ended.node}) {end.how} before "
                                  "every rank joined" + (f". Its last lines: {lines}" if lines else "")
                                  + "\n(see also %dist_workers)")
        now = time.monotonic()
        if now - self._looked < QUEUE_EVERY:
            return
        self._looked = now
        self.last = self.look()
        if self.last.state in ENDED or self.last.state == "GONE":
            tails = "\n".join(f"rank {t.rank}: " + " | ".join(t.output_tail(4)) for t in self.tasks
                              if t.output_tail(1))
            raise WorkerError(f"Slurm job {self.job_id} ended ({self.last}) before every rank joined"
                              + (f". Its tasks' last lines:\n{tails}" if tails else f"; its output is in {self.folder}")
                              + "\n(see also %dist_workers)")

    def look(self) -> JobState:
        """The job's state from squeue (also a job that ended a moment ago); GONE once squeue forgets it."""
        try:
            proc = subprocess.run(["squeue", "-h", "--states=all", "-j", self.job_id, "-o", "%T|%r|%N"],
                                  capture_output=True, text=True, timeout=SUBMIT_WAIT)
        except (OSError, subprocess.TimeoutExpired) as exc:
            return JobState(self.last.state, f"squeue did not answer: {exc}", self.last.nodes)
        line = proc.stdout.strip().splitlines()[0] if proc.returncode == 0 and proc.stdout.strip() else ""
        if not line:
            return JobState("GONE", "no longer in the queue")
        state, reason, nodes = (line.split("|") + ["", ""])[:3]
        return JobState(state, reason, nodes)

    def title(self) -> str:
        return f"nbdist workers · Slurm job {self.job_id} · {self.last} · {len(self.tasks)} task(s)"

    def rows(self) -> list[dict[str, Any]]:
        """Each task for %dist_workers: its node and pid as it said them, its restarts and exits."""
        self.last = self.look()
        running = self.last.state not in ENDED and self.last.state != "GONE"
        rows = []
        for t in self.tasks:
            place = t.place or self._place(t)
            pid = place.pid if place else (t.exits[-1].pid if t.exits else None)
            alive = running and t.down is None and t.ended is None and (t.step is None or t.step.poll() is None)
            rows.append({"rank": t.rank, "pid": pid, "node": place.node if place else "not started yet",
                         "alive": alive, "joined": t.joined, "failed": t.failed,
                         "log": t.log_tail() or [f"(no output here yet: {t.log})"], **self.slot_row(t)})
        return rows

    def pids(self) -> list[int]:
        return []  # the tasks run on other nodes: Slurm, not this kernel, ends them

    def report_to(self, client: StoreClient, key: Callable[[str], str]) -> None:
        """The world formed: every task joined. From now on a task that dies is started again, and told."""
        for t in self.tasks:
            t.joined = True
            t.place = t.place or self._place(t)
            t.localid = t.place.localid if t.place else t.localid
        super().report_to(client, key)

    def shutdown(self) -> None:
        """Stop the watch (a restart under way first), cancel the job (every step of it, restarts' too) and wait up
        to CANCEL_WAIT s for it to leave the queue, then for the restarts' sruns; idempotent."""
        self._unwatch()
        if self.job_id:
            try:
                subprocess.run(["scancel", self.job_id], capture_output=True, text=True, timeout=SUBMIT_WAIT)
                deadline = time.monotonic() + CANCEL_WAIT
                while time.monotonic() < deadline and self.look().state not in (*ENDED, "GONE"):
                    time.sleep(0.2)
            except (OSError, subprocess.TimeoutExpired) as exc:
                # Nothing more this kernel can do: the tasks end by themselves when they see the driver gone.
                log.warning("could not cancel Slurm job %s: %s", self.job_id, exc)
        for t in self.tasks:
            _end_step(t, STEP_WAIT)
        self._remove_folder()
        self.tasks = []

    def _remove_folder(self) -> None:
        if self.folder:
            shutil.rmtree(self.folder, ignore_errors=True)

    # --- the supervisor's hooks (nbdist.drive.supervisor) ------------------------------------------------------
    def _round(self) -> None:
        """Read what the job's srun said since the last look: which of its tasks ended, and how."""
        if not self.folder or not self.job_id:
            return
        try:
            with open(os.path.join(self.folder, f"job-{self.job_id}.log"), "rb") as f:
                f.seek(self._read)
                text = f.read()
        except OSError:  # not written yet (or not seen from here)
            return
        whole = text[:text.rfind(b"\n") + 1]  # a line being written is read at the next look
        self._read += len(whole)
        for end in srunlog.task_ends(whole.decode(errors="replace").splitlines()):
            for procid in end.tasks:
                if 0 <= procid < len(self.tasks) and self.tasks[procid].step is None:
                    self.tasks[procid].ended = end

    def _check(self, t: Task) -> Ending | None:
        if t.step is None:
            end = t.ended
        else:
            code = t.step.poll()
            if code is None:
                end = None
            else:
                try:
                    with open(t.step_err, errors="replace") as f:
                        said = srunlog.task_ends(f.read().splitlines())
                except OSError:
                    said = []
                end = said[-1] if said else srunlog.TaskEnd(t.place.node if t.place else "", (0,), None,
                                                            _srun_error(t.step_err, code))
        if t.place is None or not t.joined:
            lines = t.own_lines()
            t.place = t.place or srunlog.last_place(lines)
            t.joined = t.joined or srunlog.joined(lines)
        return None if end is None else self._ending(t, end)

    def _ending(self, t: Task, end: srunlog.TaskEnd) -> Ending:
        how = (restarts.describe(end.returncode, None) if end.returncode is not None
               else f"ended ({end.said}, as srun said)")
        told = t.output_tail(restarts.TOLD_LINES, t.since)
        return Ending(t.place.pid if t.place else None, how, None, tuple(t.log_tail()), told)

    def _cannot_restart(self, t: Task) -> str | None:
        state = self.look()
        if state.state != "RUNNING":
            return f"its Slurm job {self.job_id} is {state} (a task is started again only within it)"
        if t.place is None:
            return "where it ran is not known (its output file has no task line)"
        return None

    def _clean(self, t: Task) -> None:
        _end_step(t)

    def _reset(self, t: Task) -> None:
        super()._reset(t)
        try:
            t.since = os.path.getsize(t.log)
        except OSError:
            t.since = 0
        t.ended = None

    def _start(self, t: Task) -> None:
        """A new step of one task on its node, in the same job: same rank, device index, flags and environment."""
        node = t.place.node if t.place else ""
        t.place = None
        t.step_err = os.path.join(self.folder, f"srun-{t.rank}-{next(self._restarts)}.log")
        command = ["srun", "-v", f"--jobid={self.job_id}", f"--nodelist={node}", "--nodes=1", "--ntasks=1",
                   "--overlap", f"--job-name=nbdist-{self.master_port}-rank{t.rank}", f"--output={t.log}",
                   "--open-mode=append", *self._follow("--rank", str(t.rank), "--world-size", str(self.world_size),
                                                       "--device", str(t.localid))]
        with open(t.step_err, "wb") as err:
            # A session of its own: the stop button (SIGINT to this kernel's group) must not end the step.
            t.step = subprocess.Popen(command, env=self._env, stdin=subprocess.DEVNULL, stdout=err, stderr=err,
                                      start_new_session=True)

    def _place(self, t: Task) -> srunlog.Place | None:
        return srunlog.last_place(t.own_lines())


def _end_step(t: Task, wait: float = 0.0) -> None:
    """Reap a restart's srun (its task ended, or its job was cancelled): given ``wait`` s, then SIGTERM (srun ends
    its step), then killed after STEP_WAIT s."""
    step, t.step = t.step, None
    if step is None:
        return
    try:
        step.wait(wait)
    except subprocess.TimeoutExpired:
        step.terminate()
        try:
            step.wait(STEP_WAIT)
        except subprocess.TimeoutExpired:
            step.kill()
            step.wait()


def _srun_error(path: str, code: int) -> str:
    """What srun said when it could not run a task: its first error line, and its exit code."""
    try:
        with open(path, errors="replace") as f:
            errors = [line.strip() for line in f if "error" in line.lower()]
    except OSError:
        errors = []
    return f"srun exited with code {code}" + (f": {errors[0]}" if errors else "")


def _first_error(text: str) -> str:
    """sbatch's reason in one line: its first ``error:`` line, else its first line."""
    lines = [line.strip() for line in text.strip().splitlines() if line.strip()]
    for line in lines:
        if "error" in line.lower() or "unrecognized" in line.lower() or "invalid" in line.lower():
            return line
    return lines[0] if lines else "(it said nothing)"
