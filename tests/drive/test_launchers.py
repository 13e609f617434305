"""Where a follower's rank, world size and device come from: the flags, else the launcher that started it."""

from __future__ import annotations

import argparse
import socket

import pytest

from nbdist.config import DEFAULT_PORT, ConfigError
from nbdist.drive import headless, launchers, slurm, spawn
from nbdist.world.store import Server, connect, listening


def test_slurm_task_is_procid_plus_one_of_ntasks_plus_one_on_its_local_device():
    p = launchers.place({"SLURM_PROCID": "5", "SLURM_NTASKS": "7", "SLURM_LOCALID": "1"})
    assert (p.rank, p.world_size, p.local_rank) == (6, 8, 1)
    assert "SLURM_PROCID" in p.sources["rank"] and "offset 1" in p.sources["rank"]


@pytest.mark.parametrize(("environ", "expected"), [
    ({"OMPI_COMM_WORLD_RANK": "2", "OMPI_COMM_WORLD_SIZE": "4", "OMPI_COMM_WORLD_LOCAL_RANK": "0"}, (3, 5, 0)),
    ({"PMI_RANK": "0", "PMI_SIZE": "2", "MPI_LOCALRANKID": "0"}, (1, 3, 0)),
    # torchrun inside a Slurm allocation: the allocation's variables are still set, torchrun's win.
    ({"SLURM_PROCID": "0", "SLURM_NTASKS": "1", "SLURM_LOCALID": "0", "TORCHELASTIC_RUN_ID": "x", "RANK": "3",
      "WORLD_SIZE": "4", "LOCAL_RANK": "3"}, (4, 5, 3)),
    # mpirun inside a Slurm batch step: its own ranks, not the step's.
    ({"SLURM_PROCID": "0", "SLURM_NTASKS": "1", "OMPI_COMM_WORLD_RANK": "1", "OMPI_COMM_WORLD_SIZE": "2"},
     (2, 3, None)),
    ({"RANK": "1", "WORLD_SIZE": "2"}, (2, 3, None)),
])
def test_each_launcher_gives_the_rank_the_size_and_the_local_rank(environ, expected):
    p = launchers.place(environ)
    assert (p.rank, p.world_size, p.local_rank) == expected


def test_flags_win_over_the_launcher_and_the_offset_can_be_zero():
    environ = {"SLURM_PROCID": "1", "SLURM_NTASKS": "2"}
    assert launchers.place(environ, rank=4, world_size=6).rank == 4
    p = launchers.place(environ, offset=0)
    assert (p.rank, p.world_size) == (1, 2)


@pytest.mark.parametrize(("environ", "kwargs", "says"), [
    ({}, {}, "no rank: pass --rank"),
    ({}, {"rank": 1}, "no world size: pass --world-size"),
    ({"SLURM_PROCID": "x", "SLURM_NTASKS": "2"}, {}, "SLURM_PROCID must be an integer"),
    ({"SLURM_PROCID": "0", "SLURM_NTASKS": "2"}, {"world_size": 1}, "rank 1 is not in a world of 1"),
    ({"SLURM_PROCID": "0", "SLURM_NTASKS": "2"}, {"offset": -1}, "--rank-offset must be 0 or more"),
])
def test_what_cannot_place_a_rank_says_what_to_pass(environ, kwargs, says):
    with pytest.raises(ConfigError, match=says):
        launchers.place(environ, **kwargs)


def _follow_args(*argv: str) -> argparse.Namespace:
    parser = argparse.ArgumentParser()
    headless.add_arguments(parser)
    return parser.parse_args(list(argv))


def test_follow_takes_master_and_token_from_nbdist_variables_and_the_device_from_the_local_rank():
    environ = {"SLURM_PROCID": "2", "SLURM_NTASKS": "3", "SLURM_LOCALID": "2", "NBDIST_MASTER_ADDR": "10.0.0.1",
               "NBDIST_MASTER_PORT": "29511", "NBDIST_TOKEN": "t", "MASTER_ADDR": "10.9.9.9", "MASTER_PORT": "1"}
    flags, _ = headless.plan(_follow_args(), environ)
    assert (flags["rank"], flags["world_size"], flags["master_addr"], flags["master_port"], flags["token"],
            flags["device"]) == (3, 4, "10.0.0.1", "29511", "t", "2")
    flags, _ = headless.plan(_follow_args("--master-addr", "h", "--master-port", "5", "--device", "cpu"), environ)
    assert (flags["master_addr"], flags["master_port"], flags["device"]) == ("h", 5, "cpu")


def test_follow_without_a_master_address_names_the_flag_and_the_variable():
    with pytest.raises(ConfigError, match="pass --master-addr or set NBDIST_MASTER_ADDR"):
        headless.plan(_follow_args("--rank", "1", "--world-size", "2"), {"MASTER_ADDR": "torchrun's own"})


def _spawn_args(**kw):
    base = {"spawn": "3", "rank": None, "world_size": None, "master_addr": None, "master_port": 29555,
            "backend": None, "device": None, "timeout": None, "debug": None, "pg_timeout": None, "token": None,
            "env": None, "slurm": None}
    return argparse.Namespace(**{**base, **kw})


def test_slurm_refuses_a_loopback_master_naming_the_flag(monkeypatch, tmp_path):
    for name in slurm.COMMANDS:  # stand-ins on PATH: the plan only looks that the commands exist
        (tmp_path / name).write_text("#!/bin/sh\nexit 1\n")
        (tmp_path / name).chmod(0o755)
    monkeypatch.setenv("PATH", f"{tmp_path}:/usr/bin:/bin")
    with pytest.raises(ConfigError, match=r"--master-addr 127\.0\.0\.1 is a loopback address.*pass --master-addr"):
        spawn.plan(_spawn_args(slurm="-N 2", master_addr="127.0.0.1"), {})
    plan = spawn.plan(_spawn_args(slurm="-N 2 -p npu", master_addr="10.1.2.3"), {})
    assert plan.slurm == ["-N", "2", "-p", "npu"] and plan.flags["master_addr"] == "10.1.2.3"
    assert isinstance(plan.followers(), slurm.SlurmJob)
    with pytest.raises(ConfigError, match="leave out --master-addr"):
        spawn.plan(_spawn_args(master_addr="10.1.2.3"), {})  # without --slurm the workers are local


def test_slurm_without_its_commands_says_which_are_missing(monkeypatch, tmp_path):
    monkeypatch.setenv("PATH", str(tmp_path))
    with pytest.raises(ConfigError, match="lacks sbatch, squeue, scancel"):
        spawn.plan(_spawn_args(slurm="-N 2", master_addr="10.1.2.3"), {})


@pytest.mark.parametrize("options", ["-n 4", "--ntasks=4", "-n4", "--output x.log", "--wrap 'sleep 1'"])
def test_slurm_options_that_spawn_sets_itself_are_refused(options):
    with pytest.raises(ConfigError, match="--spawn N sets the job's tasks"):
        slurm.check_options(options)
    assert slurm.check_options("-N 2 --ntasks-per-node 4 -p npu --time=10") == [
        "-N", "2", "--ntasks-per-node", "4", "-p", "npu", "--time=10"]
    assert slurm.check_options('"-N 2 -p npu"') == ["-N", "2", "-p", "npu"]  # as %dist_init's parser leaves it


def test_sbatch_reason_is_its_error_line():
    said = "sbatch: unrecognized option '--ntask-per-node=1'\nTry \"sbatch --help\" for more information\n"
    assert slurm._first_error(said) == "sbatch: unrecognized option '--ntask-per-node=1'"
    assert slurm._first_error("sbatch: error: invalid partition specified: npu\nsbatch: error: Batch job "
                              "submission failed") == "sbatch: error: invalid partition specified: npu"


def test_spawn_takes_29500_when_it_is_free_else_a_free_port_and_says_why():
    """The port --spawn chooses without --master-port (spawn.reserve_port), with 29500 held for a moment only: the
    suite runs in two workers, and another file's --spawn may want 29500 meanwhile."""
    holder = socket.socket()
    holder.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
    try:
        holder.bind(("127.0.0.1", DEFAULT_PORT))
        holder.listen(1)
    except OSError:
        holder.close()
        holder = None  # something else holds it already: just as busy
    try:
        busy = spawn.plan(_spawn_args(master_port=None), {})
    finally:
        if holder is not None:
            holder.close()
    busy.release()
    assert busy.flags["master_port"] != DEFAULT_PORT and busy.flags["master_port"] in spawn.FALLBACK_PORTS
    assert busy.sources["master_port"] == f"--spawn: {DEFAULT_PORT} is busy, so a free port"
    given = spawn.plan(_spawn_args(master_port=29555), {})
    assert given.flags["master_port"] == 29555 and "master_port" not in given.sources
    assert given.take_port() is None  # a port the user gave is theirs to hold


def _binds(port: int) -> bool:
    """Whether another socket can listen on 127.0.0.1:``port`` now, as the rendezvous server binds it."""
    try:
        listening("127.0.0.1", port).close()
    except OSError:
        return False
    return True


def test_the_port_spawn_chose_stays_held_until_the_rendezvous_server_serves_on_it():
    """The workers start between the plan and the server: meanwhile nothing else may take the port the plan chose
    (another notebook's --spawn at the same moment, a test's server), or rank 0 would reach a stranger there."""
    first = spawn.plan(_spawn_args(master_port=None), {})
    try:
        port = first.flags["master_port"]
        assert not _binds(port)
        second = spawn.plan(_spawn_args(master_port=None), {})  # another --spawn at the same moment
        second.release()
        assert second.flags["master_port"] != port
        server = Server("127.0.0.1", port, token="held", listener=first.take_port())
        try:
            client = connect("127.0.0.1", port, 10, token="held")
            try:
                client.set("said", "here")
                assert client.get("said") == "here"
            finally:
                client.close()
        finally:
            server.stop()
    finally:
        first.release()


def test_a_plan_that_forms_no_world_lets_its_port_go():
    plan = spawn.plan(_spawn_args(master_port=None), {})
    port = plan.flags["master_port"]
    plan.release()
    plan.release()  # idempotent
    assert plan.take_port() is None and _binds(port)


def test_spawn_hands_max_restarts_to_local_workers_and_to_a_slurm_job_default_3(monkeypatch, tmp_path):
    assert spawn.plan(_spawn_args(), {}).followers().max_restarts == 3
    assert spawn.plan(_spawn_args(max_restarts="0"), {}).followers().max_restarts == 0
    with pytest.raises(ConfigError, match="0 or more"):
        spawn.plan(_spawn_args(max_restarts="-2"), {})
    for name in slurm.COMMANDS:  # Slurm's commands on PATH (never run here)
        (tmp_path / name).write_text("#!/bin/sh\nexit 1\n")
        (tmp_path / name).chmod(0o755)
    monkeypatch.setenv("PATH", f"{tmp_path}:/usr/bin:/bin")
    job = spawn.plan(_spawn_args(slurm="-N 2", master_addr="10.1.2.3", max_restarts="2"), {}).followers()
    assert isinstance(job, slurm.SlurmJob) and job.max_restarts == 2
    assert spawn.plan(_spawn_args(slurm="-N 2", master_addr="10.1.2.3"), {}).followers().max_restarts == 3
