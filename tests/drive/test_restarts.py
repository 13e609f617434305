"""When a dead worker is started again and how its end is told (nbdist.drive.restarts), as tables with a fixed
clock (issue 47)."""

from __future__ import annotations

import signal
import time

import pytest

from nbdist.drive import restarts
from nbdist.drive.restarts import WINDOW, Decision

T0 = 5000.0  # the fixed clock: every "now" below is T0 plus seconds
DOWN_START = "it died again before it joined after a restart (a failure as it starts would only repeat)"


@pytest.mark.parametrize(("earlier", "now", "max_restarts", "joined", "decision"), [
    # The first death of a joined rank: started again, unless restarts are off.
    ((), T0, 3, True, Decision(True)),
    ((), T0, 1, True, Decision(True)),
    ((), T0, 0, True, Decision(False, "restarts are off (--max-restarts 0)")),
    # K restarts within the window: the K+1th death leaves it down.
    ((T0 - 300, T0 - 200), T0, 3, True, Decision(True)),
    ((T0 - 300, T0 - 200, T0 - 100), T0, 3, True,
     Decision(False, "it died 4 times within 10 minutes (--max-restarts 3)")),
    ((T0 - 1,), T0, 1, True, Decision(False, "it died 2 times within 10 minutes (--max-restarts 1)")),
    # Restarts older than the window do not count: a long session may lose a kernel now and then.
    ((T0 - WINDOW - 1, T0 - WINDOW, T0 - 100), T0, 3, True, Decision(True)),
    ((T0 - WINDOW + 0.5, T0 - 200, T0 - 100), T0, 3, True,
     Decision(False, "it died 4 times within 10 minutes (--max-restarts 3)")),
    # Started again and dead before it joined: a crash as it starts would only loop (pytorch issue 60910).
    ((T0 - 5,), T0, 3, False, Decision(False, DOWN_START)),
    ((T0 - WINDOW - 5,), T0, 3, False, Decision(False, DOWN_START)),
    # Not joined and never restarted: the spawn's own wait reports it; the policy would start it again.
    ((), T0, 3, False, Decision(True)),
])
def test_a_dead_rank_is_started_again_within_its_budget_and_never_in_a_start_up_loop(earlier, now, max_restarts,
                                                                                    joined, decision):
    assert restarts.decide(earlier, now, max_restarts, joined) == decision


@pytest.mark.parametrize(("returncode", "rss", "said"), [
    (0, None, "exited with code 0"),
    (1, 2048, "exited with code 1"),
    (-signal.SIGKILL, 3 * 1024 * 1024 // 2, "was killed by SIGKILL (it held 1.5 GiB just before: a likely "
                                            "out-of-memory kill)"),
    (-signal.SIGKILL, 250 * 1024, "was killed by SIGKILL (it held 250 MiB just before: a likely out-of-memory kill)"),
    (-signal.SIGKILL, None, "was killed by SIGKILL"),  # no sample yet: no guess
    (-signal.SIGSEGV, 1000, "was killed by SIGSEGV"),
    (-signal.SIGTERM, None, "was killed by SIGTERM"),
    (-99, None, "was killed by signal 99"),
    (None, None, "ended (exit status unknown)"),
])
def test_how_a_kernel_ended_is_its_exit_code_or_its_signal_by_name(returncode, rss, said):
    assert restarts.describe(returncode, rss) == said


def test_the_memory_is_read_from_proc_status_and_a_line_without_it_gives_none():
    status = "Name:\tpython\nVmPeak:\t  900000 kB\nVmRSS:\t  256000 kB\nThreads:\t4\n"
    assert restarts.rss_kb(status) == 256000
    assert restarts.rss_kb("Name:\tkthreadd\nThreads:\t1\n") is None
    assert restarts.memory(512) == "512 KiB"


@pytest.mark.parametrize(("earlier", "max_restarts", "shown"), [
    ((), 3, "0 of 3 within 10 min"),
    ((T0 - 10,), 3, "1 of 3 within 10 min"),
    ((T0 - WINDOW - 10, T0 - 10), 3, "1 of 3 within 10 min (2 in all)"),
    ((), 0, "off (--max-restarts 0)"),
])
def test_restarts_are_shown_as_n_of_k_within_the_window(earlier, max_restarts, shown):
    assert restarts.count(earlier, T0, max_restarts) == shown


@pytest.mark.parametrize(("value", "expected"), [("0", 0), ("3", 3), (5, 5), ("-1", "0 or more"),
                                                 ("x", "a count of restarts"), ("1.5", "a count of restarts")])
def test_max_restarts_takes_a_count_of_zero_or_more(value, expected):
    if isinstance(expected, int):
        assert restarts.parse_max(value) == expected
    else:
        with pytest.raises(ValueError, match=expected):
            restarts.parse_max(value)


def test_an_exit_is_one_line_when_how_and_what_followed():
    at = time.mktime((2026, 12, 7, 14, 3, 9, 0, 0, -1))
    restarted = restarts.Exit(at, 4007, "was killed by SIGKILL", 1024, ("boom",), restarted=True)
    down = restarts.Exit(at, 4008, "exited with code 1", None, (), restarted=False, why_down="restarts are off")
    assert restarted.line() == "14:03:09 pid 4007 was killed by SIGKILL; restarted"
    assert down.line() == "14:03:09 pid 4008 exited with code 1; left down: restarts are off"


@pytest.mark.parametrize(("joined", "restarted", "formed", "watched"), [
    (False, False, False, False),  # a first start, still joining: the spawn's own wait watches it
    (True, False, False, True),
    (False, True, False, True),  # started again, joining: a death now is one more (decide leaves it down)
    # The world formed while its %%dist_init cell was still ending (a soak with store fuzz killed it there, and it
    # was neither started again nor left down): it is in the world, so it is watched.
    (False, False, True, True),
])
def test_every_worker_is_watched_once_the_world_formed_whether_or_not_its_init_cell_ended(joined, restarted, formed,
                                                                                         watched):
    assert restarts.watched(joined, restarted, formed) is watched
