"""The supervisor of spawned workers (nbdist.drive.workers.Workers): a dead one is started again in its slot or
left down, and a shutdown during a restart leaves no kernel behind. Stand-in kernel managers: no kernel starts."""

from __future__ import annotations

import signal
import threading
import time

import pytest

from nbdist.drive import workers

DOWN_START = "it died again before it joined after a restart (a failure as it starts would only repeat)"


class FakeProcess:
    def __init__(self, returncode: int | None) -> None:
        self.returncode = returncode

    def poll(self) -> int | None:
        return self.returncode


class FakeClient:
    def __init__(self, manager: FakeManager) -> None:
        self.manager = manager

    def start_channels(self) -> None: ...

    def stop_channels(self) -> None: ...

    def wait_for_ready(self, timeout: float) -> None:
        self.manager.waiting.set()
        if not self.manager.ready:
            time.sleep(timeout)
            raise RuntimeError("Kernel didn't respond")

    def execute(self, code: str, store_history: bool = True) -> str:
        self.manager.cells.append(code)
        return f"msg-{len(self.manager.cells)}"

    def get_iopub_msg(self, timeout: float) -> dict:
        raise RuntimeError("closed")  # the reader thread ends at once


class FakeManager:
    """A kernel manager whose kernel is a flag; ``made`` holds every one that was created."""

    made: list[FakeManager] = []
    ready = True

    def __init__(self, **_: object) -> None:
        self.has_kernel, self.cells, self.waiting = False, [], threading.Event()
        self.provisioner = type("P", (), {"pid": 4242 + len(FakeManager.made), "process": FakeProcess(None)})()
        FakeManager.made.append(self)

    def start_kernel(self, **_: object) -> None:
        self.has_kernel = True

    def client(self) -> FakeClient:
        return FakeClient(self)

    def is_alive(self) -> bool:
        return self.has_kernel and self.provisioner.process.returncode is None

    def shutdown_kernel(self, now: bool = False) -> None:
        self.has_kernel = False

    def die(self, returncode: int) -> None:
        self.provisioner.process.returncode = returncode


@pytest.fixture
def fakes(monkeypatch):
    import jupyter_client.manager

    FakeManager.made, FakeManager.ready = [], True
    monkeypatch.setattr(jupyter_client.manager, "KernelManager", FakeManager)
    return FakeManager


def joined_workers(max_restarts: int = 3) -> workers.Workers:
    ws = workers.Workers(2, 29555, "t", max_restarts=max_restarts)
    w = ws.workers[0]
    ws._start(w)
    w.joined = True
    return ws


def test_a_dead_worker_is_started_again_in_its_slot_with_its_three_cells(fakes):
    ws = joined_workers()
    w = ws.workers[0]
    old = w.manager
    old.die(-signal.SIGKILL)
    ws._look(w)
    assert w.manager is not old and not old.has_kernel and w.manager.has_kernel  # the old one cleaned up
    assert w.manager.cells[0] == "%load_ext nbdist" and w.manager.cells[1].startswith("%dist_init --rank 1 ")
    assert w.manager.cells[2] == "%dist_follow --quiet"
    (exit_,) = w.exits
    assert exit_.restarted and exit_.how == "killed by SIGKILL" and w.down is None and len(w.restarts) == 1
    # The new kernel died before it joined: left down, with the reason kept.
    w.manager.die(1)
    ws._look(w)
    assert w.down == DOWN_START and w.manager is None and [e.restarted for e in w.exits] == [True, False]
    assert "exited with code 1" in w.exits[-1].line() and "left down" in w.exits[-1].line()
    ws.shutdown()


def test_with_max_restarts_0_a_dead_worker_is_left_down_and_its_remains_are_stopped(fakes):
    ws = joined_workers(max_restarts=0)
    w = ws.workers[0]
    old = w.manager
    old.die(-signal.SIGSEGV)
    ws._look(w)
    assert w.down == "restarts are off (--max-restarts 0)" and not old.has_kernel and len(fakes.made) == 1
    (row,) = ws.rows()
    assert row["down"] and row["restarts"] == "off (--max-restarts 0)" and "SIGSEGV" in row["exits"][0]
    ws.shutdown()


def test_a_shutdown_during_a_restart_stops_the_new_kernel_and_returns_within_seconds(fakes):
    ws = joined_workers()
    w = ws.workers[0]
    w.manager.die(-signal.SIGKILL)
    FakeManager.ready = False  # the new kernel never answers: the restart waits in _wait_ready
    restart = threading.Thread(target=ws._look, args=(w,), daemon=True)
    restart.start()
    assert _restart_waiting(fakes)
    started = time.monotonic()
    ws.shutdown()
    restart.join(10)
    assert not restart.is_alive() and time.monotonic() - started < 5
    assert not any(m.has_kernel for m in fakes.made)  # no kernel left behind
    assert ws.workers == [] and w.down is None  # a stop, not a failure to report
    ws.shutdown()  # idempotent


def _restart_waiting(fakes) -> bool:
    """Whether the restart's new kernel is being waited for (its manager made, its wait begun) within 10 s."""
    deadline = time.monotonic() + 10
    while len(fakes.made) < 2:
        assert time.monotonic() < deadline, "the restart did not begin"
        time.sleep(0.01)
    return fakes.made[-1].waiting.wait(10)


def test_the_supervisor_thread_stops_with_shutdown(fakes):
    ws = workers.Workers(2, 29555, "t")
    ws.start()
    supervisor = ws._supervisor
    assert supervisor is not None and supervisor.is_alive()
    ws.shutdown()
    assert not supervisor.is_alive() and not any(m.has_kernel for m in fakes.made)
