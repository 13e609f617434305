"""The per-rank facts table and the capture helpers, without a frontend (cell tables: test_celltable.py)."""

from __future__ import annotations

from nbdist.cell.capture import BoundedStream, truncate
from nbdist.view.display import Cell, SideBySide, summary_table


def test_facts_the_same_on_every_rank_are_shown_once_and_the_rest_per_rank():
    table = summary_table("w", [{"host": "vm", "pid": 1}, {"host": "vm", "pid": 2}])
    html, text = table._repr_html_(), repr(table)
    assert html.count(">vm<") == 1 and "identical on all 2 ranks" in html and "differs between ranks" in html
    assert text.index("── all 2 ranks (identical) ──") < text.index("host: vm") < text.index("── rank 0 ──")
    assert "pid (differs): 1" in text and "pid (differs): 2" in text


def test_rows_empty_on_every_rank_are_left_out():
    table = SideBySide("t", ["rank 0", "rank 1"])
    table.add("stderr", [Cell(""), Cell("")])
    assert table.rows == []


def test_a_bounded_stream_keeps_head_and_tail_and_says_what_it_dropped():
    stream = BoundedStream(limit=100)
    for i in range(10_000):
        stream.write(f"line {i}\n")
    value = stream.getvalue()
    assert value.startswith("line 0\n")
    assert value.rstrip().endswith("line 9999")
    assert "characters not shown: output truncated" in value
    assert len(value) < 300


def test_short_output_is_not_truncated():
    assert truncate("hello\n", 100) == "hello\n"
    stream = BoundedStream(limit=100)
    stream.write("a" * 100)
    assert stream.getvalue() == "a" * 100


def test_the_status_tells_a_busy_rank_from_a_gone_one():
    from nbdist.view.notes import alive as _alive

    alive = {"heartbeat_age": 0.4, "alive": True, "gone": False, "busy": 0.0}
    assert _alive(alive) == "yes (heartbeat 0.4 s ago)"
    assert _alive({**alive, "busy": 12.3}) == "yes, busy for 12 s (its Python is inside one long call)"
    assert _alive({**alive, "alive": False, "gone": True}) == "NO: its kernel is gone"
    assert _alive({**alive, "alive": False, "heartbeat_age": 9.0}) == "NO (heartbeat 9.0 s ago)"
