"""Floods, pure: the live table's pace, the log's spill of the whole output, the files a kernel keeps."""

from __future__ import annotations

import os
import subprocess
import sys

import pytest

from nbdist.cell import live
from nbdist.cell.outputlog import OutputLog
from nbdist.cell.wholeoutput import Keeper, WholeFile


@pytest.mark.parametrize(("now", "sent", "expected"), [
    (10.0, 0, 10.5),  # a small table: every half second
    (10.0, 40_000, 10.5),  # 40 kB: still every half second (80 kB/s)
    (10.0, 100_000, 11.0),  # 100 kB: once a second, so no more than 100 kB/s
    (10.0, 1_000_000, 20.0),  # 1 MB: once in 10 s
])
def test_the_live_table_waits_longer_the_more_it_sent(now, sent, expected):
    assert live.next_show(now, sent) == pytest.approx(expected)


def test_a_live_table_of_a_flood_sends_its_front_end_a_bounded_amount_whatever_the_flood():
    now, sent, shown = 0.0, 0, 0.0
    for _ in range(600):  # a minute of ticks, every 0.1 s; each table 150 kB
        if now >= shown:
            sent += 150_000
            shown = live.next_show(now, 150_000)
        now += 0.1
    assert sent <= 60 * live.LIVE_RATE + 150_000


class Sink:
    def __init__(self) -> None:
        self.text = ""

    def write(self, text: str) -> None:
        self.text += text

    def flush(self) -> None:
        pass


def test_the_log_spills_nothing_until_it_leaves_something_out_then_everything_from_the_start():
    opened: list[Sink] = []

    def spill() -> Sink:
        opened.append(Sink())
        return opened[-1]

    log = OutputLog(lines=10)
    log.spill = spill
    for i in range(10):
        log.write("stdout", f"{i}\n")
    assert log.snapshot()[0]["text"].count("\n") == 10 and not opened
    for i in range(10, 5000):
        log.write("stdout", f"{i}\n")
        if i % 7 == 0:
            log.write("stderr", "e\n")
    log.display({"text/plain": "'shown'"})
    log.snapshot()
    (sink,) = opened
    assert sink.text.splitlines()[:12] == [*map(str, range(10)), "10", "11"]
    assert sink.text.count("e\n") == len([i for i in range(10, 5000) if i % 7 == 0])
    assert sink.text.endswith("4999\n'shown'\n")


def test_a_kept_file_stops_at_its_cap_and_says_so(tmp_path):
    f = WholeFile(tmp_path / "c.txt", cap=100)
    for _ in range(30):
        f.write("0123456789\n")
    f.close()
    assert os.path.getsize(tmp_path / "c.txt") == 100
    record = f.record()
    assert record["lines"] == 30 and record["chars"] == 330 and "230 characters more" in record["capped"]


def test_a_kernel_keeps_its_newest_cells_within_its_budget_and_clear_removes_them(tmp_path):
    keeper = Keeper(tmp_path / "k", cell_cap=1000, total_cap=2500)
    for n in range(5):
        f = keeper.open(f"t/{n}", 1)
        f.write("x" * 1000)
        f.flush()
        os.utime(f.path, (n, n))  # mtimes a second apart: the order is clear
    names = sorted(p.name for p in (tmp_path / "k").iterdir())
    assert names == ["t-3-rank1.txt", "t-4-rank1.txt"]
    keeper.clear()
    keeper.clear()
    assert not (tmp_path / "k").exists()


def test_the_folders_of_kernels_that_are_gone_are_removed_and_a_living_ones_kept(tmp_path):
    from nbdist.cell.wholeoutput import remove_dead

    gone = subprocess.Popen([sys.executable, "-c", "pass"])
    gone.wait()
    for pid in (os.getpid(), gone.pid):
        (tmp_path / str(pid)).mkdir()
        (tmp_path / str(pid) / "t-1-rank0.txt").write_text("x\n")
    remove_dead(tmp_path)
    assert sorted(p.name for p in tmp_path.iterdir()) == [str(os.getpid())]
