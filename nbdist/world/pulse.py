"""The pulse: a small helper process that beats for its kernel, so liveness does not need the kernel's GIL.

A kernel stuck in one long C call that holds the GIL (a pathological regex, a
huge ``sorted()``) cannot run a heartbeat thread, yet it is alive. So each
kernel starts a pulse process, which:

1. connects to the rendezvous server with a pure-Python client (:class:`WireClient`)
   that speaks two messages of torch's ``TCPStore`` protocol, VALIDATE and SET;
   importing torch would cost ~150 MB per kernel;
2. reads a pipe whose write end only the kernel holds; the kernel writes a byte
   into it whenever its own Python runs (:meth:`Pulse.beat`);
3. every interval, sets ``nbdist/<key>`` to ``{"n", "t", "pid", "pulse", "rank", "busy"}``,
   where ``busy`` is how long the kernel has not written (seconds);
4. when the pipe reaches end-of-file or its parent changes (the kernel died),
   sets ``{..., "gone": true}`` once more and exits 0;
5. on SIGTERM (a deliberate stop) exits at once without writing; if the server
   cannot be reached, writes one line to stderr and exits 1.

Peers read the beat (:class:`Beat`, one codec for every writer and reader) and ask :func:`judge` what it means.
Run as ``python -m nbdist.world.pulse --host H --port P --key KEY --fd N [--interval 1.0] [--rank R]``.
This module imports only the standard library, :mod:`nbdist.errors` and :mod:`nbdist.world.records` (which
imports nothing more).
"""

from __future__ import annotations

import argparse
import json
import logging
import os
import select
import signal
import socket
import struct
import subprocess
import sys
import tempfile
import threading
import time
from dataclasses import dataclass
from typing import Any, BinaryIO, Literal

from ..errors import StoreConnectionError
from .records import Fields, MalformedRecord, json_object, shown

log = logging.getLogger(__name__)

PREFIX = "nbdist/"  # the same as store.PREFIX (not imported: the pulse stays small)
BUSY_AFTER = 2.0  # seconds without the kernel's Python before a live rank counts as busy
CONNECT_TIMEOUT = 10.0  # seconds to reach the server
OP_TIMEOUT = 10.0  # seconds a write may go unacknowledged before the server counts as unreachable
CHECK_EVERY = 0.2  # longest the pulse goes without looking at its kernel
STOP_GRACE = 2.0  # seconds a stopped pulse has to exit before it is killed

# From torch/csrc/distributed/c10d (TCPStoreBackend.hpp, TCPStore.hpp, Utils.hpp), torch 2.1-2.13.
_VALIDATE, _SET = 0, 1  # detail::QueryType, one byte
_MAGIC = 0x3C85F7CE  # detail::validationMagicNumber, uint32, native byte order
_KEY_PREFIX = "/"  # TCPStore::keyPrefix_, put before every key by torch's own client
# Lengths are tcputil::SizeType (uint64), native byte order; SET has no reply.


class WireClient:
    """A write-only ``TCPStore`` client in pure Python: VALIDATE on connect, then SET.

    Keys are what torch's own client takes: ``WireClient.set("nbdist/x", v)``
    is read back by ``TCPStore.get("nbdist/x")``.
    """

    def __init__(self, host: str, port: int, timeout: float = CONNECT_TIMEOUT) -> None:
        self.address = f"[{host}]:{port}" if ":" in host else f"{host}:{port}"
        try:
            sock = socket.create_connection((host, port), timeout=timeout)
        except OSError as exc:
            raise StoreConnectionError(
                f"cannot reach the rendezvous server at {self.address}: {exc.strerror or exc}"
            ) from exc
        sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
        user_timeout = getattr(socket, "TCP_USER_TIMEOUT", None)
        if user_timeout is not None:  # a dead network fails writes after OP_TIMEOUT, not after minutes
            sock.setsockopt(socket.IPPROTO_TCP, user_timeout, int(OP_TIMEOUT * 1000))
        sock.settimeout(OP_TIMEOUT)
        self._sock: socket.socket | None = sock
        self._send(struct.pack("=BI", _VALIDATE, _MAGIC), "validate")

    def fileno(self) -> int:
        """The socket's descriptor (for ``select``): readable only when the server closed it."""
        if self._sock is None:
            raise StoreConnectionError(f"the connection to {self.address} is closed")
        return self._sock.fileno()

    def set(self, key: str, value: str | bytes) -> None:
        data = value.encode() if isinstance(value, str) else value
        name = (_KEY_PREFIX + key).encode()
        message = struct.pack("=BQ", _SET, len(name)) + name + struct.pack("=Q", len(data)) + data
        self._send(message, "set")

    def closed_by_server(self) -> bool:
        """Has the server closed this connection? (It never writes to a client that only sets.)"""
        if self._sock is None:
            return True
        ready, _, _ = select.select([self._sock], [], [], 0)
        if not ready:
            return False
        try:
            return self._sock.recv(4096) == b""
        except OSError:
            return True

    def close(self) -> None:
        """Close the connection; idempotent."""
        if self._sock is not None:
            self._sock.close()
            self._sock = None

    def _send(self, message: bytes, what: str) -> None:
        if self._sock is None:
            raise StoreConnectionError(f"the connection to {self.address} is closed ({what})")
        try:
            self._sock.sendall(message)
        except OSError as exc:
            raise StoreConnectionError(
                f"the rendezvous server at {self.address} stopped answering ({what}): {exc.strerror or exc}"
            ) from exc


STOPPED: Literal["stopped"] = "stopped"  # the "n" of the last beat of a heartbeat stopped on purpose: it stays


@dataclass(frozen=True)
class Beat:
    """One heartbeat (``hb/<session>``), written by the pulse or, until it beats, by the kernel's thread: its count
    ``n``, which moves while the kernel lives (:data:`STOPPED` in the last beat of a heartbeat stopped on purpose,
    which no longer moves); when it was written (``t``, the writer's ``time.time()``); the kernel's and the pulse's
    process ids (a pulse's beat only); the rank; how long the kernel's Python has been held (``busy`` seconds, said
    by a pulse's beat while its kernel lives; 0 in one that does not say); whether the pulse saw its kernel end
    (``gone``). Validated where read (:meth:`from_json`, :func:`beat_from`)."""

    n: int | Literal["stopped"]
    t: float
    busy: float = 0.0
    gone: bool = False
    pid: int | None = None
    pulse: int | None = None
    rank: int | None = None

    def record(self) -> dict[str, Any]:
        """The JSON object as the store has always held it: a pulse's beat ``{n, t, pid, pulse, rank, busy}`` (its
        last, ``gone``, in place of ``busy``), a thread's ``{n, t, rank}``."""
        value: dict[str, Any] = {"n": self.n, "t": self.t}
        if self.pulse is not None:
            value.update(pid=self.pid, pulse=self.pulse)
        value["rank"] = self.rank
        if self.gone:
            value["gone"] = True
        elif self.pulse is not None:
            value["busy"] = self.busy
        return value

    def to_json(self) -> str:
        return json.dumps(self.record())

    @classmethod
    def from_dict(cls, value: dict[str, Any]) -> Beat:
        """The beat a JSON object holds, or raise :class:`.records.MalformedRecord` naming why it is not one."""
        read = Fields(value)
        if "n" not in value:
            raise MalformedRecord("it has no 'n'", value)
        n = value["n"]
        if n != STOPPED and type(n) is not int:  # JSON's true is no count, though Python's bool is an int
            raise MalformedRecord(f"its 'n' is {shown(n)}, not a whole number or {STOPPED!r}", value)
        busy = read.number("busy") if value.get("busy") is not None else 0.0
        if not busy >= 0:  # not NaN either
            raise MalformedRecord(f"its 'busy' is {shown(value['busy'])}, not a number of seconds", value)

        def maybe(name: str) -> int | None:
            return read.count(name) if value.get(name) is not None else None

        return cls(STOPPED if n == STOPPED else int(n), read.time("t"), busy,
                   read.flag("gone") if "gone" in value else False, maybe("pid"), maybe("pulse"), maybe("rank"))

    @classmethod
    def from_json(cls, text: str | None) -> Beat:
        """The beat ``text`` holds, or raise :class:`.records.MalformedRecord` (unset, or not a beat)."""
        return cls.from_dict(json_object(text))


def beat_from(text: str | None) -> Beat | None:
    """A heartbeat as read from the store: None when there is none, when its kernel stopped it on purpose (it left
    its last beat, which no longer moves), or when the text is not a beat (anyone can write into the store: a
    peer's beat that is not one reads as no beat, which the peer checks time out as they do for a silent one)."""
    try:
        beat = Beat.from_json(text)
    except MalformedRecord:
        return None
    return None if beat.n == STOPPED else beat


def judge(beat: Beat | None, moved_ago: float, dead_after: float) -> tuple[str, float]:
    """What a peer's beat says: ("gone", 0), ("dead", moved_ago), ("busy", seconds) or ("alive", 0).

    ``moved_ago`` is how long ago the watcher last saw the beat's ``n`` change
    (or, with no beat yet, since it began to watch). "gone": the pulse saw its
    kernel end. "dead": nothing has beaten for over ``dead_after`` s, so the
    kernel's host or the pulse itself is unreachable. "busy": the kernel is alive
    but has not run Python for ``seconds``.
    """
    if beat is not None and beat.gone:
        return ("gone", 0.0)
    if moved_ago > dead_after:
        return ("dead", moved_ago)
    busy = beat.busy if beat is not None else 0.0
    if busy > BUSY_AFTER:
        return ("busy", busy)
    return ("alive", 0.0)


# --- the pulse process ------------------------------------------------------


def _drain(fd: int) -> tuple[bool, bool]:
    """Read what the kernel wrote, never blocking: (anything read, end of file)."""
    got = False
    for _ in range(64):  # a bounded drain: a writer that never stops cannot hold the pulse here
        try:
            chunk = os.read(fd, 65536)
        except BlockingIOError:
            break
        if not chunk:
            return got, True
        got = True
    return got, False


def beat_for(kernel: int, fd: int, client: WireClient, key: str, rank: int | None, interval: float) -> None:
    """Beat for process ``kernel`` until it ends, then say so once; store errors propagate."""
    os.set_blocking(fd, False)
    n = 0
    last_word = next_beat = time.monotonic()  # the kernel has just started us: its Python ran

    def record(busy: float = 0.0, gone: bool = False) -> str:
        return Beat(n, time.time(), busy, gone, kernel, os.getpid(), rank).to_json()

    while True:
        now = time.monotonic()
        if now >= next_beat:
            n += 1
            client.set(PREFIX + key, record(busy=round(now - last_word, 1)))
            next_beat += interval
            if next_beat <= now:  # a late beat (a stalled host): do not send a burst to catch up
                next_beat = now + interval
        wait = min(CHECK_EVERY, max(0.0, next_beat - time.monotonic()))
        readers: list[Any] = [fd, client]
        ready, _, _ = select.select(readers, [], [], wait)
        if fd in ready:
            got, eof = _drain(fd)
            if got:
                last_word = time.monotonic()
            if eof:
                break
        if client in ready and client.closed_by_server():
            raise StoreConnectionError(f"the rendezvous server at {client.address} closed the connection")
        if os.getppid() != kernel:  # the kernel died, but a process it forked still holds the pipe
            break
    n += 1
    client.set(PREFIX + key, record(gone=True))


def _parse(argv: list[str] | None) -> argparse.Namespace:
    def positive(text: str) -> float:
        value = float(text)
        if not value > 0:
            raise argparse.ArgumentTypeError(f"must be > 0, not {text}")
        return value

    parser = argparse.ArgumentParser(prog="python -m nbdist.world.pulse",
                                     description="Beat for the kernel that started us.")
    parser.add_argument("--host", required=True)
    parser.add_argument("--port", type=int, required=True)
    parser.add_argument("--key", required=True, help='stored as "nbdist/" + KEY')
    parser.add_argument("--fd", type=int, required=True, help="read end of the kernel's pipe")
    parser.add_argument("--interval", type=positive, default=1.0, help="seconds between beats")
    parser.add_argument("--rank", type=int, default=None)
    return parser.parse_args(argv)


def main(argv: list[str] | None = None) -> int:
    args = _parse(argv)
    signal.signal(signal.SIGTERM, signal.SIG_DFL)  # a kernel that ignores SIGTERM must still be able to stop us
    signal.signal(signal.SIGINT, signal.SIG_IGN)  # the interrupt button is for the kernel, not for its pulse
    kernel = os.getppid()
    me = "nbdist heartbeat process" if args.rank is None else f"nbdist heartbeat process of rank {args.rank}"
    client = None
    try:
        client = WireClient(args.host, args.port)
        beat_for(kernel, args.fd, client, args.key, args.rank, args.interval)
    except StoreConnectionError as exc:
        print(f"{me}: {exc}", file=sys.stderr)
        return 1
    except OSError as exc:  # the pipe: a wrong --fd
        print(f"{me}: cannot read the kernel's pipe (fd {args.fd}): {exc.strerror or exc}", file=sys.stderr)
        return 1
    finally:
        if client is not None:
            client.close()
    return 0


# --- the kernel's side ------------------------------------------------------


class Pulse:
    """The kernel's end of its pulse process: start it, feed it with :meth:`beat`, stop it."""

    def __init__(self, process: subprocess.Popen[bytes], pipe: int, stderr: BinaryIO) -> None:
        self._process = process
        self._pipe: int | None = pipe
        self._stderr: BinaryIO | None = stderr
        self._last_words = ""  # the end of the stderr log, kept when stop() closes it
        self._lock = threading.Lock()  # a beat must not write to a descriptor that stop() closed and reused

    @classmethod
    def start(cls, host: str, port: int, key: str, rank: int | None, interval: float = 1.0) -> Pulse:
        """Start a pulse that sets ``nbdist/<key>`` every ``interval`` s for this process."""
        read_end, write_end = os.pipe()  # not inherited across exec (a bare fork keeps them: see beat_for)
        os.set_blocking(write_end, False)
        stderr = tempfile.TemporaryFile(prefix="nbdist-pulse-", suffix=".log")
        flags = {"--host": host, "--port": port, "--key": key, "--fd": read_end, "--interval": float(interval)}
        if rank is not None:
            flags["--rank"] = rank
        argv = [sys.executable, "-m", "nbdist.world.pulse", *(str(x) for item in flags.items() for x in item)]
        # The child imports the very nbdist this kernel runs, wherever that lies.
        package_root = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
        path = os.pathsep.join(p for p in (package_root, os.environ.get("PYTHONPATH")) if p)
        env = {**os.environ, "PYTHONUNBUFFERED": "1", "PYTHONPATH": path}
        try:
            process = subprocess.Popen(
                argv,
                stdin=subprocess.DEVNULL,
                stdout=subprocess.DEVNULL,
                stderr=stderr,
                pass_fds=(read_end,),
                env=env,
                start_new_session=True,  # outside the kernel's process group: it outlives a kill of the group
            )
        except BaseException:
            os.close(write_end)
            stderr.close()
            raise
        finally:
            os.close(read_end)
        log.debug("pulse %d started for rank %s (key %s)", process.pid, rank, key)
        return cls(process, write_end, stderr)

    @property
    def pid(self) -> int:
        return self._process.pid

    @property
    def running(self) -> bool:
        return self._process.poll() is None

    @property
    def returncode(self) -> int | None:
        return self._process.poll()

    def beat(self) -> None:
        """Tell the pulse that this kernel's Python runs; never blocks, never raises."""
        with self._lock:
            if self._pipe is None:
                return
            try:
                os.write(self._pipe, b"\x01")
            except (BlockingIOError, BrokenPipeError):  # the pipe is full, or the pulse has died
                pass

    def error(self, lines: int = 5) -> str:
        """The last lines the pulse wrote to stderr ("" when it wrote nothing)."""
        text = self._last_words if self._stderr is None else self._read_stderr()
        return "\n".join(text.splitlines()[-lines:])

    def stop(self) -> None:
        """Stop the pulse without it saying "gone"; idempotent."""
        if self._process.poll() is None:
            self._process.terminate()
            try:
                self._process.wait(STOP_GRACE)
            except subprocess.TimeoutExpired:
                log.warning("nbdist: heartbeat process %d ignored SIGTERM for %g s; killing it", self.pid, STOP_GRACE)
                self._process.kill()
                try:
                    self._process.wait(STOP_GRACE)
                except subprocess.TimeoutExpired:  # stuck in the OS; nothing more to do from here
                    log.warning("nbdist: heartbeat process %d did not exit after SIGKILL", self.pid)
        with self._lock:  # closed only after the pulse ended, or it would read end-of-file and say "gone"
            if self._pipe is not None:
                os.close(self._pipe)
                self._pipe = None
        if self._stderr is not None:
            self._last_words = self._read_stderr()
            self._stderr.close()
            self._stderr = None

    def __enter__(self) -> Pulse:
        return self

    def __exit__(self, *exc: object) -> None:
        self.stop()

    def _read_stderr(self, limit: int = 4096) -> str:
        assert self._stderr is not None
        fd = self._stderr.fileno()
        size = os.fstat(fd).st_size
        start = max(0, size - limit)
        # pread leaves the shared offset alone: the child keeps appending where it was
        return os.pread(fd, size - start, start).decode(errors="replace")


if __name__ == "__main__":
    sys.exit(main())
