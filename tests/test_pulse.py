"""The pulse process: real processes, a real TCPStore on a free loopback port, no mocks."""

from __future__ import annotations

import itertools
import json
import os
import queue
import signal
import socket
import subprocess
import sys
import threading
import time
import uuid
from collections.abc import Callable, Iterator
from datetime import timedelta
from typing import Any

import pytest

from nbdist.world import pulse, store
from nbdist.world.pulse import Beat, Pulse, WireClient, beat_from, judge

from .conftest import free_port

torch_dist = pytest.importorskip("torch.distributed")

# A stand-in kernel: starts its pulse, beats from a thread every 0.5 s, and obeys
# commands on stdin: "hold" (a regex that holds the GIL for 4.5-11 s), "fork" (a child
# that inherits the pipe and outlives the kernel).
KERNEL = r"""
import math, os, re, sys, threading, time
from nbdist.world.pulse import Pulse

host, port, key = sys.argv[1], int(sys.argv[2]), sys.argv[3]
p = Pulse.start(host, port, key, rank=3)

def feed():
    while True:
        p.beat()
        time.sleep(0.5)

def backtrack(n):  # catastrophic backtracking inside _sre, which never releases the GIL
    start = time.monotonic()
    re.match(r"(a+)+$", "a" * n + "b")
    return time.monotonic() - start

threading.Thread(target=feed, daemon=True).start()
print("ready", p.pid, flush=True)
for line in sys.stdin:
    command = line.strip()
    if command == "hold":
        n = 25 + round(math.log2(8.0 / backtrack(25)))  # each extra "a" about doubles the time
        while (held := backtrack(n)) < 4.5:  # a busy host skews the estimate
            n += 1
        print("held", held, flush=True)
    elif command == "fork":
        child = os.fork()
        if child == 0:  # holds the write end of the pipe, as a DataLoader worker would
            time.sleep(60)
            os._exit(0)
        print("forked", child, flush=True)
"""


def exited(pid: int) -> bool:
    """Has process ``pid`` ended? (A zombie has: an orphan's new parent may be slow to reap it.)"""
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return True
    try:
        with open(f"/proc/{pid}/stat") as f:
            return f.read().rsplit(")", 1)[1].split()[0] in ("Z", "X")
    except FileNotFoundError:  # reaped meanwhile, or no /proc here (then os.kill said enough)
        return os.path.isdir("/proc")


def wait_until(condition: Callable[[], Any], seconds: float, what: str, every: float = 0.05) -> Any:
    """Poll ``condition`` until it returns something true; fail the test after ``seconds``."""
    deadline = time.monotonic() + seconds
    while True:
        value = condition()
        if value:
            return value
        if time.monotonic() > deadline:
            pytest.fail(f"waited {seconds:g} s for {what}")
        time.sleep(every)


class Master:
    """A real TCPStore server in this process, read through torch's own client."""

    def __init__(self, host: str = "127.0.0.1", use_libuv: bool = True) -> None:
        self.host, self.port = host, free_port()
        self.store = torch_dist.TCPStore(
            host,
            self.port,
            is_master=True,
            wait_for_workers=False,
            use_libuv=use_libuv,
            timeout=timedelta(seconds=5),
        )

    def beat(self, key: str) -> dict[str, Any] | None:
        full = pulse.PREFIX + key
        return json.loads(self.store.get(full)) if self.store.check([full]) else None


@pytest.fixture
def master() -> Master:
    return Master()


@pytest.fixture
def key() -> str:
    return f"hb/{uuid.uuid4().hex}"


class Kernel:
    """The stand-in kernel process, with its stdout read line by line in a thread."""

    def __init__(self, master: Master, key: str) -> None:
        self.process = subprocess.Popen(
            [sys.executable, "-c", KERNEL, master.host, str(master.port), key],
            stdin=subprocess.PIPE,
            stdout=subprocess.PIPE,
            text=True,
        )
        self.lines: queue.Queue[str] = queue.Queue()
        threading.Thread(target=self._read, daemon=True).start()
        self.pulse_pid = int(self.expect("ready", 15)[0])
        self.forked: list[int] = []

    def _read(self) -> None:
        assert self.process.stdout is not None
        for line in self.process.stdout:
            self.lines.put(line)

    def send(self, command: str) -> None:
        assert self.process.stdin is not None
        self.process.stdin.write(command + "\n")
        self.process.stdin.flush()

    def expect(self, word: str, seconds: float) -> list[str]:
        """The words after ``word`` on the next line the kernel prints; fails after ``seconds``."""
        try:
            line = self.lines.get(timeout=seconds)
        except queue.Empty:
            pytest.fail(f"the kernel did not print {word!r} within {seconds:g} s")
        head, *rest = line.split()
        assert head == word, line
        return rest

    def poll_line(self) -> str | None:
        try:
            return self.lines.get_nowait()
        except queue.Empty:
            return None

    def kill(self) -> None:
        self.process.kill()
        self.process.wait()


@pytest.fixture
def start_kernel(master: Master, key: str) -> Iterator[Callable[[], Kernel]]:
    """Factory: a stand-in kernel with its pulse; everything it started is ended after the test."""
    started: list[Kernel] = []

    def factory() -> Kernel:
        started.append(Kernel(master, key))
        return started[-1]

    yield factory
    for k in started:
        k.kill()
        for pid in k.forked:
            if not exited(pid):
                os.kill(pid, signal.SIGKILL)
        deadline = time.monotonic() + 3
        while not exited(k.pulse_pid) and time.monotonic() < deadline:
            time.sleep(0.05)
        if not exited(k.pulse_pid):  # a pulse that outlives its kernel is a bug: end it, then fail
            os.kill(k.pulse_pid, signal.SIGKILL)
            pytest.fail(f"pulse {k.pulse_pid} outlived its kernel")


def beats_of(master: Master, key: str) -> Callable[[], dict[str, Any] | None]:
    return lambda: master.beat(key)


# --- the wire client -----------------------------------------------------------


def socket_has_ipv6_loopback() -> bool:
    try:
        with socket.socket(socket.AF_INET6) as s:
            s.bind(("::1", 0))
    except OSError:
        return False
    return True


@pytest.mark.timeout(30)
@pytest.mark.parametrize("use_libuv", [True, False], ids=["libuv", "classic"])
@pytest.mark.parametrize("host", ["127.0.0.1", "::1"], ids=["ipv4", "ipv6"])
def test_wire_client_set_reads_back_through_torchs_client(host: str, use_libuv: bool) -> None:
    if host == "::1" and not socket_has_ipv6_loopback():
        pytest.skip("no IPv6 loopback here")
    m = Master(host, use_libuv=use_libuv)
    reader = torch_dist.TCPStore(host, m.port, is_master=False, use_libuv=use_libuv, timeout=timedelta(seconds=5))
    big = json.dumps({"text": "é" * 50_000, "n": 1})  # multi-byte and long: lengths are bytes, 8 of them
    client = WireClient(host, m.port)
    try:
        client.set("nbdist/wire/a", "first")
        client.set("nbdist/wire/a", big)  # overwrites
        client.set("nbdist/wire/b", b"")  # an empty value, then one more message: the framing held
        client.set("nbdist/wire/c", '{"ok": true}')
        assert reader.get("nbdist/wire/c") == b'{"ok": true}'  # get waits: SET has no reply
        assert reader.get("nbdist/wire/a").decode() == big
        assert reader.get("nbdist/wire/b") == b""
        assert not client.closed_by_server()
    finally:
        client.close()
    client.close()  # idempotent


def test_pulse_module_does_not_import_torch() -> None:
    code = "import sys, nbdist.world.pulse; print(sorted(m for m in sys.modules if m.split('.')[0] == 'torch'))"
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=30, check=True)
    assert out.stdout.strip() == "[]"
    assert pulse.PREFIX == store.PREFIX


# --- the pulse process ---------------------------------------------------------


@pytest.mark.timeout(60)
def test_pulse_beats_every_second_while_the_kernel_runs_python(master: Master, key: str, start_kernel) -> None:
    kernel = start_kernel()
    first = wait_until(beats_of(master, key), 10, "the first beat")
    start = time.monotonic()
    seen = [first]
    while seen[-1]["n"] < first["n"] + 3:
        assert time.monotonic() - start < 4.5, f"3 beats took over 4.5 s: {seen}"
        beat = master.beat(key)
        if beat["n"] != seen[-1]["n"]:
            seen.append(beat)
        time.sleep(0.05)
    for beat in seen:
        assert beat["pid"] == kernel.process.pid
        assert beat["pulse"] == kernel.pulse_pid
        assert beat["rank"] == 3
        assert beat["busy"] < 2.0
        assert "gone" not in beat
    assert [b["n"] for b in seen] == list(range(first["n"], first["n"] + 4))
    assert all(0.5 < b["t"] - a["t"] < 1.5 for a, b in itertools.pairwise(seen))
    if os.path.isdir("/proc"):  # a pulse that imported torch would use over 150 MB
        with open(f"/proc/{kernel.pulse_pid}/status") as f:
            rss_kb = next(int(line.split()[1]) for line in f if line.startswith("VmRSS:"))
        assert rss_kb < 60_000, f"the pulse uses {rss_kb} kB"


@pytest.mark.timeout(60)
def test_pulse_keeps_beating_while_the_kernel_holds_the_gil(master: Master, key: str, start_kernel) -> None:
    kernel = start_kernel()
    wait_until(beats_of(master, key), 10, "the first beat")
    kernel.send("hold")
    samples = []
    deadline = time.monotonic() + 25
    while (line := kernel.poll_line()) is None:
        assert time.monotonic() < deadline, "the regex did not end within 25 s"
        samples.append(master.beat(key))
        time.sleep(0.1)
    head, seconds = line.split()
    assert head == "held" and float(seconds) > 4.0, f"the GIL was held for {seconds} s only: recalibrate"
    print(f"held the GIL for {float(seconds):.1f} s; busy peaked at {max(s['busy'] for s in samples)} s")
    assert not any(s.get("gone") for s in samples)
    assert max(s["busy"] for s in samples) > 3.0
    beats_while_busy = {s["n"] for s in samples if s["busy"] > 1.0}
    assert len(beats_while_busy) >= 3, samples  # beats kept coming while the kernel's Python could not run
    wait_until(lambda: master.beat(key)["busy"] < 2.0, 3, "busy to fall once the regex ended")


@pytest.mark.timeout(60)
def test_pulse_says_gone_within_1_5_s_when_the_kernel_is_killed(master: Master, key: str, start_kernel) -> None:
    kernel = start_kernel()
    last = wait_until(beats_of(master, key), 10, "the first beat")
    kernel.kill()
    gone = wait_until(lambda: (b := master.beat(key)) and b.get("gone") and b, 1.5, "the beat to say gone")
    assert gone["n"] > last["n"]
    assert gone["pid"] == kernel.process.pid and gone["pulse"] == kernel.pulse_pid
    wait_until(lambda: exited(kernel.pulse_pid), 1.5, "the pulse to exit")


@pytest.mark.timeout(60)
def test_pulse_says_gone_when_the_kernel_dies_but_a_forked_child_holds_the_pipe(
    master: Master, key: str, start_kernel
) -> None:
    kernel = start_kernel()
    wait_until(beats_of(master, key), 10, "the first beat")
    kernel.send("fork")
    kernel.forked.append(int(kernel.expect("forked", 5)[0]))
    kernel.kill()
    wait_until(lambda: (b := master.beat(key)) and b.get("gone"), 1.5, "the beat to say gone")
    wait_until(lambda: exited(kernel.pulse_pid), 1.5, "the pulse to exit")
    assert not exited(kernel.forked[0])  # the pipe was still open: the parent check saw the kernel go


@pytest.mark.timeout(60)
def test_stop_ends_the_pulse_without_saying_gone(master: Master, key: str) -> None:
    p = Pulse.start(master.host, master.port, key, rank=0, interval=0.3)
    try:
        first = wait_until(beats_of(master, key), 10, "the first beat")
        assert p.running and first["pulse"] == p.pid and first["pid"] == os.getpid()
        p.beat()
        p.stop()
        assert not p.running and exited(p.pid)
        assert p.returncode == -signal.SIGTERM
        last = master.beat(key)
        time.sleep(0.6)  # two intervals: a pulse that wrote on its way out would have by now
        assert master.beat(key) == last and not last.get("gone")
        p.beat()  # after stop: a no-op, no error
    finally:
        p.stop()  # idempotent
    assert p.error() == ""


@pytest.mark.timeout(30)
def test_pulse_exits_1_with_one_clear_line_when_nothing_listens(key: str) -> None:
    port = free_port()
    with Pulse.start("127.0.0.1", port, key, rank=5) as p:
        wait_until(lambda: not p.running, 10, "the pulse to give up")
        assert p.returncode == 1
        lines = p.error().splitlines()
    assert len(lines) == 1, lines
    assert lines[0].startswith("nbdist heartbeat process of rank 5: cannot reach the rendezvous server at 127.0.0.1:")
    assert f":{port}" in lines[0] and "refused" in lines[0]
    assert p.error() == lines[0]  # still there after stop


@pytest.mark.timeout(30)
def test_pulse_exits_1_when_the_server_goes_away(key: str) -> None:
    m = Master()
    with Pulse.start(m.host, m.port, key, rank=1, interval=0.2) as p:
        wait_until(beats_of(m, key), 10, "the first beat")
        del m.store  # the last reference: the server stops and closes its connections
        wait_until(lambda: not p.running, 3, "the pulse to notice")
        assert p.returncode == 1
        expected = f"nbdist heartbeat process of rank 1: the rendezvous server at 127.0.0.1:{m.port} "
        assert p.error().startswith(expected), p.error()


@pytest.mark.timeout(30)
def test_pulse_says_gone_and_exits_0_when_its_pipe_closes(master: Master, key: str) -> None:
    read_end, write_end = os.pipe()
    process = subprocess.Popen(
        [
            sys.executable,
            "-m",
            "nbdist.world.pulse",
            "--host",
            master.host,
            "--port",
            str(master.port),
            "--key",
            key,
            "--fd",
            str(read_end),
            "--interval",
            "0.2",
        ],
        pass_fds=(read_end,),
        stderr=subprocess.PIPE,
    )
    os.close(read_end)
    try:
        wait_until(beats_of(master, key), 10, "the first beat")
        os.close(write_end)
        assert process.wait(timeout=2) == 0, process.stderr.read() if process.stderr else ""
        gone = wait_until(lambda: (b := master.beat(key)) and b.get("gone") and b, 1, "the beat to say gone")
        assert gone["rank"] is None and gone["pulse"] == process.pid
    finally:
        process.kill()
        process.wait()


# --- judging a beat ------------------------------------------------------------


@pytest.mark.parametrize(
    ("beat", "moved_ago", "verdict"),
    [
        (Beat(4, 1.0, busy=0.4), 0.8, ("alive", 0.0)),
        (Beat(4, 1.0, busy=2.0), 0.8, ("alive", 0.0)),
        (Beat(4, 1.0, busy=12.3), 0.8, ("busy", 12.3)),
        (Beat(4, 1.0, busy=0.4), 6.0, ("dead", 6.0)),
        (Beat(4, 1.0, busy=12.3), 6.0, ("dead", 6.0)),  # a stale beat proves nothing about being busy
        (Beat(5, 1.0, gone=True), 0.1, ("gone", 0.0)),
        (Beat(5, 1.0, gone=True), 60.0, ("gone", 0.0)),  # the last word stays
        (beat_from('{"n": 3, "t": 1.0}'), 0.5, ("alive", 0.0)),  # an old-style heartbeat has no "busy"
        (None, 1.0, ("alive", 0.0)),  # not beaten yet, still within the grace
        (None, 9.0, ("dead", 9.0)),
    ],
)
def test_judge_reads_a_beat(beat: Beat | None, moved_ago: float, verdict: tuple[str, float]) -> None:
    assert judge(beat, moved_ago, dead_after=5.0) == verdict
