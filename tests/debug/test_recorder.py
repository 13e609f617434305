"""The Flight Recorder matched across ranks: real dumps of a real two-process gloo world (tests.debug.fr_world)."""

from __future__ import annotations

import copy
import json
import re
import subprocess
import sys
from pathlib import Path

import pytest

from nbdist.debug import recorder

from ..conftest import free_port

ROOT = Path(__file__).resolve().parents[2]


def world_dumps(tmp_path: Path, mode: str) -> dict[int, dict]:
    port = free_port()
    ranks = [subprocess.Popen([sys.executable, "-m", "tests.debug.fr_world", str(r), str(port), str(tmp_path), mode],
                              cwd=ROOT, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True) for r in (0, 1)]
    for r in ranks:
        out, _ = r.communicate(timeout=120)
        assert r.returncode == 0, out
    return {r: json.loads((tmp_path / f"rank{r}.json").read_text()) for r in (0, 1)}


@pytest.fixture(scope="module")
def missing(tmp_path_factory) -> dict[int, dict]:
    return world_dumps(tmp_path_factory.mktemp("missing"), "missing")


@pytest.fixture(scope="module")
def differs(tmp_path_factory) -> dict[int, dict]:
    return world_dumps(tmp_path_factory.mktemp("differs"), "differs")


@pytest.fixture(scope="module")
def ddp(tmp_path_factory) -> dict[int, dict]:
    return world_dumps(tmp_path_factory.mktemp("ddp"), "ddp")


def by_group(findings: list[recorder.Finding]) -> dict[str, recorder.Finding]:
    return {f.group: f for f in findings}


def test_a_rank_that_skipped_an_all_reduce_is_named_missing_by_torchs_analyser(missing):
    found = by_group(recorder.analyse(missing))
    default = found["0"]
    assert default.by == "torch"
    assert default.line(2) == ("the default group: all_reduce #4 (sizes [[3]]): rank 0 entered, rank 1 missing; "
                               "last completed on every member: all_reduce #3")
    assert (default.entered, default.missing) == ([0], [1])
    side = found["1"]
    assert side.parted is None and side.ranks == [0, 1]
    assert side.line(2).startswith("group 1 of all 2 ranks: in step; last completed on every member: broadcast #")


def test_torch_npus_hccl_recorder_is_read_where_torch_npu_provides_it(tmp_path):
    # No NPU here: a stand-in torch_npu whose reader returns torch's own JSON (the form torch_npu's dump has),
    # with torch's readers off. What HCCL itself records is untested here.
    found = by_group(recorder.analyse(world_dumps(tmp_path, "npu")))
    assert found["0"].line(2).startswith("the default group: all_reduce #4 (sizes [[3]]): rank 0 entered, rank 1 "
                                         "missing"), found["0"].line(2)


def test_only_the_rebuilt_groups_entries_are_sent_not_the_destroyed_one_of_the_same_name(missing):
    for dump in missing.values():
        numbers = [e["collective_seq_id"] for e in dump["entries"] if e["group"] == "0"]
        assert numbers == sorted(numbers) and numbers[0] == 1 and max(numbers) <= 4, numbers  # five before
        assert dump["groups"]["0"]["desc"] == "default_pg" and dump["groups"]["0"]["ranks"] == [0, 1]


def test_nbdists_own_matcher_agrees_with_torchs(missing, differs):
    for dumps in (missing, differs):
        theirs = by_group(recorder.torch_findings(recorder.align(copy.deepcopy(dumps))))
        ours = by_group(recorder.match(recorder.align(copy.deepcopy(dumps))))
        assert set(theirs) == set(ours)
        for name in theirs:
            assert (theirs[name].entered, theirs[name].missing) == (ours[name].entered, ours[name].missing)
            assert (theirs[name].parted is None) == (ours[name].parted is None)
            assert theirs[name].last_done == ours[name].last_done


def test_a_rank_that_called_another_collective_is_named_with_what_it_called(differs):
    default = by_group(recorder.analyse(differs))["0"]
    assert default.parted == ("#4 differs: rank 0 called all_reduce #4 (sizes [[3]]); "
                              "rank 1 called broadcast #4 (sizes [[5]])")


def test_a_rank_that_skipped_a_ddp_backward_is_named_missing_from_ddps_own_all_reduce(ddp):
    default = by_group(recorder.analyse(ddp))["0"]
    # after DDP's constructor's own collectives (an all_gather, broadcasts), its one bucket of 8 + 2 values
    assert re.fullmatch(r"all_reduce #\d+ \(sizes \[\[10\]\]\): rank 0 entered, rank 1 missing",
                        default.parted or ""), default.line(2)
    assert (default.last_done or "").startswith("broadcast #"), default.line(2)


def test_where_torchs_analyser_cannot_run_nbdists_matcher_answers(missing):
    dumps = copy.deepcopy(missing)
    dumps[1]["version"] = "1.0"  # torch's analyser asserts every rank's dump has the same version
    default = by_group(recorder.analyse(dumps))["0"]
    assert default.by == "nbdist"
    assert default.parted == "all_reduce #4 (sizes [[3]] Float): rank 0 entered, rank 1 missing"


def test_a_rank_without_a_dump_is_said_not_missing():
    dumps = {0: {"version": "2.10", "groups": {"0": {"desc": "default_pg", "ranks": [0, 1, 2], "seq": 1}},
                 "entries": [entry(1, retired=False)]},
             2: {"version": "2.10", "groups": {"0": {"desc": "default_pg", "ranks": [0, 1, 2], "seq": 0}},
                 "entries": []}}
    default = by_group(recorder.match(dumps))["0"]
    assert default.unheard == [1]
    assert default.line(3) == ("the default group: all_reduce #1 (sizes [[3]] Float): rank 0 entered, rank 2 "
                               "missing; none completed on every member; no dump from rank 1")


# --- pure: which entries count ---------------------------------------------------------------------------------

def entry(n: int, group: str = "0", retired: bool = True, name: str = "gloo:all_reduce") -> dict:
    return {"collective_seq_id": n, "p2p_seq_id": 0, "is_p2p": False, "profiling_name": name, "group": group,
            "input_sizes": [[3]], "input_dtypes": ["Float"], "retired": retired, "record_id": n}


def test_the_latest_run_of_a_name_starts_where_its_numbers_start_again():
    old = [entry(n) for n in (1, 2, 3, 4, 5)]
    new = [entry(n) for n in (1, 2)]
    assert recorder.latest_run(old + new, seq=2) == new
    assert recorder.latest_run(old, seq=0) == []  # rebuilt, nothing issued yet: the old entries are not its
    assert recorder.latest_run(old, seq=None) == old


def test_ranks_rings_are_aligned_at_the_same_first_number():
    dumps = {0: {"entries": [entry(n) for n in range(37, 101)]}, 1: {"entries": [entry(n) for n in range(36, 100)]}}
    aligned = recorder.align(dumps)
    assert [e["collective_seq_id"] for e in aligned[1]["entries"]][0] == 37
    assert [e["collective_seq_id"] for e in aligned[0]["entries"]][0] == 37
