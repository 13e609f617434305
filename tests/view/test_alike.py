"""Equal errors group (nbdist.view.alike, and the tables that use it): what names a rank itself is taken out,
nothing else; a group's one text names its ranks as a set. Pure: table tests."""

from __future__ import annotations

import pytest

from nbdist.view.alike import key, merge
from nbdist.view.celltable import FULL_TRACEBACK, cell_table
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
    # Whoever did it to every rank ("by rank 0 (…)"), the same text on rank 0 as on the others: alike.
    ("stopped by rank 0 (vm, pid 100) with %dist_stop", "stopped by rank 0 (vm, pid 100) with %dist_stop", True),
    ("stopped by rank 0 (vm, pid 100) with %dist_stop", "stopped by rank 2 (vm, pid 102) with %dist_stop", False),
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
    # How long or since when, in nbdist's own words, as each rank saw it: alike.
    ("because rank 3 (vm, pid 13) stopped responding: no heartbeat for 5 s (its kernel", "because rank 3 (vm, pid 13) "
     "stopped responding: no heartbeat for 12 s (its kernel", True),
    ("Missing: rank 2 (vm, pid 12); idle since 09:59:58; last: ran cell 4, 3 s ago", "Missing: rank 2 (vm, pid 12); "
     "idle since 10:00:01; last: ran cell 4, 17 s ago", True),
    # A clock time, alone or in a timestamp (a log line's), whoever wrote it: alike.
    ("[E1203 12:03:04.123456 gloo] timed out", "[E1203 12:03:05.000002 gloo] timed out", True),
    ("at 2024-05-01T23:59:59 it broke", "at 2024-05-02T00:00:01 it broke", True),
    # A number next to "s" that nbdist did not write as a time, or the same words with another rank: not alike.
    ("ValueError: step took 5.03 s", "ValueError: step took 5.31 s", False),
    ("ValueError: after 5 s", "ValueError: after 6 s", False),
    ("ValueError: 5 s ago", "ValueError: 6 s ago", False),
    ("MaxTimeError: was still running after --max-time 1 s", "MaxTimeError: was still running after --max-time 2 s",
     False),
    ("rank 3 (vm, pid 13) stopped responding: no heartbeat for 5 s", "rank 2 (vm, pid 12) stopped responding: no "
     "heartbeat for 5 s", False),
    ("no heartbeat for 5 s on 3 ranks", "no heartbeat for 6 s on 4 ranks", False),
    # A differing number beside a clock time still differs; what only looks like a clock (no hour 24) stays.
    ("loss 0.25 at 12:03:04", "loss 0.26 at 12:03:05", False),
    ("ValueError: 24:00:00", "ValueError: 24:00:01", False),
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


@pytest.mark.parametrize(("texts", "shown"), [
    # Times that differ are the members' range, earliest to latest, whichever member wrote which.
    (["rank 3 (vm, pid 13) stopped responding: no heartbeat for 7 s", "rank 3 (vm, pid 13) stopped responding: no "
      "heartbeat for 5 s", "rank 3 (vm, pid 13) stopped responding: no heartbeat for 12 s"],
     "rank 3 (vm, pid 13) stopped responding: no heartbeat for 5–12 s"),
    (["idle since 10:00:01; last: ran cell 4, 3 s ago", "idle since 09:59:58; last: ran cell 4, 3 s ago"],
     "idle since 09:59:58–10:00:01; last: ran cell 4, 3 s ago"),
    # A clock with a fraction orders by it; a timestamp's day is said once when it is the same.
    (["at 12:03:04.5 x", "at 12:03:04.25 x"], "at 12:03:04.25–12:03:04.5 x"),
    (["at 2024-05-01 12:00:09 x", "at 2024-05-01 12:00:02 x"], "at 2024-05-01 12:00:02–12:00:09 x"),
    (["at 2024-05-01T23:59:59 x", "at 2024-05-02T00:00:01 x"], "at 2024-05-01T23:59:59–2024-05-02T00:00:01 x"),
    # With the group's own-rank phrase: both written for the group.
    ([f"rank {r} (vm, pid {10 + r}) waited; Missing: rank 3 (vm, pid 13); last: ran cell 4, {4 + 2 * r} s ago"
      for r in range(3)], "each of ranks 0-2 (vm, pids 10, 11, 12) waited; Missing: rank 3 (vm, pid 13); last: ran "
     "cell 4, 4–8 s ago"),
    # Times that do not pair up one to one: the first text's, as it is.
    (["at 12:00:01 and 12:00:02", "at 12:00:03"], "at 12:00:01 and 12:00:02"),
])
def test_a_groups_differing_times_are_written_as_their_range(texts, shown):
    assert merge(texts, list(range(len(texts)))) == shown


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


@pytest.mark.parametrize("view", ["ranks", "groups"])
def test_a_groups_full_traceback_shows_the_cell_line_not_one_kernels_temporary_file(view):
    caps = [_cap(f"rank {r} (vm, pid {100 + r}) was still running", f"/tmp/ipykernel_{100 + r}/8.py", hidden=True)
            for r in range(4)]
    table = cell_table("t", [{"host": "vm"}] * 4, caps, view=view)
    text, html = repr(table), table._repr_html_()
    assert len(_heads(table)) == 1, text
    full = text.split(FULL_TRACEBACK, 1)[1]  # the text form's full traceback, after the short one
    assert "cell line 2, in <module>" in full and 'File "/x/nbdist/cell/stopper.py", line 9' in full, text
    opened = html.split("full traceback (with nbdist&#x27;s frames)", 1)[1]  # the HTML's, one click away
    assert "cell line 2, in &lt;module&gt;" in opened and "stopper.py" in opened, html
    assert "ipykernel" not in text + html


def _cut(r: int, seconds: int) -> Capture:
    """Rank ``r``'s column after rank 3 stopped responding: its collective cut, as its own watcher judged it."""
    short = frame(f"/tmp/ipykernel_{100 + r}/8.py", 3, "dist.all_reduce(t)") + "RuntimeError: the group was cut\n"
    return Capture.from_dict({"outputs": [], "result": None, "wall": 6.0, "cancelled": (
        f"rank 3 (vm, pid 103) stopped responding: no heartbeat for {seconds} s (its kernel, host or network went "
        "away)"), "error": {"ename": "RuntimeError", "evalue": "the group was cut", "traceback": short, "short": short,
                            "where": "`dist.all_reduce(t)`, line 3", "consequence": True}})


def test_ranks_stopped_by_one_lost_rank_are_one_group_however_long_each_saw_it_silent():
    table = cell_table("t", [{"host": "vm"}] * 4, [_cut(r, s) for r, s in enumerate([6, 5, 7])] + [_cut(3, 5)],
                       show=[0, 1, 2])
    text = repr(table)
    assert _heads(table) == ["all 3 shown ranks (identical)"], text
    assert ("stopped in `dist.all_reduce(t)`, line 3, because rank 3 (vm, pid 103) stopped responding: no heartbeat "
            "for 5–7 s (its kernel") in text
    assert "cell line 3, in <module>" in text and "ipykernel" not in text + table._repr_html_()
