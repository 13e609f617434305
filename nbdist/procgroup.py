"""The default process group of a world: built under a fresh store prefix, cut, rebuilt.

A stuck collective cannot be interrupted, and ``destroy_process_group`` waits
for it. So nbdist can *cut* the group: for gloo it shuts down the TCP
connections the group opened to its peers (recorded when it was built), which
makes every pending operation on every rank fail at once with "connection
closed", exactly as if a peer had died; for nccl/hccl it uses torch's abort.
The group is then destroyed and rebuilt under a new prefix at the next cell.
"""

from __future__ import annotations

import logging
import os
import socket
from datetime import timedelta
from typing import Any

log = logging.getLogger(__name__)


def _socket_fds() -> set[int]:
    fds = set()
    for name in os.listdir("/proc/self/fd"):
        try:
            if os.readlink(f"/proc/self/fd/{name}").startswith("socket:"):
                fds.add(int(name))
        except OSError:
            continue  # closed meanwhile
    return fds


class ProcessGroup:
    """One build of the default process group (a *generation*)."""

    def __init__(self, backend: str, store: Any, prefix: str, rank: int, world_size: int, timeout: float,
                 exclude_peer: tuple[str, int] | None = None) -> None:
        import torch.distributed as dist

        self.backend, self.prefix = backend, prefix
        self.broken = False
        self._exclude = exclude_peer
        before = _socket_fds() if os.path.isdir("/proc/self/fd") else set()
        dist.init_process_group(backend, store=dist.PrefixStore(prefix, store), rank=rank,
                                world_size=world_size, timeout=timedelta(seconds=timeout))
        self._fds = (_socket_fds() - before) if before else set()

    def cut(self) -> None:
        """Make every pending collective of this group fail now, on every rank. Idempotent."""
        if self.broken:
            return
        self.broken = True
        if self.backend == "gloo":
            for fd in self._fds:
                self._shutdown(fd)
            return
        import torch.distributed as dist

        abort = getattr(dist.distributed_c10d, "_abort_process_group", None)
        if abort is not None:
            abort()

    def _shutdown(self, fd: int) -> None:
        try:
            sock = socket.socket(fileno=os.dup(fd))
        except OSError:
            return  # closed already
        with sock:  # closes the duplicate only
            try:
                peer = sock.getpeername()
            except OSError:
                return  # a listening socket has no peer: never touch it (gloo aborts the process)
            if self._exclude is not None and (peer[0].removeprefix("::ffff:"), peer[1]) == self._exclude:
                return
            try:
                sock.shutdown(socket.SHUT_RDWR)
            except OSError as exc:
                log.debug("shutdown of fd %s: %s", fd, exc)

    def destroy(self) -> None:
        """Destroy the group if it is still the default one; idempotent."""
        destroy_default()


def destroy_default() -> None:
    import sys

    if "torch.distributed" not in sys.modules:
        return
    import torch.distributed as dist

    if dist.is_available() and dist.is_initialized():
        dist.destroy_process_group()
