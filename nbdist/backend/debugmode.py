"""%dist_debug: torch's and the backend's own diagnostics, on or off for the whole world.

The world has one switch, ``r/<round>/debug`` in the store (JSON: on or off, a change
number, who changed it). :func:`switch` writes it and then moves the world to a new
generation (:mod:`nbdist.world.counters`), so every rank rebuilds its process group at its next
step that uses it, as after a failure (a %%collective's start decides it for every rank; a
plain cell's collective meets the others first, ``Session.ensure_group``). Every build of a
group on a rank (join, rebuild) first applies the switch to that rank's environment, and
torch's debug level from the environment (:meth:`DebugMode.before_build`): ranks that did
not run the magic, a driven world's workers and a rank that replaces a lost one all build
under it. The switch is written before the generation moves, so a rank that sees the move
reads the new switch; peers that each run ``%dist_debug on`` change it once (the second
finds it on). A rank already waiting at its next step is met there: the last to arrive reads
the generation then, and every rank rebuilds. The variables come from the backend, which
every rank shares (compared at join), never from the store. Without a switch, each build
still takes torch's level from the environment (``%%dist_init --debug`` after torch was
imported), and ``TORCH_DISTRIBUTED_DEBUG`` is compared at join (``envplan.AGREED``).

When each variable is read (checked in the sources; only the gloo rows ran here):

- ``TORCH_DISTRIBUTED_DEBUG``: once, at ``import torch.distributed``
  (torch/distributed/__init__.py:170, ``set_debug_level_from_env``); ``init_process_group``
  does not read it again. So nbdist calls ``set_debug_level_from_env()`` before each build.
  DETAIL wraps gloo and nccl groups in ``ProcessGroupWrapper``, which compares every
  collective across ranks over a helper gloo group (distributed_c10d.py:2298 in
  ``_new_process_group_helper``, :5440 ``_create_process_group_wrapper``), and torch_npu
  does the same for hccl (torch_npu/distributed/distributed_c10d.py:808, in the
  ``_patched_new_process_group_helper`` it installs at :858). DETAIL on one rank only makes
  it wait for a helper group the others never make: hence the one switch. On nccl and hccl
  the helper gets ``GLOO_SOCKET_IFNAME``, the interface the backend uses (:func:`helper_interface`).
- ``NCCL_DEBUG``: once per process, at NCCL's first log line (NCCL src/debug.cc,
  ``ncclDebugInit`` returns when the level is set); NCCL starts at the first collective.
- ``HCCL_ENTRY_LOG_ENABLE``, ``ASCEND_GLOBAL_LOG_LEVEL``: read by CANN (when is not
  documented; see :func:`nbdist.backend.envplan.debug_variables`).
- torch's flight recorder (every backend, gloo too, in torch 2.13): on by default, the last
  2000 collectives (``TORCH_FR_BUFFER_SIZE``, else ``TORCH_NCCL_TRACE_BUFFER_SIZE``), read
  once per process by its singleton (torch/csrc/distributed/c10d/FlightRecorder.hpp,
  ``FlightRecorder()``); measured here: 2000 entries kept without the variable, and a value
  set after the first group changes nothing. nbdist leaves it.
- torch_npu's flight recorder (Ascend/pytorch v26.2.0-beta.1-pytorch2.13.0): off by default;
  ``TORCH_HCCL_TRACE_BUFFER_SIZE`` is read once per process by ``HCCLTraceBuffer``
  (torch_npu/csrc/distributed/TraceUtils.h:256-261), first used at the first HCCL
  communicator (ProcessGroupHCCL.cpp:2619), and by each group when it is made
  (ProcessGroupHCCL.cpp:1190). ``TORCH_HCCL_DUMP_ON_TIMEOUT`` is left alone: with it, the
  watchdog sleeps ``TORCH_HCCL_HEARTBEAT_TIMEOUT_SEC`` (10 min) after a failed collective
  before handling it (ProcessGroupHCCL.cpp:2152-2162, the 10 min at :1187), which would hold a failing cell that long.
"""

from __future__ import annotations

import json
import logging
import os
import sys
from collections.abc import Mapping
from dataclasses import asdict, dataclass
from typing import Protocol

from ..errors import WorldChangedError
from ..world import netinfo
from ..world.world import World
from . import envplan
from .backends import Choice

log = logging.getLogger(__name__)

KEY = "debug"  # the world's switch, under r/<round>/
CHANGE_TRIES = 5  # compare-and-set attempts when several notebooks switch at once
HCCL_TRACE_ENTRIES = "2000"  # as torch's own flight recorder keeps by default
GLOO_IFNAME = "GLOO_SOCKET_IFNAME"

_READ = {
    "TORCH_DISTRIBUTED_DEBUG": "torch reads it once, at import; nbdist applies it with set_debug_level_from_env() "
                               "before each build. DETAIL wraps the group in ProcessGroupWrapper, which compares "
                               "every collective's op, shapes and dtypes across ranks before it runs",
    "NCCL_DEBUG": "NCCL reads it once per process, at its first collective: a kernel that ran an NCCL collective "
                  "before keeps its old level",
    "HCCL_ENTRY_LOG_ENABLE": "read by CANN, which may read it once per process",
    "ASCEND_GLOBAL_LOG_LEVEL": "read by CANN, which may read it once per process",
    GLOO_IFNAME: "each rank: the interface its backend uses here, unless you set it. DETAIL adds a gloo helper "
                 "group to each group, and gloo otherwise advertises what the hostname resolves to",
    "TORCH_HCCL_TRACE_BUFFER_SIZE": "torch_npu's flight recorder: it keeps the last 2000 HCCL collectives, but only "
                                    "in a kernel that had run no HCCL collective before (read once per process, "
                                    "TraceUtils.h:258); read it with torch_npu's _dump_hccl_trace_json()",
}
_RECORDER = {
    "gloo": "torch's flight recorder keeps the last 2000 collectives of every group, gloo too (TORCH_FR_BUFFER_SIZE, "
            "read once per process, so nbdist leaves it): read it with "
            "torch._C._distributed_c10d._dump_fr_trace_json()",
    "hccl": "torch_npu's flight recorder: TORCH_HCCL_TRACE_BUFFER_SIZE above",
}


@dataclass(frozen=True)
class Switch:
    """The world's debug switch, as stored: on or off, how many changes so far, who made the last one."""

    on: bool
    n: int
    by: str

    def text(self) -> str:
        return json.dumps(asdict(self), sort_keys=True)

    @property
    def word(self) -> str:
        return "on" if self.on else "off"

    @staticmethod
    def parse(text: str | None) -> Switch | None:
        """The switch stored as ``text``; None if there is none (anyone who reaches the port may write junk)."""
        if not text:
            return None
        try:
            raw = json.loads(text)
            return Switch(bool(raw["on"]), int(raw["n"]), str(raw["by"]))
        except (ValueError, TypeError, KeyError) as exc:
            log.warning("nbdist: ignoring a debug switch that nbdist did not write (%s): %.80r", exc, text)
            return None


def variables(backend: str) -> dict[str, str]:
    """What ``%dist_debug on`` sets on every rank of a ``backend`` world."""
    values = {v.key: v.value for v in envplan.debug_variables(backend, "files", "%dist_debug on") if v.value}
    if backend == "hccl":
        values["TORCH_HCCL_TRACE_BUFFER_SIZE"] = HCCL_TRACE_ENTRIES
    return values


def helper_interface(backend: str, environ: Mapping[str, str], names: Mapping[str, str]) -> str | None:
    """The interface for the gloo helper group DETAIL adds to each nccl or hccl group: the one the backend uses.

    torch wraps nccl groups, and torch_npu hccl ones (torch_npu/distributed/distributed_c10d.py, its copy of
    ``_new_process_group_helper``), with a helper gloo group; without GLOO_SOCKET_IFNAME gloo advertises what
    the hostname resolves to, often 127.0.0.1. ``names``: this host's interfaces and IPv4 addresses. None on
    gloo (its plan sets the variable), where ``environ`` has it already, or where the backend names no
    interface of this host (NCCL_SOCKET_IFNAME a pattern, HCCL_IF_IP not an address here).
    """
    if backend == "gloo" or environ.get("GLOO_SOCKET_IFNAME"):
        return None
    if backend == "nccl":
        name = environ.get("NCCL_SOCKET_IFNAME", "")
        return name if name in names else None
    if backend == "hccl":
        return next((name for name, ip in names.items() if ip == environ.get("HCCL_IF_IP")), None)
    return None


def read(world: World) -> Switch | None:
    return Switch.parse(world.client.get_if(world.key(KEY)))


def joined_with_debug(world: World) -> bool:
    """Whether the ranks joined with TORCH_DISTRIBUTED_DEBUG=DETAIL (``%%dist_init --debug``; compared at join)."""
    return any(r.agreed.get("TORCH_DISTRIBUTED_DEBUG") == "DETAIL" for r in world.ranks)


def _set_torch_level() -> None:
    """torch.distributed's debug level from the environment (torch itself reads it only at import)."""
    if "torch.distributed" not in sys.modules:
        return  # torch reads it when it is imported
    import torch.distributed as dist

    try:
        dist.set_debug_level_from_env()
    except (ValueError, RuntimeError) as exc:  # a value the user set after import: torch's own message
        log.warning("nbdist: %s; torch.distributed's debug level stays %s", exc, dist.get_debug_level().name)


class DebugMode:
    """One kernel's side of the switch: what it put in os.environ, and what its group was built under."""

    def __init__(self) -> None:
        self._saved: dict[str, str | None] = {}  # what the variables held before this rank turned debug on
        self._set: dict[str, str] = {}  # what it set them to
        self.built: Switch | None = None  # the switch this rank's process group was last built under

    def before_build(self, world: World, backend: str, user_env: Mapping[str, str]) -> None:
        """Just before this rank builds a process group: apply the world's switch, if it has one.

        ``user_env``: the environment without the values nbdist set (``Session.environ_for_config``).
        """
        current = read(world)
        if current is None:  # never switched: each rank's %%dist_init decided (compared at join)
            _set_torch_level()  # as the environment says now, also where torch was imported before --debug set it
            return
        if current.on:
            wanted = variables(backend)
            env = dict(os.environ)
            if env.get(GLOO_IFNAME) == self._set.get(GLOO_IFNAME):
                env.pop(GLOO_IFNAME, None)  # this rank's own, from an earlier build: chosen again
            interface = helper_interface(backend, env, netinfo.interfaces())
            if interface is not None:
                wanted[GLOO_IFNAME] = interface
            self._put_back({k: v for k, v in self._saved.items() if k not in wanted})
            for key, value in wanted.items():
                if key not in self._saved:
                    self._saved[key] = user_env.get(key)
                os.environ[key] = value
                self._set[key] = value
        else:
            mine = dict(self._saved)
            self._put_back(mine)
            for key in variables(backend):  # values %%dist_init --debug set (not the user's): off means off
                if key not in mine and key in os.environ and user_env.get(key) != os.environ[key]:
                    self._put_back({key: user_env.get(key)}, force=True)
        _set_torch_level()
        self.built = current

    def _put_back(self, old: Mapping[str, str | None], force: bool = False) -> None:
        for key, value in old.items():
            if force or os.environ.get(key) == self._set.get(key):  # else changed since by someone else: theirs
                if value is None:
                    os.environ.pop(key, None)
                else:
                    os.environ[key] = value
            self._saved.pop(key, None)
            self._set.pop(key, None)

    def restore(self) -> None:
        """Leaving the world: put back what this rank set, and torch's level with it. Idempotent."""
        if self.built is None and not self._saved:
            return
        self._put_back(dict(self._saved))
        self.built = None
        _set_torch_level()

    def why_moved(self, world: World) -> str | None:
        """Why the world moved on, if it was a switch this rank has not built under yet (for the cell's table)."""
        current = read(world)
        if current is None or (self.built is not None and self.built.n == current.n):
            return None
        return f"debug {current.word} for every rank: {current.by} ran %dist_debug {current.word}"


class Switched(Protocol):
    """What ``%dist_debug`` reads: the kernel's session, in these parts."""

    @property
    def world(self) -> World | None: ...

    @property
    def choice(self) -> Choice | None: ...

    @property
    def debug(self) -> DebugMode: ...

    def require_world(self, what: str) -> World: ...


def switch(session: Switched, on: bool) -> str:
    """``%dist_debug on|off``: change the world's switch (once, whoever asks first); says what happens when."""
    world = session.require_world(f"%dist_debug {'on' if on else 'off'}")
    assert session.choice is not None  # set as the rank joined, before its world
    backend = session.choice.backend
    key, me, word = world.key(KEY), world.describe(world.rank), "on" if on else "off"
    for _ in range(CHANGE_TRIES):
        text = world.client.get_if(world.key(KEY)) or ""
        current = Switch.parse(text)
        state = current.on if current is not None else joined_with_debug(world)
        if state == on:
            return _unchanged(session, world, current, on)
        new = Switch(on, (current.n if current is not None else 0) + 1, me)
        if world.client.compare_set(key, text, new.text()) == new.text():
            break
    else:
        raise WorldChangedError(f"other notebooks changed the debug switch {CHANGE_TRIES} times while this one "
                                f"tried: run %dist_debug {word} again")
    world.generations.bump(world.generations.stored())  # after the switch: whoever sees the move reads it
    return _changed(world, on, backend)


def _all(world: World) -> str:
    return f"all {world.world_size} ranks" if world.world_size > 1 else "the one rank"


def _where(world: World) -> str:
    return (f"for {_all(world)}: each rank rebuilds its process group at its next cell that uses it "
            "(a %%collective, or a plain cell's first collective; a driven world's workers at the driver's next "
            "%%collective)")


def _changed(world: World, on: bool, backend: str) -> str:
    wanted = variables(backend)
    names = ", ".join(f"{k}={v}" for k, v in wanted.items())
    if on:
        head = f"nbdist: debug on {_where(world)} with {names}. %dist_debug off puts them back."
    else:
        head = (f"nbdist: debug off {_where(world)}, with the variables nbdist set put back (unset where you had "
                f"not set them): {', '.join(wanted)}.")
    if backend != "gloo":
        wanted = {**wanted, GLOO_IFNAME: "<interface>"}
    lines = [head, *_variable_lines(wanted if on else dict.fromkeys(wanted))]
    lines.append(f"  flight recorder: {_RECORDER.get(backend, _RECORDER['gloo'])}")
    if on:
        lines += _quiet_note()
    return "\n".join(lines)


def _unchanged(session: Switched, world: World, current: Switch | None, on: bool) -> str:
    word = "on" if on else "off"
    who = f"{current.by} turned it {word}" if current is not None else (
        "every notebook joined with --debug" if on else "nobody turned it on")
    if current is None or (session.debug.built is not None and session.debug.built.n == current.n):
        mine = "this rank's process group runs with it already"
    else:
        mine = "this rank rebuilds its process group with it at its next cell that uses it"
    return f"nbdist: debug is already {word} for {_all(world)} ({who}): nothing changes; {mine}"


def _variable_lines(values: Mapping[str, str | None]) -> list[str]:
    lines = []
    for key, value in values.items():
        shown = f"{key}={value}" if value is not None else f"{key} (put back)"
        lines.append(f"  {shown}  # {_READ.get(key, 'read by the backend')}")
    return lines


def show(session: Switched) -> str:
    """``%dist_debug``: the world's switch, this rank's group, torch's level and the variables as they are here."""
    world = session.world
    backend = session.choice.backend if session.choice is not None else "gloo"
    lines = []
    if world is None:
        lines.append("nbdist debug: this notebook is not in a world (%dist_debug on|off needs one)")
    else:
        current = read(world)
        if current is None:
            state = "on (every notebook joined with --debug)" if joined_with_debug(world) else "off"
            lines.append(f"nbdist debug: {state} for {_all(world)}; %dist_debug on|off switches it")
        else:
            lines.append(f"nbdist debug: {current.word} for {_all(world)} ({current.by} ran "
                         f"%dist_debug {current.word}; change #{current.n})")
            built = session.debug.built
            lines.append("this rank's process group was built with it" if built is not None and built.n == current.n
                         else "this rank rebuilds its process group with it at its next cell that uses it")
    if "torch.distributed" in sys.modules:
        import torch.distributed as dist

        lines.append(f"torch.distributed.get_debug_level() here: {dist.get_debug_level().name}")
    lines.append("variables here:")
    shown = [*variables(backend), *([GLOO_IFNAME] if backend != "gloo" else [])]
    lines += [f"  {key}={os.environ[key]}" if key in os.environ else f"  {key} (unset)" for key in shown]
    lines.append(f"  flight recorder: {_RECORDER.get(backend, _RECORDER['gloo'])}")
    return "\n".join(lines + _quiet_note())


def _quiet_note() -> list[str]:
    """Where torch's C++ log lines are hidden (nbdist.backend.cpplog), DETAIL's own C++ lines are too."""
    level = os.environ.get("TORCH_CPP_LOG_LEVEL", "").upper()
    if level not in ("ERROR", "FATAL"):
        return []
    return [f"  torch's C++ INFO and WARNING lines stay hidden (TORCH_CPP_LOG_LEVEL={level}, read once when torch "
            "loaded); its errors, and the mismatches DETAIL finds, are raised in the cell"]
