"""Local worker kernels: ``%dist_init --spawn N`` makes this notebook rank 0 of N on this machine.

Each worker is an IPython kernel started through jupyter_client, never a fork
(CUDA and NPU forbid forking an initialised process). It runs three cells:
``%load_ext nbdist``, its ``%%dist_init``, and ``%dist_follow``, so that every
``%%collective`` of the driving notebook runs there too. A worker is a child of
the driving kernel: jupyter_client gives it that kernel's pid, and ipykernel
ends a kernel whose parent is gone, so no worker outlives a killed driver.
Output that never reaches a notebook (the kernel's own stdout and stderr, and
what its cells showed) is kept, the last lines of it, for ``%dist_workers``.

A supervisor thread watches the workers that joined. One whose kernel died is
recorded (when, how, the memory it held, its last lines) and, as
:mod:`nbdist.drive.restarts` decides, started again in its slot: same rank and
flags, the same three cells. Its new kernel takes the old one's place in the
formed world (the rendezvous replaces a rank whose heartbeat is gone), and
every rank rebuilds the process group at the next collective.
"""

from __future__ import annotations

import collections
import glob
import logging
import os
import shutil
import subprocess
import tempfile
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass, field, replace
from typing import Any

from ..config import RUN_VARIABLE, WORKER_VARIABLE
from ..errors import StoreConnectionError, WorkerError
from ..world import keys
from ..world.exited_record import Exited
from ..world.store import StoreClient
from . import restarts
from .restarts import Exit

LOG_LINES = 200  # lines of each worker's output kept for %dist_workers
SHUTDOWN_WAIT = 3.0  # seconds a worker gets to leave before it is killed
FOLDER_PREFIX = "nbdist-worker-"  # then the driving kernel's pid and the worker's rank
LOOK_INTERVAL = 0.5  # seconds between the supervisor's looks at the workers (and samples of their memory)
READY_WAIT = 60.0  # seconds a worker kernel gets to answer once started

logger = logging.getLogger(__name__)


@dataclass
class Worker:
    """One worker kernel: its rank, process and the last lines it wrote."""

    rank: int
    manager: Any = None
    client: Any = None
    folder: str = ""
    lines: collections.deque[str] = field(default_factory=lambda: collections.deque(maxlen=LOG_LINES))
    init_id: str = ""
    failed: str | None = None  # why its %load_ext or %%dist_init failed, once known
    joined: bool = False
    restarts: list[float] = field(default_factory=list)  # when (monotonic) its slot was started again
    exits: list[Exit] = field(default_factory=list)  # how each of its kernels that died ended
    down: str | None = None  # why it was left down after it died, once it was
    rss_kb: int | None = None  # its kernel's memory at the supervisor's last look
    _reader: threading.Thread | None = None
    _halt: threading.Event = field(default_factory=threading.Event)

    @property
    def pid(self) -> int | None:
        provisioner = getattr(self.manager, "provisioner", None)
        return getattr(provisioner, "pid", None)

    def alive(self) -> bool:
        return self.manager is not None and self.manager.is_alive()

    def returncode(self) -> int | None:
        """The exit status of its kernel process (``Popen.returncode``: -N for signal N); None while it runs."""
        process = getattr(getattr(self.manager, "provisioner", None), "process", None)
        return None if process is None else process.poll()

    def sample_memory(self) -> None:
        """Note its kernel's resident memory now, so the last value before it dies is known."""
        try:
            with open(f"/proc/{self.pid}/status") as f:
                kb = restarts.rss_kb(f.read())
        except OSError:  # gone, or no /proc: keep the last sample
            return
        if kb is not None:
            self.rss_kb = kb

    def log_tail(self, n: int = 12) -> list[str]:
        """The last ``n`` lines: what the kernel process wrote, then what its cells showed."""
        return [*self.process_tail(n), *list(self.lines)[-n:]][-n:]

    def process_tail(self, n: int) -> list[str]:
        """The last ``n`` lines the kernel process itself wrote (its stdout and stderr), blank ones left out."""
        try:
            with open(os.path.join(self.folder, "kernel.log"), errors="replace") as f:
                return list(collections.deque((line.rstrip("\n") for line in f if line.strip()), maxlen=n))
        except OSError:
            return []


def remove_stale_folders() -> None:
    """The folders of workers whose driving kernel was killed (nothing else removes them)."""
    for path in glob.glob(os.path.join(tempfile.gettempdir(), f"{FOLDER_PREFIX}*-*-*")):
        pid = os.path.basename(path).removeprefix(FOLDER_PREFIX).split("-")[0]
        if pid.isdigit() and not os.path.exists(f"/proc/{pid}"):
            shutil.rmtree(path, ignore_errors=True)


def _texts(msg: dict[str, Any]) -> list[str]:
    kind, content = msg["msg_type"], msg["content"]
    if kind == "stream":
        text: str = content["text"]
        return text.splitlines()
    if kind == "error":
        return [f"{content['ename']}: {content['evalue']}"]
    if kind in ("display_data", "execute_result", "update_display_data"):
        text = content.get("data", {}).get("text/plain", "")
        return [line for line in text.splitlines() if line.startswith("nbdist")][:3]
    return []


class Workers:
    """The worker kernels of one spawned world (ranks 1..N-1), and the supervisor that starts a dead one again."""

    def __init__(self, world_size: int, master_port: int, token: str, init_flags: str = "",
                 max_restarts: int = restarts.DEFAULT_MAX) -> None:
        self.world_size, self.master_port, self.token, self.init_flags = world_size, master_port, token, init_flags
        self.max_restarts = max_restarts
        self.workers = [Worker(rank) for rank in range(1, world_size)]
        # One lock orders the supervisor's restarts against shutdown(): once shutdown holds it, nothing starts.
        self._lock = threading.Lock()
        self._closing = threading.Event()
        self._supervisor: threading.Thread | None = None
        self._report: tuple[StoreClient, Callable[[str], str]] | None = None  # where deaths are told (report_to)

    def start(self) -> None:
        """Start every worker kernel in parallel and queue its three cells; raise WorkerError if one cannot start.
        Then watch them (:meth:`_supervise`)."""
        remove_stale_folders()
        errors: list[str] = []

        def one(w: Worker) -> None:
            try:
                self._start(w)
            except Exception as exc:  # reported below, with its log
                errors.append(f"rank {w.rank}: {type(exc).__name__}: {exc}")

        threads = [threading.Thread(target=one, args=(w,), daemon=True) for w in self.workers]
        for t in threads:
            t.start()
        for t in threads:
            t.join()
        if errors:
            self.shutdown()
            raise WorkerError("worker kernels did not start: " + "; ".join(errors))
        with self._lock:
            if not self._closing.is_set():
                self._supervisor = threading.Thread(target=self._supervise, name="nbdist-supervisor", daemon=True)
                self._supervisor.start()

    def _start(self, w: Worker) -> None:
        from jupyter_client.manager import KernelManager

        # Kernels talk over Unix sockets in a private folder: nothing listens on TCP.
        w.folder = tempfile.mkdtemp(prefix=f"{FOLDER_PREFIX}{os.getpid()}-{w.rank}-")
        w.manager = KernelManager(kernel_name="python3", transport="ipc", ip=os.path.join(w.folder, "k"))
        w.manager.shutdown_wait_time = SHUTDOWN_WAIT
        env = {**os.environ, "NBDIST_TOKEN": self.token, WORKER_VARIABLE: "1"}
        for key in ("RANK", "WORLD_SIZE", "LOCAL_RANK", "MASTER_ADDR", "MASTER_PORT", "DEVICE_ID", RUN_VARIABLE):
            env.pop(key, None)  # this notebook's own rank settings are not the worker's
        with open(os.path.join(w.folder, "kernel.log"), "w") as log:
            w.manager.start_kernel(env=env, stdout=log, stderr=subprocess.STDOUT)
        w.client = w.manager.client()
        w.client.start_channels()
        self._wait_ready(w)
        w._reader = threading.Thread(target=self._read, args=(w,), name=f"nbdist-worker{w.rank}", daemon=True)
        w._reader.start()
        w.client.execute("%load_ext nbdist", store_history=False)
        w.init_id = w.client.execute(
            f"%dist_init --rank {w.rank} --world-size {self.world_size} --master-addr 127.0.0.1 "
            f"--master-port {self.master_port} {self.init_flags}", store_history=False)
        w.client.execute("%dist_follow --quiet", store_history=False)  # nobody sees a worker's output area

    def _wait_ready(self, w: Worker) -> None:
        """Wait until the kernel answers, in slices, so that shutdown() need not wait out a restart's start."""
        deadline = time.monotonic() + READY_WAIT
        while True:
            try:
                w.client.wait_for_ready(timeout=1.0)
                return
            except RuntimeError:  # no answer within the slice (or the kernel died: the next slice says so)
                if self._closing.is_set():
                    raise WorkerError(f"worker rank {w.rank}: stopped as it started") from None
                if not w.alive() or time.monotonic() > deadline:
                    raise

    def _read(self, w: Worker) -> None:
        """Keep the worker's recent output, and see whether its set-up cells failed."""
        import queue

        while not w._halt.is_set():
            try:
                msg = w.client.get_iopub_msg(timeout=0.5)
            except queue.Empty:
                continue
            except Exception:  # the channels were closed (shutdown)
                return
            w.lines.extend(_texts(msg))
            parent = msg.get("parent_header", {}).get("msg_id")
            if msg["msg_type"] == "error" and w.failed is None and not w.joined:
                w.failed = f"{msg['content']['ename']}: {msg['content']['evalue']}"
            elif parent == w.init_id and msg["msg_type"] == "status" and msg["content"]["execution_state"] == "idle":
                w.joined = w.failed is None
                if w.joined:
                    # From here on its kernel's own log says what went wrong; reading every message it
                    # sends would only take this kernel's time from the cells it drives.
                    w.client.iopub_channel.stop()
                    return

    # --- the supervisor: a dead worker is started again in its slot ------------------------------------------
    def _supervise(self) -> None:
        """Look at the workers every LOOK_INTERVAL s until shutdown(); never raises (a failed look is logged)."""
        while not self._closing.wait(LOOK_INTERVAL):
            for w in list(self.workers):
                try:
                    self._look(w)
                except Exception as exc:  # a look that failed must not end the watch over the others
                    logger.warning("nbdist: watching worker rank %d: %r", w.rank, exc)

    def _look(self, w: Worker) -> None:
        if w.down is not None or w.manager is None or not restarts.watched(w.joined, bool(w.restarts),
                                                                          self._report is not None):
            return  # left down, or still joining the first time (the spawn's own wait watches that)
        if w.alive():
            w.sample_memory()
            if w.restarts and w.failed is not None:  # started again, and its %%dist_init failed: do not loop
                self._leave_down(w, f"failed to join after a restart: {w.failed}")
            return
        self._died(w)

    def _died(self, w: Worker) -> None:
        """Record how ``w``'s kernel ended, then start it again in its slot, or leave it down, as the policy says."""
        now = time.monotonic()
        how = restarts.describe(w.returncode(), w.rss_kb)
        decision = restarts.decide(w.restarts, now, self.max_restarts, w.joined)
        exit_ = Exit(time.time(), w.pid, how, w.rss_kb, tuple(w.log_tail()), decision.restart, decision.why)
        w.exits.append(exit_)
        tail = w.process_tail(restarts.TOLD_LINES)  # what the dead process wrote, before its folder goes
        with self._lock:
            if self._closing.is_set():
                return  # shutdown() stops what is left of it
            self._tell(w.rank, exit_, restarts.in_window([*w.restarts, now], now), tail)
            self._clean(w)
            if not decision.restart:
                w.down = decision.why
                w.lines.append(f"nbdist: rank {w.rank} {how}; left down: {decision.why}")
                logger.warning("nbdist: worker rank %d %s; left down: %s. %s", w.rank, how, decision.why,
                               restarts.AFTER_DOWN)
                return
            w.restarts.append(now)
            n = restarts.in_window(w.restarts, now)
            w.lines.append(f"nbdist: rank {w.rank} {how}; starting it again ({n} of {self.max_restarts})")
            logger.warning("nbdist: worker rank %d %s; starting it again (%d of %d)", w.rank, how, n,
                           self.max_restarts)
            w.joined, w.failed, w.init_id, w.rss_kb, w._halt = False, None, "", None, threading.Event()
            try:
                self._start(w)
            except Exception as exc:  # it could not start: left down, its half-started kernel stopped
                why = f"it could not be started again: {type(exc).__name__}: {exc}"
                self._clean(w)
                if not self._closing.is_set():  # (else shutdown() has stopped the world; nothing to report)
                    w.down = why
                    w.exits[-1] = replace(w.exits[-1], restarted=False, why_down=why)
                    self._tell(w.rank, w.exits[-1], n, tail)

    def report_to(self, client: StoreClient, key: Callable[[str], str]) -> None:
        """From now on, say in the world's store how each worker's kernel that dies ended, and what became of its
        slot (:class:`nbdist.world.exited_record.Exited`, which the ranks that lose it read); ``client``: a connection
        of the supervisor's own, closed at shutdown; ``key``: the world's round's key of a name. It is called once
        the world formed: from then on every worker is watched (:func:`nbdist.drive.restarts.watched`)."""
        self._report = (client, key)

    def _tell(self, rank: int, exit_: Exit, n: int, lines: list[str]) -> None:
        """Publish how rank ``rank``'s kernel ended (``n``: its restarts within the window, this one counted;
        ``lines``: the last its process wrote)."""
        if self._report is None or exit_.pid is None:
            return
        client, key = self._report
        then = (f"rank {rank} was restarted ({n} of {self.max_restarts})" if exit_.restarted
                else f"rank {rank} was left down: {exit_.why_down}; {restarts.AFTER_DOWN}")
        told = Exited(exit_.pid, exit_.how, lines, exit_.restarted, then, exit_.at)
        try:
            client.set(key(keys.exited(rank)), told.to_json())
        except StoreConnectionError as exc:  # the world is going: nobody is left to tell
            logger.info("nbdist: could not say how worker rank %d ended: %s", rank, exc)

    def _leave_down(self, w: Worker, why: str) -> None:
        with self._lock:
            if self._closing.is_set():
                return
            w.down = why
            w.exits.append(Exit(time.time(), w.pid, "did not join", w.rss_kb, tuple(w.log_tail()), False, why))
            self._clean(w)

    def _clean(self, w: Worker) -> None:
        """Stop what is left of ``w``'s kernel (its process group, its channels) and remove its folder."""
        w._halt.set()
        try:
            if w.client is not None:
                w.client.stop_channels()
            if w.manager is not None and w.manager.has_kernel:
                w.manager.shutdown_kernel(now=True)  # reaps it, removes its connection files (its pulse ends itself)
        except Exception as exc:  # nothing more to stop: say so and go on
            w.lines.append(f"nbdist: cleaning up after rank {w.rank}: {exc}")
        finally:
            if w.folder:
                shutil.rmtree(w.folder, ignore_errors=True)
            w.client, w.manager, w.folder = None, None, ""

    # --- what the driving notebook asks --------------------------------------------------------------------
    def check(self) -> None:
        """Raise :class:`WorkerError` naming a worker that died or failed to join (rank 0 waits for them)."""
        for w in self.workers:
            if w.failed is not None or not w.alive():
                why = w.failed or f"its kernel exited (pid {w.pid})"
                tail = "\n".join(w.log_tail())
                raise WorkerError(f"worker rank {w.rank} (pid {w.pid}) did not join: {why}. Its last lines:\n{tail}"
                                  "\n(see also %dist_workers)")

    def rows(self) -> list[dict[str, Any]]:
        """Each worker for %dist_workers; one left down keeps the pid of its last kernel."""
        now = time.monotonic()
        return [{"rank": w.rank, "pid": w.pid or (w.exits[-1].pid if w.exits else None), "alive": w.alive(),
                 "joined": w.joined, "failed": w.failed, "log": w.log_tail(), "down": w.down,
                 "after_down": restarts.AFTER_DOWN, "restarts": restarts.count(w.restarts, now, self.max_restarts),
                 "exits": [e.line() for e in w.exits]} for w in self.workers]

    def restarted(self) -> list[int]:
        """The ranks whose kernel was started again, and runs (their namespace is new)."""
        return [w.rank for w in self.workers if w.restarts and w.down is None]

    def pids(self) -> list[int]:
        return [w.pid for w in self.workers if w.pid is not None]

    def shutdown(self) -> None:
        """Stop the supervisor, then every worker (ask, then kill after SHUTDOWN_WAIT s), in parallel; idempotent."""
        self._closing.set()
        with self._lock:  # a restart under way ends first (its start is cut at the next second); none begins
            pass
        if self._supervisor is not None and self._supervisor is not threading.current_thread():
            self._supervisor.join(timeout=LOOK_INTERVAL + 5)
        report, self._report = self._report, None
        if report is not None:
            report[0].close()

        def one(w: Worker) -> None:
            w._halt.set()
            try:
                if w.client is not None:
                    w.client.stop_channels()
                if w.manager is not None and w.manager.has_kernel:
                    w.manager.shutdown_kernel(now=False)
            except Exception as exc:  # a kernel that is already gone: kill what may be left
                w.lines.append(f"nbdist: shutting down: {exc}")
                if w.manager is not None and w.manager.has_kernel:
                    w.manager.shutdown_kernel(now=True)
            finally:
                if w.folder:
                    shutil.rmtree(w.folder, ignore_errors=True)

        threads = [threading.Thread(target=one, args=(w,), daemon=True) for w in self.workers]
        for t in threads:
            t.start()
        deadline = time.monotonic() + SHUTDOWN_WAIT + 5
        for t in threads:
            t.join(timeout=max(0.1, deadline - time.monotonic()))
        self.workers = [w for w in self.workers if w.manager is not None and w.manager.has_kernel]
