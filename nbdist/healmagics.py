"""The magics of a world that heals: the workers this notebook started (``%dist_workers``), and what brings back
the state of a rank whose kernel was started again (``%dist_replay``, ``%dist_sync``). Thin, as
:mod:`nbdist.magics`: parse, call, display."""

from __future__ import annotations

from typing import Any

from IPython.core.error import UsageError
from IPython.core.magic import Magics, magics_class
from IPython.core.magic_arguments import parse_argstring
from IPython.display import display

from . import config
from .cell import cells
from .divergemagics import DivergeMagics
from .errors import ConfigError
from .heal import replay, sync
from .magicflags import argument, line_magic, magic_arguments
from .magics import DistMagics
from .session import Session
from .view.display import workers_table

NAME = "HealMagics"


@magics_class
class HealMagics(Magics):
    """nbdist's magics for its workers and restarted ranks, on :class:`DistMagics`' session."""

    def __init__(self, shell: Any, dist: DistMagics) -> None:
        super().__init__(shell)
        self.dist = dist  # the session, and the %%collective a sync runs as

    @property
    def session(self) -> Session:
        return self.dist.session

    @line_magic
    def dist_workers(self, line: str) -> None:
        """Show the followers this notebook started (%dist_init --spawn): rank, pid, state, device, last lines;
        for local workers also their restarts (n of --max-restarts within the window) and how each kernel ended.

        For --slurm: the job's id and state, and each rank's node.
        """
        workers = self.session.workers
        if workers is None:
            print("nbdist: this notebook started no workers (%dist_init --spawn N [--slurm OPTIONS] starts them)")
            return
        rows = workers.rows()
        ranks = self.session.world.registrations() if self.session.world is not None else []
        title = getattr(workers, "title", lambda: f"nbdist workers · {len(rows)} kernel(s) started by this notebook")
        display(workers_table(title(), rows, ranks, lambda: {r["rank"]: r["alive"] for r in self.session.status()}))

    @magic_arguments()
    @argument("names", nargs="+", metavar="NAME", help="what to copy: tensors, modules and optimizers (their state, "
                                                        "into the receiving rank's own), plain values")
    @argument("--from", dest="source", metavar="RANK", help="the rank to copy from (default: the lowest that keeps it)")
    @argument("--to", metavar="RANKS", help="the ranks to copy to, e.g. 1,3 (default: the workers started again since "
                                            "they died, else the ranks that lack the name)")
    @argument("--timeout", default=config.TIMEOUTS["barrier"],
              help=f"seconds each barrier waits for the other ranks (default {config.TIMEOUTS['barrier']:g})")
    @line_magic
    def dist_sync(self, line: str) -> None:
        """Copy what a surviving rank holds under NAME... to a rank that lost it (its kernel was started again).

        Runs as one %%collective on every rank: tensors (and a module's state) go through torch.distributed, an
        optimizer's state and plain values (numbers, text, and lists, tuples and dicts of them and of tensors) as
        torch.save's bytes read back with weights_only, never the store and never another object. A name whose
        value differs between the ranks that keep it is rank-specific state, and is not copied; nor is an object
        of another kind, nor a module or optimizer the receiving rank has none of (%dist_replay makes it again).
        Each rank's column says what it sent, received or why not. In peer notebooks, run it in every notebook.
        """
        args = parse_argstring(self.dist_sync, line)
        world = self.session.require_world("%dist_sync")
        restarted: list[int] = getattr(self.session.workers, "restarted", lambda: [])()
        try:
            body = sync.command(args.names, args.source, args.to, world.world_size, restarted)
        except ConfigError as exc:
            raise UsageError(str(exc)) from None
        self.dist.collective(f"--timeout {args.timeout}", body)


    @magic_arguments()
    @argument("--ranks", metavar="RANKS", help="the ranks to replay on, e.g. 1,3 (default: the workers whose kernel "
                                               "was restarted since their last replay)")
    @line_magic
    def dist_replay(self, line: str) -> None:
        """Run again, on a restarted rank alone, this world's earlier %%collective cells that called no collective.

        A worker whose kernel died and was started again has a new namespace: this runs the cells that defined it
        again there (imports, model and data set-up), in order, as one %%collective --ranks step, and stops at the
        first that raises. It names the cells it leaves: those in which any rank called a collective (%dist_sync
        NAME... --from RANK copies such state from a survivor), those that failed, and --ranks cells that did not
        run on that rank. In a driving notebook (one that spawned workers or drives followers) it replays on the
        workers restarted since their last replay, or on --ranks. In peer notebooks, run it in every notebook once
        the restarted one ran %%dist_init again: the lowest surviving rank sends its record of the cells, and each
        rank whose kernel is new runs those that ended before it joined.
        """
        args = parse_argstring(self.dist_replay, line)
        world = self.session.require_world("%dist_replay")
        if not self.session.driving.drives():
            if args.ranks is not None:
                raise UsageError("%dist_replay --ranks runs in a driving notebook; in peer notebooks, run "
                                 "%dist_replay in every notebook: it replays on the ranks whose kernel is new")
            self.dist._run(replay.SHARED, cells.Flags(config.TIMEOUTS["barrier"]), kept=False)
            return
        try:
            plan = replay.prepare(self.session.history, args.ranks, world.world_size, world.rank,
                                  self.session.driving.restarts())
        except ConfigError as exc:
            raise UsageError(f"%dist_replay {exc}") from None
        print("\n".join(plan.said))
        if plan.ranks:
            self.dist._run(plan.body, cells.Flags(config.TIMEOUTS["barrier"], ranks=plan.ranks), kept=False)
        self.session.history.answered(plan.answers)

def replay_here(shell: Any) -> None:
    """A peer notebook's ``%dist_replay`` on this rank (:func:`nbdist.heal.replay.shared`, the body every rank runs)."""
    magics = shell.magics_manager.registry.get(NAME)
    if magics is None:
        raise UsageError("%dist_replay: nbdist is not loaded in this kernel")
    history = magics.session.history
    if replay.shared(shell, history.entries, history.joined_after):
        history.joined_after = None  # answered: a second %dist_replay has nothing to do here


CLASSES = (DistMagics, HealMagics, DivergeMagics)  # every class of nbdist's magics, as %load_ext registers them


def magic_function(kind: str, name: str) -> Any:
    """The function of nbdist's ``kind`` ("line" or "cell") magic ``name``, or None."""
    for cls in CLASSES:
        method = cls.magics[kind].get(name)
        if method is not None:
            return getattr(cls, method)
    return None
