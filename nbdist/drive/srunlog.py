"""What srun and a follower task's log say, read: where a task runs and how it ended. Pure text, no processes.

Each task of ``%dist_init --spawn N --slurm`` starts with one line of its own (:data:`WRAPPER`, a shell that then
execs ``nbdist follow``, so the pid is the follower's): ``nbdist-slurm-task procid=1 localid=0 node=nbdn2
pid=4242``. srun, run with ``-v``, says how each task ended, one line per node::

    srun: error: nbdn2: task 1: Killed
    srun: error: nbdn1: tasks 0-1: Exited with exit code 3
    srun: nbdn2: task 0: Completed

A signal is said in the C library's words (``strsignal``), here turned back into its number.
"""

from __future__ import annotations

import re
import signal
from collections.abc import Iterable
from dataclasses import dataclass

MARK = "nbdist-slurm-task"
# sh -c WRAPPER sh COMMAND...: one line saying where the task runs, then the command in its place (same pid).
WRAPPER = (f'echo "{MARK} procid=$SLURM_PROCID localid=$SLURM_LOCALID node=$SLURMD_NODENAME pid=$$"; '
           'exec "$@"')
_PLACE = re.compile(rf"^{MARK} procid=(\d+) localid=(\d*) node=(\S+) pid=(\d+)\s*$")
_END = re.compile(r"^srun: (?:error: )?(\S+): tasks? ([\d,\-]+): (.+?)\s*$")
_EXITED = re.compile(r"^Exited with exit code (\d+)$")
_JOINED = re.compile(r"^nbdist follow: rank \d+: joined: ")


@dataclass(frozen=True)
class Place:
    """Where a task's process runs: its task id in its step, its local id on the node, the node, its pid."""

    procid: int
    localid: int
    node: str
    pid: int


@dataclass(frozen=True)
class TaskEnd:
    """How srun says tasks of a step ended: on ``node``, tasks ``tasks`` (their ids in the step), ``returncode``
    as ``Popen.returncode`` has it (-N for signal N; None where srun's words are not known) and its words."""

    node: str
    tasks: tuple[int, ...]
    returncode: int | None
    said: str


def place(line: str) -> Place | None:
    """The task's own first line, read; None for any other line."""
    m = _PLACE.match(line.strip())
    if m is None:
        return None
    return Place(int(m[1]), int(m[2] or 0), m[3], int(m[4]))


def last_place(lines: Iterable[str]) -> Place | None:
    """Where the last process that wrote to a task's log runs (its log gains a line at each restart)."""
    found = None
    for line in lines:
        found = place(line) or found
    return found


def joined(lines: Iterable[str]) -> bool:
    """Whether ``nbdist follow`` said it joined, in these lines of its log."""
    return any(_JOINED.match(line) for line in lines)


def task_ids(text: str) -> tuple[int, ...]:
    """``0-2,5`` as (0, 1, 2, 5)."""
    ids: list[int] = []
    for part in text.split(","):
        first, _, last = part.partition("-")
        if first.isdigit() and (last == "" or last.isdigit()):
            ids += range(int(first), int(last or first) + 1)
    return tuple(ids)


def _signals() -> dict[str, int]:
    words: dict[str, int] = {}
    for sig in signal.Signals:
        text = signal.strsignal(sig)
        if text:
            words.setdefault(text, int(sig))
    return words


_SIGNAL_WORDS = _signals()


def returncode(said: str) -> int | None:
    """srun's words for how a task ended as a ``Popen.returncode``: ``Completed`` 0, ``Exited with exit code 3`` 3,
    ``Killed`` -9, ``Segmentation fault (core dumped)`` -11; None for words it does not know."""
    said = said.removesuffix(" (core dumped)").strip()
    if said == "Completed":
        return 0
    m = _EXITED.match(said)
    if m is not None:
        return int(m[1])
    sig = _SIGNAL_WORDS.get(said)
    return None if sig is None else -sig


def task_end(line: str) -> TaskEnd | None:
    """One line of srun's output as how tasks ended; None for any other line."""
    m = _END.match(line.strip())
    if m is None:
        return None
    ids = task_ids(m[2])
    if not ids:
        return None
    return TaskEnd(m[1], ids, returncode(m[3]), m[3])


def task_ends(lines: Iterable[str]) -> list[TaskEnd]:
    """Every task end srun said in ``lines``, in order."""
    return [end for end in map(task_end, lines) if end is not None]
