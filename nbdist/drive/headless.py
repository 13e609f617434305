"""``nbdist follow``: a follower with no Jupyter kernel, for any launcher (srun, sbatch, torchrun, mpirun, ssh).

It is the ``%dist_follow`` loop in a plain IPython shell: the process loads the
extension, joins as its rank (:mod:`nbdist.drive.launchers`), runs every cell
the driving notebook sends until it is released, and exits. What its cells show
goes to the driver's table, as for ``--spawn`` workers; this process prints one
line per state change. Exit status: 0 when the driver released the world or
left it, 1 when following failed (a refused token, no master, a refused cell,
a driver gone), 2 for bad arguments, 130 on Ctrl-C or SIGTERM (``scancel``).
"""

from __future__ import annotations

import argparse
import os
import signal
import sys
from collections.abc import Callable, Mapping
from typing import Any

from .. import config
from ..backend import envplan
from ..config import DEFAULT_PORT
from ..errors import ConfigError, NbdistError
from . import follow, launchers

# What a launcher sets for its own processes that must not decide this rank's world.
LAUNCHER_OWN = ("RANK", "WORLD_SIZE", "LOCAL_RANK", "MASTER_ADDR", "MASTER_PORT", "DEVICE_ID", "BACKEND")


def add_arguments(parser: argparse.ArgumentParser) -> None:
    """``nbdist follow``'s flags (the ``%dist_init`` flags a worker takes, and where rank and size come from)."""
    parser.add_argument("--rank", type=int, default=None,
                        help="this rank (default: the launcher's rank, SLURM_PROCID, OMPI_COMM_WORLD_RANK, PMI_RANK "
                             "or torchrun's RANK, plus --rank-offset)")
    parser.add_argument("--world-size", type=int, default=None,
                        help="ranks in the world, the driver included (default: the launcher's task count plus "
                             "--rank-offset)")
    parser.add_argument("--rank-offset", type=int, default=1,
                        help="added to the launcher's rank and count (default 1: the driving notebook is rank 0)")
    parser.add_argument("--master-addr", default=None, help="the driver's address (else NBDIST_MASTER_ADDR)")
    parser.add_argument("--master-port", type=int, default=None,
                        help=f"the rendezvous port (else NBDIST_MASTER_PORT, else {DEFAULT_PORT})")
    parser.add_argument("--token", default=None, help="the world's token (else NBDIST_TOKEN); never shown")
    parser.add_argument("--backend", default=None, help="auto (default), gloo, nccl or hccl")
    parser.add_argument("--device", default=None,
                        help="this rank's device (default: the launcher's local rank, e.g. npu:3 for SLURM_LOCALID 3)")
    parser.add_argument("--timeout", type=float, default=None,
                        help=f"seconds to wait for the world to form (default {config.TIMEOUTS['join']:g})")
    parser.add_argument("--pg-timeout", default=None, help="seconds before a stuck collective fails")
    parser.add_argument("--debug", nargs="?", const="files", choices=("files", "stdout"),
                        help="the backend's diagnostics, as %%dist_init --debug")
    parser.add_argument("--env", action="append", metavar="KEY=VALUE", help="a backend variable (repeatable)")


def plan(args: argparse.Namespace, environ: Mapping[str, str]) -> tuple[dict[str, Any], launchers.Placement]:
    """The flags for :func:`nbdist.config.resolve`, and this process's placement; raise ConfigError."""
    placement = launchers.place(environ, args.rank, args.world_size, args.rank_offset)
    addr = args.master_addr or environ.get("NBDIST_MASTER_ADDR") or None
    if addr is None:
        raise ConfigError("no master address: pass --master-addr or set NBDIST_MASTER_ADDR (the driving notebook's "
                          "address, one this node can reach)")
    port = args.master_port if args.master_port is not None else environ.get("NBDIST_MASTER_PORT") or DEFAULT_PORT
    device = args.device
    if device is None and placement.local_rank is not None:
        device = str(placement.local_rank)  # an index: cuda:N or npu:N where there are devices, else cpu
    flags = {"rank": placement.rank, "world_size": placement.world_size, "master_addr": addr, "master_port": port,
             "backend": args.backend, "device": device, "timeout": args.timeout, "debug": args.debug,
             "pg_timeout": args.pg_timeout, "token": args.token or environ.get("NBDIST_TOKEN") or None,
             "env": envplan.parse_overrides(args.env)}
    return flags, placement


class Lines:
    """The one line per state change this process prints (flushed at once: a launcher's log may be all one sees)."""

    def __init__(self, rank: int | None = None) -> None:
        self.rank = rank

    def __call__(self, text: str) -> None:
        who = f"rank {self.rank}: " if self.rank is not None else ""
        sys.stdout.write(f"nbdist follow: {who}{text}\n")  # one write: a launcher merges the tasks' lines
        sys.stdout.flush()


def run(args: argparse.Namespace, make_session: Callable[[], Any]) -> int:
    """``nbdist follow``: join, follow until released, leave; returns the exit status.

    ``make_session``: the session of a plain IPython shell with nbdist loaded (the shell runs the cells, as a
    kernel does), made once the flags are known to be good.
    """
    say = Lines()
    try:
        flags, placement = plan(args, os.environ)
        cfg = config.resolve(flags, {}, {k: v for k, v in os.environ.items() if k not in LAUNCHER_OWN})
    except ConfigError as exc:
        say(f"failed: {exc}")
        return 2
    say.rank = cfg.rank
    for key in LAUNCHER_OWN:  # the launcher's own rank settings are not this rank's; nbdist sets its own
        os.environ.pop(key, None)
    terminated: list[int] = []

    def on_term(signum: int, _frame: Any) -> None:
        terminated.append(signum)
        raise KeyboardInterrupt

    signal.signal(signal.SIGTERM, on_term)
    session = make_session()
    try:
        where = ", ".join(f"{key.replace('_', ' ')} from {src}" for key, src in placement.sources.items())
        say(f"joining {cfg.master_addr}:{cfg.master_port} as rank {cfg.rank} of {cfg.world_size} ({where})")
        session.process = "nbdist follow"  # the others' messages about this rank say so
        session.init(cfg)
        session.fill_namespace()
        world = session.world
        say(f"joined: {world.describe(cfg.rank)}, device {session.device}")
        show = follow.Shows(
            source=lambda m: say(f"cell #{m.number} from {world.describe(m.driver)}"),
            outcome=lambda _outcome: None,  # the driver's table shows it
            error=lambda e: say(f"the cell ended in an error (the driver's table shows it): {type(e).__name__}: "
                                f"{_first_line(e)}"),
            barrier=lambda waited: say(f"barrier (waited {waited:.2f} s)"),
            started=lambda: say("following: it runs every %%collective cell the driving notebook runs"),
            tables=False,
        )
        ended = session.follow(show)
    except KeyboardInterrupt:
        say("stopped by " + ("SIGTERM (scancel, or the launcher)" if terminated else "Ctrl-C") + "; leaving")
        return 130
    except NbdistError as exc:
        say(f"failed: {type(exc).__name__}: {_first_line(exc)}")
        return 1
    finally:
        signal.signal(signal.SIGTERM, signal.SIG_DFL)
        try:
            session.close()
        except NbdistError as exc:
            say(f"could not leave cleanly: {_first_line(exc)}")
    if ended.released:
        say(f"released: {ended}")
        return 0
    say(f"failed: {ended}")
    return 1


def _first_line(exc: BaseException) -> str:
    text = str(exc).strip()
    return text.splitlines()[0] if text else type(exc).__name__

