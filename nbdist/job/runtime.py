"""What an exported script runs: its world formed from the launcher, as ``%%dist_init`` forms a notebook's.

The rank, world size and local rank come from the launcher that started the
process (torchrun, srun, mpirun: :mod:`nbdist.drive.launchers`), the master
from ``MASTER_ADDR`` and ``MASTER_PORT`` (torchrun sets them; under Slurm
without them, the first node of the job and 29500). The backend, the device
and the environment plan are chosen as in a notebook
(:func:`nbdist.backend.backends.choose`, :func:`nbdist.backend.envplan.plan`,
the same process-group timeout), so a script and the notebook it came from
run with the same HCCL, NCCL or gloo settings.

Each line the script prints is marked with its rank (``[rank 1] ...``),
as the ranks' outputs share one terminal; a cell's last expression is printed
as its Out row shows it (IPython's text form).
"""

from __future__ import annotations

import atexit
import io
import os
import subprocess
import sys
import threading
from collections.abc import Iterable, Mapping
from dataclasses import dataclass
from datetime import timedelta
from typing import Any, TextIO

from .. import ranksets
from ..backend import backends, envplan, threads
from ..config import DEFAULT_PORT
from ..drive import launchers
from ..errors import ConfigError
from ..world import netinfo


@dataclass(frozen=True)
class Joined:
    """What ``init()`` gives the script: the names a notebook has after ``%%dist_init``."""

    rank: int
    world_size: int
    local_rank: int
    device: Any  # a torch.device
    backend: str
    pg_timeout: float


_joined: Joined | None = None


def master(environ: Mapping[str, str]) -> tuple[str, int]:
    """(address, port): MASTER_ADDR and MASTER_PORT, else the first node of a Slurm job and 29500."""
    port = int(environ.get("MASTER_PORT") or DEFAULT_PORT)
    if environ.get("MASTER_ADDR"):
        return environ["MASTER_ADDR"], port
    nodes = environ.get("SLURM_STEP_NODELIST") or environ.get("SLURM_JOB_NODELIST")
    if nodes:
        try:
            shown = subprocess.run(["scontrol", "show", "hostnames", nodes], capture_output=True, text=True,
                                   timeout=30, check=True).stdout.split()
        except (OSError, subprocess.SubprocessError) as exc:
            raise ConfigError(f"no MASTER_ADDR, and `scontrol show hostnames {nodes}` failed ({exc}): "
                              "export MASTER_ADDR=<the first node's address>") from None
        if shown:
            return shown[0], port
    raise ConfigError("no MASTER_ADDR: start the script with torchrun or srun, or set MASTER_ADDR and MASTER_PORT")


def init(namespace: Mapping[str, Any] | None = None, backend: str | None = None, device: str | None = None,
         env: Iterable[str] = (), pg_timeout: Any = None, debug: Any = None, prefix: bool = True) -> Joined:
    """Form this process's world from its launcher; the flags are ``%%dist_init``'s of the same names.

    Where a flag is absent, ``BACKEND`` and ``DEVICE_ID`` come from ``namespace`` (the script's globals, as a
    notebook's), then from the environment.

    Sets ``RANK``, ``WORLD_SIZE``, ``LOCAL_RANK``, ``MASTER_ADDR`` and ``MASTER_PORT`` in the environment (as
    torchrun does), the backend's variables, and the current device. The world ends when the script exits.
    Raises :class:`nbdist.errors.ConfigError` with what is missing.
    """
    global _joined
    if _joined is not None:
        return _joined
    environ = os.environ
    if launchers.detect(environ) is None:
        print("nbdist: no launcher (torchrun, srun, mpirun) gave this process a rank: it is the only rank of a "
              "world of 1", file=sys.stderr, flush=True)
        free = netinfo.first_free_port(range(DEFAULT_PORT, DEFAULT_PORT + 100))
        environ.update(RANK="0", WORLD_SIZE="1", LOCAL_RANK="0", MASTER_ADDR=environ.get("MASTER_ADDR", "127.0.0.1"),
                       MASTER_PORT=environ.get("MASTER_PORT", str(free or DEFAULT_PORT)))
    place = launchers.place(environ, offset=0)
    addr, port = master(environ)
    names = namespace or {}
    backend = str(backend or names.get("BACKEND") or environ.get("BACKEND") or "auto")
    chosen = device if device is not None else names.get("DEVICE_ID", environ.get("DEVICE_ID"))
    device = None if chosen is None else str(chosen)
    choice = backends.choose(backend, device, place.local_rank or 0)  # before torch: torch_npu may break it
    try:
        route = netinfo.route_to(addr, port)
    except OSError as exc:
        raise ConfigError(f"the master address {addr!r} does not resolve or route: {exc}") from None
    npu = choice.npu if choice.backend == "hccl" else None
    plan = envplan.plan(choice.backend, route, environ, envplan.parse_overrides(list(env)), debug, npu)
    for var in plan:
        if var.value is not None:
            environ[var.key] = var.value
    requested = None if pg_timeout is None else float(pg_timeout)
    timeout = envplan.process_group_timeout(choice.backend, plan, requested)
    for warning in (*choice.warnings, *(v.warning for v in plan if v.warning)):
        print(f"nbdist: warning: {warning}", file=sys.stderr, flush=True)
    environ.update(RANK=str(place.rank), WORLD_SIZE=str(place.world_size), LOCAL_RANK=str(place.local_rank or 0),
                   MASTER_ADDR=addr, MASTER_PORT=str(port))
    count = threads.plan(environ)
    if count is not None:  # as torchrun, and as the notebook this script came from (nbdist.backend.threads)
        environ[threads.VARIABLE] = str(count)
        threads.apply(count)
    import torch.distributed as dist

    dev = backends.activate(choice)
    dist.init_process_group(choice.backend, rank=place.rank, world_size=place.world_size,
                            timeout=timedelta(seconds=timeout))
    atexit.register(_end)
    _joined = Joined(place.rank, place.world_size, place.local_rank or 0, dev, choice.backend, timeout)
    if prefix:
        mark(place.rank)
    return _joined


def _end() -> None:
    import torch.distributed as dist

    for stream in (sys.stdout, sys.stderr):
        if isinstance(stream, _Marked):
            stream.finish()
        stream.flush()
    if dist.is_initialized():
        dist.destroy_process_group()


def on_ranks(text: str) -> set[int]:
    """The ranks of a ``%%collective --ranks`` set, in this world (``0-3,5``)."""
    assert _joined is not None, "nbdist.script.init() forms the world first"
    return set(ranksets.parse(text, _joined.world_size))


def out(value: Any) -> None:
    """Print a cell's last expression as its Out row would show it (nothing for None)."""
    if value is None:
        return
    try:
        from IPython.lib.pretty import pretty
    except ImportError:  # IPython is a dependency, but a script may run where only torch is
        text = repr(value)
    else:
        text = pretty(value, max_width=79)
    print(f"Out: {text}", flush=True)


class _Marked(io.TextIOBase):
    """A text stream that starts each line with ``[rank k] `` and writes whole lines only.

    The ranks share one terminal: a line written in one piece cannot be split by another rank's. A line with
    no end yet waits for it (or for :meth:`finish`, at exit).
    """

    def __init__(self, inner: TextIO, rank: int) -> None:
        self.inner, self.mark = inner, f"[rank {rank}] "
        self.pending, self.lock = "", threading.Lock()

    def writable(self) -> bool:
        return True

    def write(self, text: str) -> int:
        with self.lock:
            self.pending += text
            if "\n" in self.pending:
                whole, _, self.pending = self.pending.rpartition("\n")
                self.inner.write("".join(self.mark + line + "\n" for line in whole.split("\n")))
                self.inner.flush()
        return len(text)

    def finish(self) -> None:
        """Write the last line even if it has no end."""
        with self.lock:
            if self.pending:
                self.inner.write(self.mark + self.pending + "\n")
                self.pending = ""
            self.inner.flush()

    def flush(self) -> None:
        self.inner.flush()

    def isatty(self) -> bool:
        return self.inner.isatty()

    def fileno(self) -> int:
        return self.inner.fileno()

    @property
    def encoding(self) -> str:  # type: ignore[override]
        return getattr(self.inner, "encoding", "utf-8")


def mark(rank: int) -> None:
    """Mark every line this process prints, on stdout and stderr, with its rank."""
    if not isinstance(sys.stdout, _Marked):
        sys.stdout = _Marked(sys.stdout, rank)
    if not isinstance(sys.stderr, _Marked):
        sys.stderr = _Marked(sys.stderr, rank)
