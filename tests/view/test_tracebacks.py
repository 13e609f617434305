"""nbdist.view.tracebacks: the short form of an error hides nbdist's frames and keeps the user's."""

from __future__ import annotations

import linecache
import os
import sys
import traceback

import pytest

import nbdist.view.tracebacks
from nbdist.view.tracebacks import summarise

# Code objects that carry a filename inside the nbdist package, so their frames count as
# nbdist's own without writing a file there. No linecache entry: they show no source line.
INTERNAL = os.path.join(os.path.dirname(nbdist.view.tracebacks.__file__), "_fake_internal.py")
INTERNAL_SRC = """\
import json

def run(code, ns):
    exec(code, ns)

def dist_all_reduce(t):
    return _wait(t)

def _wait(t):
    raise RuntimeError("rank 1 raised: ZeroDivisionError")

def interrupted(t):
    raise KeyboardInterrupt

def parse(text):
    return json.loads(text)

def rewrap(t):
    try:
        dist_all_reduce(t)
    except RuntimeError:
        raise ValueError("all_reduce failed")
"""

CELL = "/tmp/ipykernel_1234/567.py"  # how ipykernel names a cell
CELL_SRC = "t = [1.0, 2.0]\nout = helper(t)\n"

OLD_CELL = "<ipython-input-3-abc>"  # how older IPython names a cell
OLD_CELL_SRC = """\
def helper(t):
    t = [x * 2 for x in t]
    # nothing
    # to see
    # here
    dist_all_reduce(t)
    return t
"""

SCRIPT = "/tmp/project/train.py"  # a user module that is not a cell
SCRIPT_SRC = "def train(t):\n    return dist_all_reduce(t)\n"

ALL_SOURCES = {CELL: CELL_SRC, OLD_CELL: OLD_CELL_SRC, SCRIPT: SCRIPT_SRC}


@pytest.fixture
def ns():
    """A namespace holding the fake nbdist functions and the user's code, with its source lines known."""
    for filename, src in ALL_SOURCES.items():
        linecache.cache[filename] = (len(src), None, src.splitlines(True), filename)
    namespace: dict = {}
    exec(compile(INTERNAL_SRC, INTERNAL, "exec"), namespace)
    exec(compile(OLD_CELL_SRC, OLD_CELL, "exec"), namespace)
    exec(compile(SCRIPT_SRC, SCRIPT, "exec"), namespace)
    yield namespace
    for filename in ALL_SOURCES:
        linecache.cache.pop(filename, None)


def raised(fn, *args) -> BaseException:
    """The exception ``fn(*args)`` raises; its traceback starts with this frame, as run_cell's does."""
    try:
        fn(*args)
    except BaseException as exc:  # noqa: B036 (KeyboardInterrupt is tested too)
        return exc
    raise AssertionError("did not raise")


def run_cell(ns: dict, src: str = CELL_SRC) -> BaseException:
    """Run ``src`` as a cell through the fake nbdist ``run``; its source lines are known, as IPython's are."""
    linecache.cache[CELL] = (len(src), None, src.splitlines(True), CELL)
    return raised(ns["run"], compile(src, CELL, "exec"), ns)


def check_fields(summary: dict) -> None:
    assert set(summary) == {"ename", "evalue", "traceback", "short", "where"}
    assert all(isinstance(value, str) for value in summary.values())


def test_short_form_keeps_user_frames_with_source_and_hides_nbdist_frames(ns):
    summary = summarise(run_cell(ns), skip=1)
    check_fields(summary)
    short = summary["short"]
    assert short.startswith("Traceback (nbdist's own frames hidden; 3 hidden):\n")
    assert f'File "{CELL}", line 2, in <module>' in short
    assert "out = helper(t)" in short
    assert f'File "{OLD_CELL}", line 6, in helper' in short
    assert "dist_all_reduce(t)" in short
    assert "_fake_internal.py" not in short
    assert short.endswith("RuntimeError: rank 1 raised: ZeroDivisionError\n")


def test_full_form_keeps_nbdist_frames_but_drops_the_callers_skipped_frames(ns):
    full = summarise(run_cell(ns), skip=1)["traceback"]
    assert full.startswith("Traceback (most recent call last):\n")
    assert full.count(INTERNAL) == 3  # run, dist_all_reduce, _wait
    assert "out = helper(t)" in full
    assert __file__ not in full
    assert __file__ in summarise(run_cell(ns))["traceback"]


def test_where_names_the_innermost_cell_line_without_a_file_name(ns):
    assert summarise(run_cell(ns), skip=1)["where"] == "`dist_all_reduce(t)`, line 6"


def test_where_names_the_file_of_a_user_module_that_is_not_a_cell(ns):
    summary = summarise(run_cell(ns, "train(t := [1.0])\n"), skip=1)
    assert summary["where"] == "`return dist_all_reduce(t)`, train.py line 2"


def test_ename_and_evalue_are_the_exceptions(ns):
    summary = summarise(run_cell(ns), skip=1)
    assert (summary["ename"], summary["evalue"]) == ("RuntimeError", "rank 1 raised: ZeroDivisionError")


def test_no_frames_hidden_gives_the_normal_header():
    summary = summarise(raised(lambda: 1 / 0))
    assert summary["short"].startswith("Traceback (most recent call last):\n")
    assert summary["short"] == summary["traceback"]


def test_skip_never_drops_the_innermost_frame(ns):
    summary = summarise(raised(ns["_wait"], []), skip=5)
    assert summary["traceback"].count(INTERNAL) == 1


def test_chained_exception_keeps_both_messages_and_filters_both_parts(ns):
    summary = summarise(run_cell(ns, "rewrap(t := [1.0])\n"), skip=1)
    short = summary["short"]
    assert "RuntimeError: rank 1 raised: ZeroDivisionError" in short
    assert "During handling of the above exception, another exception occurred:" in short
    assert short.endswith("ValueError: all_reduce failed\n")
    assert "_fake_internal.py" not in short
    # The cause's part had only nbdist frames (rewrap's try, dist_all_reduce, _wait); the last part had run, rewrap.
    assert "Traceback (nbdist's own frames hidden; 3 hidden):" in short
    assert "Traceback (nbdist's own frames hidden; 2 hidden):" in short


def test_explicit_cause_keeps_both_messages_in_order():
    def fail() -> None:
        try:
            {}["missing"]
        except KeyError as err:
            raise RuntimeError("lookup failed") from err

    short = summarise(raised(fail))["short"]
    cause, effect = short.split("The above exception was the direct cause of the following exception:")
    assert "KeyError: 'missing'" in cause
    assert "RuntimeError: lookup failed" in effect


@pytest.mark.skipif(sys.version_info < (3, 11), reason="add_note is new in Python 3.11")
def test_notes_added_with_add_note_appear_in_short(ns):
    exc = run_cell(ns)
    exc.add_note("rank 1 failed first")
    assert summarise(exc, skip=1)["short"].endswith(
        "RuntimeError: rank 1 raised: ZeroDivisionError\nrank 1 failed first\n"
    )


def test_no_user_frames_gives_empty_where(ns):
    summary = summarise(raised(ns["dist_all_reduce"], []), skip=1)
    assert summary["where"] == ""
    assert summary["short"] == (
        "Traceback (nbdist's own frames hidden; 2 hidden):\nRuntimeError: rank 1 raised: ZeroDivisionError\n"
    )


def test_only_library_frames_outside_nbdist_gives_the_innermost_of_them(ns):
    exc = raised(ns["parse"], "{")
    innermost = traceback.extract_tb(exc.__traceback__)[-1]
    assert innermost.filename.endswith(os.path.join("json", "decoder.py"))
    summary = summarise(exc, skip=1)
    assert summary["where"] == f"`{innermost.line}`, decoder.py line {innermost.lineno}"
    assert "json" in summary["short"]  # other libraries' frames are kept: they tell where the error is


def test_exception_whose_str_raises_does_not_make_summarise_raise():
    class Odd(Exception):
        def __str__(self) -> str:
            raise ValueError("no str for you")

    summary = summarise(raised(lambda: (_ for _ in ()).throw(Odd("x"))))
    check_fields(summary)
    assert summary["ename"] == "Odd"
    assert summary["evalue"] == "Odd('x')"


def test_exception_whose_str_and_repr_raise_does_not_make_summarise_raise():
    class Odder(Exception):
        def __str__(self) -> str:
            raise ValueError

        def __repr__(self) -> str:
            raise ValueError

    summary = summarise(Odder())
    check_fields(summary)
    assert summary["evalue"] == "<Odder object>"


def test_a_failure_while_formatting_falls_back_to_one_line(monkeypatch):
    def broken(*args, **kwargs):
        raise RuntimeError("formatting broke")

    monkeypatch.setattr(nbdist.view.tracebacks.traceback, "format_exception", broken)
    summary = summarise(raised(lambda: 1 / 0))
    check_fields(summary)
    assert summary["short"] == summary["traceback"] == "ZeroDivisionError: division by zero\n"
    assert summary["where"] == ""


def test_keyboard_interrupt_summarises_like_any_other(ns):
    summary = summarise(run_cell(ns, "x = 1\ninterrupted(x)\n"), skip=1)
    check_fields(summary)
    assert (summary["ename"], summary["evalue"]) == ("KeyboardInterrupt", "")
    assert summary["short"].startswith("Traceback (nbdist's own frames hidden; 2 hidden):\n")
    assert summary["short"].endswith("KeyboardInterrupt\n")
    assert summary["where"] == "`interrupted(x)`, line 2"
