"""The per-kernel state of nbdist: one :class:`Session` per kernel, owned by the magics."""

from __future__ import annotations

import contextlib
import dataclasses
import logging
import os
import platform
import socket
import time
import uuid
from collections.abc import Callable
from typing import TYPE_CHECKING, Any

from ._version import __version__
from .backend import backends, debugmode, envplan, setup, threads, userinit
from .backend.environ import Environ
from .backend.procgroup import destroy_default
from .cell import capture, cells, prestart, progress, rebuild, turn
from .cell.guard import Guard, request_stop
from .cell.hooks import Collectives
from .cell.plain import PlainNet
from .cell.stopper import Stopper
from .cell.turn import Phase
from .config import HEARTBEAT_INTERVAL, TIMEOUTS, WorldConfig
from .debug import aids, postmortem
from .drive import follow
from .drive.slurm import SlurmJob
from .drive.workers import Workers
from .errors import (
    DriveError,
    JoinError,
    NotInitializedError,
    PeerFailedError,
    StoppedError,
    StoreConnectionError,
)
from .world import keys, netinfo, reach, rendezvous, signing
from .world.heartbeat import Heartbeat
from .world.store import Server, StoreClient, connect
from .world.world import World

if TYPE_CHECKING:
    from .measure import bench, dashboard

log = logging.getLogger(__name__)

EXIT_GRACE = 3.0  # seconds a kernel that hosts the server keeps serving at exit while other ranks still use it


def _node_id() -> str:
    """Identifies this machine, to tell which ranks share a host (and so local ranks)."""
    try:
        with open("/etc/machine-id") as f:
            return f"{socket.gethostname()}/{f.read().strip()}"
    except OSError:
        return socket.gethostname()


class Session:
    """One kernel's membership of a world: server, connections, heartbeat, process group."""

    def __init__(self, shell: Any) -> None:
        self.shell = shell
        self.id = uuid.uuid4().hex
        self.server: Server | None = None
        self.client: StoreClient | None = None
        self.world: World | None = None
        self.watch_client: StoreClient | None = None
        self.heartbeat: Heartbeat | None = None
        self.choice: backends.Choice | None = None
        self.config: WorldConfig | None = None
        self.device: Any = None
        self.local_rank = 0
        self.env_plan: list[envplan.EnvVar] = []
        self.environ = Environ()  # what nbdist put in os.environ, to put back what was there
        self.pg_timeout = envplan.PG_TIMEOUT
        self.npu_seen: dict[str, str | None] | None = None  # what torch_npu read once in this process, if known
        self.npu_seen_when = ""
        self.notes: list[str] = []  # warnings for the init summary
        self.cpplog_note: str | None = None  # torch was imported first: its C++ log lines may show
        self.around_tunnel: envplan.EnvVar | None = None  # the interface chosen for the peers, the master on loopback
        self.hooks = Collectives()
        self.user_init = userinit.UserInit()  # the notebook's own init_process_group, while in a world
        self.stopper = Stopper()  # lets nbdist's watchers end the running cell (--max-time, %dist_stop)
        self.guard: Guard | None = None
        self.plain = PlainNet(self)  # the watcher of a plain cell that calls a collective
        self.drive = follow.Drive(self.id)  # driving followers (nbdist.drive.follow)
        self.following = False
        self.process = "kernel"  # what runs this rank: a kernel, or "nbdist follow" (a process with no kernel)
        self.workers: Workers | SlurmJob | None = None  # the followers of %dist_init --spawn
        # The running cell's turn at its step (nbdist.cell.turn): a %%collective claims the world's next step as
        # the cell begins (its pre_run_cell), even if another rank's same cell closes that step before this one
        # reaches nbdist's code.
        self.turn = turn.Turn()
        self.debug = debugmode.DebugMode()  # the world's %dist_debug switch, as applied here
        self.prestart = prestart.Window()  # the stop button just before or after a cell (installed at load)
        self.stop_pressed = False  # pressed in the gap just before this cell began: a %%collective stops at once
        self.view: str | None = None  # %dist_config view=: how this notebook draws tables (None: by the ranks)
        self.threads_before: int | None = None  # torch's thread count before nbdist set it (backend.threads)
        self.run_body = cells.watched_body  # how a %%collective's body runs (the interleaving explorer's has none)
        self.kept = postmortem.Kept()  # this rank's last failed %%collective body, for %dist_pdb
        self.aids = aids.Aids(self.secret, lambda: self.pg_timeout)  # breakpoints, where a hung cell's ranks were

    # --- joining ------------------------------------------------------------
    def prepare(self) -> None:
        """At ``%load_ext``: what can be set before the master is known, before torch_npu reads it.

        torch_npu reads some variables once per process (:data:`nbdist.backend.envplan.READ_ONCE`); set now,
        they are in place however the notebook goes on.
        """
        setup.prepare(self)

    def init(self, cfg: WorldConfig, on_status: Callable[[Any], None] | None = None,
             keep_workers: bool = False) -> list[dict[str, Any]]:
        """Join (or re-join) the world described by ``cfg``; returns every rank's registration."""
        workers = self.workers if keep_workers else None
        if keep_workers:
            self.workers = None  # leaving the old world must not stop the workers that join this one
        self.leave()
        self.workers = workers
        self.config = cfg
        self.choice = backends.choose(cfg.backend, cfg.device, 0)
        setup.apply_plan(self, cfg)
        self.notes = [*self.choice.warnings, *(v.warning for v in self.env_plan if v.warning),
                      *([self.cpplog_note] if self.cpplog_note else [])]
        late = envplan.stale(self.env_plan, self.npu_seen) if self.choice.backend == "hccl" else []
        if late:
            certain = self.npu_seen_when == rebuild.BUILT_HCCL
            self.notes.append(
                f"these values {'will' if certain else 'may'} not take effect: {', '.join(late)}. torch_npu reads "
                f"them once per process, at its first HCCL process group, and {self.npu_seen_when}"
                f"{'' if certain else ' (a group made since keeps what torch_npu read then)'}. Restart the kernel "
                "and run %load_ext nbdist before anything imports torch")
        import torch

        deadline = time.monotonic() + cfg.timeout
        self.client, self.server = reach.reach(cfg, deadline, on_status, self.server, self.id)
        self.heartbeat = Heartbeat(self.client.clone(op_timeout=5.0), self.id, cfg.rank)
        self.watch_client = self.client.clone(op_timeout=5.0)
        try:
            addr = netinfo.route_to(cfg.master_addr, cfg.master_port).local_ip
        except OSError:  # plan_for routed it a moment ago
            addr = ""
        me = {
            "session": self.id,
            "rank": cfg.rank,
            "host": socket.gethostname(),
            "node": _node_id(),
            "pid": os.getpid(),
            "process": self.process,
            "addr": addr,  # this rank's end of its route to the master (loopback: a tunnel or proxy)
            "addrs": netinfo.host_addresses(),
            "nbdist": __version__,
            "torch": torch.__version__,
            "python": platform.python_version(),
            "backend": self.choice.backend,
            "backend_reason": self.choice.reason,
            "device": self.choice.device,
            "device_chosen": cfg.device is not None,
            "torch_npu": self.choice.npu.torch_npu,
            "cann": self.choice.npu.cann,
            "agreed": envplan.agreed_values(self.choice.backend, self.env_plan, self.choice.npu),
            "env": setup.env_lines(self.env_plan),
        }
        self.world = rendezvous.join(self.client, me, cfg.world_size, cfg.timeout, on_status, deadline=deadline)
        problems = envplan.disagreements(self.world.ranks)
        if problems:
            self.world = None
            raise JoinError("; ".join(problems) + ". Use the same values in every notebook, then re-run %%dist_init")
        setup.route_around_tunnel(self, cfg)
        setup.settle_devices(self)
        setup.set_environment(self, cfg)
        setup.set_threads(self)
        self.hooks.group_timeout = self.pg_timeout
        self.hooks.install()
        self.stopper.install()
        self.hooks.on_plain = self.plain.checker
        self.user_init.install(self._formed, lambda: rebuild.restore(self))
        self.guard = Guard(self.client.clone(op_timeout=5.0), self.world.key, cfg.rank, self.id, self._stop_requested)
        self.world.last_turn = self.world.turn() - 1  # the steps before this rank joined are not ones it missed
        if self.world.replaced is None:
            self.world.gen = self.world.store_generation()
            self.rebuild_process_group("join")
        self._answer_where()
        self.world.note("joined")
        return self.world.ranks

    def _answer_where(self) -> None:
        """Answer %dist_where from the heartbeat thread, while cells run (:mod:`nbdist.debug.where`)."""
        from .debug import where

        world, heartbeat = self.world, self.heartbeat
        assert world is not None and heartbeat is not None
        heartbeat.add_chore(where.responder(world.client, world.round, world.rank, self.secret).tick)
        heartbeat.add_chore(postmortem.responder(world, self.secret, self.kept).tick)

    def pdb(self, rank: int, timeout: float) -> None:
        """%dist_pdb: the debugger at ``rank``'s failed cell, here (:mod:`nbdist.debug.postmortem`)."""
        postmortem.debug(self.require_world("%dist_pdb"), rank, self.kept, self.secret, timeout)

    def where(self, threads: bool, native: bool, timeout: float) -> str:
        """%dist_where: where every rank is now, as a report."""
        from .debug import where

        world = self.require_world("%dist_where")
        return where.where(world.client, world.round, world.world_size, signing.key_from(self.secret()),
                           world.describe, threads=threads, native=native, timeout=timeout,
                           by=world.describe(world.rank))

    def fill_namespace(self) -> None:
        """After joining: ``torch``, ``dist`` (unless the notebook has its own), ``RANK``, ``WORLD_SIZE``,
        ``LOCAL_RANK`` and ``DEVICE`` in the notebook's namespace."""
        import torch
        import torch.distributed as dist

        assert self.config is not None
        ns = self.shell.user_ns
        ns.setdefault("torch", torch)
        ns.setdefault("dist", dist)
        ns.update(RANK=self.config.rank, WORLD_SIZE=self.config.world_size, LOCAL_RANK=self.local_rank,
                  DEVICE=self.device)

    def plan_for(self, cfg: WorldConfig, backend: str) -> list[envplan.EnvVar]:
        """The environment plan for ``backend`` on this host (:func:`nbdist.backend.setup.plan_for`)."""
        return setup.plan_for(self, cfg, backend)

    def environ_for_config(self) -> dict[str, str]:
        """The environment as the user set it: values nbdist itself set are left out."""
        return self.environ.as_user_set()

    def _formed(self) -> userinit.Formed:
        """This world as the notebook's own ``init_process_group`` is compared with it."""
        world, choice = self.require_world("init_process_group"), self.choice
        assert choice is not None
        return userinit.Formed(choice.backend, world.rank, world.world_size, world.describe(world.rank))

    def rebuild_process_group(self, tag: str, step: int | None = None) -> None:
        """Build this world's process group afresh, as every rank does at the same point (:mod:`.cell.rebuild`)."""
        rebuild.build(self, tag, step)

    def group_state(self, world: World, gen: int) -> dict[str, Any]:
        """This rank's process-group state as the others judge it at a step (:func:`.cell.rebuild.state`)."""
        return rebuild.state(self, world, gen)

    def ensure_group(self) -> str | None:
        """Before a plain cell's first collective: rebuild with every rank if the group is not trusted; why, or None."""
        return rebuild.ensure(self)

    def _stop_requested(self, info: dict[str, Any]) -> None:
        """The guard saw a stop of every rank (%dist_stop, nbdist stop) while a cell runs here."""
        info = {**info, "kind": "stopped", "rank": -1}
        watch = self.stopper.watch
        if watch is not None:
            watch.stop_all(info)  # it cuts a collective that is waiting
        else:
            self.stopper.stop(StoppedError(info.get("message", "stopped")))

    def stop_all(self) -> int:
        """%dist_stop: ask every rank to stop its running cell."""
        world = self.require_world("%dist_stop")
        return request_stop(world.client, world.round, f"{world.describe(world.rank)} with %dist_stop", self.id)

    # --- one notebook drives (nbdist.drive.follow, nbdist.drive.workers) ------------------
    def secret(self) -> str:
        """The secret this world's cells are signed with (see :func:`nbdist.world.signing.world_secret`)."""
        world = self.require_world("driving or following")
        cfg = self.config
        assert cfg is not None
        return signing.world_secret(cfg.token, cfg.master_addr, cfg.master_port, world.client.marker)

    def follow(self, show: follow.Shows) -> follow.Ended:
        """%dist_follow: run the driving notebook's cells until it releases or leaves; returns why it ended."""
        world = self.require_world("%dist_follow")
        if self.drive.holding:
            raise DriveError("this notebook drives the world: run %dist_release here first, then %dist_follow")
        follower = follow.Follower(world, self.id, self.secret())
        self.following = True
        self.stopper.disarm()  # between the driver's cells, only the stop button ends the wait
        try:
            return follow.run(self, follower, show)
        finally:
            self.following = False

    def release(self) -> bool:
        """%dist_release: stop driving; the followers run their own cells again. True if this notebook drove."""
        if self.world is None or not self.drive.holding:
            return False
        return self.drive.release(self.world, self.secret)

    def spawn(self, cfg: WorldConfig, workers: Workers | SlurmJob, on_status: Callable[[Any], None] | None = None
              ) -> list[dict[str, Any]]:
        """%dist_init --spawn: start the followers (ranks 1..N-1: local worker kernels or a Slurm job), join as
        rank 0, and drive them."""
        self.leave()
        assert cfg.token
        workers.start()
        self.workers = workers

        def status(state: Any) -> None:
            workers.check()  # a worker that failed ends the wait at once, with its log
            if on_status is not None:
                note = getattr(workers, "note", None)
                on_status({**state, "launcher": note()} if isinstance(state, dict) and note else state)

        try:
            ranks = self.init(cfg, status, keep_workers=True)
            self.drive.take(self.require_world("%dist_init --spawn"))
        except BaseException:
            self.leave()
            raise
        return ranks

    def sync_generation(self, world: World, gen: int | None = None) -> int:
        """Follow the world to a new generation (a rank was replaced): renumber, re-read ranks.

        The process group stays until the next cell that uses it rebuilds it. Returns the generation.
        ``gen``: the store's generation, where the caller knows it (a follower, from its driver's message).
        """
        gen = world.store_generation() if gen is None else gen
        if gen != world.gen:
            world.enter_generation(gen)
        return gen

    # --- using the world ----------------------------------------------------
    def require_world(self, what: str) -> World:
        if self.world is None:
            raise NotInitializedError(what)
        return self.world

    def collective(self, source: str, flags: cells.Flags, align: tuple[int, int] | None = None,
                   driver: int | None = None, shows_table: bool = True) -> cells.Outcome:
        """Run ``source`` on this rank in lockstep with the others; see :mod:`nbdist.cell.cells`.

        A driving notebook first publishes it to its followers (:mod:`nbdist.drive.follow`); a
        follower passes ``align``, the driver's (generation, step), and the ``driver``'s rank.
        ``shows_table`` False: nobody draws the cell's table from the outcome, which then holds only the
        captures this rank's error needs (:mod:`nbdist.cell.ending`).
        """
        world = self.require_world("%%collective")
        assert self.watch_client is not None
        self.kept.begin()
        if self.stop_pressed:  # as the cell began (nbdist.cell.prestart): it takes its step, closed (after_cell)
            self.stop_pressed = False
            raise KeyboardInterrupt
        try:
            # A follower takes the generation its driver read a moment ago, and saves a round trip.
            gen = self.sync_generation(world, None if align is None else align[0])
            if align is None:
                claimed = self.turn.step if self.turn.phase is Phase.CLAIMED else None
                step = world.turn() if claimed is None else claimed
                self.turn.claim(step)
                try:
                    turn.refuse_if_peer_did_not_start(world, step, source)
                except PeerFailedError:
                    self.turn.done()  # it decided at its start: no step of its own to close (after_cell)
                    raise
                with self.turn.stops.held():  # a press as the cell is published is taken once it is, whole
                    self.drive.before(world, self.secret, "collective", source, follow.cell_flags(flags), step=step)
            else:
                self.turn.claim(align[1])  # the driver's step, which it runs too
                if self.guard is not None:
                    self.guard.new_cell()  # a stop sent during the driver's last cell is not for this one
            flags = dataclasses.replace(flags, view=flags.view or self.view)  # the cell's own, else this notebook's
            answering = (self.aids.breakpoints.answering(world, keys.step(self.turn.step))  # followers' breakpoints
                         if align is None and self.drive.holding and self.turn.step is not None
                         else contextlib.nullcontext())
            with answering:
                return cells.run(world, self.shell, source, flags, self.watch_client, self.hooks.params,
                                 activate=self._activate,
                                 rebuild=lambda n: self.rebuild_process_group(f"t{n}", n),
                                 turn=self.turn, state=self.group_state(world, gen), stopper=self.stopper,
                                 driver=driver, draw_live=self.process == "kernel", run_body=self.run_body,
                                 keep=self.kept.body_ended, aids=self.aids, shows_table=shows_table)
        except StoreConnectionError as exc:
            marker = world.client.marker
            hosts = [i for i, r in enumerate(world.ranks)
                     if (r.get("host"), r.get("pid")) == (marker.get("host"), marker.get("pid"))]
            owner = f"{world.describe(hosts[0])}, which hosts the rendezvous server" if hosts else "the server"
            failure = StoreConnectionError(f"lost contact with {owner}: {exc}")
            failure.outcome = getattr(exc, "outcome", None)  # type: ignore[attr-defined]
            raise failure from exc

    def _activate(self, checker: Any) -> None:
        self.hooks.active = checker

    def before_cell(self, info: Any = None, *_: Any) -> None:
        """IPython's pre_run_cell event: a cell of the user runs from now (a stop may end it).

        A ``%%collective`` cell takes the world's next step now: a rank whose same cell fails before
        nbdist's code (a typo in its flags) closes that step, and this rank, arriving after, fails at once
        with the reason instead of waiting at the step after it.
        """
        self.turn.begin()
        late = self.prestart.started()
        stops = self.turn.stops
        # A press while this runs would raise inside IPython's event loop, which swallows it: hold it for the cell.
        with stops.held(take=False):
            if self.world is not None:
                if (getattr(info, "raw_cell", "") or "").lstrip().startswith("%%collective"):
                    try:
                        self.turn.claim(self.world.turn())
                    except StoreConnectionError:  # the cell itself will say so
                        pass
                self.stopper.arm()
                self.plain.begin(getattr(info, "raw_cell", "") or "")  # a plain cell is watched from its start
                if self.guard is not None:
                    self.guard.new_cell()
                    self.guard.running = True
        self.stop_pressed = late or stops.pressed or self.stop_pressed
        stops.drop()

    def after_cell(self, result: Any) -> None:
        """IPython's post_run_cell event: a %%collective stopped before its turn still takes it, closed.

        The stop button can land before nbdist's code runs (IPython, the magic's
        flags); without this, the other ranks would wait for this one until their
        --timeout.
        """
        raw = getattr(getattr(result, "info", None), "raw_cell", "") or ""
        error = getattr(result, "error_before_exec", None) or getattr(result, "error_in_exec", None)
        self.plain.end(error)
        self.prestart.ended()
        self.stop_pressed = False
        self.stopper.reset()  # not disarm(): an arm whose disarm a stop cut short must not outlive the cell
        if self.guard is not None:
            self.guard.running = False
        try:
            if self.world is None or error is None or not raw.lstrip().startswith("%%collective"):
                return
            if isinstance(error, DriveError):
                return  # another notebook drives: this cell never had a turn of its own
            interrupted = isinstance(error, KeyboardInterrupt)
            why = ("interrupted its cell" if interrupted
                   else f"could not start its cell ({type(error).__name__}: {error})")
            # A second press must not cut this short (IPython's event loop would swallow it, and nobody be told).
            with self.turn.stops.held(take=False):
                try:
                    self.sync_generation(self.world)
                    if self.turn.step is None:  # the step could not be read as the cell began: the world's next one
                        self.turn.claim(self.world.turn())
                    # Before nbdist's code (the magic's flags, a stop): the step this cell began with, closed.
                    self.turn.abort(self.world, why, interrupted, raw.lstrip().partition("\n")[2])
                except StoreConnectionError as exc:
                    log.info("could not tell the others this rank's cell did not start: %s", exc)
            self.turn.stops.drop()
        finally:
            self.turn.begin()

    def barrier(self, timeout: float, step: int | None = None) -> float:
        """All ranks meet at the world's next step (a follower: its driver's ``step``); returns the seconds waited."""
        world = self.require_world("%dist_barrier")
        start = time.perf_counter()
        bar = turn.Turn(self.turn.stops)  # its own turn: a %dist_barrier may run inside another cell
        with bar.guarded(world, turn.BARRIER), bar.stops.held():  # a stop anywhere is taken where the turn can act
            self.sync_generation(world)
            bar.claim(world.turn() if step is None else step)
            n = bar.step
            assert n is not None
            if step is None:
                try:  # another rank's barrier gave up this step before it was counted in: it waits for none
                    turn.refuse_if_peer_did_not_start(world, n, turn.BARRIER)
                except PeerFailedError:
                    bar.done()
                    raise
                self.drive.before(world, self.secret, "barrier", flags={"timeout": timeout}, step=n)
            # A stop once every rank arrived has nothing left to stop: the barrier is passed.
            bar.meet(world, "barrier", f"%dist_barrier #{n}", {}, timeout, working=world.busy_elsewhere,
                     on_missed=cells.say)
            bar.done()
            bar.stops.drop()
        world.note(f"passed %dist_barrier #{n}")
        return time.perf_counter() - start

    def status(self) -> list[dict[str, Any]]:
        """Per-rank status: joined, alive, last activity, left."""
        world = self.require_world("%dist_status")
        rows = []
        now = time.time()
        for i, info in enumerate(world.ranks):
            last = world.last(i)
            beat = world.client.get_json_if(keys.heartbeat(info["session"]))
            left = world.client.check([world.key(keys.left(i))])
            age = None if beat is None else max(0.0, now - beat["t"])
            rows.append({
                **info,
                "alive": beat is not None and age is not None and age < 5 * HEARTBEAT_INTERVAL and not beat.get("gone"),
                "gone": bool(beat and beat.get("gone")),
                "busy": float((beat or {}).get("busy") or 0.0),
                "heartbeat_age": age,
                "last": last.get("what", ""),
                "last_age": None if not last else max(0.0, now - last["t"]),
                "left": left,
            })
        return rows

    # --- leaving ------------------------------------------------------------
    def leave(self) -> None:
        """Leave the world (others see it); keeps a hosted server running. Idempotent."""
        self.plain.end()
        if self.guard is not None:
            self.guard.stop()
            self.guard = None
        if self.world is not None:
            try:
                if self.drive.holding:
                    self.drive.release(self.world, self.secret, "left the world (%dist_destroy, a new %%dist_init, "
                                                                "or its kernel exits)")
            except (StoreConnectionError, signing.SigningError) as exc:
                log.info("could not release the drive: %s", exc)
            try:
                self.world.leave()
            except StoreConnectionError as exc:
                log.info("could not tell the others this rank left: %s", exc)
            if self.world.pg is not None:
                self.world.pg.cut("left")  # nothing may still wait on it, or destroying it would hang
                self.world.pg.destroy()
            self.world = None
        self.hooks.active, self.hooks.pg = None, None
        self.kept.clear()
        self.user_init.uninstall()
        destroy_default()
        self.debug.restore()
        self.environ.restore(keep=self.environ.early)
        if self.watch_client is not None:
            self.watch_client.close()
            self.watch_client = None
        if self.heartbeat is not None:
            self.heartbeat.stop()
            self.heartbeat = None
        if self.client is not None:
            self.client.close()
            self.client = None
        self.device = None
        if self.threads_before is not None:
            threads.apply(self.threads_before)
            self.threads_before = None
        self.drive = follow.Drive(self.id)
        if self.workers is not None:  # after leaving: their follow loops end as they see this rank leave
            self.workers.shutdown()
            self.workers = None

    def close_at_exit(self) -> None:
        """Kernel exit: leave, keep serving the others a moment if they still use the world, then close.

        A notebook that ends first must not break the others' last cells: when rank 0's kernel, which
        hosts the server, shuts down as its notebook ends, the others may be one cell behind. They
        leave when their own notebook ends, or die; nbdist waits for that for up to EXIT_GRACE seconds
        (jupyter_client gives a kernel 5 s to exit before it kills it).
        """
        self.leave()
        server = self.server
        if server is not None and server.running:
            deadline = time.monotonic() + EXIT_GRACE
            try:
                client = connect(server.host, server.port, TIMEOUTS["connect"], token=server.token)
                try:
                    while time.monotonic() < deadline and rendezvous.live_peers(client, self.id):
                        time.sleep(0.1)
                finally:
                    client.close()
            except StoreConnectionError as exc:
                log.info("at exit, could not see whether other ranks still use the server: %s", exc)
        self.close()

    def close(self) -> None:
        """Leave, and stop the server this kernel hosts; idempotent (teardown, unload, exit)."""
        self.leave()
        self.environ.restore()
        self.environ.early.clear()
        self.hooks.uninstall()
        capture.unroute_streams()
        progress.unpatch()
        self.stopper.uninstall()
        self.prestart.uninstall()
        if self.server is not None:
            self.server.stop()
            self.server = None


if TYPE_CHECKING:
    def _fits(s: Session) -> tuple[follow.FollowHost, debugmode.Switched, bench.Benched, dashboard.Watched]:
        """The parts below that take the session whole name what they need of it as Protocols: it has that."""
        return s, s, s, s
