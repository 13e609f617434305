"""``nbdist follow``: a follower with no kernel, started by a launcher (here torchrun), driven from a notebook."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time

import pytest

from .conftest import free_port

TOKEN = "follow-command-test"


def _env(**extra: str) -> dict[str, str]:
    env = {k: v for k, v in os.environ.items() if k not in ("RANK", "WORLD_SIZE", "LOCAL_RANK", "MASTER_ADDR",
                                                             "MASTER_PORT", "NBDIST_TOKEN")}
    return {**env, **extra}


def _follow(*argv: str, env: dict[str, str] | None = None) -> subprocess.Popen:
    return subprocess.Popen([sys.executable, "-m", "nbdist", "follow", *argv], env=env or _env(),
                            stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)


def _ended(proc: subprocess.Popen, within: float) -> tuple[int, str]:
    try:
        out, _ = proc.communicate(timeout=within)
    except subprocess.TimeoutExpired:
        proc.kill()
        out, _ = proc.communicate()
        pytest.fail(f"nbdist follow did not exit within {within} s; it printed:\n{out}")
    return proc.returncode, out


def test_torchrun_starts_two_followers_that_a_notebook_drives_until_it_releases_them(driver):
    port = free_port()
    torchrun = subprocess.Popen(
        [sys.executable, "-m", "torch.distributed.run", "--standalone", "--nproc-per-node", "2", "-m", "nbdist",
         "follow", "--master-addr", "127.0.0.1", "--master-port", str(port)],
        env=_env(NBDIST_TOKEN=TOKEN), stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
    try:
        r = driver.execute(f"%dist_init --rank 0 --world-size 3 --master-addr 127.0.0.1 --master-port {port} "
                           f"--token {TOKEN}", timeout=120)
        assert r.status == "ok", r.error
        # Before any cell was driven, the followers already run only the driver's cells: a plain cell's collective
        # is refused at once (it waited for them until torch's group timeout).
        r = driver.execute("t = torch.ones(1); dist.all_reduce(t)", timeout=60)
        assert r.status == "error" and r.error["ename"] == "DriveError", r.error
        assert r.error["evalue"].startswith("other ranks of this world are `nbdist follow` processes"), r.error
        r = driver.execute("%%collective\nt = torch.tensor([RANK + 1.0]); dist.all_reduce(t)\n"
                           "print(f'rank {RANK} of {WORLD_SIZE} local {LOCAL_RANK}: {t.item()}')", timeout=60)
        assert r.status == "ok", r.error
        for rank in range(3):
            assert f"rank {rank} of 3 local" in r.text() and ": 6.0" in r.text(), r.text()
        r = driver.execute("%%collective\nif RANK == 2:\n    raise ValueError(f'bad on {RANK}')", timeout=60)
        assert r.status == "error" and "bad on 2" in r.text(), r.text()
        # Long enough for a live table, and the followers wait for rank 0 at the end.
        r = driver.execute("%%collective\nimport time; time.sleep(2 if RANK == 0 else 0.8); 'slept'", timeout=60)
        assert r.status == "ok" and "slept" in r.text() and "stdout (differs)" not in r.text(), r.text()
        r = driver.execute("%dist_release", timeout=30)
        assert "released the world" in r.text(), r.text()
        code, out = _ended(torchrun, 30)
    finally:
        if torchrun.poll() is None:
            torchrun.kill()
            torchrun.wait()
    assert code == 0, out
    for rank in (1, 2):  # torchrun's RANK 0 and 1, plus the offset
        said = [line.split(f"rank {rank}: ", 1)[1] for line in out.splitlines()
                if f"nbdist follow: rank {rank}: " in line]
        assert said[0].startswith(f"joining 127.0.0.1:{port} as rank {rank} of 3 (local rank from LOCAL_RANK "
                                  "(torchrun), rank from RANK (torchrun) + offset 1"), said
        assert said[1].startswith(f"joined: rank {rank} (") and said[2].startswith("following"), said
        assert said[3].startswith("cell #1 from rank 0 (") and said[4].startswith("cell #2 from rank 0 ("), said
        assert said[5].startswith("the cell ended in an error (the driver's table shows it): "), said
        assert said[-1].startswith("released: rank 0 (") and "%dist_release" in said[-1], said
    # A follower publishes its part of the live table for the notebooks, but draws none in its log.
    assert "state: running" not in out and "── all 3 ranks" not in out, out
    for rank in (1, 2):
        assert f"rank {rank}: the cell ended in an error (the driver's table shows it): CollectiveError: rank 2 (" \
            in out, out


def test_follow_exits_non_zero_with_one_line_for_each_cause(driver):
    code, out = _ended(_follow("--master-addr", "127.0.0.1"), 30)
    assert (code, out.strip()) == (2, "nbdist follow: failed: no rank: pass --rank, or start nbdist follow with a "
                                      "launcher that sets one of OMPI_COMM_WORLD_RANK, PMI_RANK, RANK, SLURM_PROCID")
    code, out = _ended(_follow("--rank", "1", "--world-size", "2"), 30)
    assert code == 2 and "no master address: pass --master-addr or set NBDIST_MASTER_ADDR" in out, out
    nobody = free_port()
    code, out = _ended(_follow("--rank", "1", "--world-size", "2", "--master-addr", "127.0.0.1", "--master-port",
                               str(nobody), "--timeout", "2"), 60)
    assert code == 1 and "failed: StoreConnectionError: " in out and f"127.0.0.1:{nobody}" in out, out
    assert out.strip().splitlines()[-1].startswith("nbdist follow: rank 1: failed:"), out

    port = free_port()
    follower = _follow("--rank", "1", "--world-size", "2", "--master-addr", "127.0.0.1", "--master-port", str(port),
                       env=_env(NBDIST_TOKEN=TOKEN))
    r = driver.execute(f"%dist_init --rank 0 --world-size 2 --master-addr 127.0.0.1 --master-port {port} "
                       f"--token {TOKEN}", timeout=120)
    assert r.status == "ok", r.error
    assert driver.execute("%%collective\n1", timeout=60).status == "ok"
    intruder = _follow("--rank", "1", "--world-size", "2", "--master-addr", "127.0.0.1", "--master-port", str(port),
                       "--timeout", "3", env=_env(NBDIST_TOKEN="not-the-token"))
    code, out = _ended(intruder, 60)
    assert code == 1 and "failed: TokenError: " in out, out
    # The driving notebook dies: its follower says so and exits 1 (no task outlives its driver).
    os.kill(driver.manager.provisioner.pid, signal.SIGKILL)
    started = time.monotonic()
    code, out = _ended(follower, 30)
    assert code == 1, out
    assert out.strip().splitlines()[-1].startswith("nbdist follow: rank 1: failed: following ended: "), out
    assert time.monotonic() - started < 15, out
