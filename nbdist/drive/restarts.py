"""When a worker kernel that died is started again, and how to say how it ended: pure decisions, no processes.

A spawned worker that dies (the out-of-memory killer, a segfault in a backend,
``os._exit`` in user code) is started again in its slot, at most ``--max-restarts``
times within :data:`WINDOW` seconds. One that dies once more within the window,
or dies before it has joined after a restart (a crash at start-up would only
loop: pytorch issue 60910), is left down. :mod:`nbdist.drive.workers` acts on
these decisions; the facts come to them frozen, with the clock as a number.
"""

from __future__ import annotations

import signal
import time
from collections.abc import Sequence
from dataclasses import dataclass

DEFAULT_MAX = 3  # --max-restarts when it is not given
AFTER_DOWN = "%dist_init --spawn N again starts every worker afresh (every rank's variables are lost)"
WINDOW = 600.0  # seconds within which a rank's restarts are counted
TOLD_LINES = 5  # lines of a dead kernel's last output told to the other ranks (nbdist.world.exited_record.Exited)


@dataclass(frozen=True)
class Exit:
    """How one kernel of a slot ended, and what was done about it."""

    at: float  # when it was seen dead, by the wall clock (time.time())
    pid: int | None
    how: str  # :func:`describe`
    rss_kb: int | None  # the last memory sample before it ended
    lines: tuple[str, ...]  # the last lines it wrote
    restarted: bool
    why_down: str = ""  # why it was left down, when it was

    def line(self) -> str:
        """One line for %dist_workers: when, how, and what followed."""
        after = "restarted" if self.restarted else f"left down: {self.why_down}"
        return f"{time.strftime('%H:%M:%S', time.localtime(self.at))} pid {self.pid} {self.how}; {after}"


@dataclass(frozen=True)
class Decision:
    restart: bool
    why: str = ""  # why not, in words that finish "left down: ..."


def parse_max(value: object) -> int:
    """``--max-restarts K`` as an int >= 0; raise ValueError with a one-line message for anything else."""
    try:
        k = int(str(value))
    except ValueError:
        raise ValueError(f"--max-restarts takes a count of restarts (0 = never), not {value!r}") from None
    if k < 0:
        raise ValueError(f"--max-restarts takes a count of 0 or more (0 = never), not {k}")
    return k


def in_window(restarts: Sequence[float], now: float, window: float = WINDOW) -> int:
    """How many of the ``restarts`` (monotonic times) fall within ``window`` seconds before ``now``."""
    return sum(1 for t in restarts if now - t < window)


def watched(joined: bool, restarted: bool, formed: bool) -> bool:
    """Whether the supervisor watches a slot's kernel: one that joined, or was started again, and every one once the
    world formed (its ``%%dist_init`` cell may still be ending then, but it is in the world); before that, the
    spawn's own wait watches a first start."""
    return joined or restarted or formed


def decide(restarts: Sequence[float], now: float, max_restarts: int, joined_since: bool,
           window: float = WINDOW) -> Decision:
    """Whether to start a rank's kernel again after it died at ``now``.

    ``restarts``: when (monotonic) its earlier restarts were; ``joined_since``: whether the kernel that died had
    joined the world (False only for one started again that died before it joined).
    """
    if max_restarts == 0:
        return Decision(False, "restarts are off (--max-restarts 0)")
    if restarts and not joined_since:
        return Decision(False, "it died again before it joined after a restart (a failure as it starts would "
                               "only repeat)")
    done = in_window(restarts, now, window)
    if done >= max_restarts:
        return Decision(False, f"it died {done + 1} times within {window / 60:g} minutes (--max-restarts "
                               f"{max_restarts})")
    return Decision(True)


def memory(kb: int) -> str:
    """A memory size for people: ``812 MiB``, ``1.5 GiB``."""
    if kb >= 1024 * 1024:
        return f"{kb / (1024 * 1024):.1f} GiB"
    if kb >= 1024:
        return f"{kb / 1024:.0f} MiB"
    return f"{kb} KiB"


def describe(returncode: int | None, rss_kb: int | None) -> str:
    """How a process ended, from ``Popen.returncode``: its exit code, or the signal by name; for SIGKILL the
    memory it held just before, as a likely out-of-memory kill."""
    if returncode is None:
        return "ended (exit status unknown)"
    if returncode >= 0:
        return f"exited with code {returncode}"
    try:
        name = signal.Signals(-returncode).name
    except ValueError:
        name = f"signal {-returncode}"
    if -returncode == signal.SIGKILL and rss_kb is not None:
        return f"was killed by {name} (it held {memory(rss_kb)} just before: a likely out-of-memory kill)"
    return f"was killed by {name}"


def rss_kb(status: str) -> int | None:
    """The resident memory (``VmRSS``, KiB) in the text of ``/proc/<pid>/status``; None where it has none."""
    for line in status.splitlines():
        if line.startswith("VmRSS:"):
            parts = line.split()
            if len(parts) >= 2 and parts[1].isdigit():
                return int(parts[1])
    return None


def count(restarts: Sequence[float], now: float, max_restarts: int, window: float = WINDOW) -> str:
    """A rank's restarts for %dist_workers: ``1 of 3`` (those within the window), and the total where it differs."""
    if max_restarts == 0:
        return "off (--max-restarts 0)"
    recent = in_window(restarts, now, window)
    total = "" if recent == len(restarts) else f" ({len(restarts)} in all)"
    return f"{recent} of {max_restarts} within {window / 60:g} min{total}"
