"""A rank's output as a table shows it: its first and its latest lines, and a count of what was left out. Pure."""

from __future__ import annotations

import pytest

from nbdist.view.shrink import Left, head_tail


def out(*lines: str, kind: str = "stdout") -> dict:
    return {"kind": kind, "text": "".join(f"{line}\n" for line in lines)}


def numbered(n: int) -> dict:
    return out(*(f"line {i}" for i in range(n)))


@pytest.mark.parametrize(("head", "tail", "left", "lines", "chars", "expected"), [
    # Fits: shown as it is, no note.
    ([numbered(4)], [], Left(), 10, 10_000, [numbered(4)]),
    # One long run: its first and its last lines, the middle counted.
    ([numbered(10)], [], Left(), 4, 10_000,
     [out("line 0", "line 1"), {"kind": "note", "text": "… [6 lines not shown: output truncated] …"},
      out("line 8", "line 9")]),
    # What the log left out already is added to what this view leaves out.
    ([numbered(3)], [out("line 997", "line 998", "line 999")], Left(994, 8_940), 4, 10_000,
     [out("line 0", "line 1"), {"kind": "note", "text": "… [996 lines (9 kB) not shown: output truncated] …"},
      out("line 998", "line 999")]),
    # Nothing left for this view to cut, but the log left some out: the note stays where it was.
    ([numbered(2)], [out("line 9")], Left(7, 49), 10, 10_000,
     [numbered(2), {"kind": "note", "text": "… [7 lines not shown: output truncated] …"}, out("line 9")]),
    # A line longer than the room keeps its start and its end; characters counted, not lines.
    ([{"kind": "stdout", "text": "x" * 50}], [], Left(), 10, 20,
     [{"kind": "stdout", "text": "x" * 10}, {"kind": "note", "text": "… [30 characters not shown: output truncated] …"},
      {"kind": "stdout", "text": "x" * 10}]),
    # Streams and displays keep their order; a display counts as a line, and a dropped one is counted.
    ([out("a"), {"kind": "display", "data": {"text/plain": "1"}}, out("b", kind="stderr")],
     [{"kind": "display", "data": {"text/plain": "2"}}, out("c")], Left(), 2, 10_000,
     [out("a"), {"kind": "note", "text": "… [1 line and 2 displays not shown: output truncated] …"}, out("c")]),
])
def test_the_table_keeps_the_head_and_the_latest_lines_and_counts_what_it_left_out(head, tail, left, lines, chars,
                                                                                 expected):
    assert head_tail(head, tail, left, lines, chars) == expected


def test_the_note_says_where_the_whole_output_is():
    whole = "the whole output: nbdist.rank_output(3, full=True)"
    (_, note, _) = head_tail([numbered(100)], [], Left(), 2, 10_000, whole)
    assert note["text"] == ("… [98 lines not shown: output truncated; "
                            "the whole output: nbdist.rank_output(3, full=True)] …")


def test_twenty_thousand_lines_become_a_few_kilobytes():
    shown = head_tail([numbered(20_000)], [], Left(), 100, 16 * 1024)
    assert sum(len(o["text"]) for o in shown) < 3_000
    assert shown[0]["text"].startswith("line 0\n") and shown[-1]["text"].endswith("line 19999\n")
    assert shown[1]["text"].startswith("… [19,900 lines (")
