"""Equal errors group (nbdist.view.alike, and the tables that use it): what names a rank itself is taken out,
nothing else; a group's one text names its ranks as a set. Pure: table tests."""

from __future__ import annotations

import pytest

from nbdist.view.alike import key, merge
from nbdist.view.celltable import cell_table
from nbdist.view.tracebacks import readable
from nbdist.world.capture_record import Capture


def frame(path: str, line: int = 3, code: str = "raise ValueError(x)") -> str:
    return f'Traceback (most recent call last):\n  File "{path}", line {line}, in <module>\n    {code}\n'


@pytest.mark.parametrize(("a", "b", "alike"), [
    # Equal but for the kernel's temporary file of the cell (its pid): alike.
    (frame("/tmp/ipykernel_101/826.py") + "ValueError: bad value", frame("/tmp/ipykernel_202/826.py") +
     "ValueError: bad value", True),
    # nbdist's own words for each rank itself: alike.
    ("MaxTimeError: rank 0 (vm, pid 11) was still running its body", "MaxTimeError: rank 1 (vm, pid 12) was still "
     "running its body", True),
    ("rank 0 (?, pid ?) is gone", "rank 1 (?, pid ?) is gone", True),
    # A differing number, a different line, another cell, another rank named: not alike.
    (frame("/tmp/ipykernel_101/826.py") + "ValueError: bad 0", frame("/tmp/ipykernel_202/826.py") +
     "ValueError: bad 1", False),
    (frame("/tmp/ipykernel_101/826.py", 3), frame("/tmp/ipykernel_202/826.py", 4), False),
    (frame("/tmp/ipykernel_101/826.py"), frame("/tmp/ipykernel_202/999.py"), False),
    ("stopped because rank 7 (vm, pid 17) was still running", "stopped because rank 6 (vm, pid 16) was still "
     "running", False),
    ("loss 0.25 on rank 0 (vm, pid 11)", "loss 0.26 on rank 1 (vm, pid 12)", False),
    # A rank's own number written by the user (not nbdist's phrase) stays.
    ("ValueError: bad 0", "ValueError: bad 1", False),
])
def test_two_ranks_texts_are_alike_only_when_they_differ_in_what_names_the_rank_itself(a, b, alike):
    assert (key(a, 0) == key(b, 1)) is alike


@pytest.mark.parametrize(("texts", "ranks", "shown"), [
    (["rank 0 (vm, pid 11) was still running", "rank 1 (vm, pid 12) was still running",
      "rank 2 (vm, pid 13) was still running"], [0, 1, 2], "each of ranks 0-2 (vm, pids 11, 12, 13) was still running"),
    ([f"rank {r} (vm, pid {10 + r}) hung" for r in range(7)], list(range(7)),
     "each of ranks 0-6 (vm, pids 10, 11, 12, 13, …) hung"),
    (["rank 2 (a, pid 1) x", "rank 5 (b, pid 2) x"], [2, 5], "each of ranks 2,5 (a, b, pids 1, 2) x"),
    (["the same", "the same"], [0, 1], "the same"),
    ([frame("/tmp/ipykernel_1/8.py"), frame("/tmp/ipykernel_2/8.py")], [0, 1], frame("/tmp/ipykernel_1/8.py")),
    (["rank 3 (vm, pid 13) alone"], [3], "rank 3 (vm, pid 13) alone"),
])
def test_a_groups_one_text_names_its_ranks_as_a_set(texts, ranks, shown):
    assert merge(texts, ranks) == shown


def test_a_cell_frame_reads_as_its_cell_line_and_an_installed_module_from_its_package():
    text = (frame("/tmp/ipykernel_17244/3880071843.py", 5, "loss.backward()")
            + '  File "/work/.venv/lib/python3.11/site-packages/torch/_tensor.py", line 623, in backward\n'
            + '  File "/home/me/train.py", line 9, in step\n')
    assert readable(text) == ("Traceback (most recent call last):\n  cell line 5, in <module>\n    loss.backward()\n"
                              '  File "torch/_tensor.py", line 623, in backward\n'
                              '  File "/home/me/train.py", line 9, in step\n')


def _cap(evalue: str, path: str, line: int = 2, hidden: bool = False) -> Capture:
    short = frame(path, line) + f"ValueError: {evalue}\n"
    full = short + ('  File "/x/nbdist/cell/stopper.py", line 9, in _handle\n' if hidden else "")
    return Capture.from_dict({"outputs": [], "result": None, "wall": 0.01, "error": {
        "ename": "ValueError", "evalue": evalue, "traceback": full, "short": short, "where": f"line {line}"}})


def _heads(table) -> list[str]:
    return [line.strip("─ ").split(" · ")[0] for line in repr(table).splitlines() if line.startswith("── ")]


def test_one_error_on_every_rank_is_one_row_for_all_shown_once_with_its_cell_line():
    caps = [_cap("bad value", f"/tmp/ipykernel_{100 + r}/8.py") for r in range(4)]
    table = cell_table("t", [{"host": "vm"}] * 4, caps)
    text, html = repr(table), table._repr_html_()
    assert _heads(table) == ["all 4 ranks (identical)"] and "differs" not in text + html
    assert text.count("ValueError: bad value") == 1 and "cell line 2, in <module>" in text
    assert "ipykernel" not in text + html


def test_nbdists_own_message_naming_each_rank_is_one_group_with_the_ranks_as_a_set():
    caps = [_cap(f"rank {r} (vm, pid {100 + r}) was still running", f"/tmp/ipykernel_{100 + r}/8.py", hidden=True)
            for r in range(4)]
    table = cell_table("t", [{"host": "vm"}] * 4, caps)
    text = repr(table)
    assert _heads(table) == ["all 4 ranks (identical)"]
    assert "ValueError: each of ranks 0-3 (vm, pids 100, 101, 102, 103) was still running" in text
    assert "rank 1 (vm" not in text


def test_eight_ranks_hung_in_two_places_are_two_groups():
    caps = [_cap(f"rank {r} (vm, pid {100 + r}) was still running", f"/tmp/ipykernel_{100 + r}/8.py",
                 5 if r < 7 else 7, hidden=True) for r in range(8)]
    table = cell_table("t", [{"host": "vm"}] * 8, caps)
    assert table.by_groups and _heads(table) == ["all but rank 7", "rank 7"]
    html = table._repr_html_()
    assert "each of ranks 0-6 (vm, pids 100, 101, 102, 103, …) was still running" in html
    assert "rank 7 (vm, pid 107) was still running" in html and "cell line 7" in html


@pytest.mark.parametrize("view", ["ranks", "groups"])
def test_errors_that_really_differ_stay_apart(view):
    by_number = cell_table("t", [{"host": "vm"}] * 4, [_cap(f"bad {r}", f"/tmp/ipykernel_{r}/8.py") for r in range(4)],
                           view=view)
    assert len(_heads(by_number)) == 4, repr(by_number)
    by_line = cell_table("t", [{"host": "vm"}] * 4, [_cap("bad", f"/tmp/ipykernel_{r}/8.py", 2 + r % 2)
                                                      for r in range(4)], view=view)
    assert len(_heads(by_line)) == (2 if view == "groups" else 4), repr(by_line)
