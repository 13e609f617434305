"""The per-kernel state of nbdist: one :class:`Session` per kernel, owned by the magics.

A session is the composition of four parts, each with its own lifetime: the link to the store
(:class:`nbdist.world.link.StoreLink`: the server, connections, heartbeat and world), the backend state
(:class:`nbdist.backend.state.BackendState`), the cell turn (:class:`nbdist.cell.kernelturn.KernelTurn`: the
running cell's turn, the stop button, the watchers) and the drive (:class:`nbdist.drive.driving.KernelDrive`).
It wires them, and keeps the names the magics, the extension and the layers below use: each part's attributes
read and set through the session as its own (:class:`Held`).
"""

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
from typing import TYPE_CHECKING, Any, Generic, TypeVar, overload

from ._version import __version__
from .backend import backends, debugmode, envplan, setup, userinit
from .backend.environ import Environ
from .backend.state import BackendState
from .cell import cells, names, rebuild, turn, wholeask, wholeoutput
from .cell import step as steps
from .cell.guard import Guard, request_stop
from .cell.hooks import Collectives
from .cell.kernelturn import KernelTurn
from .cell.plain import PlainNet
from .cell.prestart import Window
from .cell.stopper import Stopper
from .cell.stops import Stops
from .cell.turn import Turn
from .config import HEARTBEAT_INTERVAL, WorldConfig, spawned
from .debug import aids, postmortem
from .diverge import oplog
from .drive import follow
from .drive.driving import KernelDrive
from .drive.slurm import SlurmJob
from .drive.workers import Workers
from .errors import JoinError, StoreConnectionError
from .heal.history import History
from .world import keys, link, netinfo, signing
from .world.heartbeat import Heartbeat
from .world.link import StoreLink
from .world.liveness import PeerTracker
from .world.pulse import beat_from
from .world.records import Registration
from .world.store import Server, StoreClient
from .world.world import World

if TYPE_CHECKING:
    from .measure import bench, dashboard

log = logging.getLogger(__name__)

T = TypeVar("T")


class Held(Generic[T]):
    """An attribute of the session that one of its parts holds: read and set through the session as its own."""

    def __init__(self, part: str) -> None:
        self.part = part

    def __set_name__(self, owner: type, name: str) -> None:
        self.name = name

    @overload
    def __get__(self, obj: None, owner: type | None = None) -> Held[T]: ...

    @overload
    def __get__(self, obj: object, owner: type | None = None) -> T: ...

    def __get__(self, obj: object, owner: type | None = None) -> Held[T] | T:
        if obj is None:
            return self
        value: T = getattr(getattr(obj, self.part), self.name)
        return value

    def __set__(self, obj: object, value: T) -> None:
        setattr(getattr(obj, self.part), self.name, value)


def _node_id() -> str:
    """Identifies this machine, to tell which ranks share a host (and so local ranks)."""
    try:
        with open("/etc/machine-id") as f:
            return f"{socket.gethostname()}/{f.read().strip()}"
    except OSError:
        return socket.gethostname()


class Session:
    """One kernel's membership of a world: the composition of its parts (see the module docstring)."""

    # the link to the store
    server = Held[Server | None]("link")
    client = Held[StoreClient | None]("link")
    world = Held[World | None]("link")
    watch_client = Held[StoreClient | None]("link")
    heartbeat = Held[Heartbeat | None]("link")
    # the backend state
    choice = Held[backends.Choice | None]("backend")
    config = Held[WorldConfig | None]("backend")
    device = Held[Any]("backend")
    local_rank = Held[int]("backend")
    env_plan = Held[list[envplan.EnvVar]]("backend")
    environ = Held[Environ]("backend")
    pg_timeout = Held[float]("backend")
    npu_seen = Held[dict[str, str | None] | None]("backend")
    npu_seen_when = Held[str]("backend")
    notes = Held[list[str]]("backend")
    cpplog_note = Held[str | None]("backend")
    around_tunnel = Held[envplan.EnvVar | None]("backend")
    threads_before = Held[int | None]("backend")
    user_init = Held[userinit.UserInit]("backend")
    debug = Held[debugmode.DebugMode]("backend")
    # the cell turn
    hooks = Held[Collectives]("cell_turn")
    stopper = Held[Stopper]("cell_turn")
    guard = Held[Guard | None]("cell_turn")
    plain = Held[PlainNet]("cell_turn")
    turn = Held[Turn]("cell_turn")
    prestart = Held[Window]("cell_turn")
    stops = Held[Stops]("cell_turn")
    view = Held[str | None]("cell_turn")
    run_body = Held[Callable[[cells.Body], cells.Ran]]("cell_turn")
    # the drive
    drive = Held[follow.Drive]("driving")
    following = Held[bool]("driving")
    process = Held[str]("driving")
    workers = Held[Workers | SlurmJob | None]("driving")

    def __init__(self, shell: Any) -> None:
        self.shell = shell
        self.id = uuid.uuid4().hex
        self.link = StoreLink()
        self.backend = BackendState()
        self.driving = KernelDrive(self.id)
        self.cell_turn = KernelTurn(self.link, self.driving, lambda: rebuild.ensure(self.group))
        # What building the process group needs: the session's parts, not the session (nbdist.cell.rebuild).
        self.group = rebuild.Parts(self.link, self.backend, self.cell_turn.hooks, self.cell_turn.turn)
        self.kept = postmortem.Kept()  # this rank's last failed %%collective body, for %dist_pdb
        self.whole = wholeoutput.Keeper()  # its cells' whole outputs, where a table left some out
        self.history = History()  # this notebook's %%collective cells in its world, for %dist_replay
        self.aids = aids.Aids(self.secret, lambda: self.pg_timeout)  # breakpoints, where a hung cell's ranks were

    # --- joining ------------------------------------------------------------
    def prepare(self) -> None:
        """At ``%load_ext``: what can be set before the master is known, before torch_npu reads it.

        torch_npu reads some variables once per process (:data:`nbdist.backend.envplan.READ_ONCE`); set now,
        they are in place however the notebook goes on.
        """
        setup.prepare(self.backend)

    def init(self, cfg: WorldConfig, on_status: Callable[[Any], None] | None = None,
             keep_workers: bool = False) -> list[dict[str, Any]]:
        """Join (or re-join) the world described by ``cfg``; returns every rank's registration."""
        workers = self.workers if keep_workers else None
        if keep_workers:
            self.workers = None  # leaving the old world must not stop the workers that join this one
        self.leave()
        self.workers = workers
        self.backend.choose(cfg)
        setup.apply_plan(self.backend, cfg)
        self.backend.note_plan(rebuild.BUILT_HCCL)
        import torch

        deadline = time.monotonic() + cfg.timeout
        client = self.link.reach(cfg, deadline, on_status, self.id)
        try:
            addr = netinfo.route_to(cfg.master_addr, cfg.master_port).local_ip
        except OSError:  # plan_for routed it a moment ago
            addr = ""
        choice = self.choice
        assert choice is not None
        me = Registration(
            session=self.id,
            rank=cfg.rank,
            host=socket.gethostname(),
            node=_node_id(),
            pid=os.getpid(),
            process=self.process,
            addr=addr,  # this rank's end of its route to the master (loopback: a tunnel or proxy)
            addrs=netinfo.host_addresses(),
            nbdist=__version__,
            torch=torch.__version__,
            python=platform.python_version(),
            backend=choice.backend,
            backend_reason=choice.reason,
            device=choice.device,
            device_chosen=cfg.device is not None,
            torch_npu=choice.npu.torch_npu,
            cann=choice.npu.cann,
            agreed=envplan.agreed_values(choice.backend, self.env_plan, choice.npu),
            env=setup.env_lines(self.env_plan),
            keeps_beat=True,  # its heartbeat stays in the store once it stops (the others read it with the rest)
            spawned=spawned(),  # a worker of %dist_init --spawn: the notebook that started it says how it ended
        )
        world = self.link.join(me, cfg, on_status, deadline)
        problems = envplan.disagreements(world.registrations())
        if problems:
            self.world = None
            raise JoinError("; ".join(problems) + ". Use the same values in every notebook, then re-run %%dist_init")
        setup.route_around_tunnel(self.backend, world, cfg, hosting=self.server is not None and self.server.running)
        setup.settle_devices(self.backend, world)
        setup.set_environment(self.backend, cfg)
        setup.set_threads(self.backend)
        self.cell_turn.join(self.pg_timeout)
        self.user_init.install(self._formed, lambda: rebuild.restore(self.group))
        self.cell_turn.start_guard(client.clone(op_timeout=5.0), world.key, cfg.rank, self.id)
        world.last_turn = world.turns.next() - 1  # the steps before this rank joined are not ones it missed
        if world.replaced is None:
            world.gen = world.generations.stored()
            self.rebuild_process_group("join")
        elif world.replaced.session != self.id:  # it took over another kernel's slot: its first cell says so
            self.cell_turn.first_note = cells.new_namespace(world, world.replaced, spawned())
            self.cell_turn.took_over = True
            self.history.joined_after = world.last_turn
        self._answer_where()
        world.notes.write("joined")
        return world.registrations()

    def _answer_where(self) -> None:
        """Answer %dist_where from the heartbeat thread, while cells run (:mod:`nbdist.debug.where`)."""
        from .debug import where

        world, heartbeat = self.world, self.heartbeat
        assert world is not None and heartbeat is not None
        heartbeat.add_chore(where.responder(world.client, world.round, world.rank, self.secret).tick)
        heartbeat.add_chore(postmortem.responder(world, self.secret, self.kept).tick)
        heartbeat.add_chore(wholeask.responder(world.client, world.round, world.rank, self.secret,
                                               self.whole.root).tick)

    def whole_output(self, rank: int, capture: Any) -> wholeoutput.WholeOutput:
        """``nbdist.rank_output(rank, full=True)``: from its kept file on this disk, else asked of the rank through
        the store (:mod:`nbdist.cell.wholeask`). Raises ``LookupError`` saying why there is none."""
        world = self.require_world("nbdist.rank_output")
        where = world.describe(rank)
        try:
            return wholeoutput.read(capture, rank, where)
        except wholeoutput.Elsewhere as away:
            tracker = PeerTracker(world.ranks, world.rank)
            text = wholeask.ask(world.client, world.round, rank, away.path, signing.key_from(self.secret()),
                                where=where,
                                gone=lambda: next((why for _, why in tracker.dead(world.client, [rank])), None))
            return wholeoutput.finished(text, capture.kept, rank)

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
        ``LOCAL_RANK`` and ``DEVICE`` in the notebook's namespace (``nbdist`` is there from ``%load_ext``)."""
        import torch
        import torch.distributed as dist

        assert self.config is not None
        ns = self.shell.user_ns
        ns.setdefault("torch", torch)
        ns.setdefault("dist", dist)
        ns.update(RANK=self.config.rank, WORLD_SIZE=self.config.world_size, LOCAL_RANK=self.local_rank,
                  DEVICE=self.device)

    def environ_for_config(self) -> dict[str, str]:
        """The environment as the user set it: values nbdist itself set are left out."""
        return self.backend.environ_for_config()

    def _formed(self) -> userinit.Formed:
        """This world as the notebook's own ``init_process_group`` is compared with it."""
        world, choice = self.require_world("init_process_group"), self.choice
        assert choice is not None
        return userinit.Formed(choice.backend, world.rank, world.world_size, world.describe(world.rank))

    def rebuild_process_group(self, tag: str, step: int | None = None) -> None:
        """Build this world's process group afresh, as every rank does at the same point (:mod:`.cell.rebuild`)."""
        rebuild.build(self.group, tag, step)

    def group_state(self, world: World, gen: int) -> dict[str, Any]:
        """This rank's process-group state as the others judge it at a step (:func:`.cell.rebuild.state`)."""
        return rebuild.state(self.debug, world, gen)

    def ensure_group(self) -> str | None:
        """Before a plain cell's first collective: rebuild with every rank if the group is not trusted; why, or None."""
        return rebuild.ensure(self.group)

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
        return self.driving.follow(self, world, self.id, self.secret, show, self.stopper)

    def release(self) -> bool:
        """%dist_release: stop driving; the followers run their own cells again. True if this notebook drove."""
        return self.driving.release(self.world, self.secret)

    def spawn(self, cfg: WorldConfig, workers: Workers | SlurmJob, on_status: Callable[[Any], None] | None = None,
              port: socket.socket | None = None) -> list[dict[str, Any]]:
        """%dist_init --spawn: start the followers (ranks 1..N-1: local worker kernels or a Slurm job), join as
        rank 0, and drive them. ``port``: the socket holding the port the plan chose, for the rendezvous server,
        which starts on it before the followers do (:meth:`nbdist.drive.spawn.Plan.take_port`)."""
        self.leave()
        assert cfg.token
        if port is not None:
            self.link.host(Server(cfg.master_addr, cfg.master_port, token=cfg.token, listener=port))
        workers.start()
        self.workers = workers

        def status(state: Any) -> None:
            workers.check()  # a worker that failed ends the wait at once, with its log
            if on_status is not None:
                note = getattr(workers, "note", None)
                on_status({**state, "launcher": note()} if isinstance(state, dict) and note else state)

        try:
            ranks = self.init(cfg, status, keep_workers=True)
            world = self.require_world("%dist_init --spawn")
            self.drive.take(world)
            # A follower that dies is started again: the others are told how it ended.
            workers.report_to(world.client.clone(op_timeout=5.0), world.key)
        except BaseException:
            self.leave()
            raise
        return ranks

    def sync_generation(self, world: World, gen: int | None = None) -> int:
        """Follow the world to a new generation (a rank was replaced): :func:`nbdist.world.link.sync_generation`."""
        return link.sync_generation(world, gen)

    # --- using the world ----------------------------------------------------
    def require_world(self, what: str) -> World:
        return self.link.require_world(what)

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
        self.stops.start()  # a press as the cell began: it takes its step, closed (after_cell)
        try:
            # A follower takes the generation its driver read a moment ago, and saves a round trip.
            gen = self.sync_generation(world, None if align is None else align[0])
            if align is None:
                self.turn.starts(world, source, lambda step: self.drive.before(
                    world, self.secret, "collective", source, flags.sent(), step=step))
            else:
                self.turn.follows(align[1])  # the driver's step, which it runs too
                if self.guard is not None:
                    self.guard.new_cell()  # a stop sent during the driver's last cell is not for this one
            flags = dataclasses.replace(flags, view=flags.view or self.view)  # the cell's own, else this notebook's
            answering = (self.aids.breakpoints.answering(world, keys.step(self.turn.step))  # followers' breakpoints
                         if align is None and self.drive.holding and self.turn.step is not None
                         else contextlib.nullcontext())
            note, self.cell_turn.first_note = self.cell_turn.first_note, None
            with answering:
                return cells.run(world, self.shell, source, flags, self.watch_client, self.hooks.params,
                                 activate=self._activate,
                                 rebuild=lambda n: self.rebuild_process_group(f"t{n}", n),
                                 turn=self.turn, state=self.group_state(world, gen), stopper=self.stopper,
                                 driver=driver, draw_live=self.process == "kernel",
                                 run_body=self._body(flags, note),
                                 keep=self.kept.body_ended, aids=self.aids, shows_table=shows_table)
        except StoreConnectionError as exc:
            marker = world.client.marker
            hosts = [i for i, r in enumerate(world.ranks) if (r.host, r.pid) == (marker.get("host"), marker.get("pid"))]
            owner = f"{world.describe(hosts[0])}, which hosts the rendezvous server" if hosts else "the server"
            failure = StoreConnectionError(f"lost contact with {owner}: {exc}")
            cells.cut_short(failure, cells.partial_of(exc))
            raise failure from exc

    def _body(self, flags: cells.Flags, note: str | None) -> Callable[[cells.Body], cells.Ran]:
        """How this cell's body runs: opening with ``note``; under ``--find-divergence``, recorded and compared; in
        a kernel that took over a slot, its NameError carrying the names it holds (:mod:`nbdist.cell.names`)."""
        run_body = self.whole.body(self.run_body)
        run_body = run_body if note is None else cells.noted(run_body, note)
        if flags.find_divergence:
            run_body = cells.around(run_body, lambda: oplog.find_divergence(flags.replicas))
        if not self.cell_turn.took_over:
            return run_body
        shell = self.shell
        return names.holding(run_body, lambda: names.user_names(shell.user_ns, shell.user_ns_hidden))

    def _activate(self, checker: Any) -> None:
        self.hooks.active = checker

    def before_cell(self, info: Any = None, *_: Any) -> None:
        """IPython's pre_run_cell event (:meth:`nbdist.cell.kernelturn.KernelTurn.before_cell`)."""
        self.cell_turn.before_cell(info)

    def after_cell(self, result: Any) -> None:
        """IPython's post_run_cell event (:meth:`nbdist.cell.kernelturn.KernelTurn.after_cell`)."""
        self.cell_turn.after_cell(result)

    def barrier(self, timeout: float, step: int | None = None) -> float:
        """All ranks meet at the world's next step (a follower: its driver's ``step``); returns the seconds waited."""
        world = self.require_world("%dist_barrier")
        start = time.perf_counter()
        bar = turn.Turn(self.turn.stops)  # its own turn: a %dist_barrier may run inside another cell
        def publish(n: int) -> None:  # this notebook's own barrier: its followers meet it there
            self.drive.before(world, self.secret, "barrier", flags={"timeout": timeout}, step=n)

        def meeting(n: int) -> turn.Meeting:
            return turn.Meeting("barrier", f"%dist_barrier #{n}", timeout, working=world.notes.busy_elsewhere,
                                on_missed=cells.say)

        claim = steps.Claim(step=step, publish=None if step is not None else publish, sync=True)
        steps.drive(bar, world, steps.Plan(steps.BARRIER, meeting, turn.BARRIER, claim))
        world.notes.write(f"passed %dist_barrier #{bar.step}")
        return time.perf_counter() - start

    def status(self) -> list[dict[str, Any]]:
        """Per-rank status: joined, alive, last activity, left."""
        world = self.require_world("%dist_status")
        rows = []
        now = time.time()
        for i, info in enumerate(world.ranks):
            last = world.notes.last(i)
            beat = beat_from(world.client.get_if(keys.heartbeat(info.session)))
            left = world.client.check([world.key(keys.left(i))])
            age = None if beat is None else max(0.0, now - beat.t)
            rows.append({
                **info.as_dict(),
                "alive": beat is not None and age is not None and age < 5 * HEARTBEAT_INTERVAL and not beat.gone,
                "gone": beat is not None and beat.gone,
                "busy": 0.0 if beat is None else beat.busy,
                "heartbeat_age": age,
                "last": "" if last is None else last.what,
                "last_age": None if last is None else max(0.0, now - last.t),
                "left": left,
            })
        return rows

    # --- leaving ------------------------------------------------------------
    def leave(self) -> None:
        """Leave the world (others see it); keeps a hosted server running. Idempotent."""
        self.cell_turn.leave()
        if self.world is not None:
            self.driving.leave(self.world, self.secret)
            self.link.leave_world()
        self.cell_turn.forget_group()
        self.kept.clear()
        self.whole.clear()
        self.history.clear()
        self.backend.leave()
        self.link.disconnect()
        self.backend.forget_device()
        self.driving.reset(self.id)  # after leaving: the workers' follow loops end as they see this rank leave

    def close_at_exit(self) -> None:
        """Kernel exit: leave, keep serving the others a moment if they still use the world, then close.

        A notebook that ends first must not break the others' last cells: when rank 0's kernel, which
        hosts the server, shuts down as its notebook ends, the others may be one cell behind. They
        leave when their own notebook ends, or die; nbdist waits for that for up to
        :data:`nbdist.world.link.EXIT_GRACE` seconds (jupyter_client gives a kernel 5 s to exit before it
        kills it).
        """
        self.leave()
        self.link.serve_out(self.id)
        self.close()

    def close(self) -> None:
        """Leave, and stop the server this kernel hosts; idempotent (teardown, unload, exit)."""
        self.leave()
        self.environ.restore()
        self.environ.early.clear()
        self.cell_turn.close()
        self.link.stop_server()

if TYPE_CHECKING:
    def _fits(s: Session) -> tuple[follow.FollowHost, debugmode.Switched, bench.Benched, dashboard.Watched]:
        """The parts below that take the session whole name what they need of it as Protocols: it has that."""
        return s, s, s, s
