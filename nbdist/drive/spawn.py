"""What ``%dist_init --spawn N`` means: this notebook as rank 0 of N, and who starts the others.

On 127.0.0.1 with local worker kernels (:mod:`nbdist.drive.workers`), or, with
``--slurm "OPTIONS"``, on an address the cluster's nodes reach, with one Slurm
job of ``nbdist follow`` tasks (:mod:`nbdist.drive.slurm`).
"""

from __future__ import annotations

import ipaddress
import secrets
import shlex
import socket
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any

from ..backend import envplan
from ..config import DEFAULT_PORT, RUN_VARIABLE
from ..errors import ConfigError
from ..world import netinfo
from ..world.store import listening
from . import restarts, slurm
from .slurm import SlurmJob
from .workers import Workers

MASTER = "127.0.0.1"
FALLBACK_PORTS = (*range(DEFAULT_PORT + 1, DEFAULT_PORT + 100), *range(20000, 20100))


@dataclass
class Plan:
    flags: dict[str, Any]  # for config.resolve: this notebook's flags, as rank 0
    worker_flags: str  # the workers' %dist_init flags beside --rank/--world-size/--master-*
    sources: dict[str, str] = field(default_factory=dict)
    note: str = ""  # shown while the workers start (a port other than the one asked for)
    slurm: list[str] | None = None  # sbatch's options: the followers are one Slurm job, not local kernels
    max_restarts: int = restarts.DEFAULT_MAX  # how often a follower that dies is started again (0: never)
    held: socket.socket | None = None  # the port this plan chose, listening, until the server takes it

    def take_port(self) -> socket.socket | None:
        """The socket holding the port the plan chose (None: --master-port chose it), for the rendezvous server
        (:class:`nbdist.world.store.Server`); the plan holds it no longer."""
        held, self.held = self.held, None
        return held

    def release(self) -> None:
        """Close the port's socket if nothing took it (the world was not formed); idempotent."""
        held = self.take_port()
        if held is not None:
            held.close()

    def followers(self) -> Workers | SlurmJob:  # (the field `slurm` hides the module in this class's scope)
        """What starts ranks 1..N-1 and stops them with the world (not started yet)."""
        f = self.flags
        if self.slurm is not None:
            return slurm.SlurmJob(f["world_size"], f["master_addr"], f["master_port"], f["token"], self.worker_flags,
                                  self.slurm, self.max_restarts)
        return Workers(f["world_size"], f["master_port"], f["token"], self.worker_flags, self.max_restarts)


def reserve_port(addr: str = MASTER) -> tuple[socket.socket, str]:
    """A socket listening on 29500 if nothing holds it on ``addr``, else on a free port below the ephemeral range;
    and a note saying so. It holds the port until the rendezvous server takes it over (:meth:`Plan.take_port`):
    nothing else can take it meanwhile, not even another notebook's ``--spawn`` that looks at the same moment."""
    for port in (DEFAULT_PORT, *FALLBACK_PORTS):
        try:
            held = listening(addr, port)
        except OSError:
            continue
        return held, "" if port == DEFAULT_PORT else f" (port {DEFAULT_PORT} is busy: using {port})"
    raise ConfigError(f"no free TCP port on {addr} for the world: pass --master-port")


def from_namespace(namespace: Mapping[str, Any], environ: Mapping[str, str]) -> str | None:
    """``SPAWN = N`` in the notebook (a course notebook's parameters) as ``--spawn N``; 0, None or False: none.

    Not in a copy that ``nbdist run`` started as one rank of several (``NBDIST_RUN``): the runner chose its rank."""
    if environ.get(RUN_VARIABLE):
        return None
    value = namespace.get("SPAWN")
    if value is None or value is False or value == 0 or value == "":
        return None
    return str(value)


def restarts_from_namespace(namespace: Mapping[str, Any]) -> str | None:
    """``MAX_RESTARTS = K`` in the notebook (``nbdist run --spawn --max-restarts K`` sets it) as ``--max-restarts
    K``, for a notebook that spawns; None where it has none."""
    value = namespace.get("MAX_RESTARTS")
    return None if value is None else str(value)


def plan(args: Any, environ: Mapping[str, str]) -> Plan:
    """The world ``--spawn N`` forms, from the %dist_init flags; raise ConfigError for flags it cannot take."""
    try:
        n = int(str(args.spawn))
    except ValueError:
        raise ConfigError(f"--spawn takes the number of ranks, not {args.spawn!r}") from None
    if n < 2:
        raise ConfigError(f"--spawn N needs N >= 2 (this notebook and at least one worker), not {n}")
    options = getattr(args, "slurm", None)
    given_max = getattr(args, "max_restarts", None)
    try:
        max_restarts = restarts.DEFAULT_MAX if given_max is None else restarts.parse_max(given_max)
    except ValueError as exc:
        raise ConfigError(str(exc)) from None
    given = [flag for flag, value in (("--rank", args.rank), ("--world-size", args.world_size),
                                      ("--master-addr", None if options is not None else args.master_addr))
             if value is not None]
    if given:
        where = "on an address the nodes reach" if options is not None else f"on {MASTER}"
        raise ConfigError(f"--spawn {n} makes this notebook rank 0 of {n} {where}: leave out {', '.join(given)}")
    sources = {"rank": "--spawn", "world_size": "--spawn", "master_addr": "--spawn"}
    addr, words = MASTER, None
    if options is not None:
        words = slurm.check_options(options)
        missing = slurm.missing_commands()
        if missing:
            raise ConfigError(f"--slurm needs Slurm's {', '.join(slurm.COMMANDS)} commands on PATH; this machine "
                              f"lacks {', '.join(missing)}")
        addr = reachable_address(args.master_addr)
        sources["master_addr"] = "--master-addr" if args.master_addr else "this host's name"
    env = envplan.parse_overrides(args.env)
    token = args.token or environ.get("NBDIST_TOKEN") or None
    if token is None:
        token = secrets.token_hex(16)  # the workers get it in their environment, never through the store
        sources["token"] = "--spawn, random"
    note, held = "", None  # the last that may fail: a port held is handed on from here
    if args.master_port is not None:
        port = args.master_port
    else:
        held, note = reserve_port(addr)
        port = held.getsockname()[1]
        sources["master_port"] = f"--spawn: {DEFAULT_PORT} is busy, so a free port" if note else "default"
    flags = {"rank": 0, "world_size": n, "master_addr": addr, "master_port": port, "backend": args.backend,
             "device": args.device, "timeout": args.timeout, "debug": args.debug, "pg_timeout": args.pg_timeout,
             "token": token, "env": env}
    worker = []
    for flag, value in (("--backend", args.backend), ("--timeout", args.timeout), ("--pg-timeout", args.pg_timeout)):
        if value is not None:
            worker += [flag, str(value)]
    if args.debug is not None:
        worker += ["--debug", args.debug]
    for key, value in env.items():
        worker += ["--env", f"{key}={value}"]
    return Plan(flags, shlex.join(worker), sources, note, words, max_restarts, held)


def reachable_address(given: str | None) -> str:
    """Where the nodes of a cluster reach this notebook: ``given``, else this host's name's address; never loopback.

    Raises ConfigError naming --master-addr and this host's other addresses.
    """
    addr = given
    if addr is None:
        try:
            addr = netinfo.resolve(socket.gethostname())
        except OSError:
            addr = "127.0.0.1"
    try:
        loopback = ipaddress.ip_address(netinfo.resolve(addr)).is_loopback
    except (OSError, ValueError):
        raise ConfigError(f"--master-addr {addr!r} does not resolve to an address") from None
    if loopback:
        others = ", ".join(netinfo.host_addresses()) or "none found"
        said = f"--master-addr {addr} is" if given else f"this host's name ({socket.gethostname()}) resolves to {addr},"
        raise ConfigError(f"--slurm: {said} a loopback address, which the other nodes cannot reach: pass --master-addr "
                          f"with this machine's address on the cluster's network (its addresses: {others})")
    return addr
