"""The table of one %%collective cell, live or final: merge rule, order, safety, errors. Pure, no kernel: each
rank's capture is its record as published, read by its one codec (the view takes it by its fields)."""

from __future__ import annotations

import json

from nbdist.view.celltable import FULL_TRACEBACK, cell_table
from nbdist.view.shrink import DROPPED, fit
from nbdist.world.capture_record import Capture

RANKS = [{"host": "host-a"}, {"host": "host-b"}]
FIG = "<Figure size 200x100 with 1 Axes>"


def _out(text: str, kind: str = "stdout") -> dict:
    return {"kind": kind, "text": text}


def _show(data: dict) -> dict:
    return {"kind": "display", "data": data}


def _record(*outputs: dict, result: dict | None = None, error: dict | None = None, **extra) -> dict:
    return {"outputs": list(outputs), "result": result, "error": error, "wall": 0.01, **extra}


def _cap(*outputs: dict, result: dict | None = None, error: dict | None = None, **extra) -> Capture:
    return Capture.from_dict(_record(*outputs, result=result, error=error, **extra))


def test_identical_output_is_shown_once_and_marked_identical():
    table = cell_table("t", RANKS, [_cap(_out("same\n")), _cap(_out("same\n"))])
    html, text = table._repr_html_(), repr(table)
    assert html.count("same") == 1 and "identical on all 2 ranks" in html
    assert "── all 2 ranks (identical) ──\nstdout: same" in text


def test_differing_output_is_marked_and_each_rank_stands_under_its_heading():
    text = repr(table := cell_table("t", RANKS, [_cap(_out("zero\n")), _cap(_out("one\n"))]))
    assert "differs between ranks" in table._repr_html_()
    assert text.index("── rank 0 · host-a") < text.index("zero") < text.index("── rank 1 · host-b") < text.index("one")
    assert "stdout (differs): zero" in text


def test_figures_with_the_same_text_but_different_pictures_are_each_shown():
    flat, rising = {"text/plain": FIG, "image/png": "AAAA"}, {"text/plain": FIG, "image/png": "BBBB"}
    html = cell_table("t", RANKS, [_cap(_show(flat)), _cap(_show(rising))])._repr_html_()
    assert "base64,AAAA" in html and "base64,BBBB" in html
    assert "identical" not in html and "differs between ranks" in html


def test_bundles_are_merged_only_when_every_mime_type_is_equal():
    a = {"text/plain": "df", "text/html": "<b>1</b>"}
    b = {"text/plain": "df", "text/html": "<b>2</b>"}
    assert "identical" not in cell_table("t", RANKS, [_cap(_show(a)), _cap(_show(b))])._repr_html_()
    assert "identical on all 2" in cell_table("t", RANKS, [_cap(_show(a)), _cap(_show(dict(a)))])._repr_html_()


def test_each_column_keeps_the_order_the_rank_produced_its_outputs_in():
    outputs = [_out("one\n"), _show({"text/plain": "'two'"}), _out("three\n"), _out("four\n", "stderr"),
               _out("five\n")]
    text = repr(cell_table("t", RANKS, [_cap(*outputs, result={"text/plain": "1"})] * 2))
    positions = [text.index(word) for word in ("one", "'two'", "three", "four", "five", "Out: 1")]
    assert positions == sorted(positions), text


def test_merging_never_reorders_a_ranks_own_outputs():
    rank0 = _cap(_out("before\n"), _show({"text/plain": "tensor([0.])"}), _out("after\n"))
    rank1 = _cap(_out("before\n"), _show({"text/plain": "tensor([1.])"}), _out("after\n"))
    text = repr(cell_table("t", RANKS, [rank0, rank1]))
    assert text.index("before") < text.index("tensor([0.])") < text.index("tensor([1.])") < text.index("after")
    assert text.count("── all 2 ranks (identical) ──") == 2  # before, then after, around the differing display


def test_stderr_is_styled_apart_from_stdout():
    html = cell_table("t", RANKS, [_cap(_out("warn\n", "stderr"))] * 2)._repr_html_()
    assert "rgba(255,0,0,0.08)" in html


def test_rank_text_is_escaped_never_run():
    evil = "<script>alert(1)</script><img src=x onerror=alert(2)>"
    html = cell_table("t", RANKS, [_cap(_out(evil)), _cap(_out(evil), result={"text/plain": evil})])._repr_html_()
    assert "<script>" not in html and "<img src=x" not in html and "&lt;script&gt;" in html


def test_rank_html_is_rendered_after_sanitising():
    table = '<table class="dataframe"><tr><td onclick="x()">1</td></tr></table><script>alert(1)</script>'
    html = cell_table("t", RANKS, [_cap(_show({"text/plain": "df", "text/html": table}))] * 2)._repr_html_()
    assert '<table class="dataframe">' in html and "<td>1</td>" in html
    assert "onclick" not in html and "<script" not in html


def test_svg_markdown_and_latex_are_shown_as_their_source_text():
    svg = '<svg onload="alert(1)"><circle r="4"/></svg>'
    outputs = [_show({"text/plain": "<SVG>", "image/svg+xml": svg}),
               _show({"text/plain": "<Md>", "text/markdown": "**b**"}),
               _show({"text/plain": "<L>", "text/latex": "$x^2$"})]
    html = cell_table("t", RANKS, [_cap(*outputs)] * 2)._repr_html_()
    assert "<svg" not in html and "&lt;svg onload" in html and "shown as its source" in html
    assert "**b**" in html and "$x^2$" in html


def test_only_valid_base64_images_are_embedded():
    good = {"image/png": "iVBORw0KGgo=", "text/plain": FIG}
    bad = {"image/png": '"><script>alert(1)</script>', "text/plain": FIG}
    html = cell_table("t", RANKS, [_cap(_show(good)), _cap(_show(bad))])._repr_html_()
    assert 'src="data:image/png;base64,iVBORw0KGgo="' in html and "<script>" not in html


def test_the_text_form_leaves_out_what_a_rank_did_not_produce():
    text = repr(cell_table("t", RANKS, [_cap(_out("zero\n"), result={"text/plain": "0"}), _cap(_out("one\n"))]))
    rank1 = text[text.rindex("── rank 1"):]
    assert "Out" not in rank1 and "Out (differs): 0" in text


def test_an_error_shows_the_users_frames_with_the_full_traceback_one_click_away():
    error = {"ename": "ZeroDivisionError", "evalue": "division by zero", "where": "`1 / 0`, line 2",
             "short": "Traceback (nbdist's own frames hidden; 3 hidden):\nZeroDivisionError: division by zero",
             "traceback": "Traceback:\n  File \"nbdist/world/world.py\"\nZeroDivisionError: division by zero"}
    table = cell_table("t", RANKS, [_cap(error=error), _cap()])
    html, text = table._repr_html_(), repr(table)
    assert html.index("3 hidden") < html.index("<details>") < html.index("nbdist/world/world.py")
    assert text.index("3 hidden") < text.index(FULL_TRACEBACK) < text.index("nbdist/world/world.py")


def test_a_rank_stopped_by_another_says_where_it_was_and_why():
    error = {"ename": "PeerFailedError", "evalue": "x", "where": "`dist.all_reduce(t)`, line 6", "short": "s",
             "traceback": "full", "consequence": True}
    stopped = _cap(error=error, cancelled="rank 1 (host-b, pid 2) raised ZeroDivisionError: division by zero")
    text = repr(cell_table("t", RANKS, [stopped, _cap()]))
    assert ("stopped by nbdist (differs): stopped in `dist.all_reduce(t)`, line 6, because rank 1 (host-b, pid 2) "
            "raised ZeroDivisionError") in text.replace("\n  ", " ")


def test_a_live_table_has_a_state_row_per_rank_and_no_durations_in_its_headings():
    table = cell_table("t", RANKS, [_cap(_out("step 1\n")), _cap()], states=["running 12 s", "finished in 3.1 s"])
    text = repr(table)
    assert "── rank 0 · host-a ──" in text and "ms" not in text
    assert "state: running 12 s" in text and "state: finished in 3.1 s" in text


def test_a_capture_of_megabytes_fits_the_store_and_says_what_it_dropped():
    huge = {"text/plain": FIG, "image/png": "A" * (6 * 1024 * 1024)}
    text = fit(_record(_out("out\n"), _show(huge), _show({"text/plain": "small", "image/png": "QUFB"})))
    assert len(text) < 8 * 1024 * 1024
    kept = json.loads(text)["outputs"]
    assert kept[1]["data"]["text/plain"] == FIG and "image/png" not in kept[1]["data"]
    assert "image/png, 6.3 MB, not shown" in kept[1]["data"][DROPPED]
    assert kept[2]["data"]["image/png"] == "QUFB"  # only as much as needed was dropped
    html = cell_table("t", RANKS, [Capture.from_json(text)] * 2)._repr_html_()
    assert "not shown: this rank&#x27;s output was over nbdist&#x27;s" in html


def test_even_text_too_large_for_the_store_leaves_a_note():
    record = _record(*[_out("x" * 10_000 + "\n", k) for k in ("stdout", "stderr") * 50])
    cut = fit(record, limit=300_000)
    assert len(cut) <= 300_000 and cut.count("characters not shown") == 100
    gone = fit(record, limit=50_000)
    assert len(gone) <= 50_000 and "[100 outputs not shown: this rank's output was over" in gone
