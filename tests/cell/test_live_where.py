"""Where a running body is, as the live table says it: the sampled cell line and the collective it waits in."""

from __future__ import annotations

import threading
import time

from nbdist.cell.live import cell_line, where


def test_where_names_the_collective_and_the_line_and_how_long():
    assert where(("collective #12 (all_reduce)", time.monotonic() - 3.2), 8) == \
        "waits in all_reduce #12 at cell line 8 for 3 s"
    assert where(("collective #1 (barrier)", time.monotonic()), None) == "waits in barrier #1"
    assert where(None, 5) == "at cell line 5"
    assert where(None, None) == ""


def test_cell_line_samples_another_thread_inside_a_cell_s_code():
    ready, done = threading.Event(), threading.Event()
    # Code compiled under a cell's pseudo-file name, as IPython compiles a notebook cell.
    code = compile("\nready.set()\ndone.wait(10)\n", "/tmp/ipykernel_1/123.py", "exec")
    worker = threading.Thread(target=exec, args=(code, {"ready": ready, "done": done}))
    worker.start()
    try:
        assert ready.wait(5)
        time.sleep(0.05)
        assert cell_line(worker.ident) == 3
        assert cell_line(threading.get_ident()) is None  # this thread runs no cell
    finally:
        done.set()
        worker.join(5)
