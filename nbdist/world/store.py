"""The rendezvous server and clients: torch's ``TCPStore``, reached through one choke point.

Everything stored is JSON text; nothing read from the network is decoded any other way.
Every store call goes through :meth:`StoreClient._call`, which turns torch's
network errors into :class:`~nbdist.errors.StoreConnectionError` naming the
server. Every wait runs in a helper thread while the calling thread waits in
short slices, so the stop button works (TCPStore ignores SIGINT).

For soaks, ``NBDIST_STORE_FUZZ`` (:func:`nbdist.config.store_fuzz`) makes each client
sleep a seeded random delay before and after its operations and waits (:class:`Fuzzer`);
unset, a client pays one attribute check per call.

:data:`COUNTS` counts this process's store traffic as it passes (:class:`StoreCounts`): operations, by kind,
and the bytes of keys and values sent and received.
"""

from __future__ import annotations

import itertools
import json
import logging
import os
import queue
import random
import socket
import threading
import time
from collections.abc import Callable, Sequence
from datetime import timedelta
from typing import Any

from .._version import __version__
from ..config import FUZZ_VARIABLE, POLL_INTERVAL, TIMEOUTS, StoreFuzz, store_fuzz
from ..errors import NotNbdistServerError, StoreConnectionError, WaitTimeout
from . import auth, keys, records, signing

OP_TIMEOUT = 10.0  # seconds a single store operation may take before the server counts as unreachable

log = logging.getLogger(__name__)

PREFIX = "nbdist/"
_ABSENT = "\x00nbdist:absent"  # never a stored value: nbdist stores JSON and plain text
MARKER_KEY = PREFIX + keys.SERVER


def probe(host: str, port: int, timeout: float = 1.0) -> str:
    """Is anything listening at host:port? One of "open", "refused", "timeout", "unreachable"."""
    try:
        with socket.create_connection((host, port), timeout=timeout):
            return "open"
    except ConnectionRefusedError:
        return "refused"
    except TimeoutError:
        return "timeout"
    except OSError:
        return "unreachable"


def tcp_store(*args: Any, **kwargs: Any) -> Any:
    """A ``TCPStore`` on libuv (the classic server can freeze when one client stalls); older torch has no choice."""
    import torch.distributed as dist

    try:
        return dist.TCPStore(*args, **{**kwargs, "use_libuv": True})
    except TypeError:  # torch < 2.4 does not take use_libuv
        return dist.TCPStore(*args, **kwargs)


def bound_connections(host: str, port: int, seconds: float = OP_TIMEOUT) -> int:
    """Make this process's connections to host:port fail after ``seconds`` of unacknowledged data.

    A TCPStore call on a connection whose network went away otherwise blocks
    until TCP gives up (many minutes), ignoring the store's own timeout.
    ``TCP_USER_TIMEOUT`` makes the kernel abort such a connection instead, so
    the call raises. Returns how many connections were set.
    """
    option = getattr(socket, "TCP_USER_TIMEOUT", None)
    if option is None or not os.path.isdir("/proc/self/fd"):
        return 0
    try:
        ips = {info[4][0] for info in socket.getaddrinfo(host, port, proto=socket.IPPROTO_TCP)}
    except OSError:
        return 0
    ips |= {f"::ffff:{ip}" for ip in ips}
    count = 0
    for name in os.listdir("/proc/self/fd"):
        try:
            if not os.readlink(f"/proc/self/fd/{name}").startswith("socket:"):
                continue
            with socket.socket(fileno=os.dup(int(name))) as sock:
                peer = sock.getpeername()
                if isinstance(peer, tuple) and peer[0] in ips and peer[1] == port:
                    sock.setsockopt(socket.IPPROTO_TCP, option, int(seconds * 1000))
                    count += 1
        except OSError:
            continue  # closed meanwhile, not a TCP socket, or not connected
    return count


def run_in_thread(fn: Callable[[], Any], seconds: float, what: str, on_tick: Callable[[], None] | None = None) -> Any:
    """Run a blocking torch call in a daemon thread; wait in interruptible slices (``on_tick`` runs at each, and
    may raise to give up the wait)."""
    box: dict[str, Any] = {}
    done = threading.Event()

    def target() -> None:
        try:
            box["value"] = fn()
        except BaseException as exc:  # handed to the caller below
            box["error"] = exc
        finally:
            done.set()

    threading.Thread(target=target, name=f"nbdist-{what}", daemon=True).start()
    deadline = time.monotonic() + seconds
    while not done.wait(POLL_INTERVAL):
        if on_tick is not None:
            on_tick()
        if time.monotonic() > deadline:
            raise WaitTimeout(f"{what} took longer than {seconds:g} s")
    if "error" in box:
        raise box["error"]
    return box["value"]


def listening(host: str, port: int) -> socket.socket:
    """A socket listening on ``host:port`` (raises OSError where it cannot): what a :class:`Server` serves on."""
    family = socket.AF_INET6 if ":" in host else socket.AF_INET
    sock = socket.socket(family, socket.SOCK_STREAM)
    sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
    try:
        sock.bind((host, port))
        sock.listen(512)
    except OSError:
        sock.close()
        raise
    return sock


class Server:
    """A ``TCPStore`` server bound to one address (not all interfaces)."""

    def __init__(self, host: str, port: int, token: str | None = None, listener: socket.socket | None = None
                 ) -> None:
        """``listener``: a socket already listening on ``host:port`` (:func:`listening`), which the server takes
        over; else the server binds the port itself."""
        self.host, self.port = host, port
        self.token = token  # kept in memory only: the store holds a salted hash
        if listener is not None:
            sock = listener
        else:
            try:
                sock = listening(host, port)
            except OSError as exc:
                raise StoreConnectionError(
                    f"cannot start the rendezvous server on {host}:{port}: {exc.strerror or exc}"
                ) from exc
        if port == 0:
            self.port = sock.getsockname()[1]
        # The server owns the descriptor from here on; closing it under the
        # server would abort the process.
        fd = sock.detach()
        self._store = tcp_store(
            host,
            self.port,
            is_master=True,
            wait_for_workers=False,
            master_listen_fd=fd,
            timeout=timedelta(seconds=TIMEOUTS["connect"]),
        )
        marker = {"nbdist": __version__, "host": socket.gethostname(), "pid": os.getpid(),
                  "auth": auth.record(token)}
        self._store.set(MARKER_KEY, json.dumps(marker))
        # A world on one machine without a token still signs the cells it drives (nbdist.world.signing).
        self.key_path = signing.create_local_key(self.port) if not token and signing.on_loopback(host) else None

    @property
    def running(self) -> bool:
        return self._store is not None

    def stop(self) -> None:
        """Stop serving; idempotent."""
        if self._store is not None:
            self._store = None  # dropping the last reference stops the server
            signing.remove_local_key(self.key_path)
            log.debug("rendezvous server on %s:%s stopped", self.host, self.port)


class StoreCounts:
    """This process's store traffic through :class:`StoreClient`, counted where it passes: a few integer adds.

    ``ops`` counts every :meth:`StoreClient._call` (each public operation, and ``clone``) and every
    :meth:`StoreClient.wait`; ``kinds`` breaks them down by operation (``what``) as ``[ops, sent, received]``.
    ``get_if`` counts how many of the ``compare_set`` ones were :meth:`StoreClient.get_if` reads.

    Bytes are the payload as far as the client sees it, approximate: ``sent``, the characters of the keys
    (with their prefix) and values a call sends (``len`` of the str: the bytes where the text is ASCII, as
    nbdist's JSON is), 8 for an ``add``'s amount; ``received``, the value a call returns (bytes: its length;
    a number 8, a boolean 1; ``multi_get``'s values together). torch's framing (command bytes, lengths) is not
    counted, nor what does not pass a ``StoreClient``: the pulse process's beats (:mod:`.pulse`), the process
    group's own use of the store, a wait helper's connection being made. ``TCPStore.get`` is one operation
    here and two round trips on the wire (a wait, then the read). Threads update the counts without a lock:
    an update lost to a thread switch is possible, if unlikely. :meth:`snapshot` and :meth:`delta` read them.
    """

    __slots__ = ("ops", "sent", "received", "get_if", "kinds")

    def __init__(self) -> None:
        self.ops = self.sent = self.received = self.get_if = 0
        self.kinds: dict[str, list[int]] = {}

    def kind(self, what: str) -> list[int]:
        """The ``[ops, sent, received]`` of one operation kind (made on its first use)."""
        counts = self.kinds.get(what)
        if counts is None:
            counts = self.kinds[what] = [0, 0, 0]
        return counts

    def snapshot(self) -> dict[str, Any]:
        """The counts now, as plain JSON-able data."""
        return {"ops": self.ops, "sent": self.sent, "received": self.received, "get_if": self.get_if,
                "kinds": {what: list(counts) for what, counts in self.kinds.items()}}

    @staticmethod
    def delta(before: dict[str, Any], after: dict[str, Any]) -> dict[str, Any]:
        """What moved between two snapshots (kinds that did not move are left out)."""
        kinds = {}
        for what, counts in after["kinds"].items():
            old = before["kinds"].get(what, [0, 0, 0])
            moved = [a - b for a, b in zip(counts, old, strict=True)]
            if any(moved):
                kinds[what] = moved
        out = {key: after[key] - before[key] for key in ("ops", "sent", "received", "get_if")}
        out["kinds"] = kinds
        return out


COUNTS = StoreCounts()  # this process's: every StoreClient adds to it


def _sent(what: str, size: int) -> None:
    """Count ``size`` bytes sent by an operation of kind ``what`` (its ``_call`` counts the operation)."""
    counts = COUNTS
    counts.sent += size
    counts.kind(what)[1] += size


_ORDINALS = itertools.count()  # this process's fuzzed clients, in the order they were made


class Fuzzer:
    """One client's schedule fuzz: before and after each store operation, a delay with some probability.

    Each decision draws from the client's own ``random.Random``, seeded from the fuzz seed and the
    client's ordinal in its process, so a process that makes its clients in the same order takes the
    same decisions for a given seed. ``chances`` and ``delays`` count the decisions and the delays drawn.
    """

    def __init__(self, fuzz: StoreFuzz, ordinal: int) -> None:
        self.fuzz, self.ordinal = fuzz, ordinal
        self._rng = random.Random(f"nbdist-store-fuzz:{fuzz.seed}:{ordinal}")
        self._lock = threading.Lock()  # a client may be shared by threads: one decision at a time
        self.chances = 0
        self.delays = 0

    @classmethod
    def from_environment(cls) -> Fuzzer | None:
        """A fuzzer for a new client if ``NBDIST_STORE_FUZZ`` asks for one, else None (read once per client)."""
        fuzz = store_fuzz()
        if fuzz is None:
            return None
        ordinal = next(_ORDINALS)
        if ordinal == 0:
            log.info("store fuzzing on (%s=%s, SEED:PROBABILITY:MAX_MS)", FUZZ_VARIABLE, fuzz.spec)
        return cls(fuzz, ordinal)

    def draw(self) -> float:
        """The next decision, in seconds to sleep (0.0: this chance is not taken)."""
        with self._lock:
            taken = self._rng.random() < self.fuzz.probability
            ms = self._rng.uniform(0.0, self.fuzz.max_ms)  # drawn either way: every decision uses two numbers
            self.chances += 1
            self.delays += taken
        return ms / 1000.0 if taken else 0.0

    def pause(self) -> None:
        """Take the next decision: sleep, or not."""
        seconds = self.draw()
        if seconds > 0.0:
            time.sleep(seconds)


class StoreClient:
    """One connection to the rendezvous server, with JSON helpers."""

    def __init__(self, host: str, port: int, store: Any) -> None:
        self.host, self.port = host, port
        self._store = store
        self._idle_waiters: list[Any] = []
        self.marker: dict[str, Any] = {}  # the server's marker, once verified
        self.fuzzer = Fuzzer.from_environment()  # None unless NBDIST_STORE_FUZZ is set

    @property
    def address(self) -> str:
        return f"{self.host}:{self.port}"

    def raw(self) -> Any:
        """The underlying ``TCPStore`` (for ``init_process_group``)."""
        return self._store

    def _call(self, what: str, fn: Callable[[], Any]) -> Any:
        import torch.distributed as dist

        fuzzer = self.fuzzer
        if fuzzer is not None:
            fuzzer.pause()
        try:
            out = fn()
        except dist.DistNetworkError as exc:
            raise self._gone(what) from exc
        except dist.DistStoreError as exc:  # an operation (not a wait) that timed out: the link is gone
            raise self._gone(what) from exc
        counts = COUNTS
        counts.ops += 1
        kind = counts.kind(what)
        kind[0] += 1
        got = type(out)
        size = len(out) if got is bytes else 8 if got is int else 1 if got is bool else 0
        if got is list:  # multi_get's values
            size = sum(len(v) for v in out if type(v) is bytes)
        if size:
            counts.received += size
            kind[2] += size
        if fuzzer is not None:
            fuzzer.pause()  # after a success only: no delay stands between an error and its caller
        return out

    def _gone(self, what: str) -> StoreConnectionError:
        return StoreConnectionError(
            f"the rendezvous server at {self.address} stopped answering ({what}); "
            "if the notebook hosting it was closed or restarted, re-run %%dist_init "
            "there first, then in the other notebooks"
        )

    # --- plain operations -------------------------------------------------
    def set(self, key: str, value: str) -> None:
        _sent("set", len(PREFIX) + len(key) + len(value))
        self._call("set", lambda: self._store.set(PREFIX + key, value))

    def get(self, key: str) -> str:
        _sent("get", len(PREFIX) + len(key))
        return str(self._call("get", lambda: self._store.get(PREFIX + key)).decode())

    def get_if(self, key: str) -> str | None:
        """The value of ``key``, or None when it is not set: one round trip, never waits.

        (``get`` costs two round trips, a wait and a read; a compare-and-set whose
        expected value can never be stored reads in one and changes nothing. But
        torch's TCPStore wakes every wait on a missing key that it reads this way:
        read a key that others may be waiting for with :meth:`check`, and wait in a
        loop that looks again, as :func:`nbdist.world.gather.barrier` does.)
        """
        COUNTS.get_if += 1  # counted as a compare_set: this says how many of those were reads
        value = self.compare_set(key, _ABSENT, _ABSENT)
        return None if value == _ABSENT else value

    def multi_get(self, keys: Sequence[str]) -> list[str]:
        """Values of keys that are known to exist."""
        full = [PREFIX + k for k in keys]
        _sent("multi_get", sum(len(k) for k in full))
        return [v.decode() for v in self._call("multi_get", lambda: self._store.multi_get(full))]

    def check(self, keys: Sequence[str]) -> bool:
        full = [PREFIX + k for k in keys]
        _sent("check", sum(len(k) for k in full))
        return bool(self._call("check", lambda: self._store.check(full)))

    def add(self, key: str, amount: int) -> int:
        _sent("add", len(PREFIX) + len(key) + 8)
        return int(self._call("add", lambda: self._store.add(PREFIX + key, amount)))

    def compare_set(self, key: str, expected: str, desired: str) -> str:
        """Set ``key`` to ``desired`` if it holds ``expected`` ("" = unset); returns its value."""
        _sent("compare_set", len(PREFIX) + len(key) + len(expected) + len(desired))
        out = self._call(
            "compare_set", lambda: self._store.compare_set(PREFIX + key, expected, desired)
        )
        return str(out.decode())

    def delete(self, key: str) -> None:
        _sent("delete_key", len(PREFIX) + len(key))
        self._call("delete_key", lambda: self._store.delete_key(PREFIX + key))

    def append(self, key: str, value: str) -> None:
        _sent("append", len(PREFIX) + len(key) + len(value))
        self._call("append", lambda: self._store.append(PREFIX + key, value))

    # --- JSON -------------------------------------------------------------
    def set_json(self, key: str, value: Any) -> None:
        self.set(key, json.dumps(value))

    def get_json(self, key: str) -> Any:
        return json.loads(self.get(key))

    def get_json_if(self, key: str) -> Any:
        text = self.get_if(key)
        return None if text is None else json.loads(text)

    # --- waiting ----------------------------------------------------------
    def clone(self, op_timeout: float | None = None) -> StoreClient:
        """A second connection to the same server (for another thread); ``op_timeout`` defaults to ``OP_TIMEOUT``."""
        store = self._call("clone", self._store.clone)
        store.set_timeout(timedelta(seconds=OP_TIMEOUT if op_timeout is None else op_timeout))
        bound_connections(self.host, self.port)
        return StoreClient(self.host, self.port, store)

    def wait(
        self,
        keys: Sequence[str],
        seconds: float,
        on_tick: Callable[[], None] | None = None,
    ) -> None:
        """Wait until all ``keys`` are set. ``on_tick`` runs every slice and may raise.

        The blocking ``TCPStore.wait`` runs on a spare connection in a helper
        thread; this thread waits in slices, so KeyboardInterrupt and the checks
        in ``on_tick`` end the wait promptly. A connection whose wait was
        abandoned is not reused.
        """
        import torch.distributed as dist

        fuzzer = self.fuzzer
        if fuzzer is not None:
            fuzzer.pause()  # before the wait's deadline starts: a delay does not shorten it
        waiter = self._idle_waiters.pop() if self._idle_waiters else _Waiter(self._store, self.host, self.port)
        full = [PREFIX + k for k in keys]
        counts = COUNTS  # a wait does not pass _call: counted here, once, whether or not it is woken in time
        counts.ops += 1
        kind = counts.kind("wait")
        kind[0] += 1
        size = sum(len(k) for k in full)
        counts.sent += size
        kind[1] += size
        box, done = waiter.submit(full, seconds)
        deadline = time.monotonic() + seconds
        try:
            while not done.wait(POLL_INTERVAL):
                if on_tick is not None:
                    on_tick()
                if time.monotonic() > deadline:
                    raise WaitTimeout(f"waited {seconds:g} s for {', '.join(keys)}")
        except BaseException:
            waiter.close()  # still waiting: its connection is not reused
            raise
        error = box.get("error")
        if error is None:
            self._idle_waiters.append(waiter)
            if fuzzer is not None:
                fuzzer.pause()
            return
        waiter.close()
        if isinstance(error, dist.DistNetworkError):
            raise self._gone("wait") from error
        raise WaitTimeout(f"waited {seconds:g} s for {', '.join(keys)}") from error

    def close(self) -> None:
        """Drop this connection and its spare ones; idempotent."""
        self._store = None
        for waiter in self._idle_waiters:
            waiter.close()
        self._idle_waiters.clear()


class _Waiter:
    """A spare connection with a thread of its own, for one blocking ``TCPStore.wait`` at a time.

    The thread lives as long as the connection is reused, so a wait costs no thread start.
    """

    def __init__(self, store: Any, host: str, port: int) -> None:
        self._store, self._host, self._port = store, host, port
        self._conn: Any = None
        self._jobs: queue.SimpleQueue[Any] = queue.SimpleQueue()
        threading.Thread(target=self._run, name="nbdist-wait", daemon=True).start()

    def submit(self, keys: list[str], seconds: float) -> tuple[dict[str, Any], threading.Event]:
        box: dict[str, Any] = {}
        done = threading.Event()
        self._jobs.put((keys, seconds, box, done))
        return box, done

    def close(self) -> None:
        """No more waits: the thread ends once its current one does."""
        self._jobs.put(None)

    def _run(self) -> None:
        while (job := self._jobs.get()) is not None:
            keys, seconds, box, done = job
            try:
                if self._conn is None:  # connecting ignores SIGINT: do it here, not in the waiting thread
                    self._conn = self._store.clone()
                    bound_connections(self._host, self._port)
                self._conn.wait(keys, timedelta(seconds=seconds + 5.0))
            except BaseException as exc:  # handed to the waiting thread
                box["error"] = exc
            finally:
                done.set()


# A TCPStore answers its handshake in milliseconds, but a slow reverse-DNS lookup
# of the peer can stall a connect by ~5 s; anything slower is not a TCPStore.
HANDSHAKE_TIMEOUT = 15.0


def connect(host: str, port: int, timeout: float = TIMEOUTS["connect"], token: str | None = None,
            holder: str | None = None) -> StoreClient:
    """Connect to a server already known to listen at host:port; check it is nbdist's and the token.

    ``holder`` describes the local process on that port, if known, for the error message.
    """
    import torch.distributed as dist

    def make() -> Any:
        return tcp_store(host, port, is_master=False, timeout=timedelta(seconds=timeout))

    on_port = f" (held by {holder})" if holder else ""
    try:
        store = run_in_thread(make, min(timeout, HANDSHAKE_TIMEOUT), f"connecting to {host}:{port}")
    except WaitTimeout as exc:
        raise NotNbdistServerError(
            f"{host}:{port}{on_port} accepts connections but does not answer like an nbdist server; "
            "another program uses that port: choose another --master-port"
        ) from exc
    except (dist.DistNetworkError, dist.DistStoreError) as exc:
        raise NotNbdistServerError(
            f"{host}:{port}{on_port} is not an nbdist server ({str(exc).splitlines()[0]}); "
            "choose another --master-port"
        ) from exc
    store.set_timeout(timedelta(seconds=OP_TIMEOUT))
    bound_connections(host, port)
    client = StoreClient(host, port, store)
    client.marker = verify(client)
    auth.check(client.marker, token, client.address)
    return client


def verify(client: StoreClient, grace: float = 2.0) -> dict[str, Any]:
    """Check that the server is nbdist's (its marker key); returns the marker."""
    deadline = time.monotonic() + grace
    while True:
        text = client.get_if(keys.SERVER)
        if text is not None:
            marker = records.object_or_none(text)  # anyone can write there: what is not a JSON object is no marker
            if marker is None:
                break
            return marker
        if time.monotonic() > deadline:
            break
        time.sleep(POLL_INTERVAL)  # a server started a moment ago sets its marker next
    raise NotNbdistServerError(
        f"{client.address} answers as a TCPStore but is not an nbdist server "
        "(perhaps a torchrun job uses that port): choose another --master-port"
    )
