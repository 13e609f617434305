"""A kernel's backend and environment, over its lifetime: before torch is imported, then at each world it joins.

:func:`prepare` runs at ``%load_ext`` (what must be set before torch or torch_npu reads it); at each
``%%dist_init``, :func:`apply_plan` sets the environment plan for the chosen backend, and once the world
formed :func:`route_around_tunnel`, :func:`settle_devices`, :func:`set_environment` and :func:`set_threads`
finish it. They work on the kernel's :class:`~nbdist.backend.state.BackendState`, and are handed the world
where they need it.
"""

from __future__ import annotations

import logging
import os
import sys
from dataclasses import replace

from ..config import DEFAULT_PORT, WorldConfig, validate
from ..errors import ConfigError
from ..world import keys, netinfo
from ..world.world import World
from . import backends, cpplog, envplan, threads, tunnel
from .state import BackendState

log = logging.getLogger(__name__)


def env_lines(plan: list[envplan.EnvVar]) -> list[str]:
    """The plan as a registration shows it (the init summary's "environment" row)."""
    return [f"{v.key}={v.value}  # {v.source}" for v in plan if v.value is not None]


def prepare(b: BackendState) -> None:
    """At ``%load_ext``: what can be set before the master is known, before torch_npu reads it."""
    usable, _, facts = backends.npu_status()
    b.notes = backends.guard_torch_import(facts)
    quiet, b.cpplog_note = cpplog.plan(b.environ.as_user_set(), sys.modules)
    b.environ.set(quiet)  # torch's C++ log level, before torch reads it (only if the user did not set it)
    b.environ.early.update(quiet)
    if b.cpplog_note:
        b.notes.append(b.cpplog_note)
    if "torch_npu" in sys.modules:
        b.npu_seen = {key: os.environ.get(key) for key in envplan.READ_ONCE}
        b.npu_seen_when = "torch_npu was imported before %load_ext nbdist"
    if not usable:
        return
    variables = envplan.early(b.environ.as_user_set(), facts)
    values = {v.key: v.value for v in variables if v.value is not None and v.source == "nbdist"}
    b.environ.set(values)
    b.environ.early.update(values)


def plan_shown(b: BackendState, joined: bool, master_addr: str | None, master_port: str | None,
               backend: str | None, env: list[str] | None, debug: str | None) -> str:
    """%dist_env: the plan for ``backend`` on this host as shell lines; a flag left None is this world's (in a joined
    world its --env and --debug count, as at its %%dist_init; flags given replace them). Raises ConfigError."""
    cfg = b.config
    master = master_addr or (cfg.master_addr if cfg else None)
    if master is None:
        raise ConfigError("pass --master-addr (or run %%dist_init first)")
    port = master_port or (cfg.master_port if cfg else DEFAULT_PORT)
    backend = backend or (b.choice.backend if b.choice else "auto")
    overrides = envplan.parse_overrides(env) if env else (dict(cfg.env) if cfg else {})
    debug = debug if debug is not None else (cfg.debug if cfg else "")
    planned = validate(rank=0, world_size=1, master_addr=master, master_port=port, backend=backend, env=overrides,
                       debug=debug)
    if planned.backend == "auto":
        backend = backends.choose("auto", None, 0).backend
    return envplan.as_shell(plan_for(b, planned, backend, joined))


def plan_for(b: BackendState, cfg: WorldConfig, backend: str, joined: bool) -> list[envplan.EnvVar]:
    """The environment plan for ``backend`` on this host (values nbdist set earlier are not the user's);
    ``joined``: the kernel is in a world, whose interface around a tunnel (if one was chosen) stays."""
    try:
        route = netinfo.route_to(cfg.master_addr, cfg.master_port)
    except OSError as exc:
        raise ConfigError(f"the master address {cfg.master_addr!r} does not resolve or route: {exc}") from None
    npu = b.choice.npu if b.choice is not None and b.choice.backend == backend else None
    if npu is None and backend == "hccl":
        npu = backends.npu_status(count=False)[2]
    variables = envplan.plan(backend, route, b.environ.as_user_set(), cfg.env, cfg.debug, npu)
    chosen = b.around_tunnel if joined else None
    if chosen is not None and tunnel.is_loopback(route.local_ip):  # as at this world's join
        variables = [chosen if v.key == chosen.key and v.source == "nbdist" else v for v in variables]
    return variables


def apply_plan(b: BackendState, cfg: WorldConfig) -> None:
    """The chosen backend's plan, as the kernel joins a world: its variables set, the process group's timeout from
    it."""
    assert b.choice is not None
    b.env_plan = plan_for(b, cfg, b.choice.backend, joined=False)
    b.pg_timeout = envplan.process_group_timeout(b.choice.backend, b.env_plan, cfg.pg_timeout)
    b.environ.set({var.key: var.value for var in b.env_plan if var.value is not None})


def route_around_tunnel(b: BackendState, world: World, cfg: WorldConfig, hosting: bool) -> None:
    """Behind a tunnel or proxy to the master, advertise the interface that routes to the peers (backend.tunnel);
    ``hosting``: this kernel runs the world's store server."""
    choice = b.choice
    assert choice is not None
    chosen, note, addr = tunnel.detour(world.registrations(), world.rank, choice.backend, b.env_plan, cfg.master_addr,
                                       hosting, world.describe)
    b.around_tunnel = chosen
    if note:
        b.notes.append(note)
    if chosen is None:
        if note:
            log.warning("nbdist: %s", note)  # shown at once: the process group may never form
        return
    b.env_plan = [chosen if v.key == chosen.key else v for v in b.env_plan]
    assert chosen.value is not None  # a route's address or interface
    b.environ.set({chosen.key: chosen.value})
    mine = replace(world.ranks[world.rank], addr=addr, env=env_lines(b.env_plan))
    world.ranks[world.rank] = mine
    world.client.set(world.key(keys.rank(world.rank)), mine.to_json())  # for those who read it again


def settle_devices(b: BackendState, world: World) -> None:
    """Default devices follow the local rank: the index among ranks on the same host."""
    assert b.choice is not None
    seen: dict[str, int] = {}
    for i, info in enumerate(world.ranks):
        local = seen.get(info.node, 0)
        seen[info.node] = local + 1
        if i == world.rank:
            b.local_rank = local
        if not info.device_chosen and ":" in info.device:
            world.ranks[i] = replace(info, device=f"{info.device.split(':')[0]}:{local}")
    mine = world.ranks[world.rank]
    b.choice = backends.Choice(b.choice.backend, mine.device, b.choice.reason)
    b.device = backends.activate(b.choice)


def set_environment(b: BackendState, cfg: WorldConfig) -> None:
    """The variables torchrun would set, for code that reads them."""
    b.environ.set({
        "RANK": str(cfg.rank),
        "WORLD_SIZE": str(cfg.world_size),
        "LOCAL_RANK": str(b.local_rank),
        "MASTER_ADDR": cfg.master_addr,
        "MASTER_PORT": str(cfg.master_port),
    })


def set_threads(b: BackendState) -> None:
    """One torch thread per rank, as torchrun gives, unless the user set OMP_NUM_THREADS (backend.threads)."""
    count = threads.plan(b.environ.as_user_set())
    if count is None:
        return
    b.environ.set({threads.VARIABLE: str(count)})  # for the processes this kernel starts, too
    before = threads.apply(count)
    if b.threads_before is None:
        b.threads_before = before
