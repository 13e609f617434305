"""What srun and a follower task's log say, read (nbdist.drive.srunlog): the lines as Slurm 22.05's srun -v wrote
them on the test cluster (tests/slurm.py), and the task line nbdist's wrapper writes."""

from __future__ import annotations

import subprocess

import pytest

from nbdist.drive import restarts, srunlog
from nbdist.drive.srunlog import Place, TaskEnd

JOB_LOG = """\
srun: jobid 2: nodes(2):`nbdn[1-2]', cpu counts: 1(x2)
srun: launching StepId=2.0 on host nbdn2, 1 tasks: 1
srun: launch/slurm: _task_start: Node nbdn2, 1 tasks started
srun: launch/slurm: _task_finish: Received task exit notification for 1 task of StepId=2.0 (status=0x0009).
srun: error: nbdn2: task 1: Killed
srun: Complete StepId=2.0+0 received
slurmstepd-nbdn1: error: *** JOB 2 ON nbdn1 CANCELLED AT 2026-12-06T13:10:35 ***
srun: error: nbdn1: task 0: Terminated
""".splitlines()


@pytest.mark.parametrize(("line", "end"), [
    ("srun: error: nbdn2: task 1: Killed", TaskEnd("nbdn2", (1,), -9, "Killed")),
    ("srun: error: nbdn2: task 0: Exited with exit code 3", TaskEnd("nbdn2", (0,), 3, "Exited with exit code 3")),
    ("srun: nbdn1: task 4: Completed", TaskEnd("nbdn1", (4,), 0, "Completed")),
    ("srun: error: gpu-07: tasks 0-2,5: Terminated", TaskEnd("gpu-07", (0, 1, 2, 5), -15, "Terminated")),
    ("srun: error: nbdn1: task 0: Segmentation fault (core dumped)",
     TaskEnd("nbdn1", (0,), -11, "Segmentation fault (core dumped)")),
    ("srun: error: nbdn1: task 0: Something new", TaskEnd("nbdn1", (0,), None, "Something new")),
    ("srun: launch/slurm: _task_start: Node nbdn2, 1 tasks started", None),
    ("srun: launching StepId=2.0 on host nbdn2, 1 tasks: 1", None),
    ("nbdist follow: rank 2: joined: rank 2 (nbdn2, pid 7), device cpu", None),
])
def test_srun_says_which_tasks_ended_on_which_node_and_how(line, end):
    assert srunlog.task_end(line) == end


def test_a_job_log_gives_each_task_end_in_order():
    assert [(e.node, e.tasks, e.returncode) for e in srunlog.task_ends(JOB_LOG)] == [
        ("nbdn2", (1,), -9), ("nbdn1", (0,), -15)]


@pytest.mark.parametrize(("returncode", "rss", "how"), [
    (-9, None, "was killed by SIGKILL"),  # no memory sample of a process on another node
    (3, None, "exited with code 3"),
    (-11, None, "was killed by SIGSEGV"),
])
def test_how_a_task_ended_is_said_as_for_a_local_worker(returncode, rss, how):
    assert restarts.describe(returncode, rss) == how


@pytest.mark.parametrize(("line", "place"), [
    ("nbdist-slurm-task procid=1 localid=0 node=nbdn2 pid=4242", Place(1, 0, "nbdn2", 4242)),
    ("nbdist-slurm-task procid=0 localid=3 node=gpu-07.cluster pid=17 ", Place(0, 3, "gpu-07.cluster", 17)),
    ("nbdist-slurm-task procid=0 localid= node=nbdn1 pid=17", Place(0, 0, "nbdn1", 17)),
    ("nbdist follow: rank 1: joined: rank 1 (nbdn1, pid 17), device cpu", None),
    ("nbdist-slurm-task procid= localid=0 node=nbdn1 pid=17", None),
])
def test_a_task_line_says_where_its_process_runs(line, place):
    assert srunlog.place(line) == place


def test_the_last_task_line_of_a_log_is_its_current_process_and_joined_is_its_follow_line():
    log = ["nbdist-slurm-task procid=1 localid=0 node=nbdn2 pid=10",
           "nbdist follow: rank 2: joining 10.0.0.1:29500 as rank 2 of 3 (rank from SLURM_PROCID)",
           "nbdist follow: rank 2: joined: rank 2 (nbdn2, pid 10), device cpu",
           "nbdist-slurm-task procid=0 localid=0 node=nbdn2 pid=20"]
    assert srunlog.last_place(log) == Place(0, 0, "nbdn2", 20)
    assert srunlog.joined(log[:3]) and not srunlog.joined(log[3:]) and not srunlog.joined(log[:2])
    assert srunlog.last_place([]) is None


@pytest.mark.parametrize(("text", "ids"), [("1", (1,)), ("0-2", (0, 1, 2)), ("0-1,4,6-7", (0, 1, 4, 6, 7)),
                                           ("x", ())])
def test_task_ids_unfold(text, ids):
    assert srunlog.task_ids(text) == ids


def test_the_wrapper_says_where_it_runs_and_execs_the_command_in_its_own_pid():
    out = subprocess.run(["sh", "-c", srunlog.WRAPPER, "sh", "sh", "-c", "echo $$"], capture_output=True, text=True,
                         env={"SLURM_PROCID": "2", "SLURM_LOCALID": "1", "SLURMD_NODENAME": "n7"}, check=True)
    first, second = out.stdout.splitlines()
    place = srunlog.place(first)
    assert place is not None and (place.procid, place.localid, place.node) == (2, 1, "n7")
    assert place.pid == int(second)
