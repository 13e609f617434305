"""The supervisor of spawned workers (nbdist.drive.workers.Workers), on real worker kernels: a restarted worker
that dies before it joins is left down, and a shutdown during a restart leaves no kernel behind.

No master listens on the workers' port: their %%dist_init waits, so none joins on its own. A test marks the
first kernel joined, as the driving kernel's spawn sees it once it did (a restart is only for a worker that
joined); what the supervisor does from there is its own, on kernels started and killed for real.
"""

from __future__ import annotations

import os
import secrets
import signal
import time
from collections.abc import Callable, Iterator

import pytest

from nbdist.drive import workers

from ..conftest import free_port, wait_gone

DOWN_START = "it died again before it joined after a restart (a failure as it starts would only repeat)"


def kernels_with(token: str) -> list[int]:
    """The processes started with ``token`` as their NBDIST_TOKEN: the kernels of one Workers, whatever started."""
    found = []
    for entry in os.listdir("/proc"):
        if entry.isdigit():
            try:
                with open(f"/proc/{entry}/environ", "rb") as f:
                    if f"NBDIST_TOKEN={token}".encode() in f.read().split(b"\0"):
                        found.append(int(entry))
            except OSError:
                continue
    return found


def wait_until(what: str, ok: Callable[[], bool], within: float = 90) -> None:
    deadline = time.monotonic() + within
    while not ok():
        assert time.monotonic() < deadline, f"{what}: not within {within} s"
        time.sleep(0.1)


@pytest.fixture
def supervised() -> Iterator[workers.Workers]:
    """One worker kernel, started, marked joined, under the supervisor; everything with its token is gone after."""
    token = secrets.token_hex(8)
    ws = workers.Workers(2, free_port(), token)
    try:
        ws.start()
        ws.workers[0].joined = True
        yield ws
    finally:
        ws.shutdown()
        for pid in kernels_with(token):  # a test that failed half-way: nothing of it may outlive it
            os.kill(pid, signal.SIGKILL)


def test_a_restarted_worker_that_dies_before_it_joins_is_left_down_and_nothing_is_left_running(supervised):
    w = supervised.workers[0]
    first = w.pid
    assert first is not None
    os.kill(first, signal.SIGKILL)
    # Started again, its three cells queued (killed before it answered, its start fails).
    wait_until("the worker is started again", lambda: w.pid not in (None, first) and w.init_id != "")
    second = w.pid
    assert second is not None and len(w.restarts) == 1
    os.kill(second, signal.SIGKILL)  # before it joins (it cannot: no master)
    wait_until("the restarted worker is left down", lambda: w.down is not None)
    assert w.down == DOWN_START
    assert [e.restarted for e in w.exits] == [True, False] and "killed by SIGKILL" in w.exits[0].how
    assert [e.pid for e in w.exits] == [first, second]
    (row,) = supervised.rows()
    assert row["down"] == DOWN_START and row["restarts"].startswith("1 of 3") and row["pid"] == second
    wait_gone([first, second], 15)
    assert kernels_with(supervised.token) == []


def test_a_shutdown_during_a_restart_stops_the_supervisor_and_leaves_no_kernel(supervised):
    w = supervised.workers[0]
    first = w.pid
    assert first is not None
    os.kill(first, signal.SIGKILL)
    wait_until("the restart begins", lambda: len(w.restarts) == 1)
    supervisor = supervised._supervisor
    supervised.shutdown()  # the new kernel is starting, or has just started: either way it is stopped
    assert supervisor is not None and not supervisor.is_alive()
    wait_gone(kernels_with(supervised.token), 15)
    assert w.down is None  # a stop, not a failure to report
    supervised.shutdown()  # idempotent
