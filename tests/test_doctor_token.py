"""The doctor and a token-protected server: real `nbdist serve --token` and a real token world, on loopback."""

from __future__ import annotations

import os
import re
import subprocess
import sys
from collections.abc import Iterator

import pytest

from nbdist.drive import kernels

from .conftest import free_port, init_line, start_serve

NBDIST = [sys.executable, "-m", "nbdist.cli"]
TOKEN = "s3cret-T0ken"


@pytest.fixture(scope="module")
def token_server() -> Iterator[int]:
    """`nbdist serve --token TOKEN` on a free loopback port; its port."""
    port = free_port()
    proc = start_serve(port, "--token", TOKEN)
    try:
        yield port
    finally:
        proc.kill()
        proc.wait(timeout=30)


def doctor(port: int, *flags: str, **environ: str) -> subprocess.CompletedProcess[str]:
    env = {k: v for k, v in os.environ.items() if k != "NBDIST_TOKEN"} | environ
    return subprocess.run([*NBDIST, "doctor", "--master-addr", "127.0.0.1", "--master-port", str(port), *flags],
                          capture_output=True, text=True, timeout=60, env=env)


def server_line(output: str, port: int) -> str:
    lines = [line for line in output.splitlines() if f"TCP to 127.0.0.1:{port}:" in line]
    assert len(lines) == 1, output
    return lines[0]


@pytest.mark.timeout(120)
def test_without_a_token_the_doctor_says_an_nbdist_server_requires_one_and_advises_stopping_nothing(token_server):
    proc = doctor(token_server)
    line = server_line(proc.stdout, token_server)
    assert line.startswith("[warn]"), line
    assert "an nbdist server answers and requires a token; give it with --token or NBDIST_TOKEN" in line
    assert "not an nbdist server" not in proc.stdout and "stop the program" not in proc.stdout
    assert proc.returncode == 0, proc.stdout  # a warning: the doctor could not check the token, nothing failed
    assert TOKEN not in proc.stdout + proc.stderr  # not even in the local port's holder (`serve --token ...`)


@pytest.mark.timeout(120)
def test_with_the_right_token_flag_the_server_check_passes(token_server):
    proc = doctor(token_server, "--token", TOKEN)
    line = server_line(proc.stdout, token_server)
    assert line.startswith("[ ok ]") and "requires a token, and the one given (--token) is right" in line, line
    assert "nbdist doctor: all checks passed" in proc.stdout and proc.returncode == 0, proc.stdout
    assert TOKEN not in proc.stdout + proc.stderr


@pytest.mark.timeout(120)
def test_with_the_right_token_in_NBDIST_TOKEN_the_server_check_passes(token_server):
    proc = doctor(token_server, NBDIST_TOKEN=TOKEN)
    line = server_line(proc.stdout, token_server)
    assert line.startswith("[ ok ]") and "the one given (NBDIST_TOKEN) is right" in line, line
    assert proc.returncode == 0, proc.stdout
    assert TOKEN not in proc.stdout + proc.stderr


@pytest.mark.timeout(120)
def test_a_wrong_token_fails_saying_the_token_is_wrong(token_server):
    proc = doctor(token_server, "--token", "not-the-token")
    line = server_line(proc.stdout, token_server)
    assert line.startswith("[FAIL]") and "an nbdist server answers, but the token (--token) is wrong" in line, line
    assert "give the token that rank 0's %%dist_init (or `nbdist serve`) was started with" in line
    assert "not an nbdist server" not in proc.stdout and "stop the program" not in proc.stdout
    assert "not-the-token" not in proc.stdout and proc.returncode == 1


@pytest.mark.timeout(180)
def test_dist_doctor_in_a_token_world_checks_the_server_with_the_worlds_token(reused_kernels, port):
    ks = reused_kernels(2)
    token = "secret123"
    results = kernels.execute_all(ks, [init_line(i, 2, port, f"--token {token}") for i in range(2)], timeout=90)
    for rank, r in enumerate(results):
        assert r.status == "ok", f"rank {rank}: {r.error}"
    for rank, r in enumerate(kernels.execute_all(ks, "%dist_doctor", timeout=60)):
        out = r.text()
        assert r.status == "ok", f"rank {rank}: {r.error}"
        line = server_line(out, port)
        assert line.startswith("[ ok ]") and "requires a token, and the one given (this world's" in line, line
        assert not re.search(rf"^\[FAIL\] TCP to .*:{port}:", out, re.M), out
        assert token not in out, f"rank {rank} printed the token"
