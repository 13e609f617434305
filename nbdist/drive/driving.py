"""What one kernel drives or follows: its drive, whether it follows now, what runs it, and its spawned workers.

The session holds one :class:`KernelDrive` for the kernel's life; a world's leaving releases the drive and
ends the workers (:mod:`nbdist.drive.follow`, :mod:`nbdist.drive.workers`, :mod:`nbdist.drive.slurm`).
"""

from __future__ import annotations

import logging
from collections.abc import Callable

from ..cell.stopper import Stopper
from ..errors import DriveError, StoreConnectionError
from ..world import signing
from ..world.world import World
from . import follow
from .slurm import SlurmJob
from .workers import Workers

log = logging.getLogger(__name__)


def _note(world: World, why: str) -> None:
    """Say why following ended in this rank's note: nobody sees a spawned worker's output, but ``%dist_status``
    and the message of a rank that waits for it show its note."""
    try:
        world.notes.write(why[:300])
    except StoreConnectionError as exc:  # the server is gone: nobody to tell
        log.info("could not note why following ended: %s", exc)


class KernelDrive:
    """See the module docstring. ``session``: this kernel's session id, which its claims of the drive name."""

    def __init__(self, session: str) -> None:
        self.drive = follow.Drive(session)  # driving followers (nbdist.drive.follow)
        self.following = False
        self.process = "kernel"  # what runs this rank: a kernel, or "nbdist follow" (a process with no kernel)
        self.workers: Workers | SlurmJob | None = None  # the followers of %dist_init --spawn

    def drives(self) -> bool:
        """Whether this notebook drives: it spawned its followers, or holds the drive of its world."""
        return self.workers is not None or self.drive.holding

    def restarts(self) -> dict[int, list[float]]:
        """When (``time.monotonic()``) each spawned follower's process was started again, by rank."""
        return {} if self.workers is None else self.workers.restart_times()

    def follow(self, host: follow.FollowHost, world: World, session: str, secret: Callable[[], str],
               show: follow.Shows, stopper: Stopper) -> follow.Ended:
        """%dist_follow: run the driving notebook's cells until it releases or leaves; returns why it ended."""
        if self.drive.holding:
            raise DriveError("this notebook drives the world: run %dist_release here first, then %dist_follow")
        follower = follow.Follower(world, session, secret())
        self.following = True
        stopper.disarm()  # between the driver's cells, only the stop button ends the wait
        why = "stopped following"
        try:
            ended = follow.run(host, follower, show)
            why = f"stopped following: {ended.why}"
            return ended
        except BaseException as exc:
            why = f"stopped following: {type(exc).__name__}" + (f": {exc}" if str(exc) else "")
            raise
        finally:
            self.following = False
            _note(world, why)

    def release(self, world: World | None, secret: Callable[[], str]) -> bool:
        """%dist_release: stop driving; the followers run their own cells again. True if this notebook drove."""
        if world is None or not self.drive.holding:
            return False
        return self.drive.release(world, secret)

    def leave(self, world: World, secret: Callable[[], str]) -> None:
        """Leaving ``world``: the followers are told, if this notebook drives them."""
        try:
            if self.drive.holding:
                self.drive.release(world, secret, "left the world (%dist_destroy, a new %%dist_init, "
                                                  "or its kernel exits)")
        except (StoreConnectionError, signing.SigningError) as exc:
            log.info("could not release the drive: %s", exc)

    def reset(self, session: str) -> None:
        """The last of leaving: a drive not held, and no workers (their follow loops end as they see this rank
        leave)."""
        self.drive = follow.Drive(session)
        if self.workers is not None:
            self.workers.shutdown()
            self.workers = None
