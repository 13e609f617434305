"""``nbdist run``: execute notebooks headless with nbclient, one kernel per rank, all ranks at once.

Each copy gets a papermill-style ``injected-parameters`` cell (RANK, WORLD_SIZE, MASTER_ADDR,
MASTER_PORT, the ``--param`` values) and, in its kernel's environment, ``NBDIST_RUN``, which
``%%dist_init`` prefers to the notebook's own settings (with ``--spawn``, one copy gets ``SPAWN = N``
and forms the world itself). When one rank fails, the others are stopped
(they would wait at the next collective). Every executed notebook is written out, also after a failure.
"""

from __future__ import annotations

import ast
import asyncio
import copy
import json
import keyword
import logging
import os
import secrets
import signal
import sys
import tempfile
import threading
import time
from collections.abc import Iterator, Sequence
from contextlib import contextmanager, suppress
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Any, TextIO, cast

import nbformat
from nbclient import NotebookClient
from nbclient.exceptions import CellExecutionError
from traitlets.config import Config

from ..config import DEFAULT_PORT, RUN_VARIABLE
from ..errors import ConfigError
from ..world import netinfo
from . import restarts

if TYPE_CHECKING:
    from jupyter_client.manager import AsyncKernelManager

log = logging.getLogger(__name__)

MASTER_ADDR = "127.0.0.1"
# Set by the runner, not by --param:
RESERVED = ("RANK", "WORLD_SIZE", "MASTER_ADDR", "MASTER_PORT", "SPAWN", "MAX_RESTARTS")
# Below the ephemeral range (sockets opened later cannot take it), and never 29500, interactive notebooks' default.
PORTS = [p for p in range(20000, 30000) if p != DEFAULT_PORT]
INTERRUPT_GRACE = 5.0  # seconds a stopped rank's interrupted cell has to end before its task is cancelled


@dataclass
class Copy:
    """One rank's copy of a notebook, and how its run went."""

    rank: int
    path: Path
    nb: Any  # nbformat.NotebookNode, executed in place
    env: dict[str, str]
    values: dict[str, Any]  # what the injected cell sets, beside the --param values
    state: str = "pending"  # then running, and ok, failed or stopped
    note: str = ""  # where and why it failed, or why it was stopped
    cells_run: int = 0
    seconds: float = 0.0
    cell: int | None = None  # index of the cell running or last run
    cell_started: float = 0.0
    client: NotebookClient | None = field(default=None, repr=False)
    task: asyncio.Future[None] | None = field(default=None, repr=False)

    @property
    def out_name(self) -> str:
        return f"{self.path.stem}.rank{self.rank}.ipynb"


def parse_params(pairs: Sequence[str]) -> dict[str, Any]:
    """``KEY=VALUE`` pairs as papermill takes them: VALUE a Python literal, else the string itself."""
    params: dict[str, Any] = {}
    for pair in pairs:
        key, sep, raw = pair.partition("=")
        if not sep or not key.isidentifier() or keyword.iskeyword(key):
            raise ConfigError(f"--param takes KEY=VALUE with KEY a Python name, not {pair!r}")
        if key in RESERVED:
            raise ConfigError(f"--param {key}: nbdist run sets {key} itself (see --world-size, --master-port, --spawn)")
        try:
            params[key] = ast.literal_eval(raw)
        except (ValueError, SyntaxError, MemoryError, RecursionError):
            params[key] = raw
    return params


def inject(nb: Any, values: dict[str, Any]) -> int:
    """Insert a cell tagged ``injected-parameters`` setting ``values`` right after the first cell tagged
    ``parameters``, or else first (an earlier run's injected cell is dropped); return its index."""
    nb.cells = [c for c in nb.cells if "injected-parameters" not in c.get("metadata", {}).get("tags", [])]
    source = "# Parameters\n" + "".join(f"{key} = {value!r}\n" for key, value in values.items())
    cell = nbformat.v4.new_code_cell(source, metadata={"tags": ["injected-parameters"]})
    if nb.get("nbformat_minor", 5) < 5:
        cell.pop("id", None)  # cell ids are invalid before nbformat 4.5
    tagged = [i for i, c in enumerate(nb.cells) if "parameters" in c.get("metadata", {}).get("tags", [])]
    at = tagged[0] + 1 if tagged else 0
    nb.cells.insert(at, cell)
    return at


def plan(notebooks: Sequence[str], world_size: int | None, spawn: bool, params: dict[str, Any],
         master_port: int | None, max_restarts: str | None = None) -> list[Copy]:
    """The copies to run, parameters injected; raise ConfigError for arguments or notebooks it cannot take.
    ``max_restarts``: with ``spawn``, how often a worker that dies is started again (``MAX_RESTARTS``)."""
    paths = [Path(n).resolve() for n in notebooks]
    read = []
    for path in paths:
        if not path.is_file():
            raise ConfigError(f"no notebook at {path}")
        try:
            read.append(nbformat.read(path, as_version=4))
        except Exception as exc:  # nbformat raises JSON, validation and OS errors alike
            why = f"{type(exc).__name__}: {exc}".splitlines()[0]
            raise ConfigError(f"cannot read {path} as a notebook: {why}") from None
    n = len(paths) if world_size is None else world_size
    if spawn:
        if len(paths) != 1 or n < 2:
            raise ConfigError("--spawn runs one notebook, with --world-size N (N >= 2) ranks in all")
    elif len(paths) > 1 and n != len(paths):
        raise ConfigError(f"{len(paths)} notebooks make a world of {len(paths)}, not --world-size {n}")
    elif n < 1:
        raise ConfigError(f"--world-size must be at least 1, not {n}")
    if max_restarts is not None and not spawn:
        raise ConfigError("--max-restarts applies to the workers of --spawn")
    try:
        restarts_ = None if max_restarts is None else restarts.parse_max(max_restarts)
    except ValueError as exc:
        raise ConfigError(str(exc)) from None
    if master_port is not None and not 0 < master_port < 65536:
        raise ConfigError(f"--master-port must be 1-65535, not {master_port}")
    port = master_port or netinfo.first_free_port(secrets.SystemRandom().sample(PORTS, 200), MASTER_ADDR)
    if port is None:
        raise ConfigError(f"no free TCP port on {MASTER_ADDR}: pass --master-port")
    copies = []
    for rank in range(1 if spawn else n):
        path, nb = (paths[rank], read[rank]) if len(paths) > 1 else (paths[0], copy.deepcopy(read[0]))
        env = dict(os.environ)
        if spawn:  # %%dist_init forms the world itself; NBDIST_RUN would make it ignore SPAWN
            env.pop(RUN_VARIABLE, None)
            values: dict[str, Any] = {"SPAWN": n, **({} if restarts_ is None else {"MAX_RESTARTS": restarts_})}
        else:
            values = {"RANK": rank, "WORLD_SIZE": n, "MASTER_ADDR": MASTER_ADDR, "MASTER_PORT": port}
            env[RUN_VARIABLE] = json.dumps(values)
        inject(nb, {**values, **params})
        copies.append(Copy(rank, path, nb, env, values))
    return copies


def _where(c: Copy, cell: Any | None) -> str:
    if c.cell is None or cell is None:
        return "before its first cell"
    lines = cell.source.strip().splitlines() or [""]
    first = lines[0] if len(lines[0]) <= 60 else lines[0][:57] + "..."
    ident = f"id {cell['id']}, " if cell.get("id") else ""
    return f"cell {c.cell + 1} ({ident}`{first}`)"


def _error(ename: object, evalue: object) -> str:
    return f"{ename}: {evalue}" if evalue else str(ename)


def _describe(exc: BaseException) -> str:
    if isinstance(exc, CellExecutionError):
        return _error(exc.ename, exc.evalue)
    return _error(type(exc).__name__, (str(exc).strip().splitlines() or [""])[0])


class _Run:
    """Every copy's NotebookClient in one event loop; the first failure stops the rest."""

    def __init__(self, copies: list[Copy], timeout: int, out: TextIO, sockets: str) -> None:
        self.copies, self.timeout, self.out, self.sockets = copies, timeout, out, sockets
        self.stopped_by = ""
        self.halts: list[asyncio.Future[None]] = []

    async def main(self) -> None:
        tasks = [asyncio.ensure_future(self._one(c)) for c in self.copies]
        for c, task in zip(self.copies, tasks, strict=True):
            c.task = task
        await asyncio.gather(*tasks, return_exceptions=True)
        for error in await asyncio.gather(*self.halts, *(self._sweep(c) for c in self.copies), return_exceptions=True):
            if isinstance(error, BaseException):
                log.warning("nbdist run: stopping a kernel failed: %r", error)
        # nbclient leaves a kernel-alive poller behind when its cell is cancelled: end it before the loop closes
        left = [t for t in asyncio.all_tasks() if t is not asyncio.current_task()]
        for task in left:
            task.cancel()
        await asyncio.gather(*left, return_exceptions=True)

    def stop(self, reason: str) -> None:
        """Stop every copy still running (see :meth:`_halt`)."""
        self.stopped_by = self.stopped_by or reason
        for c in self.copies:
            if c.state in ("pending", "running"):
                c.state, c.note = "stopped", reason
                self.halts.append(asyncio.ensure_future(self._halt(c)))

    async def _halt(self, c: Copy) -> None:
        """Interrupt the copy's kernel, so that its cell ends and nbclient shuts an idle kernel down; if it is
        still running after INTERRUPT_GRACE (or still starting), cancel it: nbclient then shuts its kernel down
        anyway (interrupt, ask, SIGTERM, SIGKILL)."""
        if c.task is None:
            return
        try:
            if c.client is not None and c.client.kc is not None and c.client.km is not None:
                km = cast("AsyncKernelManager", c.client.km)  # nbclient's, typed as the base KernelManager
                await km.interrupt_kernel()
                await asyncio.wait([c.task], timeout=INTERRUPT_GRACE)
        finally:
            c.task.cancel()

    def _fail(self, c: Copy, note: str) -> None:
        if c.state == "running":
            c.state, c.note = "failed", note
            self.stop(f"rank {c.rank} failed")

    async def _one(self, c: Copy) -> None:
        if self.stopped_by:
            return
        c.state, started = "running", time.monotonic()
        # IPC sockets, as nbdist's other kernels use: no TCP ports, and no warning from ipykernel about them
        transport = Config({"KernelManager": {"transport": "ipc", "ip": os.path.join(self.sockets, f"rank{c.rank}")}})
        c.client = NotebookClient(
            c.nb, timeout=self.timeout, resources={"metadata": {"path": str(c.path.parent)}}, config=transport,
            on_cell_execute=lambda cell, cell_index: self._executing(c, cell_index),
            on_cell_executed=lambda cell, cell_index, execute_reply: self._executed(c, cell, cell_index, execute_reply))
        try:
            await c.client.async_execute(env=c.env)  # forwarded to the kernel manager's start_kernel
        except (Exception, asyncio.CancelledError) as exc:  # nbclient turns our cancel into DeadKernelError
            cell = c.nb.cells[c.cell] if c.cell is not None else None
            self._fail(c, f"{_where(c, cell)}: {_describe(exc)}")
        else:
            if c.state == "running":
                c.state = "ok"
        finally:
            c.seconds = time.monotonic() - started

    def _executing(self, c: Copy, index: int) -> None:
        c.cell, c.cell_started = index, time.monotonic()

    def _executed(self, c: Copy, cell: Any, index: int, reply: dict[str, Any] | None) -> None:
        c.cells_run += 1
        content = (reply or {}).get("content", {})
        error = _error(content.get("ename"), content.get("evalue")) if content.get("status") == "error" else ""
        allowed = "raises-exception" in cell.get("metadata", {}).get("tags", [])
        outcome = ("ok" if not error else f"error allowed (raises-exception): {error}" if allowed else
                   f"stopped: {error}" if c.state == "stopped" else f"failed: {error}")
        print(f"rank {c.rank} · {c.path.name} · cell {index + 1}/{len(c.nb.cells)} {outcome} "
              f"({time.monotonic() - c.cell_started:.1f} s)", file=self.out, flush=True)
        if error and not allowed:  # stop the others now, not after this kernel has shut down
            self._fail(c, f"{_where(c, cell)}: {error}")

    async def _sweep(self, c: Copy) -> None:
        """Shut down a kernel nbclient left (one cancelled while it started, before nbclient's cleanup applies)."""
        km = cast("AsyncKernelManager | None", c.client.km if c.client is not None else None)  # as in _halt
        if km is not None and km.has_kernel:
            await km.shutdown_kernel(now=True)
        if c.client is not None and c.client.kc is not None:
            c.client.kc.stop_channels()


@contextmanager
def _sigterm_as_interrupt() -> Iterator[None]:
    if threading.current_thread() is not threading.main_thread():
        yield
        return

    def interrupt(signum: int, frame: Any) -> None:
        raise KeyboardInterrupt

    previous = signal.signal(signal.SIGTERM, interrupt)
    try:
        yield
    finally:
        signal.signal(signal.SIGTERM, previous)


def execute(copies: list[Copy], timeout: int, out: TextIO = sys.stdout) -> bool:
    """Run every copy at once; return whether Ctrl-C (or SIGTERM) stopped them."""
    sockets = tempfile.TemporaryDirectory(prefix="nbdist-run-")
    run, loop, crashed, done = _Run(copies, timeout, out, sockets.name), asyncio.new_event_loop(), [], threading.Event()

    def in_thread() -> None:
        try:
            loop.run_until_complete(run.main())
            loop.run_until_complete(loop.shutdown_asyncgens())
        except BaseException as exc:  # re-raised in the main thread below
            crashed.append(exc)
        finally:
            loop.close()
            done.set()

    # Off the main thread, nbclient cannot add its own SIGINT handler to the loop (one per client, the last
    # wins, and it shuts only that client's kernel down), so Ctrl-C reaches us here and stops every rank.
    # We wait on an Event, not on Thread.join: a Ctrl-C inside join(timeout) can mark a live thread as
    # stopped (CPython 3.11, bpo-45274's fix), and then nbclient's atexit cleanup races the loop.
    thread, interrupted = threading.Thread(target=in_thread, name="nbdist-run"), False
    with _sigterm_as_interrupt():
        thread.start()
        while not done.is_set():
            try:
                done.wait(0.2)
            except KeyboardInterrupt:
                if not interrupted:
                    print("nbdist run: interrupted: stopping every kernel", file=sys.stderr, flush=True)
                    with suppress(RuntimeError):  # the loop has just closed: nothing is left to stop
                        loop.call_soon_threadsafe(run.stop, "interrupted")
                interrupted = True
    thread.join()
    sockets.cleanup()
    if crashed:
        raise crashed[0]
    return interrupted


def run(notebooks: Sequence[str], world_size: int | None = None, out: str = "nbdist-run", timeout: int = 600,
        params: Sequence[str] = (), master_port: int | None = None, spawn: bool = False,
        stdout: TextIO = sys.stdout, max_restarts: str | None = None) -> int:
    """``nbdist run``: 0 if every rank ran every cell, 1 if one failed, 2 for bad arguments, 130 if interrupted."""
    folder = Path(out).resolve()
    try:
        if timeout <= 0:
            raise ConfigError(f"--timeout must be positive, not {timeout}")
        copies = plan(notebooks, world_size, spawn, parse_params(params), master_port, max_restarts)
        folder.mkdir(parents=True, exist_ok=True)
    except (ConfigError, OSError) as exc:
        print(f"nbdist run: {exc}", file=sys.stderr)
        return 2
    names = ", ".join(dict.fromkeys(c.path.name for c in copies))
    world = (f"{names} as rank 0 of {world_size}, with SPAWN = {world_size}" if spawn else
             f"{len(copies)} rank(s) of {names} on {MASTER_ADDR}:{copies[0].values['MASTER_PORT']}")
    print(f"nbdist run: {world}; each cell may run {timeout} s", file=stdout, flush=True)
    interrupted = execute(copies, timeout, stdout)
    for c in copies:
        nbformat.write(c.nb, folder / c.out_name)
    print("nbdist run: summary", file=stdout)
    for c in copies:
        state = f"{c.state}: {c.note}" if c.note else c.state
        print(f"  rank {c.rank} · {c.path.name} · {c.cells_run} code cell(s) run · {c.seconds:.1f} s · {state}",
              file=stdout)
    print(f"nbdist run: executed notebooks in {folder}: {', '.join(c.out_name for c in copies)}", file=stdout,
          flush=True)
    failed = [c for c in copies if c.state == "failed"]
    for c in failed:
        print(f"nbdist run: rank {c.rank} ({c.path.name}) failed: {c.note}", file=sys.stderr, flush=True)
    return 130 if interrupted else 0 if all(c.state == "ok" for c in copies) else 1
