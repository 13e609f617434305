"""The IPython magics: parse flags, call the session, display. Nothing more."""

from __future__ import annotations

import sys
from collections.abc import Callable
from dataclasses import replace
from typing import Any

from IPython.core.error import UsageError
from IPython.core.magic import Magics, magics_class
from IPython.core.magic_arguments import parse_argstring
from IPython.display import display

from . import config, magicflags
from .backend import doctor, envplan, setup
from .cell import cellerror, cells, names, outcome_view
from .drive import follow, restarts, spawn
from .errors import ConfigError, NbdistError
from .magicflags import argument, cell_magic, line_cell_magic, line_magic, magic_arguments
from .session import Session
from .view import notes
from .view.display import JoinStatus, Message, Source, status_table, summary_table

_NAME = "DistMagics"
VIEWS = ("ranks", "groups")  # how a cell's table is drawn (%%collective --view, %dist_config view=)
_VIEW_WORDS = {"ranks": "a column per rank", "groups": "a column per group of alike ranks",
               None: "groups past 4 ranks or when the columns would be too wide, else a column per rank"}


@magics_class
class DistMagics(Magics):
    """nbdist's magics; the state lives on :attr:`session`."""

    def __init__(self, shell: Any) -> None:
        super().__init__(shell)
        self.session = Session(shell)
        self.last_trace: list[dict[str, Any]] = []  # the calls of the last --trace cell (nbdist.last_trace())
        self.last_outcome: cells.Outcome | None = None  # the last cell's table shown here (nbdist.rank_output())

    @magic_arguments()
    @argument("--rank", help="this notebook's rank, 0..N-1 (else RANK)")
    @argument("--world-size", help="number of notebooks in the world (else WORLD_SIZE)")
    @argument("--master-addr", help="address of rank 0 / the rendezvous server (else MASTER_ADDR)")
    @argument("--master-port", help=f"rendezvous port (default {config.DEFAULT_PORT}, else MASTER_PORT)")
    @argument("--backend", help="auto (default), gloo, nccl or hccl (else BACKEND)")
    @argument("--device", help="device for this rank, e.g. cpu, cuda:1, npu:0 (else DEVICE_ID)")
    @argument("--timeout", help=f"seconds to wait for every rank to join (default {config.TIMEOUTS['join']:g})")
    @argument("--env", action="append", metavar="KEY=VALUE",
              help="set a backend variable (repeatable); shown in the summary")
    @argument("--debug", nargs="?", const="files", choices=("files", "stdout"),
              help="turn on the backend's diagnostics; for hccl, CANN keeps writing its log files (files, the "
                   "default) or prints them here and writes none (stdout)")
    @argument("--pg-timeout", help=f"seconds before a stuck collective fails (default "
                                   f"{config.TIMEOUTS['process_group']:g}; for hccl at least 60 s above "
                                   "HCCL_CONNECT_TIMEOUT and HCCL_EXEC_TIMEOUT, so 660 by default)")
    @argument("--token", help="a shared secret every rank must present to join (else NBDIST_TOKEN)")
    @argument("--spawn", metavar="N", help="make this notebook rank 0 of N, with N-1 local worker kernels that "
                                           "follow it (master 127.0.0.1; port 29500, else a free one)")
    @argument("--slurm", metavar="OPTIONS", help="with --spawn N: start the N-1 followers as one Slurm job of "
                                                 "`nbdist follow` tasks, OPTIONS passed to sbatch (e.g. \"-N 2 -p "
                                                 "npu\"); the master is --master-addr, an address the nodes reach")
    @argument("--max-restarts", metavar="K", help=f"with --spawn N: when a worker kernel dies, start a new one in "
                                                  f"its slot (with --slurm: a new step of the job on the task's "
                                                  f"node), at most K times per rank within "
                                                  f"{restarts.WINDOW / 60:g} minutes (default "
                                                  f"{restarts.DEFAULT_MAX}; 0: never)")
    @line_cell_magic
    def dist_init(self, line: str, cell: str | None = None) -> None:
        """Join this notebook to a torch.distributed world as one rank.

        Run it in every notebook, each with its own --rank. Rank 0 starts the
        rendezvous server on --master-addr:--master-port unless one answers
        there. The cell body, if any, runs first: RANK, WORLD_SIZE,
        MASTER_ADDR, MASTER_PORT, DEVICE_ID and BACKEND defined in it are used
        where a flag is absent; environment variables of those names come
        last. Afterwards ``dist``, ``torch`` and ``nbdist`` are in the namespace, with
        ``RANK``, ``WORLD_SIZE``, ``LOCAL_RANK`` (ints) and ``DEVICE`` (this
        rank's ``torch.device``, also ``nbdist.get_device()``).
        Re-running it leaves the world and joins again.

        With --spawn N, this notebook alone forms a world of N on this machine:
        nbdist starts N-1 worker kernels (through jupyter_client, never fork),
        each joins and runs %dist_follow, so every %%collective here runs on
        all N ranks. The workers stop with the world (%dist_destroy, unloading
        nbdist, this kernel's exit or restart); %dist_workers shows them.
        A worker whose kernel dies is started again in its slot (same rank
        and flags) and takes its place in the world, which rebuilds its group
        at the next collective; its variables are gone. --max-restarts K caps
        that per rank within a window; one that dies before it joins again is
        left down. With --slurm, a task that dies is started again as a new
        step of the same job, on its node.
        ``SPAWN = N`` in the body or the namespace (``nbdist run --spawn``
        sets it) does the same where --spawn is absent; 0 or None: no spawn
        (nor in a copy that ``nbdist run`` runs as one rank of several).
        """
        args = parse_argstring(self.dist_init, line)
        assert self.shell is not None  # a magic runs in its shell
        if cell and cell.strip():
            self.shell.run_cell(cell, store_history=False).raise_error()
        if args.spawn is None:
            args.spawn = spawn.from_namespace(self.shell.user_ns, self.session.environ_for_config())
        if args.spawn is not None:
            if args.max_restarts is None:
                args.max_restarts = spawn.restarts_from_namespace(self.shell.user_ns)
            self._spawn(args)
            return
        if args.max_restarts is not None:
            raise UsageError("--max-restarts applies to the workers of --spawn N; this notebook spawns none")
        flags: dict[str, Any] = {name: getattr(args, name) for name in (
            "rank", "world_size", "master_addr", "master_port", "backend", "device", "timeout", "debug", "pg_timeout",
            "token")}
        try:
            flags["env"] = envplan.parse_overrides(args.env)
            cfg = config.resolve(flags, self.shell.user_ns, self.session.environ_for_config())
        except ConfigError as exc:
            raise UsageError(str(exc)) from None
        self._join(cfg, f"joining {cfg.master_addr}:{cfg.master_port} as rank {cfg.rank} of {cfg.world_size}",
                   lambda on_status: self.session.init(cfg, on_status))

    def _spawn(self, args: Any) -> None:
        try:
            plan = spawn.plan(args, self.session.environ_for_config())
        except ConfigError as exc:
            raise UsageError(str(exc)) from None
        try:  # the plan holds the port it chose until the server takes it, or until here
            try:
                cfg = config.resolve(plan.flags, {}, {})
            except ConfigError as exc:
                raise UsageError(str(exc)) from None
            cfg = replace(cfg, sources={**cfg.sources, **plan.sources})
            starting = (f"submitting a Slurm job of {cfg.world_size - 1} follower task(s)" if plan.slurm is not None
                        else f"starting {cfg.world_size - 1} worker kernel(s)")
            self._join(cfg, f"{starting} for a world of {cfg.world_size} on {cfg.master_addr}:{cfg.master_port}"
                            f"{plan.note}",
                       lambda on_status: self.session.spawn(cfg, plan.followers(), on_status, plan.take_port()))
        finally:
            plan.release()

    def _join(self, cfg: Any, saying: str, join: Callable[[Callable[[Any], None]], list[dict[str, Any]]]) -> None:
        """Join (``join(on_status)``), a line saying so (``saying``) updated while it waits; then the world's table."""
        address = f"{cfg.master_addr}:{cfg.master_port}"
        handle = display(Message(f"nbdist: {saying}…"), display_id=True)

        def on_status(status: Any) -> None:
            handle.update(Message(status) if isinstance(status, str) else JoinStatus(status, address))

        try:
            ranks = join(on_status)
        except ConfigError as exc:
            raise UsageError(str(exc)) from None
        self._joined(cfg, ranks, address)

    def _joined(self, cfg: Any, ranks: list[dict[str, Any]], address: str) -> None:
        self.session.fill_namespace()
        spawned = " · this notebook drives its workers" if self.session.workers is not None else ""
        display(summary_table(
            f"nbdist world · {cfg.world_size} rank(s) · rendezvous {address} · this notebook is rank {cfg.rank}"
            f"{spawned}",
            ranks, footer=" ".join(filter(None, [config.describe_sources(cfg), notes.version_note(ranks),
                                                 notes.replaced_note(self.session.world),
                                                 *(f"warning: {note}." for note in self.session.notes)])),
        ))

    @magic_arguments()
    @argument("--timeout", default=config.TIMEOUTS["barrier"],
              help=f"seconds each barrier waits for the other ranks (default {config.TIMEOUTS['barrier']:g})")
    @argument("--no-check", action="store_true",
              help="do not compare each collective (op, shape, dtype, root) across ranks before it runs")
    @argument("--allow-different", action="store_true",
              help="allow different code on different ranks (by default such cells are refused)")
    @argument("--max-time", default=None, metavar="S",
              help="seconds the body may run on any rank; then the cell fails on every rank (default: no limit)")
    @argument("--no-live", action="store_true",
              help="no live table while the body runs: only the final one (this notebook only)")
    @argument("--trace", action="store_true",
              help="draw below the table when each collective entered and left on every rank, and who was late "
                   "(the calls: nbdist.last_trace())")
    @argument("--ranks", metavar="RANKS", help="run the body only on these ranks, e.g. 0-3,5; the others skip it "
                                               "and wait (default: every rank)")
    @argument("--view", choices=VIEWS, help="draw the table with a column per rank, or per group of ranks whose "
                                            "output is alike (default: %%dist_config view=, else groups past 4 "
                                            "ranks or when the columns would be too wide)")
    @argument("--show", metavar="RANKS", help="show only these ranks' columns, e.g. 0-3 (every rank still runs)")
    @argument("--find-divergence", action="store_true",
              help="record every operation the body runs (forward, backward, collectives) with its output's hash, "
                   "then name the first whose output differs between ranks, its line and the ranks holding each "
                   "hash (torch's DebugMode; the first 100,000 operations)")
    @argument("--replicas", metavar="RANKS", help="with --find-divergence: the ranks that must agree, e.g. 0,1 "
                                                  "(default: every rank)")
    @cell_magic
    def collective(self, line: str, cell: str) -> None:
        """Run this cell on every rank in lockstep; show every rank's output side by side.

        A barrier before and after the body keeps ranks together; ranks whose
        code (or these flags) differs are refused before anything runs. Each
        torch.distributed collective is compared across the members of its
        group before it runs. The table has one column per rank, each listing
        that rank's outputs in the order it produced them; outputs equal on
        every rank are shown once. From 0.5 s into the body, the table is shown
        live, updated twice a second with each rank's output and state. The
        end barrier waits for a rank still running the body as long as its
        kernel lives (--timeout counts only for ranks not in the cell);
        --max-time bounds the body itself. A failure on any rank (an exception,
        the stop button, a rank that is gone, %dist_stop) ends the cell on every
        rank, after the table is shown. The process group is kept unless a
        collective was waiting on it; then the next cell that uses it rebuilds it.
        With --ranks 0-3 only those ranks run the body (the others skip it and
        wait), and a collective that would wait for a skipped rank is refused:
        use a group made with dist.new_group in a cell every rank runs.
        breakpoint() in the body stops that rank in IPython's debugger (for a
        driven rank, in the driving notebook); a hung cell that ended badly
        shows where every rank was, as %dist_where does.
        """
        args = parse_argstring(self.collective, line)
        self._run(cell, magicflags.cell_flags(args, getattr(self.session.world, "world_size", None)))

    def _run(self, cell: str, flags: cells.Flags, kept: bool = True) -> None:
        """Run a step of ``cell``, show its table, raise its error; ``kept``: the world's history keeps the cell."""
        world = self.session.world
        try:
            outcome = self.session.collective(cell, flags)
        except (NbdistError, KeyboardInterrupt) as exc:
            partial = cells.partial_of(exc)
            if partial is not None and world is not None:
                self._show(partial)
                if kept and world is self.session.world:
                    self.session.history.ended(cell, flags.ranks, partial, cut=True)
            raise
        self._show(outcome)
        if kept:
            self.session.history.ended(cell, flags.ranks, outcome)
        world = self.session.world
        assert world is not None  # collective() required it
        shell = self.shell
        assert shell is not None
        error = cellerror.error_for(world, outcome, lambda: names.user_names(shell.user_ns, shell.user_ns_hidden))
        if error is not None:
            raise error

    def _show(self, outcome: cells.Outcome) -> None:
        """Show a cell's table, and its timeline if it was traced (kept for nbdist.last_trace())."""
        world = self.session.world
        if world is None:
            return
        calls = outcome_view.show(world, outcome)
        self.last_outcome = outcome
        if calls is not None:
            self.last_trace = calls

    @magic_arguments()
    @argument("setting", nargs="*", metavar="view=ranks|groups|auto",
              help="how this notebook draws tables; absent: show the settings")
    @line_magic
    def dist_config(self, line: str) -> None:
        """Show or set how this notebook shows the world: ``%dist_config view=ranks|groups|auto``.

        view: ranks draws a column per rank; groups a column per group of ranks
        whose output is alike (numbers that differ are summarised); auto (the
        default) groups past 4 ranks, or when the columns would be too wide.
        A cell's own ``%%collective --view`` wins for that cell. Without an
        argument, shows the settings.
        """
        for word in parse_argstring(self.dist_config, line).setting:
            key, eq, value = word.partition("=")
            if key != "view" or not eq:
                raise UsageError(f"%dist_config: unknown setting {word!r}; the setting is view=ranks|groups|auto")
            if value not in (*VIEWS, "auto"):
                raise UsageError(f"%dist_config: view={value!r}: choose ranks, groups or auto")
            self.session.view = None if value == "auto" else value
        print(f"nbdist: view={self.session.view or 'auto'} (tables: {_VIEW_WORDS[self.session.view]})")

    @magic_arguments()
    @argument("--backend", default=None, help="gloo, nccl or hccl (default: this world's, else auto)")
    @argument("--master-addr", default=None, help="the master's address (default: this world's)")
    @argument("--master-port", default=None, help="the master port (default: this world's, else 29500)")
    @argument("--env", action="append", metavar="KEY=VALUE",
              help="an override, as with %%dist_init (default: this world's --env flags)")
    @argument("--debug", nargs="?", const="files", choices=("files", "stdout"),
              help="include the debug switches (default: as this world's %%dist_init had it)")
    @line_magic
    def dist_env(self, line: str) -> None:
        """Show the environment plan (variable, value, why) for a backend on this host; changes nothing.

        In a joined world it shows that world's plan, with the --env and --debug flags its %%dist_init had.
        """
        args = parse_argstring(self.dist_env, line)
        try:
            print(setup.plan_shown(self.session.backend, self.session.world is not None, args.master_addr,
                                   args.master_port, args.backend, args.env, args.debug))
        except ConfigError as exc:
            raise UsageError(str(exc)) from None

    @magic_arguments()
    @argument("--master-addr", default=None, help="the master's address (default: this world's)")
    @argument("--master-port", default=None, help="the master port (default: this world's, else 29500)")
    @argument("--backend", default=None, help="gloo, nccl or hccl (default: this world's)")
    @argument("--token", default=None,
              help="the token to check the server takes (default: this world's, else NBDIST_TOKEN); never shown")
    @line_magic
    def dist_doctor(self, line: str) -> None:
        """Check what a world needs: address, route, master port, HCCL ports, devices, versions, settings.

        In a joined world the server is checked with the world's own token.
        """
        args = parse_argstring(self.dist_doctor, line)
        ranks = self.session.world.registrations() if self.session.world else None
        try:
            checks = doctor.for_world(self.session.config, self.session.choice, ranks, args.master_addr,
                                      args.master_port, args.backend, args.token)
        except ConfigError as exc:
            raise UsageError(str(exc)) from None
        print(doctor.report(checks))

    @line_magic
    def dist_status(self, line: str) -> None:
        """Show every rank of this world: joined, alive, last activity, backend, device, host."""
        rows = self.session.status()
        world = self.session.world
        assert world is not None  # status() required it
        display(status_table(world.round, rows))

    @magic_arguments()
    @argument("state", nargs="?", choices=("on", "off"),
              help="on: TORCH_DISTRIBUTED_DEBUG=DETAIL and the backend's debug variables on every rank; off: put "
                   "them back; absent: show the switch, torch's debug level and the variables here")
    @line_magic
    def dist_debug(self, line: str) -> None:
        """Turn torch's and the backend's own diagnostics on or off for the whole world.

        Run it in one notebook: every rank, including notebooks that did not run it and
        the workers of --spawn, rebuilds its process group under the new setting at its
        next cell that uses the group (torch reads TORCH_DISTRIBUTED_DEBUG only at import:
        nbdist applies it to each rebuilt group). Running it in every notebook changes the
        switch once. off puts back what the variables held (unset where you had not set them).
        """
        from .backend import debugmode

        args = parse_argstring(self.dist_debug, line)
        print(debugmode.show(self.session) if args.state is None
              else debugmode.switch(self.session, args.state == "on"))

    @magic_arguments()
    @argument("--timeout", default=config.TIMEOUTS["barrier"],
              help=f"seconds to wait for the other ranks (default {config.TIMEOUTS['barrier']:g})")
    @line_magic
    def dist_barrier(self, line: str) -> None:
        """Wait until every rank reaches a %dist_barrier."""
        args = parse_argstring(self.dist_barrier, line)
        waited = self.session.barrier(magicflags.seconds("--timeout", args.timeout))
        world = self.session.world
        assert world is not None  # barrier() required it
        print(f"nbdist: all {world.world_size} ranks met (waited {waited * 1000:.1f} ms)")

    @magic_arguments()
    @argument("--ops", default=None, help="comma list of all_reduce, all_gather, reduce_scatter, broadcast, "
                                          "all_to_all, send_recv, or all (default: all)")
    @argument("--sizes", default=None, help="S in bytes, as nccl-tests: MIN:MAX doubling, one size, or a comma list; "
                                            "K, M, G are 1024-based (default 8:16M)")
    @argument("--iters", default=None, help="timed iterations per op and size (default 20)")
    @argument("--warmup", default=None, help="untimed iterations first (default 5)")
    @argument("--dtype", default=None, help="torch dtype of the buffers (default float32)")
    @line_magic
    def dist_bench(self, line: str) -> Any:
        """Measure the collectives' bandwidth on every rank; show a table and a log-log plot of busbw.

        Per op and size S: the median time over the iterations on each rank, the slowest rank's
        median; algbw = S / time; busbw = algbw x nccl-tests' factor for the op and world size
        (all_reduce 2(n-1)/n; all_gather, reduce_scatter, all_to_all (n-1)/n; broadcast, send_recv
        1). S is each rank's buffer (all_reduce, broadcast, send_recv) or the whole gathered or
        scattered buffer (all_gather, reduce_scatter, all_to_all), rounded down to whole elements
        and chunks. The raw torch functions are timed on the world's device (synchronised after
        each iteration on cuda and npu), without nbdist's checks; send_recv is a ring, as in
        nccl-tests (each rank sends S to rank+1 while it receives S from rank-1). Runs on every
        rank like a %%collective (followers too; peer notebooks each run the same %dist_bench).
        The defaults take 10-15 s on 2 CPU ranks (gloo on loopback).

        Returns the results, a list of dicts (op, size, count, time_us, algbw_gbps, busbw_gbps,
        ...): ``r = %dist_bench`` keeps them; shown as Out they take one line. The stop button
        shows the sizes measured so far, then ends the cell with KeyboardInterrupt (the other
        ranks' with PeerFailedError).
        """
        from .measure import bench

        args = parse_argstring(self.dist_bench, line)
        world = self.session.require_world("%dist_bench")
        try:
            spec = bench.spec(args.ops, args.sizes, args.iters, args.warmup, args.dtype, world.world_size)
        except ConfigError as exc:
            raise UsageError(str(exc)) from None
        return bench.run_shown(self.session, spec)

    @magic_arguments()
    @argument("--threads", action="store_true", help="every thread's stack, not only the cell's (the main thread)")
    @argument("--native", action="store_true", help="native frames too (C++ inside gloo, NCCL or HCCL), through "
                                                    "py-spy (pip install 'nbdist[debug]'); else the reason")
    @argument("--timeout", default=10.0, metavar="S",
              help="seconds to wait for every rank's answer (default 10)")
    @line_magic
    def dist_where(self, line: str) -> None:
        """Show where every rank is now, also while their cells run: stacks, collectives, native frames.

        Every rank answers from its heartbeat thread, not the cell's: its Python
        stack (merged into one tree whose branches are labelled with rank sets,
        the cell's frames as cell lines) and torch's Flight Recorder, matched
        across ranks by torch's own analyser: per process group, the last
        collective every member completed and the first where members differ or
        are missing ("all_reduce #4: rank 0 entered, rank 1 missing"). The
        request and the answers go through the rendezvous server, signed with
        the world's key; nothing listens on a new port. From a terminal, while
        this notebook is busy: nbdist where --master-addr ADDR [--master-port P].
        """
        args = parse_argstring(self.dist_where, line)
        print(self.session.where(args.threads, args.native, magicflags.seconds("--timeout", args.timeout)))

    @magic_arguments()
    @argument("rank", nargs="?", help="the rank to debug (default: the first rank whose body failed in the last "
                                      "cell shown here, else this notebook's own)")
    @argument("--timeout", default=10.0, metavar="S", help="seconds to wait for the rank to answer (default 10)")
    @line_magic
    def dist_pdb(self, line: str) -> None:
        """Open the debugger at a rank's failing frame after a %%collective failed, like %debug.

        Each rank keeps the traceback of its last failed %%collective body until
        its next %%collective starts (nothing for a body that succeeded). For
        this notebook's own rank it is IPython's post-mortem, as %debug. For
        another rank (a driven world's workers, another peer notebook), that
        rank runs IPython's debugger on its kept frames in a thread of its own,
        while its kernel is idle between cells, and its input and output come
        here through the rendezvous server: the prompt is labelled with the
        rank (rank 5 (host) ipdb>), and each line typed is signed with the
        world's key for that rank only. q or c ends it; so does the stop button
        while the prompt waits (an empty line repeats the last command, as in pdb).
        """
        args = parse_argstring(self.dist_pdb, line)
        world = self.session.require_world("%dist_pdb")
        if args.rank is None:
            failing = outcome_view.failing_ranks(self.last_outcome.captures if self.last_outcome else [])
            rank = failing[0] if failing else world.rank
        else:
            try:
                rank = int(args.rank)
            except ValueError:
                raise UsageError(f"%dist_pdb: {args.rank!r} is not a rank (0..{world.world_size - 1})") from None
        if not 0 <= rank < world.world_size:
            raise UsageError(f"%dist_pdb: this world has ranks 0..{world.world_size - 1}, not {rank}")
        self.session.pdb(rank, magicflags.seconds("--timeout", args.timeout))

    @line_magic
    def dist_stop(self, line: str) -> None:
        """End the cell every other rank is running, within 2 s; each fails naming this notebook.

        Like the stop button, pressed in every notebook at once; the process
        group is rebuilt at the next cell that uses it, if a collective was
        waiting. From a terminal: nbdist stop --master-addr ADDR [--master-port P].
        """
        n = self.session.stop_all()
        print(f"nbdist: stop #{n} sent to every rank of this world")

    @magic_arguments()
    @argument("--quiet", action="store_true",
              help="show only errors, not each cell's source and table (the workers of --spawn follow this way)")
    @line_magic
    def dist_follow(self, line: str) -> None:
        """Follow the driving notebook: run, in lockstep, every %%collective cell it runs, and show it here.

        Any joined notebook drives by running a %%collective while others
        follow. Each cell arrives through the rendezvous server, signed with a
        key derived from the world's token (a world on one machine without a
        token gets a random key); a cell that does not verify is refused and
        nothing of it runs. Following ends when the driver runs %dist_release
        or leaves, or with this notebook's stop button; the notebook stays in
        the world and runs its own cells again.
        """
        args = parse_argstring(self.dist_follow, line)
        world = self.session.require_world("%dist_follow")
        rank, quiet = world.rank, args.quiet
        show = follow.Shows(
            source=None if quiet else lambda m: display(Source(f"nbdist: {world.describe(m.driver)} runs "
                                                               f"%%collective #{m.number}:", m.source)),
            outcome=(lambda o: None) if quiet else self._show,
            error=lambda e: print(f"{type(e).__name__}: {e}", file=sys.stderr),
            barrier=lambda waited: print(f"nbdist: all ranks met at the driver's %dist_barrier "
                                         f"(waited {waited * 1000:.1f} ms)"),
            started=lambda: print(f"nbdist: rank {rank} follows: it runs every %%collective the driving notebook "
                                  "runs, shown here (the stop button stops following)"),
            tables=not quiet,
        )
        try:
            why = self.session.follow(show)
        except KeyboardInterrupt:
            print(f"nbdist: stopped following (the stop button); this notebook stays in the world as rank {rank} "
                  "and runs its own cells again")
            return
        print(f"nbdist: {why}")

    @line_magic
    def dist_release(self, line: str) -> None:
        """Stop driving: the followers stop following and run their own cells again (lockstep)."""
        if self.session.release():
            print("nbdist: released the world; its followers run their own cells again")
        else:
            print("nbdist: this notebook does not drive the world")

    dashboard: Any = None  # the %dist_dashboard running in this kernel (nbdist.measure.dashboard.Dashboard), if any

    @magic_arguments()
    @argument("--once", action="store_true",
              help="print one text snapshot and return: no widget, no thread (nbconvert, headless runs)")
    @argument("--stop", action="store_true", help="stop the dashboard running here; its last snapshot stays")
    @line_magic
    def dist_dashboard(self, line: str) -> None:
        """Show every rank live: joined or left, heartbeat, host, device, what it does, its last error.

        An ipywidgets panel, updated at most twice a second from a background
        thread (on a connection of its own to the rendezvous server) while
        other cells of this notebook run. "What it does": the %%collective it
        runs, the collective it has been inside for over 0.5 s, or the barrier
        it waits at. Its "stop all ranks" button does what %dist_stop does,
        once this kernel is idle (a cell running here holds the click: the
        toolbar's stop button ends that cell). Where widgets do not render
        (nbconvert, a terminal) the output's text is a snapshot, the last one
        once the dashboard stops. It stops with %dist_destroy, %unload_ext
        nbdist, kernel exit, leaving the world (a new %%dist_init), --stop, or
        a new %dist_dashboard.
        """
        args = parse_argstring(self.dist_dashboard, line)
        if args.stop:
            self._stop_dashboard("%dist_dashboard --stop")
            return
        from .measure.dashboard import Dashboard, snapshot

        self.session.require_world("%dist_dashboard")
        if self.session.hooks.active is not None:
            raise UsageError("%dist_dashboard shows this notebook's own panel: run it in a plain cell, not in a "
                             "%%collective")
        if args.once:
            print(snapshot(self.session))
            return
        self._stop_dashboard("replaced by a new %dist_dashboard")
        self.dashboard = Dashboard.start(self.session)
        self.dashboard.show()

    def _stop_dashboard(self, why: str) -> None:
        """Stop the running %dist_dashboard, if any (idempotent)."""
        if self.dashboard is not None:
            self.dashboard.stop(why)
            self.dashboard = None

    @line_magic
    def dist_destroy(self, line: str) -> None:
        """Leave the world: destroy the process group; other ranks see it in %dist_status."""
        if self.session.world is None:
            print("nbdist: this notebook is not in a world")
            return
        self._stop_dashboard("this notebook left the world (%dist_destroy)")
        self.session.leave()
        print("nbdist: left the world (a rendezvous server hosted here keeps running)")


def registered() -> DistMagics | None:
    """This kernel's nbdist magics (and so its session), if the extension is loaded."""
    from IPython import get_ipython

    shell = get_ipython()
    return shell.magics_manager.registry.get(_NAME) if shell is not None else None
