"""The Slurm harness itself (tests/slurm.py): real daemons, two nodes, jobs that run, queue, pend and cancel."""

from __future__ import annotations

import socket
import sys
import threading
import time

import pytest

from .conftest import wait_gone
from .slurm import SlurmCluster

# On each node: connect to the root namespace's server and say which node this is, and its name's address.
_CALL_HOME = ("import socket, sys\nname = socket.gethostname()\n"
              "socket.create_connection((sys.argv[1], int(sys.argv[2])), 10).sendall("
              "f'{name} {socket.gethostbyname(name)}'.encode())")


def _accept_names(server: socket.socket, n: int, box: list[str]) -> None:
    for _ in range(n):
        conn, _addr = server.accept()
        with conn:
            box.append(conn.recv(100).decode())


def _wait_for(what: str, cond, seconds: float) -> float:
    """Seconds until ``cond()``; fails after ``seconds``."""
    started = time.monotonic()
    while not cond():
        assert time.monotonic() - started < seconds, f"{what}: not within {seconds:g} s"
        time.sleep(0.1)
    return time.monotonic() - started


@pytest.mark.timeout(180)
def test_two_nodes_run_steps_reach_the_driver_queue_pend_for_resources_and_cancel(slurm_cluster: SlurmCluster):
    c = slurm_cluster
    c.cancel_all()

    # A step on both nodes: each task runs under its node's own hostname.
    r = c.run("srun", "-N", "2", "--ntasks-per-node", "1", "hostname")
    assert r.returncode == 0, f"{r.stderr}\n{c.logs()}"
    assert sorted(r.stdout.split()) == sorted(c.nodes)

    # A task on a node reaches a server bound on the root namespace's bridge address; its name resolves there.
    with socket.create_server((c.addr, 0)) as server:
        server.settimeout(30)
        names: list[str] = []
        acceptor = threading.Thread(target=_accept_names, args=(server, 2, names), daemon=True)
        acceptor.start()
        r = c.run("srun", "-N", "2", "--ntasks-per-node", "1", sys.executable, "-c", _CALL_HOME,
                  c.addr, str(server.getsockname()[1]))
        acceptor.join(30)
    assert r.returncode == 0, f"{r.stderr}\n{c.logs()}"
    assert sorted(names) == sorted(f"{n} {a}" for n, a in zip(c.nodes, c.node_addrs, strict=True))

    # A batch job shows in the queue; once it runs, cancel_all empties the queue.
    job = c.sbatch("--wrap", "exec sleep 300")
    assert job in [j["id"] for j in c.queue()]
    _wait_for(f"job {job}'s script running", lambda: c.task_pids(job), 10)
    started = time.monotonic()
    c.cancel_all()
    assert c.queue() == [] and time.monotonic() - started < 10

    # Both nodes held: the next job pends for resources; the holder's processes die with it.
    holder = c.occupy()
    (running,) = c.queue()
    assert running["id"] == holder and running["state"] == "RUNNING" and sorted(running["nodes"]) == sorted(c.nodes)
    pids = c.task_pids(holder)
    assert pids, f"no processes found for job {holder}"
    waiting = c.sbatch("--wrap", "true")

    def pending_for_resources() -> bool:
        job = next(j for j in c.queue() if j["id"] == waiting)
        assert job["state"] == "PENDING", job
        return job["reason"] in ("Resources", "Priority")

    _wait_for(f"job {waiting} pending for Resources", pending_for_resources, 10)
    c.cancel_all()
    wait_gone(pids, within=10)
    c.wait_idle(10)
