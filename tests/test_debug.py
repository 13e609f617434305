"""%dist_debug: torch's and the backend's diagnostics on or off for the whole world, applied by rebuilding."""

from __future__ import annotations

import socket
import time

import pytest

from nbdist.backend.debugmode import helper_interface, variables
from nbdist.drive import kernels
from nbdist.world.store import connect

from .conftest import REAPER, form, free_port, init_line, ok, restore_kernel_state, run_in_background

HOST = socket.gethostname()
# Each rank prints what its rebuilt group runs with: the variable, torch's level, the backend torch made.
SHOW = ("%%collective\nimport os\nt = torch.ones(1)\ndist.all_reduce(t)\n"
        "_b = dist.distributed_c10d._get_default_group()._get_backend(torch.device('cpu'))\n"
        "print(f'rank {RANK}: {os.environ.get(\"TORCH_DISTRIBUTED_DEBUG\")} {dist.get_debug_level().name} '\n"
        "      f'{type(_b).__name__} {t.item()}')\n")
ON = "DETAIL DETAIL _ProcessGroupWrapper 2.0"
OFF = "None OFF ProcessGroupGloo 2.0"
SESSION = "get_ipython().magics_manager.registry['DistMagics'].session"
GEN, ROUND = f"{SESSION}.world.gen", f"{SESSION}.world.round"


def shows(ks: list[kernels.Kernel], *expected: str) -> list[kernels.Result]:
    """Run SHOW on every rank; every notebook's table has each rank's ``expected`` line."""
    results = ok(kernels.execute_all(ks, SHOW, timeout=60))
    for r in results:
        for rank, line in enumerate(expected):
            assert f"rank {rank}: {line}" in r.text(), r.text()
    return results


def rebuilt(r: kernels.Result) -> bool:
    return "the process group was rebuilt before this cell" in r.text()


def gens(ks: list[kernels.Kernel]) -> list[int]:
    return [int(k.execute("", user_expressions={"g": GEN}).expression("g")) for k in ks]


def round_of(kernel: kernels.Kernel) -> str:
    return kernel.execute("", user_expressions={"r": ROUND}).expression("r")


def seen(shared, round_: str, rank: int, what: str, box: dict) -> None:
    """Wait until a third client sees ``what`` ("barrier", "collective") in ``rank``'s last recorded activity."""
    client = connect("127.0.0.1", shared.port)
    try:
        deadline = time.monotonic() + 20
        while what not in (client.get_json_if(f"r/{round_}/last/{rank}") or {}):
            assert time.monotonic() < deadline, f"rank {rank} was not seen with {what!r} in 20 s"
            assert "r" not in box, f"rank {rank}'s cell ended: {box['r'].error}"
            time.sleep(0.05)
    finally:
        client.close()


@pytest.fixture
def world(shared):
    """The module's two-rank world; formed again afterwards (a new round has no switch), its state put back."""
    yield shared.kernels
    form(shared.kernels, shared.port)
    for k, baseline in zip(shared.kernels, shared.baselines, strict=True):
        restore_kernel_state(k, baseline, reload_nbdist=False)


@pytest.mark.timeout(120)
def test_dist_debug_on_in_one_notebook_rebuilds_every_rank_with_detail_and_off_puts_back_what_was_there(world):
    ok([world[1].execute("import os; os.environ['TORCH_DISTRIBUTED_DEBUG'] = 'INFO'")])  # rank 1's user's own
    r = world[0].execute("%dist_debug on", timeout=30)
    assert r.status == "ok", r.error
    assert ("debug on for all 2 ranks: each rank rebuilds its process group at its next cell that uses it"
            in r.text() and "with TORCH_DISTRIBUTED_DEBUG=DETAIL" in r.text()), r.text()
    for res in shows(world, ON, ON):  # rank 1 never ran the magic
        assert f"rebuilt before this cell (debug on for every rank: rank 0 ({HOST}, pid" in res.text(), res.text()
    assert not any(rebuilt(res) for res in shows(world, ON, ON))  # once
    status = world[1].execute("%dist_debug", timeout=30).text()
    assert "nbdist debug: on for all 2 ranks (rank 0" in status and "was built with it" in status, status
    assert "get_debug_level() here: DETAIL" in status and "TORCH_DISTRIBUTED_DEBUG=DETAIL" in status, status
    r = world[1].execute("%dist_debug off", timeout=30)
    assert r.status == "ok" and "debug off for all 2 ranks" in r.text(), (r.error, r.text())
    # Put back: unset on rank 0, where nbdist set it; rank 1's own INFO (which does not wrap the group).
    for res in shows(world, OFF, "INFO INFO ProcessGroupGloo 2.0"):
        assert f"(debug off for every rank: rank 1 ({HOST}, pid" in res.text(), res.text()


@pytest.mark.timeout(120)
def test_peers_that_each_run_it_switch_and_rebuild_once(world):
    before = gens(world)
    results = ok(kernels.execute_all(world, "%dist_debug on", timeout=30))
    texts = sorted(r.text() for r in results)
    assert "debug is already on for all 2 ranks" in texts[0] and "debug on for all 2 ranks:" in texts[1], texts
    assert all(rebuilt(r) for r in shows(world, ON, ON))
    assert gens(world) == [before[0] + 1] * 2  # one generation: one rebuild
    results = ok(kernels.execute_all(world, "%dist_debug off", timeout=30))
    assert sum("debug is already off" in r.text() for r in results) == 1, [r.text() for r in results]
    assert all(rebuilt(r) for r in shows(world, OFF, OFF))
    assert gens(world) == [before[0] + 2] * 2


@pytest.mark.timeout(120)
def test_with_debug_on_a_failing_cell_the_stop_button_in_a_stuck_plain_collective_and_a_mismatch_leave_it_working(
        world, shared, record_fault):
    ok([world[0].execute("%dist_debug on", timeout=30)])
    shows(world, ON, ON)
    failing = ("%%collective --timeout 60\nimport time\nif RANK == 1:\n    time.sleep(0.5)\n    1 / 0\n"
               "t = torch.ones(1)\ndist.all_reduce(t)\n")
    results = kernels.execute_all(world, failing, timeout=60)
    assert [r.status for r in results] == ["error", "error"]
    assert "ZeroDivisionError" in results[0].error["evalue"], results[0].error
    shows(world, ON, ON)
    # A plain cell's all_reduce that rank 1 never joins waits in torch's wrapper (its check runs first, over its
    # own gloo group, which nbdist's cut reaches too): the stop button ends it.
    round_ = round_of(world[0])
    thread, box = run_in_background(world[0], "t = torch.ones(1)\ndist.all_reduce(t)\n", timeout=60)
    seen(shared, round_, 0, "collective", box)
    pressed = time.monotonic()
    world[0].interrupt()
    thread.join(timeout=30)
    record_fault("stop button in a plain-cell collective, %dist_debug on", box["t"] - pressed)
    assert box["t"] - pressed < 2 and box["r"].error["ename"] == "KeyboardInterrupt", (box["t"] - pressed,
                                                                                        box["r"].error)
    plain = ok(kernels.execute_all(world, "t = torch.ones(1)\ndist.all_reduce(t)\nprint(t.item(), "
                                          "dist.get_debug_level().name)", timeout=60))
    assert all("2.0 DETAIL" in r.text() for r in plain), [r.text() for r in plain]
    shows(world, ON, ON)
    # Different collectives with nbdist's check off: torch's own check (DETAIL) names them, nothing hangs.
    mismatch = ("%%collective --timeout 60 --no-check\nt = torch.ones(4)\nif RANK == 0:\n    dist.all_reduce(t)\n"
                "else:\n    dist.broadcast(t, src=1)\n")
    results = kernels.execute_all(world, mismatch, timeout=60)
    assert [r.status for r in results] == ["error", "error"]
    assert all("Detected mismatch between collectives" in r.error["evalue"] for r in results), results[0].error
    shows(world, ON, ON)


@pytest.mark.timeout(120)
def test_a_rank_already_waiting_at_its_next_cell_meets_the_others_there_under_the_new_switch(world, shared):
    round_ = round_of(world[0])
    thread, box = run_in_background(world[1], SHOW, timeout=60)
    seen(shared, round_, 1, "barrier", box)  # rank 1 waits at its cell's start, built before the switch
    ok([world[0].execute("%dist_debug on", timeout=30)])
    time.sleep(1.0)
    assert thread.is_alive(), f"rank 1's cell ended while it waited for rank 0: {box['r'].error}"
    mine = world[0].execute(SHOW, timeout=60)
    thread.join(timeout=30)
    for r in (mine, box["r"]):
        assert r.status == "ok" and rebuilt(r), (r.error, r.text())
        assert f"rank 0: {ON}" in r.text() and f"rank 1: {ON}" in r.text(), r.text()


@pytest.mark.timeout(120)
def test_init_with_debug_then_off_and_debug_on_one_rank_only_refused_at_join(world, shared):
    form(world, shared.port, "--debug")  # torch was imported before: its level must follow the variable anyway
    shows(world, ON, ON)
    assert "on (every notebook joined with --debug)" in world[1].execute("%dist_debug", timeout=30).text()
    ok([world[0].execute("%dist_debug off", timeout=30)])
    shows(world, OFF, OFF)
    lines = [init_line(0, 2, shared.port, "--debug --timeout 60"), init_line(1, 2, shared.port, "--timeout 60")]
    for r in kernels.execute_all(world, lines, timeout=90):
        assert r.status == "error" and r.error["ename"] == "JoinError", r.error
        assert ("TORCH_DISTRIBUTED_DEBUG differs between ranks (rank 0: DETAIL; rank 1: (unset))"
                in r.error["evalue"]), r.error


@pytest.mark.timeout(150)
def test_a_driven_world_gets_it_on_its_worker_and_bad_arguments_are_one_line_errors():
    k = kernels.Kernel()
    try:
        ok([k.execute("%load_ext nbdist", timeout=60)])
        r = k.execute("%dist_debug maybe", timeout=30)
        assert r.status == "error" and r.error["ename"] == "UsageError", r.error
        assert "invalid choice: 'maybe'" in r.error["evalue"] and "\n" not in r.error["evalue"], r.error
        r = k.execute("%dist_debug on", timeout=30)
        assert r.status == "error" and r.error["ename"] == "NotInitializedError", r.error
        assert "not in a world" in k.execute("%dist_debug", timeout=30).text()
        help_text = "".join(p.get("data", {}).get("text/plain", "") for p in k.execute("%dist_debug?").payload)
        assert "TORCH_DISTRIBUTED_DEBUG=DETAIL" in help_text, help_text
        ok([k.execute(f"%dist_init --spawn 2 --master-port {free_port()}", timeout=180)])
        ok([k.execute("%dist_debug on", timeout=30)])
        (r,) = shows([k], ON, ON)  # rank 1 is the worker kernel: it follows, and never ran the magic
        assert rebuilt(r), r.text()
        ok([k.execute("%dist_debug off", timeout=30)])
        shows([k], OFF, OFF)
    finally:
        REAPER.later([k])


def test_what_on_sets_per_backend_and_the_gloo_helpers_interface_follows_the_backends_own():
    assert variables("gloo") == {"TORCH_DISTRIBUTED_DEBUG": "DETAIL"}
    assert variables("nccl") == {"NCCL_DEBUG": "INFO", "TORCH_DISTRIBUTED_DEBUG": "DETAIL"}
    assert variables("hccl") == {"HCCL_ENTRY_LOG_ENABLE": "1", "ASCEND_GLOBAL_LOG_LEVEL": "1",
                                 "TORCH_DISTRIBUTED_DEBUG": "DETAIL", "TORCH_HCCL_TRACE_BUFFER_SIZE": "2000"}
    names = {"lo": "127.0.0.1", "eth0": "10.0.0.2"}
    assert helper_interface("nccl", {"NCCL_SOCKET_IFNAME": "eth0"}, names) == "eth0"
    assert helper_interface("nccl", {"NCCL_SOCKET_IFNAME": "^lo,docker"}, names) is None  # a pattern: no name
    assert helper_interface("hccl", {"HCCL_IF_IP": "10.0.0.2"}, names) == "eth0"
    assert helper_interface("hccl", {"HCCL_IF_IP": "10.0.0.9"}, names) is None
    assert helper_interface("hccl", {"HCCL_IF_IP": "10.0.0.2", "GLOO_SOCKET_IFNAME": "ib0"}, names) is None  # yours
    assert helper_interface("gloo", {}, names) is None  # gloo's own plan sets it
