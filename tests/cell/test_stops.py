"""A rank's stop state (nbdist.cell.stops): one typed event, held for real (SIGINT on this process's main thread)
while nbdist's own part runs, and taken where the turn decides."""

from __future__ import annotations

import signal

import pytest

from nbdist.cell.prestart import Window
from nbdist.cell.stops import PRESS, Kind, Stop, Stops
from nbdist.cell.turn import Phase, Turn
from nbdist.errors import MaxTimeError, StoppedError


def test_the_stop_button_is_held_in_nbdists_part_and_raises_where_the_turn_takes_it():
    stops = Stops()
    with pytest.raises(KeyboardInterrupt):
        with stops.held():
            signal.raise_signal(signal.SIGINT)  # the stop button: recorded, not raised here
            assert stops.pressed
            marker = "went on"  # the statement after the press ran
    assert marker == "went on"
    assert signal.getsignal(signal.SIGINT) is signal.default_int_handler  # given back
    turn = Turn(stops)
    with stops.held():
        turn.claim(3)
        turn.enter(Phase.ARRIVING)
        turn.arrived()
        signal.raise_signal(signal.SIGINT)
        turn.enter(Phase.BUILDING)  # held through a rebuild
        with pytest.raises(KeyboardInterrupt):
            turn.enter(Phase.BODY)
        with stops.released():  # the body: the stop button raises at once
            with pytest.raises(KeyboardInterrupt):
                signal.raise_signal(signal.SIGINT)
        assert not stops.pressed


def test_a_press_held_while_a_cell_begins_is_left_to_the_caller():
    stops = Stops()
    with stops.held(take=False):
        signal.raise_signal(signal.SIGINT)
    assert stops.pressed  # IPython's pre_run_cell would swallow a raise: the cell takes it (finding F4)
    stops.drop()
    assert not stops.pressed



def test_a_stop_is_one_typed_event_a_press_or_the_stop_nbdist_sent():
    assert Stop.of(KeyboardInterrupt()) == PRESS and PRESS.kind is Kind.PRESS
    sent = StoppedError("stopped by rank 0")
    assert Stop.of(sent) == Stop(Kind.SENT, sent)
    raised = PRESS.error()
    assert type(raised) is KeyboardInterrupt
    assert Stop.of(sent).error() is sent  # raised as itself: its kind and message


@pytest.mark.parametrize("landed", [KeyboardInterrupt(), MaxTimeError("--max-time 5 s ran out")])
def test_a_stop_kept_after_a_meeting_opened_is_raised_as_it_came_where_the_turn_takes_it(landed):
    stops = Stops()
    with stops.held(take=False):
        stops.keep(landed)  # every rank had arrived: the stop is for what follows
        assert stops.pressed
        with pytest.raises(type(landed)) as caught:
            stops.check()
    assert type(caught.value) is type(landed) and str(caught.value) == str(landed)
    assert not stops.pressed
    stops.check()  # taken once


def test_a_press_as_a_cell_begins_stops_the_collective_on_entry_and_not_the_next_cell():
    stops = Stops()
    with stops.held(take=False):  # pre_run_cell
        stops.press()
    stops.began(late=False)
    assert stops.at_start and not stops.pressed
    with pytest.raises(KeyboardInterrupt):
        stops.start()  # the %%collective reaches nbdist's code
    stops.start()  # once
    stops.began(late=True)  # a press in ipykernel's gap before the cell, recorded by the prestart window
    stops.ended()  # a plain cell: it ran, and the press ends with it
    stops.start()
    assert not stops.at_start


def test_the_prestart_window_records_a_press_between_cells_in_the_kernels_stops():
    stops = Stops()
    window = Window(stops)
    window._record(signal.SIGINT, None)  # a press in ipykernel's gap (its handler, as pre_handler_hook sets it)
    assert stops.between
    assert window.transform(["x = 1\n"]) == ["raise KeyboardInterrupt  # nbdist: the stop button was pressed "
                                             "before this cell started\n"]
    assert window.started() is False  # the cell itself raises it: nothing is handed on
    assert not stops.between
    window.ended()
    window._record(signal.SIGINT, None)  # after the cell was transformed, before it started
    assert window.started() is True and not stops.between
    window.ended()
