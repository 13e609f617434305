"""Local worker kernels: ``%dist_init --spawn N`` makes this notebook rank 0 of N on this machine.

Each worker is an IPython kernel started through jupyter_client, never a fork
(CUDA and NPU forbid forking an initialised process). It runs three cells:
``%load_ext nbdist``, its ``%%dist_init``, and ``%dist_follow``, so that every
``%%collective`` of the driving notebook runs there too. A worker is a child of
the driving kernel: jupyter_client gives it that kernel's pid, and ipykernel
ends a kernel whose parent is gone, so no worker outlives a killed driver.
Output that never reaches a notebook (the kernel's own stdout and stderr, and
what its cells showed) is kept, the last lines of it, for ``%dist_workers``.
"""

from __future__ import annotations

import collections
import glob
import os
import shutil
import subprocess
import tempfile
import threading
import time
from dataclasses import dataclass, field
from typing import Any

from ..config import RUN_VARIABLE
from ..errors import WorkerError

LOG_LINES = 200  # lines of each worker's output kept for %dist_workers
SHUTDOWN_WAIT = 3.0  # seconds a worker gets to leave before it is killed
FOLDER_PREFIX = "nbdist-worker-"  # then the driving kernel's pid and the worker's rank


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
    _reader: threading.Thread | None = None
    _halt: threading.Event = field(default_factory=threading.Event)

    @property
    def pid(self) -> int | None:
        provisioner = getattr(self.manager, "provisioner", None)
        return getattr(provisioner, "pid", None)

    def alive(self) -> bool:
        return self.manager is not None and self.manager.is_alive()

    def log_tail(self, n: int = 12) -> list[str]:
        """The last ``n`` lines: what the kernel process wrote, then what its cells showed."""
        text: list[str] = []
        path = os.path.join(self.folder, "kernel.log")
        try:
            with open(path, errors="replace") as f:
                text = [line.rstrip("\n") for line in collections.deque(f, maxlen=n)]
        except OSError:
            text = []
        return [*text, *list(self.lines)[-n:]][-n:]


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
    """The worker kernels of one spawned world (ranks 1..N-1)."""

    def __init__(self, world_size: int, master_port: int, token: str, init_flags: str = "") -> None:
        self.world_size, self.master_port, self.token, self.init_flags = world_size, master_port, token, init_flags
        self.workers = [Worker(rank) for rank in range(1, world_size)]

    def start(self) -> None:
        """Start every worker kernel in parallel and queue its three cells; raise WorkerError if one cannot start."""
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

    def _start(self, w: Worker) -> None:
        from jupyter_client.manager import KernelManager

        # Kernels talk over Unix sockets in a private folder: nothing listens on TCP.
        w.folder = tempfile.mkdtemp(prefix=f"{FOLDER_PREFIX}{os.getpid()}-{w.rank}-")
        w.manager = KernelManager(kernel_name="python3", transport="ipc", ip=os.path.join(w.folder, "k"))
        w.manager.shutdown_wait_time = SHUTDOWN_WAIT
        env = {**os.environ, "NBDIST_TOKEN": self.token, "NBDIST_WORKER": "1"}
        for key in ("RANK", "WORLD_SIZE", "LOCAL_RANK", "MASTER_ADDR", "MASTER_PORT", "DEVICE_ID", RUN_VARIABLE):
            env.pop(key, None)  # this notebook's own rank settings are not the worker's
        with open(os.path.join(w.folder, "kernel.log"), "w") as log:
            w.manager.start_kernel(env=env, stdout=log, stderr=subprocess.STDOUT)
        w.client = w.manager.client()
        w.client.start_channels()
        w.client.wait_for_ready(timeout=60)
        w._reader = threading.Thread(target=self._read, args=(w,), name=f"nbdist-worker{w.rank}", daemon=True)
        w._reader.start()
        w.client.execute("%load_ext nbdist", store_history=False)
        w.init_id = w.client.execute(
            f"%dist_init --rank {w.rank} --world-size {self.world_size} --master-addr 127.0.0.1 "
            f"--master-port {self.master_port} {self.init_flags}", store_history=False)
        w.client.execute("%dist_follow --quiet", store_history=False)  # nobody sees a worker's output area

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

    def check(self) -> None:
        """Raise :class:`WorkerError` naming a worker that died or failed to join (rank 0 waits for them)."""
        for w in self.workers:
            if w.failed is not None or not w.alive():
                why = w.failed or f"its kernel exited (pid {w.pid})"
                tail = "\n".join(w.log_tail())
                raise WorkerError(f"worker rank {w.rank} (pid {w.pid}) did not join: {why}. Its last lines:\n{tail}"
                                  "\n(see also %dist_workers)")

    def rows(self) -> list[dict[str, Any]]:
        return [{"rank": w.rank, "pid": w.pid, "alive": w.alive(), "joined": w.joined, "failed": w.failed,
                 "log": w.log_tail()} for w in self.workers]

    def pids(self) -> list[int]:
        return [w.pid for w in self.workers if w.pid is not None]

    def shutdown(self) -> None:
        """Stop every worker (ask, then kill after SHUTDOWN_WAIT s), in parallel; idempotent."""

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
