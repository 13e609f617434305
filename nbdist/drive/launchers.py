"""Which rank a process is, from the launcher that started it: Slurm, Open MPI, PMI, torchrun.

``nbdist follow`` runs under any of them; its rank in the world is the launcher's
rank plus an offset (the driving notebook is rank 0), and its device index is the
launcher's local rank, so eight followers on an eight-NPU node take one NPU each.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass

from ..errors import ConfigError


@dataclass(frozen=True)
class Launcher:
    """Where one launcher puts a process's rank, the number of processes and the rank on its node."""

    name: str
    rank: str
    size: str
    local_rank: str
    marker: str = ""  # a variable that only this launcher sets; else ``rank``


# The most specific first: torchrun or mpirun may run inside a Slurm allocation, whose variables stay set.
LAUNCHERS = (
    Launcher("torchrun", "RANK", "WORLD_SIZE", "LOCAL_RANK", marker="TORCHELASTIC_RUN_ID"),
    Launcher("Open MPI", "OMPI_COMM_WORLD_RANK", "OMPI_COMM_WORLD_SIZE", "OMPI_COMM_WORLD_LOCAL_RANK"),
    Launcher("PMI", "PMI_RANK", "PMI_SIZE", "MPI_LOCALRANKID"),
    Launcher("Slurm", "SLURM_PROCID", "SLURM_NTASKS", "SLURM_LOCALID"),
    Launcher("the environment", "RANK", "WORLD_SIZE", "LOCAL_RANK"),
)


@dataclass(frozen=True)
class Placement:
    """This process's place in the world, and where each part came from."""

    rank: int
    world_size: int
    local_rank: int | None  # None: no launcher said; the device then follows the ranks on this host
    sources: dict[str, str]


def detect(environ: Mapping[str, str]) -> Launcher | None:
    """The launcher that started this process, or None."""
    for launcher in LAUNCHERS:
        if environ.get(launcher.marker or launcher.rank, "") != "" and environ.get(launcher.rank, "") != "":
            return launcher
    return None


def _int(name: str, value: str) -> int:
    try:
        return int(value.strip())
    except ValueError:
        raise ConfigError(f"{name} must be an integer, not {value!r}") from None


def place(environ: Mapping[str, str], rank: int | None = None, world_size: int | None = None,
          offset: int = 1) -> Placement:
    """This follower's rank and world size: the flags, else the launcher's rank and task count plus ``offset``.

    Raises :class:`ConfigError` naming what is missing or does not fit.
    """
    if offset < 0:
        raise ConfigError(f"--rank-offset must be 0 or more, not {offset}")
    launcher = detect(environ)
    sources: dict[str, str] = {}
    local = None
    if launcher is not None and environ.get(launcher.local_rank, "") != "":
        local = _int(launcher.local_rank, environ[launcher.local_rank])
        sources["local_rank"] = f"{launcher.local_rank} ({launcher.name})"
    if rank is None:
        if launcher is None:
            names = ", ".join(sorted({lc.rank for lc in LAUNCHERS}))
            raise ConfigError(f"no rank: pass --rank, or start nbdist follow with a launcher that sets one of {names}")
        rank = _int(launcher.rank, environ[launcher.rank]) + offset
        sources["rank"] = f"{launcher.rank} ({launcher.name}) + offset {offset}"
    else:
        sources["rank"] = "--rank"
    if world_size is None:
        if launcher is None or environ.get(launcher.size, "") == "":
            unset = "" if launcher is None else f" (the launcher, {launcher.name}, set no {launcher.size})"
            raise ConfigError(f"no world size: pass --world-size{unset}")
        world_size = _int(launcher.size, environ[launcher.size]) + offset
        sources["world_size"] = f"{launcher.size} ({launcher.name}) + offset {offset}"
    else:
        sources["world_size"] = "--world-size"
    if not 0 <= rank < world_size:
        raise ConfigError(f"rank {rank} is not in a world of {world_size} ({sources['rank']}; {sources['world_size']})")
    return Placement(rank, world_size, local, sources)
