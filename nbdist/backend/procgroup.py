"""The process groups of a world: built over a recording store, checked, cut, rebuilt.

A stuck collective cannot be interrupted, and ``destroy_process_group`` waits
for it. So nbdist can *cut* the groups: for gloo it shuts down the TCP
connections the groups opened to their peers, which makes every pending
operation on every rank fail at once with "connection closed", exactly as if
a peer had died; for nccl it uses torch's abort; for hccl, torch_npu's own
(see :func:`abort_hccl`).

The connections are found by what they are, not by when they were opened.
The groups meet through a store that nbdist hands to torch, and every gloo
rank publishes its listening address there (gloo's ``Rank`` record: host name,
then the listener's ``sockaddr_storage``). The store records those addresses;
a gloo connection has a listener of the world at one end, so cutting means
shutting down this process's TCP connections with such an endpoint
(listening sockets themselves are never touched: gloo aborts the process).
Groups made later with ``new_group`` meet through the same store, so they are
covered too.
"""

from __future__ import annotations

import logging
import os
import queue
import socket
import struct
import sys
import threading
import time
from collections.abc import Iterable
from datetime import timedelta
from typing import Any

from ..ranksets import who_said
from ..world import netinfo
from ..world.netinfo import plain_ip
from . import userinit

log = logging.getLogger(__name__)

Endpoint = tuple[str, int]

# gloo's tcp::Address: a sockaddr_storage (128 bytes) then a ssize_t sequence number.
_ADDRESS_BYTES = 128 + 8
WRITE_SHUTDOWN_DELAY = 0.05  # seconds between shutting down the reading and the writing side (see below)


# --- what gloo publishes ------------------------------------------------------
def _sockaddr(raw: bytes) -> Endpoint | None:
    """(ip, port) of a raw ``sockaddr_storage`` holding an IPv4 or IPv6 address, else None."""
    if len(raw) < 28:
        return None
    (family,) = struct.unpack_from("=H", raw)
    (port,) = struct.unpack_from("!H", raw, 2)
    if family == socket.AF_INET:
        ip = socket.inet_ntop(socket.AF_INET, raw[4:8])
    elif family == socket.AF_INET6:
        ip = plain_ip(socket.inet_ntop(socket.AF_INET6, raw[8:24]))
    else:
        return None
    return (ip, port) if port else None


def gloo_listeners(value: bytes) -> set[Endpoint]:
    """The listening endpoints in a value gloo's TCP transport stores for a rank; empty if it is not one.

    Two layouts exist (gloo/transport/tcp/context.cc): since mid-2023 a ``Rank``
    record (uint64 host-name length, host name, uint64 address length, the
    address, pair ids); before, one 136-byte address per peer, concatenated.
    """
    if len(value) >= 16:
        (name_len,) = struct.unpack_from("=Q", value)
        if name_len <= 1024 and len(value) >= 16 + name_len:
            (addr_len,) = struct.unpack_from("=Q", value, 8 + name_len)
            start = 16 + name_len
            if addr_len == _ADDRESS_BYTES and len(value) >= start + addr_len:
                found = _sockaddr(value[start:start + addr_len])
                return {found} if found else set()
    if value and len(value) % _ADDRESS_BYTES == 0:
        chunks = (value[i:i + _ADDRESS_BYTES] for i in range(0, len(value), _ADDRESS_BYTES))
        return {ep for chunk in chunks if (ep := _sockaddr(chunk)) is not None}
    return set()


_STORE_CLASS: Any = None


def recording_store(inner: Any, timeout: float, seen: set[Endpoint]) -> Any:
    """A ``torch.distributed.Store`` over ``inner`` that adds gloo's listener addresses to ``seen``.

    Its waits default to ``timeout`` (the process-group timeout), as the store
    torch makes itself would: ranks may reach their first collective far apart.
    """
    global _STORE_CLASS
    if _STORE_CLASS is None:
        _STORE_CLASS = _define_store_class()
    return _STORE_CLASS(inner, timeout, seen)


def _define_store_class() -> Any:
    import torch.distributed as dist

    class RecordingStore(dist.Store):
        def __init__(self, inner: dist.Store, timeout: float, seen: set[Endpoint]) -> None:
            super().__init__()
            self._inner, self._seen = inner, seen
            self._timeout = timedelta(seconds=timeout)
            self._lock = threading.Lock()

        def _note(self, value: Any) -> Any:
            if isinstance(value, bytes | bytearray) and len(value) >= 28:
                found = gloo_listeners(bytes(value))
                if found:
                    with self._lock:
                        self._seen.update(found)
            return value

        def set(self, key: str, value: Any) -> None:
            self._note(value if isinstance(value, bytes) else bytes(value) if not isinstance(value, str) else b"")
            self._inner.set(key, value)

        def get(self, key: str) -> bytes:
            self._inner.wait([key], self._timeout)
            value = self._inner.get(key)
            self._note(value)
            return value

        def add(self, key: str, amount: int) -> int:
            return self._inner.add(key, amount)

        def compare_set(self, key: str, expected: Any, desired: Any) -> bytes:
            return self._inner.compare_set(key, expected, desired)

        def wait(self, keys: list[str], timeout: timedelta | None = None) -> None:
            self._inner.wait(keys, self._timeout if timeout is None else timeout)

        def check(self, keys: list[str]) -> bool:
            return self._inner.check(keys)

        def num_keys(self) -> int:
            return self._inner.num_keys()

        def delete_key(self, key: str) -> bool:
            return self._inner.delete_key(key)

        def append(self, key: str, value: Any) -> None:
            self._inner.append(key, value)  # type: ignore[attr-defined]  # torch's stub lacks it

        def multi_get(self, keys: list[str]) -> list[bytes]:
            self._inner.wait(keys, self._timeout)
            return [self._note(v) for v in self._inner.multi_get(keys)]

        def multi_set(self, keys: list[str], values: list[Any]) -> None:
            self._inner.multi_set(keys, values)  # type: ignore[attr-defined]  # torch's stub lacks it

    return RecordingStore


# --- this process's TCP connections ---------------------------------------------
def tcp_connections() -> dict[int, tuple[Endpoint, Endpoint]]:
    """This process's TCP sockets that are not listening: file descriptor -> (local, remote) endpoints."""
    rows = {s.inode: (s.local, s.remote) for s in netinfo.tcp_sockets("/proc/self/net") if not s.listening}
    mine: dict[int, tuple[Endpoint, Endpoint]] = {}
    for name in os.listdir("/proc/self/fd"):
        try:
            target = os.readlink(f"/proc/self/fd/{name}")
        except OSError:
            continue  # closed meanwhile
        if target.startswith("socket:[") and int(target[8:-1]) in rows:
            mine[int(name)] = rows[int(target[8:-1])]
    return mine


def shutdown_connections(endpoints: Iterable[Endpoint]) -> int:
    """Shut down this process's TCP connections that have one of ``endpoints`` at either end.

    First the reading side only, so that gloo sees end-of-file and fails every
    pending operation while it can still write (a send that fails half-way
    through is never failed: gloo/transport/tcp/pair.cc signals queued
    unbound-buffer sends to nobody, and that collective would wait for its full
    timeout); then, a moment later, the writing side, so that the peers see it too.
    """
    wanted = set(endpoints)
    if not wanted or not os.path.isdir("/proc/self/fd"):
        return 0
    found = [(fd, local, remote) for fd, (local, remote) in tcp_connections().items()
             if local in wanted or remote in wanted]
    count = sum(_shutdown(fd, local, remote, socket.SHUT_RD) for fd, local, remote in found)
    if count:
        time.sleep(WRITE_SHUTDOWN_DELAY)
        for fd, local, remote in found:
            _shutdown(fd, local, remote, socket.SHUT_WR)
    return count


def _shutdown(fd: int, local: Endpoint, remote: Endpoint, how: int) -> int:
    try:
        sock = socket.socket(fileno=os.dup(fd))
    except OSError:
        return 0  # closed meanwhile
    with sock:  # closes the duplicate only
        if sock.family not in (socket.AF_INET, socket.AF_INET6):
            return 0  # the descriptor was reused meanwhile for a socket of another kind (a Unix socket)
        try:
            here, there = sock.getsockname(), sock.getpeername()
        except OSError:
            return 0  # no longer a connected socket
        if (plain_ip(here[0]), here[1]) != local or (plain_ip(there[0]), there[1]) != remote:
            return 0  # the descriptor was reused for another socket meanwhile
        try:
            sock.shutdown(how)
        except OSError as exc:
            log.debug("shutdown of fd %s: %s", fd, exc)
            return 0
    return 1


# --- the groups ----------------------------------------------------------------------
class ProcessGroup:
    """One build of the world's default process group, and the groups user code makes from it."""

    def __init__(self, backend: str, store: Any, prefix: str, rank: int, world_size: int, timeout: float) -> None:
        import torch.distributed as dist

        self.backend, self.prefix, self.timeout = backend, prefix, timeout
        self.gen = 0  # the world generation it was built in (set by the session)
        self.broken = False  # cut, or found untrustworthy: every rank rebuilds at its next cell
        self.reason = ""
        self.abandoned = False  # a collective was left pending (see abandon)
        self.endpoints: set[Endpoint] = set()
        self._calls: dict[Any, int] = {}  # group -> collectives issued through torch.distributed
        self._p2p: dict[Any, int] = {}  # group -> send/recv calls
        self._store = recording_store(store, timeout, self.endpoints)
        _restart_group_names()
        userinit.real()(backend, store=dist.PrefixStore(prefix, self._store), rank=rank, world_size=world_size,
                        timeout=timedelta(seconds=timeout))  # torch's own: user code's calls meet nbdist's stand-in
        self.group = dist.distributed_c10d._get_default_group()

    def is_current(self) -> bool:
        """Whether this build is still torch's default group (user code may have destroyed it)."""
        import torch.distributed as dist

        return dist.is_initialized() and dist.distributed_c10d._get_default_group() is self.group

    def cut(self, reason: str = "") -> None:
        """Make every pending collective of these groups fail now, on every rank. Idempotent."""
        if self.broken:
            return
        self.broken, self.reason = True, reason or "nbdist closed a stuck collective"
        if not self.is_current():
            return  # destroyed by user code: its connections are closed already
        if self.backend == "gloo":
            n = shutdown_connections(self.endpoints)
            log.debug("cut %s connection(s) of %s (%s)", n, self.prefix, reason)
            return
        if self.backend == "hccl":
            # Destroying these groups would synchronise the HCCL streams (ProcessGroupHCCL::shutdown), which
            # waits for the stuck operation: set them aside as for a collective left pending.
            self.abandoned = True
            self.reason = f"{self.reason}; {abort_hccl(self.reason)}"
            return
        import torch.distributed as dist

        abort = getattr(dist.distributed_c10d, "_abort_process_group", None)
        if abort is not None:
            abort()

    def abandon(self) -> None:
        """A collective of these groups was left behind, still pending: destroying them must not wait for it."""
        self.abandoned = True
        self.distrust("a collective was left pending in gloo")

    def distrust(self, reason: str) -> None:
        """Mark this build for a rebuild at the next cell without cutting anything."""
        if not self.broken:
            self.broken, self.reason = True, reason

    def count(self, group: Any, p2p: bool) -> None:
        """Count one call on ``group`` (None: the default group); the wrappers call it for every call."""
        if group is not None and not isinstance(group, type(self.group)):
            return  # a non-member's placeholder: torch returns at once
        table = self._p2p if p2p else self._calls
        table[group] = table.get(group, 0) + 1

    def state(self) -> dict[str, Any]:
        """What the ranks compare to decide whether the groups can be trusted (JSON-ready).

        ``groups``: the groups this rank belongs to, by torch's name; ``calls``: collectives
        issued through torch.distributed per group; ``seq``: the backend's own count per group
        (which also counts DDP's collectives), less the point-to-point calls, which only two
        ranks make.
        """
        if not self.is_current():
            return {"ok": False, "why": "the notebook's code destroyed the process group"}
        if self.broken:
            return {"ok": False, "why": self.reason}
        import torch.distributed as dist

        registered = getattr(dist.distributed_c10d._world, "pg_names", {})
        names = {group: str(name) for group, name in list(registered.items())}
        default = names.get(self.group, "0")

        def by_name(table: dict[Any, int]) -> dict[str, int]:
            out: dict[str, int] = {}
            for group, n in list(table.items()):
                name = default if group is None else names.get(group)
                if name is not None:
                    out[name] = out.get(name, 0) + n
            return out

        calls, p2p = by_name(self._calls), by_name(self._p2p)
        seq = {}
        for group, name in names.items():
            try:
                seq[name] = int(group._get_sequence_number_for_group()) - p2p.get(name, 0)
            except (AttributeError, RuntimeError):
                continue  # a backend that does not count: the calls still tell
        return {"ok": True, "groups": sorted(names.values()), "calls": calls, "seq": seq}

    def destroy(self) -> None:
        """Destroy the groups if this build is still torch's default one; idempotent.

        torch's ``destroy_process_group`` shuts every group down, which waits for
        pending collectives. With one left behind (:meth:`abandon`), the groups are
        taken out of torch's registry without that wait, and shut down by a thread
        of their own once the collective times out. Either way the groups are let go
        of in the graveyard (:func:`bury`), never by this thread.
        """
        if not self.is_current():
            return
        import torch.distributed as dist

        names = getattr(dist.distributed_c10d._world, "pg_names", None)
        held = list(names) if isinstance(names, dict) else [self.group]
        if not self.abandoned or not isinstance(names, dict):  # (a torch without the registry nbdist knows: wait)
            destroy_default()
            bury(held)  # a collective may still be pending in them: their last reference must not go on this thread
            return
        names.clear()  # destroy_process_group shuts down only what is named here
        destroy_default()
        threading.Thread(target=_shut_down, args=(held,), name="nbdist-shutdown", daemon=True).start()


def verdict(states: dict[int, dict[str, Any] | None]) -> str | None:
    """Why the world's groups cannot be trusted any more, from every rank's :meth:`ProcessGroup.state`; None if intact.

    They can be trusted when no rank cut or distrusts them and every member of
    each group issued the same collectives on it: then no rank can be inside one.
    """
    for rank, state in sorted(states.items()):
        if state is None:
            return f"rank {rank} sent no state"
        if not state.get("ok"):
            return f"rank {rank}: {state.get('why', 'its process group failed')}"
    groups = sorted({g for s in states.values() if s for g in s.get("groups", ())})
    for group in groups:
        members_ = [r for r, s in sorted(states.items()) if s and group in s.get("groups", ())]
        for key, what in (("calls", "collectives"), ("seq", "collectives (the backend's count)")):
            values = {r: states[r].get(key, {}).get(group, 0) for r in members_}  # type: ignore[union-attr]
            if key == "seq" and any(group not in states[r].get("seq", {}) for r in members_):  # type: ignore[union-attr]
                continue
            if len(set(values.values())) > 1:
                seen: dict[str, list[int]] = {}
                for r, v in values.items():
                    seen.setdefault(str(v), []).append(r)
                label = "the default group" if group == "0" else f"group {group}"
                return f"the ranks issued different numbers of {what} on {label} ({who_said(seen)})"
    return None


def members(group: Any) -> list[int] | None:
    """The world ranks of ``group`` (None: the default group, i.e. every rank)."""
    if group is None:
        return None
    import torch.distributed as dist

    try:
        return list(dist.get_process_group_ranks(group))
    except (RuntimeError, ValueError, AttributeError):
        return None


def registered(group: Any) -> bool:
    """Whether torch still knows ``group`` (not destroyed: a rebuild destroys the world's groups)."""
    import torch.distributed as dist

    if not isinstance(group, dist.ProcessGroup):
        return True  # not a group, or torch's placeholder for a non-member: torch judges it
    return group in dist.distributed_c10d._world.pg_map


def group_name(group: Any) -> str:
    """torch's name of a group ("0" for the default one), the same on every member."""
    import torch.distributed as dist

    c10d = dist.distributed_c10d
    if group is None:
        group = c10d._get_default_group()
    return str(getattr(c10d._world, "pg_names", {}).get(group, "?"))


def holders(namespace: dict[str, Any]) -> list[str]:
    """Names in a notebook namespace bound to objects that hold the process groups (re-create after a rebuild)."""
    import sys

    if "torch.distributed" not in sys.modules:
        return []
    import torch.distributed as dist

    found = []
    ddp = getattr(sys.modules.get("torch.nn.parallel"), "DistributedDataParallel", None)
    for name, value in list(namespace.items()):
        if name.startswith("_"):
            continue
        if ddp is not None and isinstance(value, ddp):
            found.append(f"{name} (DistributedDataParallel)")
        elif isinstance(value, dist.ProcessGroup):
            found.append(f"{name} (a group from new_group)")
    return found


HCCL_ABORT_WAIT = 2.0  # seconds the cut waits for torch_npu's abort before going on without it


def abort_hccl(reason: str) -> str:
    """Abort the HCCL communicators of every group in torch's registry; says what that can and cannot do.

    Checked against the sources, not run (no NPU here). torch 2.13's ``_abort_process_group`` calls
    ``Backend::abort()``, whose base version is empty (torch/csrc/distributed/c10d/Backend.hpp:525), and
    ProcessGroupHCCL's ``abort(c10::optional<std::string>)`` has another signature, so it is not reached.
    torch_npu binds ``abort_hccl_comm`` (Ascend/pytorch v26.2.0-beta.1-pytorch2.13.0,
    torch_npu/csrc/distributed/Init.cpp:377, ProcessGroupHCCL.cpp:1479-1487): it destroys the communicators
    (``HcclCommDestroy``) and forgets them, as ``torch_npu.distributed.reinit_process_group`` does
    (distributed_c10d.py:362-388). An operation already queued on the NPU is not documented to end by it:
    ``HCCL_EXEC_TIMEOUT`` ends it on the device. It takes a lock that a rank setting up a communicator
    holds, so it runs in a thread of its own and the cut does not wait for it long.
    """
    exec_timeout = os.environ.get("HCCL_EXEC_TIMEOUT") or "1836"
    tail = (f"an HCCL operation already on the NPU runs until HCCL_EXEC_TIMEOUT ends it, up to {exec_timeout} s "
            "after it started; then the cell's next NPU call raises and the group is rebuilt")
    done = threading.Event()
    found: list[int] = []

    def run() -> None:
        try:
            found.append(_abort_hccl_groups(reason))
        finally:
            done.set()

    threading.Thread(target=run, name="nbdist-hccl-abort", daemon=True).start()
    if not done.wait(HCCL_ABORT_WAIT):
        return f"torch_npu's abort_hccl_comm did not return within {HCCL_ABORT_WAIT:g} s (it goes on); {tail}"
    if not found or found[0] == 0:
        return f"this torch_npu has no abort_hccl_comm to call; {tail}"
    return f"nbdist aborted the HCCL communicators of {found[0]} group(s) (abort_hccl_comm); {tail}"


def _abort_hccl_groups(reason: str) -> int:
    import torch
    import torch.distributed as dist

    count = 0
    for group in list(getattr(dist.distributed_c10d._world, "pg_names", {})):
        try:
            backend = group._get_backend(torch.device("npu"))
        except (RuntimeError, ValueError):
            continue  # not an HCCL group
        abort = getattr(backend, "abort_hccl_comm", None)
        if abort is None:
            continue
        try:
            abort(f"nbdist: {reason}")
            count += 1
        except RuntimeError as exc:
            log.warning("abort_hccl_comm failed: %s", exc)
    return count


def _shut_down(groups: list[Any]) -> None:
    for group in groups:
        try:
            group.shutdown()
        except RuntimeError as exc:
            log.debug("shutting down a group left behind: %s", exc)
    bury(groups)


_GRAVES: queue.Queue[list[Any]] = queue.Queue()
_GRAVEYARD: list[threading.Thread] = []
GRAVE_LOOK = 1.0  # seconds between two looks at whether anything else still holds a buried group


def bury(groups: list[Any]) -> None:
    """Let go of ``groups``, which nbdist has taken out of torch's registry, on a thread of their own.

    A gloo group's destructor waits for a collective left pending in it, up to the group's timeout, on the
    thread that drops its last reference. That may be a garbage collection on the kernel's main thread:
    an earlier cell's traceback, which IPython keeps, holds the group in its frames, and the collection
    that frees them runs in the middle of a later cell, which would wait. The graveyard's thread holds each
    group until nothing else does, then drops it there, however long its destructor takes.
    """
    if not groups:
        return
    _GRAVES.put(list(groups))
    if not _GRAVEYARD:
        thread = threading.Thread(target=_graveyard, name="nbdist-graveyard", daemon=True)
        _GRAVEYARD.append(thread)
        thread.start()


def _graveyard() -> None:
    # Held here, in this daemon thread's frame, not in a module global: at the interpreter's exit the main
    # thread clears the globals, and would run the destructors there.
    held: list[Any] = []
    while True:
        try:
            held.extend(_GRAVES.get(timeout=GRAVE_LOOK if held else None))
        except queue.Empty:
            pass
        i = 0
        while i < len(held):
            if sys.getrefcount(held[i]) <= 2:  # this list's reference, and getrefcount's argument
                del held[i]  # the last one: the group's destructor runs here
            else:
                i += 1


def _restart_group_names() -> None:
    """torch names groups by a per-process count that only destroying a default group resets: a build that
    failed on one rank alone (a peer stopped or failed in it) moved that rank's count and not the others',
    and their next groups would meet under different names in the store, and hang. No default group
    exists when nbdist builds one (each build has a prefix of its own): every rank starts the count afresh."""
    import torch.distributed as dist

    world = getattr(dist.distributed_c10d, "_world", None)
    if world is not None and hasattr(world, "group_count") and not dist.is_initialized():
        world.group_count = 0


def destroy_default() -> None:
    import sys

    if "torch.distributed" not in sys.modules:
        return
    import torch.distributed as dist

    if dist.is_available() and dist.is_initialized():
        dist.destroy_process_group()
