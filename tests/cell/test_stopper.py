"""nbdist.cell.stopper: a stop raises in the main thread only while a body runs, never in nbdist's bookkeeping."""

from __future__ import annotations

import threading
import time

import pytest

from nbdist.cell.stopper import Stopper


class Stop(Exception):
    pass


@pytest.fixture
def stopper():
    s = Stopper()
    s.install()
    yield s
    s.reset()
    s.uninstall()


def _wait_for_signal() -> None:
    time.sleep(0.05)  # the handler runs on the main thread at the next bytecode after the signal


def test_an_armed_stopper_raises_in_the_main_thread(stopper: Stopper) -> None:
    stopper.arm()
    with pytest.raises(Stop):
        threading.Thread(target=stopper.stop, args=(Stop("now"),)).start()
        for _ in range(100):
            _wait_for_signal()


def test_after_pause_a_stop_is_refused_and_nothing_raises_until_the_next_arm(stopper: Stopper) -> None:
    stopper.arm()  # IPython's pre_run_cell
    stopper.arm()  # the %%collective body
    stopper.pause()  # the body ended
    stopper.disarm()
    assert stopper.armed  # still the cell's, for a plain cell's stop
    assert stopper.stop(Stop("late")) is False
    _wait_for_signal()
    stopper.arm()  # the next body: armed again
    with pytest.raises(Stop):
        threading.Thread(target=stopper.stop, args=(Stop("next"),)).start()
        for _ in range(100):
            _wait_for_signal()


def test_a_stop_sent_before_the_pause_is_dropped_by_it(stopper: Stopper) -> None:
    stopper.arm()
    from nbdist.cell import stopper as module

    with module._held_off():  # the signal is sent, but held back as when the main thread is busy in C
        assert stopper.stop(Stop("in flight")) is True
        stopper.pause()
    _wait_for_signal()  # delivered now: paused, it raises nothing


def test_reset_at_the_end_of_a_cell_clears_an_arm_that_was_never_disarmed(stopper: Stopper) -> None:
    stopper.arm()
    stopper.arm()  # a stop cut the body's disarm short
    stopper.disarm()
    assert stopper.armed
    stopper.reset()
    assert not stopper.armed and stopper.stop(Stop("after the cell")) is False
