"""The nbdist error hierarchy.

Every error a user can meet is a :class:`NbdistError`. Each also inherits the
stdlib type it resembles, builds a message that says what to do next, and
renders in a notebook as that one message (``_render_traceback_``) instead of
a traceback through nbdist's internals.
"""

from __future__ import annotations


class NbdistError(Exception):
    """Base class of every error nbdist raises on purpose."""

    def _render_traceback_(self) -> list[str]:
        # IPython calls this instead of formatting a traceback.
        return [f"{type(self).__name__}: {self}"]


class ConfigError(NbdistError, ValueError):
    """A flag, variable or configuration value is invalid."""


class NotInitializedError(NbdistError, RuntimeError):
    """A command needs a world, and this kernel has not joined one."""

    def __init__(self, what: str = "this command") -> None:
        super().__init__(
            f"{what} needs a world: run %%dist_init --rank R --world-size N "
            "--master-addr ADDR in every notebook first"
        )


class StoreConnectionError(NbdistError, ConnectionError):
    """The rendezvous server cannot be reached, or stopped answering."""


class NotNbdistServerError(NbdistError, ConnectionError):
    """Something answers on the master port, but it is not an nbdist server."""


class JoinError(NbdistError, RuntimeError):
    """The world could not be formed (duplicate rank, world-size mismatch...)."""


class TokenError(JoinError):
    """The server wants another token than this notebook's (or none, or one where this notebook has none)."""


class WaitTimeout(NbdistError, TimeoutError):
    """A wait for other ranks ran past its deadline."""


class WorldChangedError(NbdistError, RuntimeError):
    """Another rank re-initialised or left; this rank must re-run %%dist_init."""


class StaleGroupError(NbdistError, RuntimeError):
    """A call holds a process group that nbdist has rebuilt since (a model built before the rebuild)."""


class CollectiveError(NbdistError, RuntimeError):
    """A %%collective cell raised on one or more ranks."""

    def __init__(self, message: str, traceback_text: str = "") -> None:
        super().__init__(message)
        self.traceback_text = traceback_text

    def _render_traceback_(self) -> list[str]:
        lines = [f"{type(self).__name__}: {self}"]
        if self.traceback_text:
            lines = [self.traceback_text.rstrip("\n"), *lines]
        return lines

    def __reduce__(self) -> tuple[type[CollectiveError], tuple[str, str]]:  # keep it picklable with both arguments
        return (type(self), (str(self), self.traceback_text))


class SkippedRanksError(CollectiveError):
    """A collective in a %%collective --ranks cell would wait for ranks that skip the cell, so it was not started."""


class PeerLostError(NbdistError, ConnectionError):
    """A rank stopped responding (no heartbeat): its kernel died, hung hard, or its network went away."""


class PeerFailedError(NbdistError, RuntimeError):
    """Another rank failed, was interrupted, or gave up, so this rank's cell stops too."""


class CellMismatchError(NbdistError, RuntimeError):
    """Ranks entered %%collective with different code."""


class CollectiveMismatchError(NbdistError, RuntimeError):
    """Ranks issued collectives that do not match (op, shape, dtype, root...)."""


class InitProcessGroupError(NbdistError, ValueError):
    """The notebook's code called ``init_process_group`` with a backend, rank or world size the world does not have."""


class DriveError(NbdistError, RuntimeError):
    """Another notebook drives this world, or a follower refused a cell this notebook sent."""


class TurnError(NbdistError, RuntimeError):
    """nbdist's own turn was asked for a move its diagram does not have (:mod:`nbdist.cell.turn`): a ``%%collective``
    run inside another's body (the message says so), else a bug in nbdist. The step is closed, so no other rank
    waits for this one."""


class WorkerError(NbdistError, RuntimeError):
    """A local worker kernel (%dist_init --spawn) could not start or join."""


class ReplayError(NbdistError, RuntimeError):
    """A cell that %dist_replay ran again on a restarted rank raised there; the cells after it were not run."""


class ReplicasDifferError(NbdistError, AssertionError):
    """``nbdist.check_replicas`` found the ranks' models (or optimizers) unequal at a step: it names the step, the
    first entry that differs and the ranks holding each value."""

    def __init__(self, step: int, entry: str, ranks: str, differing: int = 1) -> None:
        self.step, self.entry, self.ranks, self.differing = step, entry, ranks, differing
        others = f" (and {differing - 1} more entr{'y' if differing == 2 else 'ies'})" if differing > 1 else ""
        super().__init__(f"the replicas differ at step {step}: {entry} differs{others}: {ranks}; "
                         f"%dist_compare NAME shows its elements by rank")

    def __reduce__(self) -> tuple[type[ReplicasDifferError], tuple[int, str, str, int]]:
        return (type(self), (self.step, self.entry, self.ranks, self.differing))


class StopRequest(KeyboardInterrupt):
    """Base of the stops nbdist raises inside a running body: like the stop button, user code's
    ``except Exception`` does not catch them. Shown as their one-line message."""

    def _render_traceback_(self) -> list[str]:
        return [f"{type(self).__name__}: {self}"]


class StoppedError(StopRequest):
    """Someone stopped every rank's cell (%dist_stop in a notebook, or nbdist stop in a terminal)."""


class MaxTimeError(StopRequest):
    """A %%collective body ran past its --max-time on some rank, so the cell stops on every rank."""


def by_name(name: str) -> type[NbdistError] | type[StopRequest] | None:
    """The nbdist error class of that name that a cell on another rank can raise with the same message."""
    classes = (CollectiveMismatchError, CellMismatchError, PeerFailedError, PeerLostError, StoreConnectionError,
               WaitTimeout, WorldChangedError, StoppedError, MaxTimeError, SkippedRanksError)
    return next((c for c in classes if c.__name__ == name), None)


class ExportError(NbdistError, ValueError):
    """A notebook has a cell that ``nbdist export`` cannot write as a script (it names the cell and line)."""
