"""What a kernel that took over a slot lacks (issue 47, item 3): the names sent with its NameError, and what a
notebook that survived says of them."""

from __future__ import annotations

import pytest

from nbdist.cell.names import HELD_MAX, lacking, user_names, with_held
from nbdist.world.capture_record import Capture, Raised

NAME_ERROR = Raised("NameError", "name 'model' is not defined")


def test_user_names_leave_out_ipythons_own_hidden_and_underscored_names():
    ns = {"model": 1, "opt": 2, "In": [], "Out": {}, "_": None, "_i3": "", "__builtins__": None, "get_ipython": None,
          "np": None, "exit": None}
    assert user_names(ns, hidden={"np"}) == ["model", "opt"]


@pytest.mark.parametrize(("error", "carried"), [
    (NAME_ERROR, ["a", "b"]),
    (Raised("ValueError", "bad"), None),  # only a NameError carries them
])
def test_only_a_name_error_carries_the_names(error, carried):
    assert with_held(error, ["a", "b"]).held == carried
    assert with_held(None, ["a"]) is None


def test_the_names_carried_are_bounded_and_cross_the_store_in_the_capture():
    held = with_held(NAME_ERROR, [f"n{i}" for i in range(HELD_MAX + 10)])
    assert len(held.held) == HELD_MAX
    cap = Capture(outputs=[], result=None, error=held, wall=0.1)
    assert Capture.from_dict(cap.as_dict()).error == held
    assert "held" not in Capture(outputs=[], result=None, error=NAME_ERROR, wall=0.1).as_dict()["error"]


@pytest.mark.parametrize(("held", "ours", "said"), [
    (None, ["model"], ""),
    ([], ["model"], " (its kernel is new, and it lacks 1 name this notebook holds: model; %dist_replay runs again "
                    "the cells that made them, %dist_sync NAME... copies state)"),
    (["t"], ["t", "model", "opt"], " (its kernel is new, and it lacks 2 names this notebook holds: model, opt; "
                                   "%dist_replay runs again the cells that made them, %dist_sync NAME... copies "
                                   "state)"),
    (["model"], ["model"], " (its kernel is new: it holds every name this notebook holds)"),
])
def test_a_surviving_notebook_says_which_of_its_names_the_new_kernel_lacks(held, ours, said):
    error = NAME_ERROR if held is None else Raised("NameError", "x", held=held)
    assert lacking(error, ours) == said


def test_a_long_list_is_cut_with_a_count():
    said = lacking(Raised("NameError", "x", held=[]), [f"v{i:02}" for i in range(20)])
    assert "lacks 20 names" in said and "v07, and 12 more;" in said and "v08" not in said
