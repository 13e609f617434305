"""Every rank's stack merged into one tree labelled with rank sets; sampling this process's own threads."""

from __future__ import annotations

import threading

from nbdist.debug import native, stacks
from nbdist.debug.stacks import CELL, Frame
from nbdist.view.tracebacks import is_cell


def thread(*labels: Frame, main: bool = True, skipped: int = 0) -> dict:
    return {"name": "MainThread", "main": main, "skipped": skipped, "frames": [f.record() for f in labels]}


BODY = Frame("cell", 4, "<module>", CELL, "dist.all_reduce(x)")
ALL_REDUCE = Frame("torch/distributed/distributed_c10d.py", 2950, "all_reduce")
WAIT = Frame("torch/distributed/distributed_c10d.py", 3001, "wait")
BARRIER = Frame("nbdist/world/world.py", 311, "barrier")


def test_64_ranks_in_one_all_reduce_and_one_elsewhere_read_as_two_branches():
    per_rank = {r: [thread(BODY, ALL_REDUCE, WAIT, skipped=21)] for r in range(64)}
    per_rank[6] = [thread(BARRIER, skipped=12)]
    assert stacks.render(stacks.merge(per_rank), 64) == [
        "the cell's thread (main) · all 64 ranks",
        "  … 12-21 outer frame(s) of IPython, nbdist or Python",
        "  ├─ all but rank 6",
        "  │  cell line 4: dist.all_reduce(x)",
        "  │  all_reduce  (torch/distributed/distributed_c10d.py:2950)",
        "  │  wait  (torch/distributed/distributed_c10d.py:3001)",
        "  └─ rank 6",
        "     barrier  (nbdist/world/world.py:311)",
    ]


def test_shared_frames_are_shown_once_and_branches_are_labelled_where_ranks_part_largest_first():
    per_rank = {r: [thread(BODY, ALL_REDUCE, WAIT)] for r in range(8)}
    for r in (1, 3, 5):
        per_rank[r] = [thread(BODY, ALL_REDUCE)]  # innermost here
    per_rank[7] = [thread(BODY, Frame("cell", 9, "step", CELL, "loss.backward()"))]
    assert stacks.render(stacks.merge(per_rank), 8) == [
        "the cell's thread (main) · all 8 ranks",
        "  cell line 4: dist.all_reduce(x)",
        "  ├─ all but rank 7",
        "  │  all_reduce  (torch/distributed/distributed_c10d.py:2950)",
        "  │  ├─ ranks 0,2,4,6 (4)",
        "  │  │  wait  (torch/distributed/distributed_c10d.py:3001)",
        "  │  └─ ranks 1,3,5 (3): here (innermost)",
        "  └─ rank 7",
        "     cell line 9 in step(): loss.backward()",
    ]


def test_ranks_that_differ_only_in_how_many_outer_frames_were_left_out_share_a_branch():
    per_rank = {r: [thread(BODY, ALL_REDUCE, skipped=30 + (r == 0) * 2)] for r in range(4)}
    assert stacks.render(stacks.merge(per_rank), 4) == [
        "the cell's thread (main) · all 4 ranks",
        "  … 30-32 outer frame(s) of IPython, nbdist or Python",
        "  cell line 4: dist.all_reduce(x)",
        "  all_reduce  (torch/distributed/distributed_c10d.py:2950)",
    ]


def test_an_idle_kernel_and_other_threads_are_said_so():
    per_rank = {0: [thread(BODY), {"name": "loader", "main": False, "skipped": 0, "frames": [WAIT.record()]}],
                1: [{"name": "MainThread", "main": True, "skipped": 0, "frames": [], "idle": True}]}
    assert stacks.render(stacks.merge(per_rank), 2) == [
        "the cell's thread (main) · all 2 ranks",
        "  ├─ rank 0",
        "  │  cell line 4: dist.all_reduce(x)",
        "  └─ rank 1",
        f"     {stacks.IDLE}",
        "thread loader · rank 0",
        "  wait  (torch/distributed/distributed_c10d.py:3001)",
    ]


def test_the_tree_starts_at_the_cells_body_not_at_the_line_that_called_the_magic():
    magic = Frame("cell", 1, "<module>", CELL, "get_ipython().run_cell_magic('collective', '', ...)")
    ipython = Frame("IPython/core/interactiveshell.py", 2644, "run_cell_magic")
    ours = Frame("nbdist/cell/capture.py", 245, "_run_body")
    frames = [ipython, magic, ipython, ours, BODY, ALL_REDUCE]
    kept, skipped = stacks.trim(frames, [False, False, False, True, False, False])
    assert (kept, skipped) == ([BODY, ALL_REDUCE], 4)
    kept, skipped = stacks.trim([ipython, ours, BARRIER], [False, True, True])  # no cell: from nbdist's first
    assert (kept, skipped) == ([ours, BARRIER], 1)


def test_a_long_cell_line_is_cut():
    line = Frame("cell", 1, "<module>", CELL, "x" * 200).label()
    assert len(line) < 100 and line.endswith("…")


def test_a_cell_is_ipykernels_cell_file_not_its_launcher():
    assert is_cell("/tmp/ipykernel_1234/567.py")
    assert not is_cell("/venv/lib/python3.11/site-packages/ipykernel_launcher.py")


def parked(ready: threading.Event, release: threading.Event) -> None:
    ready.set()
    release.wait(60)


def test_this_process_sampled_from_another_thread_shows_every_thread_but_nbdists_own():
    ready, release = threading.Event(), threading.Event()
    worker = threading.Thread(target=parked, args=(ready, release), name="parked-worker")
    ours = threading.Thread(target=release.wait, args=(60,), name="nbdist-heartbeat")
    worker.start()
    ours.start()
    try:
        ready.wait(10)
        only_main = stacks.capture(threads=False)
        every = stacks.capture(threads=True, skip=[threading.get_ident()])
    finally:
        release.set()
        worker.join()
        ours.join()
    assert [t["main"] for t in only_main] == [True]
    names = [t["name"] for t in every]
    assert "parked-worker" in names and "nbdist-heartbeat" not in names
    parked_frames = next(t for t in every if t["name"] == "parked-worker")["frames"]
    assert any(f[2] == "parked" and f[0].endswith("test_stacks.py") for f in parked_frames), parked_frames


def test_pyspy_shows_this_processs_native_frames_or_says_why_not():
    got = native.dump(threads=False)
    if "error" in got:  # it cannot attach here: the reason is what the report shows
        assert got["error"].startswith(("py-spy could not attach", "py-spy is not installed")), got
        return
    (main,) = got["threads"]
    kinds = {f[3] for f in main["frames"]}
    assert main["main"] and stacks.NATIVE in kinds, main
    # no cell here: the stack is shown from nbdist's outermost frame, the one that ran py-spy
    assert main["frames"][0][:3] == ["nbdist/debug/native.py", main["frames"][0][1], "dump"], main["frames"][0]


def test_a_long_run_of_nbdists_own_frames_shows_where_it_began_and_where_it_waits():
    ours = [Frame(f"nbdist/x{i}.py", 10 + i, f"f{i}") for i in range(8)]
    wait = Frame("threading.py", 331, "wait")
    shown = stacks.shorten([BODY, *ours, wait], [False] + [True] * 8 + [False])
    assert [f.label() for f in shown] == [BODY.label(), "f0  (nbdist/x0.py:10)", "… 4 frames of nbdist",
                                          "f5  (nbdist/x5.py:15)", "f6  (nbdist/x6.py:16)", "f7  (nbdist/x7.py:17)",
                                          wait.label()]
    short = [BODY, *ours[:5]]
    assert stacks.shorten(short, [False] + [True] * 5) == short
