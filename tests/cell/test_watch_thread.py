"""The cells' watching thread (:mod:`nbdist.cell.watchthread`): one thread runs one cell's watch after another, a
second watch at once gets a thread of its own, and signal bytes of an ended watch are not the next one's.

The watches here are this test's own (the thread's protocol: ``watch(read_fd)`` until ``ended()``); a real
kernel's cells run :class:`nbdist.cell.watch.CellWatch` on it (``tests/cell/test_plain_watch.py`` and the stop
tests)."""

from __future__ import annotations

import os
import select
import threading
from collections.abc import Callable

from nbdist.cell import watchthread

WAIT = 30.0  # seconds an event may take on 2 busy cores: a bound on a hang, not a speed


class Watch:
    """Records the thread it ran on and the bytes it read, until :meth:`end`."""

    def __init__(self) -> None:
        self.started, self.returned, self._ended = threading.Event(), threading.Event(), threading.Event()
        self.thread: int | None = None
        self.read = b""

    def watch(self, read_fd: int) -> None:
        self.thread = threading.get_ident()
        self.started.set()
        while not self._ended.is_set():
            ready, _, _ = select.select([read_fd], [], [], 0.05)
            if ready and not self._ended.is_set():
                try:
                    self.read += os.read(read_fd, 64).replace(b"\0", b"")
                except BlockingIOError:
                    pass
        self.returned.set()

    def ended(self) -> bool:
        return self._ended.is_set()

    def end(self) -> None:
        self._ended.set()


def wait_for(ready: Callable[[], bool]) -> bool:
    done = threading.Event()
    for _ in range(int(WAIT / 0.01)):
        if ready():
            return True
        done.wait(0.01)
    return ready()


def watching_threads() -> list[threading.Thread]:
    return [t for t in threading.enumerate() if t.name == "nbdist-watch"]


def test_one_thread_runs_one_watch_after_another() -> None:
    runner = watchthread.Runner(linger=60)
    first, second, third = Watch(), Watch(), Watch()
    try:
        assert runner.take(first)
        assert first.started.wait(WAIT)
        first.end()
        assert runner.take(second)  # taken at once: the thread lets the ended watch go at its wake-up
        assert second.started.wait(WAIT)
        assert first.returned.is_set() and second.thread == first.thread
        second.end()
        assert runner.take(third, prompt=False)  # not woken: taken at the end of the ended watch's slice
        assert third.started.wait(WAIT) and third.thread == first.thread
    finally:
        second.end()
        third.end()
        runner.stop()


def test_a_second_watch_at_once_is_refused_and_run_gets_it_a_thread_of_its_own() -> None:
    outer, inner = Watch(), Watch()
    shared = watchthread.run(outer)
    try:
        assert outer.started.wait(WAIT)
        assert not shared.take(inner)  # the shared thread runs a live watch
        own = watchthread.run(inner)
        assert own is not shared
        assert inner.started.wait(WAIT) and inner.thread != outer.thread
        inner.end()
        assert inner.returned.wait(WAIT)
        for t in watching_threads():
            if t.ident == inner.thread:
                t.join(WAIT)  # a thread of one watch ends after it
        assert inner.thread not in [t.ident for t in watching_threads()]
        assert not own.take(Watch())  # and takes no other
    finally:
        outer.end()
        watchthread.stop()


def test_signal_bytes_of_an_ended_watch_are_not_the_next_watchs() -> None:
    runner = watchthread.Runner(linger=60)
    first, second = Watch(), Watch()
    try:
        assert runner.take(first)
        assert first.started.wait(WAIT)
        first.end()
        os.write(runner.write_fd, b"\2")  # a SIGINT byte, as signal.set_wakeup_fd writes it, after the cell ended
        runner.drain()  # as CellWatch.__exit__ does
        assert runner.take(second)
        assert second.started.wait(WAIT)
        os.write(runner.write_fd, b"\3")
        assert wait_for(lambda: b"\3" in second.read)
        assert second.read == b"\3"
    finally:
        second.end()
        runner.stop()


def test_a_stopped_runner_ends_its_thread_after_its_watch_and_closes_its_pipe() -> None:
    runner = watchthread.Runner(linger=60)
    watch = Watch()
    assert runner.take(watch)
    assert watch.started.wait(WAIT)
    thread = next(t for t in watching_threads() if t.ident == watch.thread)
    runner.stop()
    assert not runner.take(Watch())  # stopped: it takes no new watch
    assert thread.is_alive()  # its watch has not ended
    watch.end()
    thread.join(WAIT)
    assert not thread.is_alive()
    runner.wake()  # after the close: nothing is written to a number another file may hold now
    runner.drain()


def test_a_runner_stopped_after_its_thread_ended_idle_closes_its_pipe() -> None:
    runner = watchthread.Runner(linger=0.01)
    pipe = os.fstat(runner.read_fd).st_ino
    watch = Watch()
    assert runner.take(watch)
    assert watch.started.wait(WAIT)
    thread = next(t for t in watching_threads() if t.ident == watch.thread)
    watch.end()
    thread.join(WAIT)  # ended idle, its pipe kept for a next watch
    assert os.fstat(runner.read_fd).st_ino == pipe
    runner.stop()
    assert not [fd for fd in (runner.read_fd, runner.write_fd) if _is_pipe(fd, pipe)]


def _is_pipe(fd: int, inode: int) -> bool:
    try:
        return os.fstat(fd).st_ino == inode
    except OSError:  # closed
        return False


def test_an_idle_thread_ends_after_its_linger_and_the_next_watch_starts_another() -> None:
    runner = watchthread.Runner(linger=0.05)
    first, second = Watch(), Watch()
    try:
        assert runner.take(first)
        assert first.started.wait(WAIT)
        thread = next(t for t in watching_threads() if t.ident == first.thread)
        first.end()
        thread.join(WAIT)  # idle past its linger
        assert not thread.is_alive()
        assert runner.take(second, prompt=False)  # the thread is gone: a new one, which takes it at once
        assert second.started.wait(WAIT)
    finally:
        first.end()
        second.end()
        runner.stop()


class Failing(Watch):
    """A watch whose every run raises: the thread must neither end nor run it again."""

    def __init__(self) -> None:
        super().__init__()
        self.runs = 0

    def watch(self, read_fd: int) -> None:
        self.runs += 1
        self.started.set()
        raise RuntimeError("a watch that fails")


def test_a_watch_that_fails_is_run_once_and_the_next_watch_runs_on_the_same_thread() -> None:
    runner = watchthread.Runner(linger=60)
    failing, after = Failing(), Watch()
    try:
        assert runner.take(failing)
        assert failing.started.wait(WAIT)
        assert wait_for(lambda: runner.take(after))  # free again once the failed run is over, though not ended
        assert after.started.wait(WAIT)
        assert failing.runs == 1 and after.thread in [t.ident for t in watching_threads()]
    finally:
        after.end()
        runner.stop()
