"""``%dist_init --spawn N --slurm "OPTIONS"`` on a real Slurm: two nodes in network namespaces (tests/slurm.py).

The notebook (a kernel in the root namespace) is rank 0 on the bridge address; one Slurm job
runs ``nbdist follow`` on both nodes. Without root or Slurm's packages these tests skip with
the reason (under CI they fail instead).
"""

from __future__ import annotations

import ast
import os
import signal
import subprocess
import sys
import time

from nbdist import demo
from nbdist.drive import kernels

from .conftest import free_port, run_in_background
from .slurm import SlurmCluster

JOB = "get_ipython().magics_manager.registry['DistMagics'].session.workers.job_id"


def _kernel(cluster: SlurmCluster) -> kernels.Kernel:
    k = kernels.Kernel(env=cluster.env)
    assert k.execute("%load_ext nbdist", timeout=60).status == "ok"
    return k


def _init(cluster: SlurmCluster, options: str = "-N 2 --ntasks-per-node 1", addr: str | None = None) -> str:
    return (f"%dist_init --spawn 3 --slurm \"{options}\" --master-addr {addr or cluster.addr} "
            f"--master-port {free_port()} --timeout 120")


def _queued(cluster: SlurmCluster, job: str) -> list[dict]:
    return [j for j in cluster.queue() if j["id"] == job]


def _rank_pid(cluster: SlurmCluster, job: str, rank: int) -> int:
    """The pid of the follower that is ``rank`` (SLURM_PROCID rank - 1, running nbdist follow)."""
    for pid in cluster.task_pids(job):
        try:
            with open(f"/proc/{pid}/environ", "rb") as f:
                env = dict(item.split(b"=", 1) for item in f.read().split(b"\0") if b"=" in item)
            with open(f"/proc/{pid}/cmdline", "rb") as f:
                cmd = f.read()
        except OSError:
            continue
        if env.get(b"SLURM_PROCID") == str(rank - 1).encode() and b"follow" in cmd and b"srun" not in cmd:
            return pid
    raise AssertionError(f"no follower process for rank {rank} in job {job}: {cluster.task_pids(job)}")


def test_a_slurm_job_of_followers_runs_the_walkthrough_and_is_cancelled_when_a_killed_task_ends_the_world(
        slurm_cluster):
    cluster = slurm_cluster
    k = _kernel(cluster)
    try:
        started = time.monotonic()
        r = k.execute(_init(cluster), timeout=180)
        formed = time.monotonic() - started
        assert r.status == "ok", (r.error, cluster.logs())
        text = r.text()
        assert "nbdist world · 3 rank(s)" in text and "drives its workers" in text, text
        assert cluster.nodes[0] in text and cluster.nodes[1] in text, text
        job = ast.literal_eval(k.execute("1", user_expressions={"j": JOB}).expression("j"))
        assert [j["state"] for j in _queued(cluster, job)] == ["RUNNING"], cluster.queue()

        checks = demo.walk(k, 3, out=open(os.devnull, "w"), timeout=120)
        failed = [c for c in checks if not c.ok]
        assert checks and not failed, failed

        shown = k.execute("%dist_workers", timeout=30).text()
        assert f"Slurm job {job} · running" in shown, shown
        for rank, node in ((1, cluster.nodes[0]), (2, cluster.nodes[1])):
            assert f"rank {rank}" in shown and node in shown, shown
            assert f"nbdist follow: rank {rank}: joined: rank {rank} (" in shown, shown  # its log's last lines

        # A task whose process dies (its node's, say) fails the running cell, naming its rank and node.
        loop = "%%collective\nimport time\nfor _ in range(2000):\n    dist.all_reduce(torch.ones(1)); time.sleep(0.02)"
        thread, box = run_in_background(k, loop, timeout=120)
        time.sleep(3)
        victim = _rank_pid(cluster, job, 2)
        os.kill(victim, signal.SIGKILL)
        killed = time.monotonic()
        thread.join(timeout=60)
        assert "r" in box, box
        assert box["t"] - killed < 10, box["t"] - killed
        assert box["r"].status == "error", box["r"].text()
        said = box["r"].text()
        assert f"rank 2 ({cluster.nodes[1]}, pid {victim}) is gone: its nbdist follow process exited or was " \
            "killed" in said, said
        shown = k.execute("%dist_workers", timeout=30).text()
        assert shown.split("── rank 2 ──")[1].split("state: ")[1].startswith("exited"), shown

        # %dist_destroy cancels the job: nothing of it is left in the queue within 10 s.
        r = k.execute("%dist_destroy", timeout=60)
        assert r.status == "ok", r.error
        deadline = time.monotonic() + 10
        while _queued(cluster, job) and time.monotonic() < deadline:
            time.sleep(0.2)
        assert not _queued(cluster, job), cluster.queue()
        assert not cluster.task_pids(job)
        print(f"world of 3 formed through Slurm in {formed:.1f} s; the killed task ended the cell in "
              f"{box['t'] - killed:.2f} s")
    finally:
        k.shutdown()
        cluster.cancel_all()


def test_a_loopback_master_and_a_misspelled_option_are_one_line_each_a_pending_job_yields_to_the_stop_button_and_kernel_exit_cancels_the_job(  # noqa: E501
        slurm_cluster):
    cluster = slurm_cluster
    k = _kernel(cluster)
    try:
        r = k.execute(_init(cluster, addr="127.0.0.1"), timeout=30)
        assert r.status == "error" and r.error["ename"] == "UsageError", r.error
        assert "--master-addr 127.0.0.1 is a loopback address" in r.error["evalue"], r.error
        assert "pass --master-addr with this machine's address" in r.error["evalue"], r.error

        started = time.monotonic()
        r = k.execute(_init(cluster, options="-N 2 --ntask-per-node 1"), timeout=30)
        assert time.monotonic() - started < 10
        assert r.status == "error" and r.error["ename"] == "WorkerError", r.error
        assert r.error["evalue"].startswith("sbatch refused the job: sbatch: unrecognized option '--ntask-per-node"), \
            r.error["evalue"]
        assert "\n" not in r.error["evalue"] and len(r.text().strip().splitlines()) <= 2, r.text()
        assert not cluster.queue()

        # A job whose tasks fail (here: sbatch told to pass them no environment, so no master address) ends the
        # join at once, with their own last lines.
        started = time.monotonic()
        r = k.execute(_init(cluster, options="-N 2 --ntasks-per-node 1 --export=NONE"), timeout=60)
        assert r.status == "error" and r.error["ename"] == "WorkerError", r.error
        assert "ended (failed" in r.error["evalue"] and "before every rank joined" in r.error["evalue"], r.error
        assert "nbdist follow: failed: no master address" in r.error["evalue"], r.error
        assert time.monotonic() - started < 30 and not cluster.queue()

        holder = cluster.occupy()
        thread, box = run_in_background(k, _init(cluster), timeout=120)
        deadline = time.monotonic() + 30
        mine: list[dict] = []
        while time.monotonic() < deadline:
            mine = [j for j in cluster.queue() if j["id"] != holder]
            if mine and mine[0]["reason"] == "Resources":
                break
            time.sleep(0.3)
        assert mine and mine[0]["state"] == "PENDING", cluster.queue()
        time.sleep(2)  # the join status has looked at the queue since
        k.interrupt()  # the stop button
        pressed = time.monotonic()
        thread.join(timeout=60)
        assert "r" in box and box["r"].status == "error" and box["r"].error["ename"] == "KeyboardInterrupt", box
        assert any(f"Slurm job {mine[0]['id']} pending: Resources" in u for u in box["r"].updates()), \
            box["r"].updates()
        while any(j["id"] == mine[0]["id"] for j in cluster.queue()) and time.monotonic() - pressed < 10:
            time.sleep(0.2)
        assert [j["id"] for j in cluster.queue()] == [holder], cluster.queue()

        # Once the nodes are free the world forms; the kernel's exit cancels its job.
        cluster.cancel_all()
        r = k.execute(_init(cluster), timeout=180)
        assert r.status == "ok", (r.error, cluster.logs())
        job = ast.literal_eval(k.execute("1", user_expressions={"j": JOB}).expression("j"))
        assert [j["state"] for j in _queued(cluster, job)] == ["RUNNING"], cluster.queue()
        k.shutdown()
        exited = time.monotonic()
        while _queued(cluster, job) and time.monotonic() - exited < 10:
            time.sleep(0.2)
        assert not _queued(cluster, job) and not cluster.task_pids(job), cluster.queue()
    finally:
        k.shutdown()
        cluster.cancel_all()


def test_an_exported_notebook_runs_as_two_srun_tasks_one_per_node_with_the_torchrun_values(slurm_cluster, tmp_path):
    """``nbdist export`` then ``srun -N 2 -n 2 python SCRIPT``: the master is the job's first node (scontrol)."""
    from pathlib import Path

    from .exported import script_values

    cluster = slurm_cluster
    walkthrough = Path(__file__).resolve().parents[1] / "examples" / "one_notebook" / "walkthrough.ipynb"
    script = tmp_path / "walkthrough.py"
    exported = subprocess.run([sys.executable, "-m", "nbdist", "export", str(walkthrough), "-o", str(script)],
                              capture_output=True, text=True, timeout=60)
    assert exported.returncode == 0, exported.stderr
    try:
        done = cluster.run("srun", "-N", "2", "-n", "2", "--ntasks-per-node", "1", sys.executable, str(script),
                           timeout=240)
        assert done.returncode == 0, (done.stdout[-2000:], done.stderr[-3000:], cluster.logs())
    finally:
        cluster.cancel_all()
    per_rank: dict[int, list[str]] = {0: [], 1: []}
    for line in done.stdout.splitlines():
        if line.startswith("[rank "):
            rank, _, text = line[6:].partition("] ")
            per_rank[int(rank)].append(text)
    torchrun, _ = script_values(walkthrough)
    assert per_rank[0] and per_rank == torchrun, (per_rank, torchrun)
    assert "'same weights': True" in per_rank[1][-1]
