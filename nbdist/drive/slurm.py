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
"""

from __future__ import annotations

import collections
import logging
import os
import shlex
import shutil
import subprocess
import sys
import time
from dataclasses import dataclass, field
from typing import Any

from ..errors import ConfigError, WorkerError

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
class Task:
    """One follower task of the job, as this notebook sees it."""

    rank: int
    log: str  # its output file
    joined: bool = False

    def log_tail(self, n: int = LOG_LINES) -> list[str]:
        try:
            with open(self.log, errors="replace") as f:
                return [line.rstrip("\n") for line in collections.deque(f, maxlen=n)]
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


@dataclass
class SlurmJob:
    """The Slurm job that runs ranks 1..N-1 as ``nbdist follow`` tasks (the followers of one ``--spawn``)."""

    world_size: int
    master_addr: str
    master_port: int
    token: str
    init_flags: str  # the %dist_init flags the followers take too (backend, timeouts, --env)
    options: list[str]
    job_id: str = ""
    folder: str = ""
    tasks: list[Task] = field(default_factory=list)
    last: JobState = field(default_factory=JobState)
    _looked: float = 0.0

    # --- the interface of nbdist.drive.workers.Workers ----------------------------------
    def start(self) -> None:
        """Submit the job (within SUBMIT_WAIT s); raise WorkerError with sbatch's own one-line reason."""
        self.folder = os.path.join(os.path.expanduser("~"), ".nbdist", "slurm", f"{os.getpid()}-{time.time_ns()}")
        os.makedirs(self.folder, exist_ok=True)
        self.tasks = [Task(rank, os.path.join(self.folder, f"task-{rank - 1}.log"))
                      for rank in range(1, self.world_size)]
        script = os.path.join(self.folder, "job.sh")
        follow = [sys.executable, "-u", "-m", "nbdist", "follow", "--world-size", str(self.world_size),
                  "--rank-offset", "1", *shlex.split(self.init_flags)]
        with open(script, "w") as f:
            f.write("#!/bin/sh\n# nbdist: the followers of a notebook's %dist_init --spawn --slurm\n"
                    f"exec srun --output={shlex.quote(os.path.join(self.folder, 'task-%t.log'))} "
                    f"{shlex.join(follow)}\n")
        # A notebook that itself runs in a Slurm job has that job's SLURM_* variables: not the new job's.
        env = {k: v for k, v in os.environ.items()
               if k not in NOTEBOOK_OWN and (not k.startswith("SLURM_") or k == "SLURM_CONF")}
        env.update(NBDIST_MASTER_ADDR=self.master_addr, NBDIST_MASTER_PORT=str(self.master_port),
                   NBDIST_TOKEN=self.token)
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

    def note(self) -> str:
        """A line for the join status: the job and its state (``job 123 pending: Resources``)."""
        return f"Slurm job {self.job_id} {self.last}" + (f" on {self.last.nodes}" if self.last.nodes else "")

    def check(self) -> None:
        """Look at the job (at most every QUEUE_EVERY s); raise WorkerError if it ended before the world formed."""
        now = time.monotonic()
        if now - self._looked < QUEUE_EVERY:
            return
        self._looked = now
        self.last = self.look()
        if self.last.state in ENDED or self.last.state == "GONE":
            tails = "\n".join(f"rank {t.rank}: " + " | ".join(t.log_tail(4)) for t in self.tasks if t.log_tail(1))
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
        return f"nbdist workers · Slurm job {self.job_id} · {self.look()} · {len(self.tasks)} task(s)"

    def rows(self) -> list[dict[str, Any]]:
        running = self.last.state not in ENDED and self.last.state != "GONE"
        return [{"rank": t.rank, "pid": None, "alive": running, "joined": t.joined, "failed": None,
                 "log": t.log_tail() or [f"(no output here yet: {t.log})"]} for t in self.tasks]

    def pids(self) -> list[int]:
        return []  # the tasks run on other nodes: Slurm, not this kernel, ends them

    def shutdown(self) -> None:
        """Cancel the job and wait up to CANCEL_WAIT s for it to leave the queue; idempotent."""
        if self.job_id:
            try:
                subprocess.run(["scancel", self.job_id], capture_output=True, text=True, timeout=SUBMIT_WAIT)
                deadline = time.monotonic() + CANCEL_WAIT
                while time.monotonic() < deadline and self.look().state not in (*ENDED, "GONE"):
                    time.sleep(0.2)
            except (OSError, subprocess.TimeoutExpired) as exc:
                # Nothing more this kernel can do: the tasks end by themselves when they see the driver gone.
                log.warning("could not cancel Slurm job %s: %s", self.job_id, exc)
        self._remove_folder()
        self.tasks = []

    def _remove_folder(self) -> None:
        if self.folder:
            shutil.rmtree(self.folder, ignore_errors=True)


def _first_error(text: str) -> str:
    """sbatch's reason in one line: its first ``error:`` line, else its first line."""
    lines = [line.strip() for line in text.strip().splitlines() if line.strip()]
    for line in lines:
        if "error" in line.lower() or "unrecognized" in line.lower() or "invalid" in line.lower():
            return line
    return lines[0] if lines else "(it said nothing)"
