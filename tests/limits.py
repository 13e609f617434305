"""Binder's limits on this machine: one CPU and a memory cgroup of 2 GB, with no swap, around a whole process tree.

mybinder.org gives a user 1 CPU and 1 to 2 GB and restarts a kernel above 2 GB. :func:`run_limited` runs a
command pinned to one CPU inside a fresh memory cgroup of its own, so that the command and every process it
starts (kernels, their heartbeat processes) count against one limit, as in a binder container, and reports
the time, the cgroup's high-water mark and its OOM kills.

Both cgroup versions are handled, for the memory controller may be on either (this project's machines mount
a hybrid: the memory controller on v1, at ``/sys/fs/cgroup/memory``, and a v2 tree without it):

- v2: a child of the cgroup2 mount's root (the root's ``cgroup.subtree_control`` gets ``+memory``), with
  ``memory.max`` and ``memory.swap.max = 0``; the high-water mark is ``memory.peak`` (Linux 5.19 and later),
  OOM kills are ``oom_kill`` in ``memory.events``;
- v1: a child of this process's own memory cgroup, with ``memory.limit_in_bytes`` and, where swap is
  accounted, ``memory.memsw.limit_in_bytes`` at the same value; the high-water mark is
  ``memory.max_usage_in_bytes``, OOM kills are ``oom_kill`` in ``memory.oom_control``.

A high-water mark below the limit means the limit was never reached (one that was reads the limit exactly);
``memory.failcnt`` would say so too, but stays 0 on this project's kernel (6.18) even after an OOM kill.

Either way the figure counts what the kernel charges to the cgroup: the processes' anonymous memory and the
page cache they are first to bring in (a library another process has already read is charged to that
process's cgroup, not this one), as a binder container's limit does. The runner is moved into the cgroup
before it executes the command, so nothing it starts escapes. :meth:`MemoryCgroup.close` kills by pid
whatever is still inside, then removes the cgroup; it is idempotent and runs also when the command failed.
Needs root; :class:`Unsupported` says why not, for a test to skip (or fail under CI).
"""

from __future__ import annotations

import os
import secrets
import signal
import subprocess
import sys
import time
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path

GB = 2**30
BINDER_MEMORY = 2 * GB  # mybinder.org restarts a kernel above 2 GB


class Unsupported(Exception):
    """This machine cannot provide what the harness needs (a reason to skip, not a failure, except under CI)."""


def _mounts() -> list[tuple[str, str, set[str]]]:
    """(mount point, file system type, options) of every cgroup mount."""
    found = []
    for line in Path("/proc/self/mounts").read_text().splitlines():
        fields = line.split()
        if len(fields) >= 4 and fields[2] in ("cgroup", "cgroup2"):
            found.append((fields[1], fields[2], set(fields[3].split(","))))
    return found


def _own_cgroup(v1_controller: str | None) -> str:
    """This process's cgroup path, in the v2 tree (``None``) or in the v1 hierarchy of ``v1_controller``."""
    for line in Path("/proc/self/cgroup").read_text().splitlines():
        number, controllers, path = line.split(":", 2)
        if v1_controller is None and number == "0" and controllers == "":
            return path
        if v1_controller is not None and v1_controller in controllers.split(","):
            return path
    raise Unsupported(f"this process is in no cgroup of {v1_controller or 'the v2 tree'}")


@dataclass(frozen=True)
class Usage:
    """What a limited run used: its wall time, its cgroup's high-water mark and OOM kills, and how it ended."""

    seconds: float
    peak_bytes: int
    oom_kills: int
    limit_bytes: int
    cgroup: str  # "v2" or "v1"
    swap_limited: bool  # swap was limited to 0 (or the machine accounts no swap to cgroups at all)
    cpus: tuple[int, ...]
    returncode: int
    stdout: str
    stderr: str

    @property
    def peak_mb(self) -> float:
        return self.peak_bytes / 2**20


class MemoryCgroup:
    """A fresh memory cgroup with a limit and no swap; :meth:`close` empties and removes it."""

    def __init__(self, limit: int, name: str = "") -> None:
        if os.geteuid() != 0:
            raise Unsupported("a memory cgroup needs root")
        name = name or f"nbdist-limits-{secrets.token_hex(3)}"
        mounts = _mounts()
        unified = [m for m in mounts if m[1] == "cgroup2"]
        v1 = [m for m in mounts if m[1] == "cgroup" and "memory" in m[2]]
        self.limit = limit
        self._closed = False
        if unified and "memory" in (Path(unified[0][0]) / "cgroup.controllers").read_text().split():
            self.version = "v2"
            root = Path(unified[0][0])
            subtree = root / "cgroup.subtree_control"
            if "memory" not in subtree.read_text().split():
                subtree.write_text("+memory")
            self.path = root / name
            self.path.mkdir()
            try:
                if not (self.path / "memory.peak").exists():
                    raise Unsupported("cgroup v2 without memory.peak (Linux 5.19 or later has it)")
                (self.path / "memory.max").write_text(str(limit))
                swap = self.path / "memory.swap.max"
                self.swap_limited = swap.exists()
                if swap.exists():
                    swap.write_text("0")
                else:  # no swap accounting: limited only if there is no swap at all
                    self.swap_limited = _no_swap()
            except BaseException:
                self.path.rmdir()
                raise
        elif v1:
            self.version = "v1"
            self.path = Path(v1[0][0]) / _own_cgroup("memory").lstrip("/") / name
            self.path.mkdir()
            try:
                (self.path / "memory.limit_in_bytes").write_text(str(limit))
                memsw = self.path / "memory.memsw.limit_in_bytes"
                if memsw.exists():  # memory plus swap, so no swap beyond the limit
                    memsw.write_text(str(limit))
                self.swap_limited = memsw.exists() or _no_swap()
            except BaseException:
                self.path.rmdir()
                raise
        else:
            raise Unsupported("no memory cgroup controller is mounted (neither cgroup v2 with memory nor v1 memory)")

    def peak(self) -> int:
        """The cgroup's high-water mark in bytes."""
        file = "memory.peak" if self.version == "v2" else "memory.max_usage_in_bytes"
        return int((self.path / file).read_text())

    def oom_kills(self) -> int:
        """Processes the OOM killer killed in this cgroup."""
        file = "memory.events" if self.version == "v2" else "memory.oom_control"
        for line in (self.path / file).read_text().splitlines():
            key, _, value = line.partition(" ")
            if key == "oom_kill":
                return int(value)
        raise Unsupported(f"{file} has no oom_kill count (Linux 4.13 or later has it)")

    def pids(self) -> list[int]:
        return [int(p) for p in (self.path / "cgroup.procs").read_text().split()]

    def close(self) -> None:
        """Kill by pid whatever is still inside (all of it started here), then remove the cgroup. Idempotent."""
        if self._closed:
            return
        deadline = time.monotonic() + 10
        while self.path.exists():
            for pid in self.pids():
                try:
                    os.kill(pid, signal.SIGKILL)
                except ProcessLookupError:
                    pass
            try:
                self.path.rmdir()
            except OSError:  # EBUSY until the killed processes are reaped
                if time.monotonic() > deadline:
                    raise
                time.sleep(0.1)
        self._closed = True


def _no_swap() -> bool:
    for line in Path("/proc/meminfo").read_text().splitlines():
        if line.startswith("SwapTotal:"):
            return int(line.split()[1]) == 0
    return False


# Runs in the child: join the cgroup (its pid into cgroup.procs), pin to the CPUs, then become the command.
_ENTER = ("import os, sys; open(sys.argv[1], 'w').write(str(os.getpid())); "
          "os.sched_setaffinity(0, {int(c) for c in sys.argv[2].split(',')}); os.execvp(sys.argv[3], sys.argv[3:])")


def one_cpu() -> int:
    """The CPU to pin to: the first this process may run on (``taskset -c 0`` on an unrestricted machine)."""
    return min(os.sched_getaffinity(0))


def run_limited(argv: Sequence[str], *, limit: int = BINDER_MEMORY, cpus: Sequence[int] | None = None,
                timeout: float = 600, cwd: Path | None = None, env: Mapping[str, str] | None = None,
                watch: Callable[[MemoryCgroup], None] | None = None) -> Usage:
    """Run ``argv`` pinned to ``cpus`` (default: one CPU) in a fresh cgroup of ``limit`` bytes; wait, measure, clean up.

    ``watch(cgroup)``, if given, is called about every 0.25 s while the command runs (to sample its processes).

    Raises :class:`Unsupported` when the cgroup cannot be made, ``subprocess.TimeoutExpired`` (after killing
    everything in the cgroup) when the command outlives ``timeout`` seconds.
    """
    chosen = tuple(cpus) if cpus is not None else (one_cpu(),)
    group = MemoryCgroup(limit)
    try:
        started = time.monotonic()
        proc = subprocess.Popen(
            [sys.executable, "-c", _ENTER, str(group.path / "cgroup.procs"), ",".join(map(str, chosen)), *argv],
            cwd=cwd, env=None if env is None else dict(env), stdout=subprocess.PIPE, stderr=subprocess.PIPE,
            text=True)
        deadline = started + timeout
        while True:
            try:
                out, err = proc.communicate(timeout=min(0.25, max(deadline - time.monotonic(), 0.01)))
                break
            except subprocess.TimeoutExpired:
                if time.monotonic() >= deadline:
                    group.close()
                    proc.communicate()
                    raise
                if watch is not None:
                    watch(group)
        seconds = time.monotonic() - started
        return Usage(seconds=seconds, peak_bytes=group.peak(), oom_kills=group.oom_kills(), limit_bytes=limit,
                     cgroup=group.version, swap_limited=group.swap_limited, cpus=chosen,
                     returncode=proc.returncode, stdout=out, stderr=err)
    finally:
        group.close()
