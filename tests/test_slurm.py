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

from .conftest import free_port, pid_gone, run_in_background
from .slurm import SlurmCluster

JOB = "get_ipython().magics_manager.registry['DistMagics'].session.workers.job_id"
SLOTS = ("[(t.rank, t.place.pid if t.place else None, t.joined, t.down, len(t.restarts)) for t in "
         "get_ipython().magics_manager.registry['DistMagics'].session.workers.tasks]")
COLLECTIVE = "%%collective\nt = torch.ones(1)\ndist.all_reduce(t)\nprint('sum', t.item(), 'kept', kept)\n"


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
    """The pid of the follower that is ``rank`` now: a task of the job's first step (SLURM_PROCID rank - 1), or of
    a step that started it again (``--rank R`` on its command line), running nbdist follow."""
    for pid in cluster.task_pids(job):
        try:
            with open(f"/proc/{pid}/environ", "rb") as f:
                env = dict(item.split(b"=", 1) for item in f.read().split(b"\0") if b"=" in item)
            with open(f"/proc/{pid}/cmdline", "rb") as f:
                cmd = f.read().split(b"\0")
        except OSError:
            continue
        if b"follow" not in cmd or any(b"srun" in word for word in cmd):
            continue
        given = cmd[cmd.index(b"--rank") + 1] if b"--rank" in cmd else None
        if (given or str(int(env.get(b"SLURM_PROCID", b"-2")) + 1).encode()) == str(rank).encode():
            return pid
    raise AssertionError(f"no follower process for rank {rank} in job {job}: {cluster.task_pids(job)}")


def _node_of(pid: int) -> str:
    with open(f"/proc/{pid}/environ", "rb") as f:
        env = dict(item.split(b"=", 1) for item in f.read().split(b"\0") if b"=" in item)
    return env[b"SLURMD_NODENAME"].decode()


def _slots(k: kernels.Kernel) -> list[tuple[int, int | None, bool, str | None, int]]:
    return ast.literal_eval(k.execute("1", user_expressions={"s": SLOTS}, timeout=30).expression("s"))


def _wait_slots(k: kernels.Kernel, what: str, ok, within: float = 120):
    deadline = time.monotonic() + within
    while not ok(found := _slots(k)):
        assert time.monotonic() < deadline, f"{what}: not within {within} s; the slots: {found}"
        time.sleep(0.5)
    return found


def _steps(cluster: SlurmCluster, job: str) -> list[list[str]]:
    """The job's steps as squeue lists them: [step id, name, nodes]."""
    out = cluster.check("squeue", "-h", "-s", "-j", job, "-o", "%i|%j|%N")
    return [line.split("|") for line in out.splitlines() if line.strip()]


def _sruns_of(job: str) -> list[int]:
    """This machine's srun processes for ``job`` (a restart's: ``srun ... --jobid=JOB``)."""
    found = []
    for entry in os.listdir("/proc"):
        if entry.isdigit():
            try:
                with open(f"/proc/{entry}/cmdline", "rb") as f:
                    cmd = f.read().split(b"\0")
            except OSError:
                continue
            if cmd and cmd[0].endswith(b"srun") and f"--jobid={job}".encode() in cmd:
                found.append(int(entry))
    return found


def _until_both_ranks_meet(k: kernels.Kernel, cell: str, dead: int):
    """Run ``cell`` until the restarted rank took part (a NameError there counts): it fails, naming the rank,
    while that rank's new process is still joining."""
    deadline = time.monotonic() + 120
    while (r := k.execute(cell, timeout=120)).status != "ok" and "NameError" not in r.text():
        assert f"rank {dead}" in r.error["evalue"] and time.monotonic() < deadline, r.error
        time.sleep(1.0)
    return r


def test_a_slurm_job_of_followers_runs_the_walkthrough_and_a_task_killed_in_a_cell_or_idle_comes_back_as_a_new_step_on_its_node(  # noqa: E501
        slurm_cluster):
    """The default --max-restarts (3): a follower task killed with SIGKILL is started again as a step of the same
    job on its node, with the same rank; the cell it died in ends naming it, and the survivors keep their
    variables. %dist_destroy cancels the job with every step."""
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
        assert "0 of 3 within 10 min" in shown, shown

        # A task whose process dies inside a cell ends that cell at once, naming its rank, node, how and its
        # last lines, and that it was started again.
        assert k.execute("%%collective\nkept = RANK * 10 + 7", timeout=60).status == "ok"
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
        said = box["r"].error["evalue"]
        assert f"rank 2 ({cluster.nodes[1]}, pid {victim}) is gone: its kernel was killed by SIGKILL (its last " \
            "lines: " in said, said
        # (The error may reach rank 0 through rank 1, which then adds what every rank does next.)
        assert "nbdist follow: rank 2: cell #" in said and "; rank 2 was restarted (1 of 3)" in said, said

        # ... as a new step of the same job, on its node, with the same rank; the survivors kept their variables.
        (_, (_, new, _, down, restarted)) = _wait_slots(
            k, "rank 2 started again and joined", lambda s: s[1][1] not in (None, victim) and s[1][2])
        assert down is None and restarted == 1
        assert _rank_pid(cluster, job, 2) == new and _node_of(new) == cluster.nodes[1]
        assert any(name.endswith("-rank2") and nodes == cluster.nodes[1] for _, name, nodes in _steps(cluster, job)), \
            _steps(cluster, job)
        r = _until_both_ranks_meet(k, COLLECTIVE, 2)
        text = r.text()
        assert "sum 3.0 kept 7" in text and "sum 3.0 kept 17" in text, text  # ranks 0 and 1 kept theirs
        assert "name 'kept' is not defined" in text, text  # rank 2's namespace is new

        # Killed while idle: it comes back too, and the next cell runs on all three.
        idle_victim = new
        os.kill(idle_victim, signal.SIGKILL)
        _wait_slots(k, "rank 2 started again once more", lambda s: s[1][1] not in (None, idle_victim) and s[1][2]
                    and s[1][4] == 2)
        r = _until_both_ranks_meet(k, "%%collective\nt = torch.ones(1)\ndist.all_reduce(t)\nprint('again', t.item())",
                                   2)
        assert r.status == "ok" and "again 3.0" in r.text(), (r.error, r.text())  # all three met
        kept = k.execute("%%collective\nprint('kept', globals().get('kept'))", timeout=60).text()
        assert "kept 7" in kept and "kept 17" in kept and "kept None" in kept, kept

        shown = k.execute("%dist_workers", timeout=30).text()
        rank2 = shown.split("── rank 2 ──")[1]
        assert "2 of 3 within 10 min" in rank2 and rank2.count("was killed by SIGKILL; restarted") == 2, shown
        assert f"pid {victim}" in rank2 and f"pid {idle_victim}" in rank2 and cluster.nodes[1] in rank2, shown
        assert "joined, following" in rank2, shown

        # %dist_destroy cancels the job: nothing of it, no step, no srun, is left within 10 s.
        sruns = _sruns_of(job)
        assert sruns, "the restart's srun runs in this machine's namespace"
        r = k.execute("%dist_destroy", timeout=60)
        assert r.status == "ok", r.error
        deadline = time.monotonic() + 10
        while _queued(cluster, job) and time.monotonic() < deadline:
            time.sleep(0.2)
        assert not _queued(cluster, job), cluster.queue()
        assert not cluster.task_pids(job) and all(pid_gone(p) for p in sruns), (cluster.task_pids(job), sruns)
        print(f"world of 3 formed through Slurm in {formed:.1f} s; the killed task ended the cell in "
              f"{box['t'] - killed:.2f} s")
    finally:
        k.shutdown()
        cluster.cancel_all()


def test_with_max_restarts_0_a_killed_slurm_task_is_left_down_and_the_survivors_are_told(slurm_cluster):
    cluster = slurm_cluster
    k = _kernel(cluster)
    try:
        r = k.execute(_init(cluster) + " --max-restarts 0", timeout=180)
        assert r.status == "ok", (r.error, cluster.logs())
        job = ast.literal_eval(k.execute("1", user_expressions={"j": JOB}).expression("j"))
        victim = _rank_pid(cluster, job, 1)
        os.kill(victim, signal.SIGKILL)
        _wait_slots(k, "rank 1 left down", lambda s: s[0][3] is not None, within=30)
        r = k.execute("%%collective\ndist.all_reduce(torch.ones(1))", timeout=60)
        assert r.status == "error", r.text()
        said = r.error["evalue"]
        assert f"rank 1 ({cluster.nodes[0]}, pid {victim}) is gone: its kernel was killed by SIGKILL" in said, said
        assert "rank 1 was left down: restarts are off (--max-restarts 0); %dist_init --spawn N --slurm OPTIONS " \
            "again submits a new job (every rank's variables are lost)" in said, said
        shown = k.execute("%dist_workers", timeout=30).text()
        rank1 = shown.split("── rank 1 ──")[1].split("── rank 2 ──")[0]
        assert "state: left down: restarts are off (--max-restarts 0)" in rank1, shown
        assert "off (--max-restarts 0)" in rank1 and f"pid {victim} was killed by SIGKILL" in rank1, shown
        assert [name for _, name, _ in _steps(cluster, job) if "rank" in name] == [], _steps(cluster, job)
        assert not _sruns_of(job)
        assert k.execute("%dist_destroy", timeout=60).status == "ok"
        deadline = time.monotonic() + 10
        while _queued(cluster, job) and time.monotonic() < deadline:
            time.sleep(0.2)
        assert not _queued(cluster, job) and not cluster.task_pids(job), cluster.queue()
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
        # (Said from the job's state, or from a task's end as srun told it: whichever this kernel saw first.)
        said = r.error["evalue"]
        assert ("ended (failed" in said or "exited with code 2" in said) and "before every rank joined" in said, said
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
