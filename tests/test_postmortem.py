"""%dist_pdb on real kernels: post-mortem of a driven worker from the driving notebook, and of peers."""

from __future__ import annotations

import ast
import os
import re
import signal
from collections.abc import Iterator

import pytest

from nbdist.drive import kernels

from .conftest import REAPER, free_port, lend, ok, plain_text, spawned_world, typing

# Rank 1 divides by zero inside divide(), where its x is 41 (rank 0's would be 40).
FAILS_ON_RANK_1 = "%%collective\ndef divide(x):\n    return x / (1 - RANK)\nx = 40 + RANK\ny = divide(x)\n"


@pytest.fixture(scope="module")
def driving() -> Iterator[kernels.Kernel]:
    """One notebook driving a spawned worker (``%dist_init --spawn 2``)."""
    with spawned_world(2) as k:
        yield k


@pytest.mark.timeout(300)
def test_the_driving_notebook_debugs_rank_1s_failure_at_its_failing_frame_with_rank_1s_values(driving):
    failed = driving.execute(FAILS_ON_RANK_1, timeout=120)
    assert failed.status == "error"
    assert "Debug a failing rank: %dist_pdb 1" in failed.text()
    answer, prompts = typing(["p x", "up", "p RANK", "q"])
    r = driving.execute("%dist_pdb 1", timeout=120, stdin=answer)
    shown = plain_text(r)
    assert r.status == "ok", r.error
    assert len(prompts) == 4 and all(re.fullmatch(r"rank 1 \(.+\) ipdb> ", p) for p in prompts), prompts
    innermost, _, outer = shown.partition("\n41\n")
    assert "divide()" in innermost and "return x / (1 - RANK)" in innermost, shown  # the frame that raised
    assert outer, f"rank 1's x (41) was not shown: {shown}"
    assert "y = divide(x)" in outer and "\n1\n" in outer, shown  # up: the cell's own line; rank 1's RANK
    assert "nbdist: the debugger ended" in shown

    ok([driving.execute("%%collective\nprint('fine', RANK)", timeout=120)])
    r = driving.execute("%dist_pdb 1", timeout=120, stdin=typing([])[0])
    shown = plain_text(r)
    assert re.search(r"nbdist: rank 1 \(.+\) has no failed cell to debug: its last cell succeeded", shown), shown


@pytest.mark.timeout(300)
def test_the_stop_button_at_the_prompt_quits_rank_1s_debugger_there_and_it_can_be_opened_again(driving):
    assert driving.execute(FAILS_ON_RANK_1, timeout=120).status == "error"

    def stop_button(prompt: str) -> None:
        driving.interrupt()  # no reply: only the stop button can end this input()

    r = driving.execute("%dist_pdb 1", timeout=120, stdin=stop_button)
    assert r.status == "ok", r.error
    assert re.search(r"nbdist: left the debugger of rank 1 \(.+\) \(the stop button\)", plain_text(r)), plain_text(r)
    answer, prompts = typing(["p x", "q"])  # rank 1 quit its debugger: a new one opens at once
    r = driving.execute("%dist_pdb 1", timeout=120, stdin=answer)
    assert r.status == "ok" and "\n41\n" in plain_text(r) and len(prompts) == 2, (r.error, plain_text(r), prompts)


@pytest.mark.timeout(300)
def test_the_driving_notebook_names_rank_1_when_its_kernel_ends_while_in_its_debugger():
    k = kernels.Kernel()
    try:
        ok([k.execute("%load_ext nbdist", timeout=60)])
        ok([k.execute(f"%dist_init --spawn 2 --master-port {free_port()}", timeout=180)])
        session = "get_ipython().magics_manager.registry['DistMagics'].session"
        pid = ast.literal_eval(k.execute("", user_expressions={"p": f"{session}.world.ranks[1].pid"})
                               .expression("p"))
        assert k.execute(FAILS_ON_RANK_1, timeout=120).status == "error"

        def kill_then_type(prompt: str) -> str:
            os.kill(pid, signal.SIGKILL)  # rank 1's kernel ends while its debugger waits for this line
            return "p x"

        r = k.execute("%dist_pdb 1", timeout=120, stdin=kill_then_type)
        assert r.status == "ok", r.error
        assert re.search(rf"nbdist: rank 1 \(.+, pid {pid}\) is gone: its kernel exited or was killed; its "
                         r"debugger ended with it", plain_text(r)), plain_text(r)
    finally:
        REAPER.later([k])


@pytest.fixture
def peers(shared) -> Iterator[list[kernels.Kernel]]:
    """The module's shared world of two peer notebooks."""
    yield from lend(shared, "%%collective\nt = torch.ones(1)\ndist.all_reduce(t)")


@pytest.mark.timeout(300)
def test_in_a_peer_world_each_notebook_debugs_its_own_rank_and_the_others(peers):
    fails_on_rank_0 = "%%collective\ndef divide(x):\n    return x / RANK\nz = divide(30 + RANK)\n"
    results = kernels.execute_all(peers, fails_on_rank_0, timeout=120)
    assert [r.status for r in results] == ["error", "error"]
    assert "Debug a failing rank: %dist_pdb 0" in results[1].text()

    answer, prompts = typing(["p x", "q"])  # rank 0's own notebook: IPython's post-mortem, as %debug
    r = peers[0].execute("%dist_pdb 0", timeout=120, stdin=answer)
    assert r.status == "ok", r.error
    assert prompts == ["ipdb> ", "ipdb> "], prompts
    assert "return x / RANK" in plain_text(r) and "\n30\n" in plain_text(r), plain_text(r)

    answer, prompts = typing(["p x", "q"])  # the other notebook: rank 0's debugger relayed through the store
    r = peers[1].execute("%dist_pdb", timeout=120, stdin=answer)  # no rank: the one that failed
    assert r.status == "ok", r.error
    assert len(prompts) == 2 and prompts[0].startswith("rank 0 ("), prompts
    assert "\n30\n" in plain_text(r), plain_text(r)

    ok(kernels.execute_all(peers, "%%collective\nprint('fine', RANK)", timeout=120))
    r = peers[0].execute("%dist_pdb 0", timeout=120, stdin=typing([])[0])
    shown = plain_text(r)
    assert re.search(r"nbdist: rank 0 \(.+\) has no failed cell to debug: its last cell succeeded", shown), shown
