"""How a spawned worker's kernel ended (``exited/<i>``, :class:`nbdist.world.records.Exited`), as the notebook that
started it tells it, and the error of the ranks that lose it (:meth:`nbdist.world.checks.Checks.lost`): real server,
real TCP; what each rank knows is a table."""

from __future__ import annotations

import json
import threading
import time
from dataclasses import replace

import pytest

from nbdist.world import checks, keys
from nbdist.world.exited_record import Exited
from nbdist.world.records import MalformedRecord, Registration

TOLD = Exited(pid=2, how="was killed by SIGKILL (it held 812 MiB just before: a likely out-of-memory kill)",
              lines=["Traceback (most recent call last):", "MemoryError"], restarted=True,
              then="rank 1 was restarted (1 of 3)", t=1_765_000_000.0)
DOWN = replace(TOLD, how="exited with code 1", lines=[], restarted=False,
               then="rank 1 was left down: it died 4 times within 10 minutes (--max-restarts 3); %dist_init --spawn "
                    "N again starts every worker afresh (every rank's variables are lost)")


def test_what_the_spawning_notebook_writes_reads_back_and_anything_else_is_no_record():
    for told in (TOLD, DOWN):
        assert Exited.from_json(told.to_json()) == told and Exited.read(told.to_json()) == told
    assert Exited.read(None) is None
    written = json.loads(TOLD.to_json())
    for text, why in [
        ("[1]", "not a JSON object"),
        (json.dumps({**written, "lines": "MemoryError"}), "its 'lines' is \"MemoryError\", not a list"),
        (json.dumps({**written, "restarted": "yes"}), "its 'restarted' is \"yes\", not true or false"),
        (json.dumps({k: v for k, v in written.items() if k != "pid"}), "it has no 'pid'"),
    ]:
        with pytest.raises(MalformedRecord, match="^" + why.replace("(", r"\(") + "$"):
            Exited.from_json(text)
        assert Exited.read(text) is None


def test_a_spawned_registration_reads_back_and_one_of_the_version_before_is_not_spawned():
    mine = Registration("s1", 1, "h", 2, spawned=True)
    assert Registration.from_json(mine.to_json()) == mine
    before = {k: v for k, v in mine.as_dict().items() if k != "spawned"}
    assert Registration.from_json(json.dumps(before)).spawned is False


GONE = "is gone: its kernel exited or was killed"


@pytest.fixture
def losing(two_worlds):
    """Rank 0's world, in which rank 1 (pid 2) is a spawned worker: ``losing.lost`` is what rank 0 raises."""
    first, second = two_worlds
    first.ranks = [first.ranks[0], replace(first.ranks[1], spawned=True)]
    return first, second


@pytest.mark.parametrize(("told", "says"), [
    (TOLD, "rank 1 (h, pid 2) is gone: its kernel was killed by SIGKILL (it held 812 MiB just before: a likely "
           "out-of-memory kill) (its last lines: Traceback (most recent call last): / MemoryError). This notebook "
           "carries on at its next %%collective once the new kernel has joined (%dist_workers shows it in the "
           "notebook that started it); rank 1 was restarted (1 of 3)"),
    (DOWN, "rank 1 (h, pid 2) is gone: its kernel exited with code 1. rank 1 was left down: it died 4 times within "
           "10 minutes (--max-restarts 3); %dist_init --spawn N again starts every worker afresh (every rank's "
           "variables are lost)"),
])
def test_a_rank_that_loses_a_spawned_worker_says_how_its_kernel_ended_as_its_starter_told(losing, told, says):
    first, second = losing
    second.client.set(second.key(keys.exited(1)), told.to_json())
    assert str(first.checks.lost([(1, GONE)])) == says


def test_a_record_of_an_earlier_kernel_of_that_slot_is_not_this_ones_end(losing):
    first, second = losing
    second.client.set(second.key(keys.exited(1)), replace(TOLD, pid=99).to_json())
    started = time.monotonic()
    got = str(first.checks.lost([(1, GONE)]))
    assert time.monotonic() - started >= checks.EXIT_WAIT  # it waited for this kernel's, in vain
    assert got == (f"rank 1 (h, pid 2) {GONE}. The notebook that started it (%dist_init --spawn) starts it again in "
                   "its slot if it can (%dist_workers there); this notebook carries on at its next %%collective once "
                   "it has joined")


def test_the_record_told_while_the_rank_waits_for_it_is_read(losing):
    first, second = losing
    writer = threading.Timer(0.5, lambda: second.client.set(second.key(keys.exited(1)), TOLD.to_json()))
    writer.start()
    try:
        assert str(first.checks.lost([(1, GONE)])).endswith("rank 1 was restarted (1 of 3)")
    finally:
        writer.join()


def test_a_peer_notebook_that_is_lost_is_not_waited_for_and_keeps_its_advice(two_worlds):
    first, _ = two_worlds
    got = str(first.checks.lost([(1, GONE)]))
    assert got.startswith(f"rank 1 (h, pid 2) {GONE}. Once its notebook runs %load_ext nbdist and its %%dist_init")
