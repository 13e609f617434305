"""The side-by-side display and the capture helpers, without a frontend."""

from __future__ import annotations

import json

from nbdist.capture import BoundedStream, truncate
from nbdist.display import Cell, SideBySide, cell_table

RANKS = [{"host": "host-a"}, {"host": "host-b"}]


def _cap(stdout="", error=None, result=None, displays=()):
    return {"stdout": stdout, "stderr": "", "result": result, "displays": list(displays), "error": error, "wall": 0.01}


def test_identical_output_is_shown_once_and_marked_identical():
    table = cell_table("t", RANKS, [_cap("same\n"), _cap("same\n")])
    bundle = table._repr_mimebundle_()
    assert bundle["text/html"].count("same") == 1
    assert "identical on all 2 ranks" in bundle["text/html"]
    assert "all 2 ranks (identical)" in bundle["text/plain"]


def test_differing_output_is_marked_and_each_rank_stands_under_its_heading():
    table = cell_table("t", RANKS, [_cap("zero\n"), _cap("one\n")])
    bundle = table._repr_mimebundle_()
    assert "differs between ranks" in bundle["text/html"]
    text = bundle["text/plain"]
    assert text.index("── rank 0 · host-a") < text.index("zero") < text.index("── rank 1 · host-b") < text.index("one")
    assert "stdout (differs)" in text


def test_rank_output_is_escaped_never_run():
    evil = "<script>alert(1)</script><img src=x onerror=alert(2)>"
    html = cell_table("t", RANKS, [_cap(evil), _cap(evil, result={"text/plain": evil})])._repr_html_()
    assert "<script>" not in html and "<img src=x" not in html
    assert "&lt;script&gt;" in html


def test_only_valid_base64_images_are_embedded():
    good = {"image/png": "iVBORw0KGgo=", "text/plain": "<Figure>"}
    bad = {"image/png": '"><script>alert(1)</script>', "text/plain": "<Figure>"}
    html = cell_table("t", RANKS, [_cap(displays=[good]), _cap(displays=[bad])])._repr_html_()
    assert 'src="data:image/png;base64,iVBORw0KGgo="' in html
    assert "<script>" not in html


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


def test_a_capture_of_megabytes_fits_the_store():
    from nbdist.cells import fit as _fit

    huge = {"text/plain": "x", "image/png": "A" * (6 * 1024 * 1024)}
    text = _fit({**_cap("out"), "displays": [huge]})
    assert len(text) < 8 * 1024 * 1024
    assert json.loads(text)["displays"] == [{"text/plain": "x"}]


def test_the_text_form_leaves_out_what_a_rank_did_not_produce():
    table = cell_table("t", RANKS, [_cap("zero\n", result={"text/plain": "0"}), _cap("one\n")])
    text = repr(table)
    rank1 = text[text.index("── rank 1"):]
    assert "Out" not in rank1 and "one" in rank1
    assert "Out (differs): 0" in text


def test_the_status_tells_a_busy_rank_from_a_gone_one():
    from nbdist.magics import _alive

    alive = {"heartbeat_age": 0.4, "alive": True, "gone": False, "busy": 0.0}
    assert _alive(alive) == "yes (heartbeat 0.4 s ago)"
    assert _alive({**alive, "busy": 12.3}) == "yes, busy for 12 s (its Python is inside one long call)"
    assert _alive({**alive, "alive": False, "gone": True}) == "NO: its kernel is gone"
    assert _alive({**alive, "alive": False, "heartbeat_age": 9.0}) == "NO (heartbeat 9.0 s ago)"
