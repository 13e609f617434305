"""``nbdist run``: rank notebooks executed headless, one real kernel per rank, a real world on loopback."""

from __future__ import annotations

import json
import re
import signal
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

import nbformat
import pytest

from nbdist import cli
from nbdist.config import RUN_VARIABLE
from nbdist.drive import runner
from nbdist.drive import spawn as spawn_module
from nbdist.errors import ConfigError

from .conftest import free_port, wait_gone

V4 = nbformat.v4
PID = "import os; os.getpid()"
ALL_REDUCE = "%%collective\nt = torch.tensor([float(RANK)])\ndist.all_reduce(t)\nt.item()"
# The child reinstates Ctrl-C's handler: a test run started in the background inherits SIGINT ignored.
RUN = [sys.executable, "-c", "import signal, sys; signal.signal(signal.SIGINT, signal.default_int_handler); "
       "from nbdist.cli import main; sys.exit(main(['run', *sys.argv[1:]]))"]


def notebook(path: Path, *cells: str | tuple[str, list[str]]) -> Path:
    """A notebook of code cells (a tuple adds the cell's tags), with a markdown cell first."""
    nb = V4.new_notebook(metadata={"kernelspec": {"name": "python3", "display_name": "Python 3", "language": "python"}})
    nb.cells = [V4.new_markdown_cell("# a rank notebook")]
    for cell in cells:
        source, tags = cell if isinstance(cell, tuple) else (cell, [])
        nb.cells.append(V4.new_code_cell(source, metadata={"tags": tags} if tags else {}))
    nbformat.write(nb, path)
    return path


def run_cli(*args: str, timeout: float = 240) -> subprocess.CompletedProcess[str]:
    return subprocess.run([*RUN, *args], capture_output=True, text=True, timeout=timeout)


def text(cell: Any) -> str:
    """Everything a cell showed, as text."""
    parts = []
    for out in cell.get("outputs", []):
        parts.append(out.get("text", "") or out.get("data", {}).get("text/plain", "") or
                     f"{out.get('ename')}: {out.get('evalue')}")
    return "\n".join(parts)


def executed(folder: Path, name: str, rank: int) -> Any:
    return nbformat.read(folder / f"{name}.rank{rank}.ipynb", as_version=4)


def pid_of(nb: Any) -> int:
    return int(next(text(c) for c in nb.cells if c.source == PID))


@pytest.mark.timeout(240)
def test_one_notebook_runs_as_world_size_ranks_with_parameters_injected_after_the_parameters_cell(tmp_path):
    nb = notebook(tmp_path / "course.ipynb", ("GREETING = 'default'", ["parameters"]), PID, "%load_ext nbdist",
                  "%%dist_init", ("1 / 0", ["raises-exception"]), ALL_REDUCE, "print(GREETING)", "%dist_destroy")
    port, out = free_port(), tmp_path / "out"
    r = run_cli(str(nb), "--world-size", "2", "--param", "GREETING='hi'", "--master-port", str(port),
                "--out", str(out))
    assert r.returncode == 0, r.stdout + r.stderr
    pids = []
    for rank in (0, 1):
        done = executed(out, "course", rank)
        assert "parameters" in done.cells[1].metadata.tags
        injected = done.cells[2]
        assert injected.metadata.tags == ["injected-parameters"]
        assert f"RANK = {rank}\nWORLD_SIZE = 2\nMASTER_ADDR = '127.0.0.1'\nMASTER_PORT = {port}\n" in injected.source
        assert f"rendezvous 127.0.0.1:{port}" in text(done.cells[5])
        assert "ZeroDivisionError" in text(done.cells[6])  # tagged raises-exception: the run goes on
        assert "1.0" in text(done.cells[7])
        assert text(done.cells[8]).strip() == "hi"
        pids.append(pid_of(done))
        assert re.search(rf"^rank {rank} · course\.ipynb · cell 8/10 ok \(\d+\.\d s\)$", r.stdout, re.M)
        assert f"rank {rank} · course.ipynb · cell 7/10 error allowed (raises-exception): ZeroDivisionError" in r.stdout
        assert re.search(rf"^  rank {rank} · course\.ipynb · 9 code cell\(s\) run · \d+\.\d s · ok$", r.stdout, re.M)
    assert "nbdist run: summary" in r.stdout
    assert f"executed notebooks in {out}: course.rank0.ipynb, course.rank1.ipynb" in r.stdout
    wait_gone(pids, within=10)


@pytest.mark.timeout(240)
def test_the_runners_free_port_beats_a_port_hard_coded_in_each_notebooks_configuration_area(tmp_path):
    body = "%%dist_init\nRANK = {}\nWORLD_SIZE = 2\nMASTER_ADDR = '127.0.0.1'\nMASTER_PORT = 29500"
    nbs = [notebook(tmp_path / f"rank{i}.ipynb", "%load_ext nbdist", body.format(i), ALL_REDUCE, "%dist_destroy")
           for i in (1, 0)]  # given as rank1.ipynb, rank0.ipynb: the order on the command line decides the rank
    r = run_cli(*map(str, nbs), "--out", str(tmp_path / "out"))
    assert r.returncode == 0, r.stdout + r.stderr
    for rank, name in enumerate(("rank1", "rank0")):
        done = executed(tmp_path / "out", name, rank)
        port = int(re.search(r"^MASTER_PORT = (\d+)$", done.cells[0].source, re.M).group(1))
        assert port != 29500
        init = text(done.cells[3])
        assert f"rendezvous 127.0.0.1:{port} · this notebook is rank {rank}" in init
        assert f"master port {port} (nbdist run)" in init
        assert "1.0" in text(done.cells[4])


@pytest.mark.timeout(240)
def test_a_rank_that_fails_stops_the_others_and_the_message_names_rank_cell_and_error(tmp_path):
    nb = notebook(tmp_path / "fail.ipynb", PID, "%load_ext nbdist", "%%dist_init",
                  "if RANK == 1:\n    raise ValueError('boom')", ALL_REDUCE, "%dist_destroy")
    proc = subprocess.Popen([*RUN, str(nb), "--world-size", "2", "--out", str(tmp_path / "out")],
                            stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
    try:
        lines, failed_at = [], None
        for line in proc.stdout:
            lines.append(line)
            if failed_at is None and "failed: ValueError: boom" in line:
                failed_at = time.monotonic()
        proc.wait(timeout=60)
    finally:
        proc.kill()
    output = "".join(lines)
    assert proc.returncode == 1, output
    took = time.monotonic() - failed_at
    assert took < 20, f"the run took {took:.1f} s to end after rank 1 failed (nbdist's barrier waits 300 s)"
    assert re.search(r"^nbdist run: rank 1 \(fail\.ipynb\) failed: cell 6 \(id [\w-]+, `if RANK == 1:`\): "
                     r"ValueError: boom$", output, re.M), output
    summary = r"^  rank 0 · fail\.ipynb · \d+ code cell\(s\) run · \d+\.\d s · stopped: rank 1 failed$"
    assert re.search(summary, output, re.M)
    assert "ValueError: boom" in text(executed(tmp_path / "out", "fail", 1).cells[5])  # written up to the failure
    wait_gone([pid_of(executed(tmp_path / "out", "fail", rank)) for rank in (0, 1)], within=10)


@pytest.mark.timeout(120)
def test_ctrl_c_stops_every_rank_writes_the_notebooks_and_exits_130(tmp_path):
    nb = notebook(tmp_path / "slow.ipynb", PID, "import time; time.sleep(600)")
    proc = subprocess.Popen([*RUN, str(nb), "--world-size", "2", "--out", str(tmp_path / "out")],
                            stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
    try:
        started = set()
        for line in proc.stdout:
            if m := re.match(r"rank (\d) · slow\.ipynb · cell 3/4 ok", line):  # the pid cell, before the sleep
                started.add(int(m.group(1)))
            if started == {0, 1}:
                break
        time.sleep(0.5)  # both kernels are in the sleeping cell now
        proc.send_signal(signal.SIGINT)
        stdout, _ = proc.communicate(timeout=30)
    finally:
        proc.kill()
    assert proc.returncode == 130, stdout
    summary = r"^  rank 0 · slow\.ipynb · 3 code cell\(s\) run · \d+\.\d s · stopped: interrupted$"
    assert re.search(summary, stdout, re.M)
    wait_gone([pid_of(executed(tmp_path / "out", "slow", rank)) for rank in (0, 1)], within=10)


@pytest.mark.parametrize("args, message", [
    (["missing.ipynb"], r"no notebook at .*missing\.ipynb"),
    (["garbage.ipynb"], r"cannot read .*garbage\.ipynb as a notebook: "),
    (["a.ipynb", "a.ipynb", "--world-size", "3"], r"2 notebooks make a world of 2, not --world-size 3"),
    (["a.ipynb", "--world-size", "0"], r"--world-size must be at least 1, not 0"),
    (["a.ipynb", "--spawn"], r"--spawn runs one notebook, with --world-size N \(N >= 2\)"),
    (["a.ipynb", "--param", "2x=1"], r"--param takes KEY=VALUE with KEY a Python name, not '2x=1'"),
    (["a.ipynb", "--param", "RANK=3"], r"--param RANK: nbdist run sets RANK itself"),
], ids=["missing-file", "unreadable", "world-size-not-the-number-of-notebooks", "world-size-0", "spawn-alone",
        "param-key-not-a-name", "param-set-by-the-runner"])
def test_bad_arguments_exit_2_with_one_line_and_start_no_kernel(tmp_path, monkeypatch, capsys, args, message):
    monkeypatch.chdir(tmp_path)
    notebook(tmp_path / "a.ipynb", "1")
    (tmp_path / "garbage.ipynb").write_text("{not json")
    assert cli.main(["run", *args]) == 2
    captured = capsys.readouterr()
    assert captured.out == ""
    assert len(captured.err.splitlines()) == 1
    assert re.fullmatch(rf"nbdist run: {message}.*\n", captured.err), captured.err
    assert not (tmp_path / "nbdist-run").exists()


def test_spawn_runs_one_copy_given_SPAWN_and_not_NBDIST_RUN_which_would_make_dist_init_ignore_it(tmp_path):
    nb = notebook(tmp_path / "a.ipynb", ("SPAWN = 0", ["parameters"]), "%%dist_init")
    (copy,) = runner.plan([str(nb)], 3, True, {"LR": 0.1}, None)
    assert copy.rank == 0 and RUN_VARIABLE not in copy.env
    assert copy.nb.cells[2].source == "# Parameters\nSPAWN = 3\nLR = 0.1\n"


def test_max_restarts_goes_to_the_spawning_copy_as_MAX_RESTARTS_and_only_with_spawn(tmp_path):
    nb = notebook(tmp_path / "a.ipynb", "%%dist_init")
    (copy,) = runner.plan([str(nb)], 3, True, {}, None, max_restarts="5")
    assert copy.values == {"SPAWN": 3, "MAX_RESTARTS": 5}
    assert "MAX_RESTARTS = 5\n" in copy.nb.cells[0].source
    for spawn, given, why in [(False, "5", "--max-restarts applies to the workers of --spawn"),
                              (True, "-1", "--max-restarts takes a count of 0 or more (0 = never), not -1")]:
        with pytest.raises(ConfigError, match=re.escape(why)):
            runner.plan([str(nb)], 3, spawn, {}, None, max_restarts=given)
    assert spawn_module.restarts_from_namespace({"MAX_RESTARTS": 5}) == "5"
    assert spawn_module.restarts_from_namespace({}) is None


def test_without_a_parameters_cell_the_injected_cell_comes_first_and_replaces_an_earlier_one(tmp_path):
    nb = nbformat.read(notebook(tmp_path / "a.ipynb", "x = 1"), as_version=4)
    nb.cells.pop(0)
    assert runner.inject(nb, {"RANK": 0}) == 0
    assert runner.inject(nb, {"RANK": 1, "NAME": "a b"}) == 0
    assert [c.source for c in nb.cells] == ["# Parameters\nRANK = 1\nNAME = 'a b'\n", "x = 1"]
    assert nb.cells[0].metadata.tags == ["injected-parameters"]


def test_a_param_value_is_a_python_literal_or_else_the_string_itself():
    assert runner.parse_params(["A=1", "B='hi'", "C=hi", "D=[1, 2]", "E=", "F=a=b"]) == \
        {"A": 1, "B": "hi", "C": "hi", "D": [1, 2], "E": "", "F": "a=b"}


def test_nbdist_run_sets_NBDIST_RUN_to_each_ranks_rank_world_size_and_master(tmp_path):
    nb = notebook(tmp_path / "a.ipynb", "1")
    copies = runner.plan([str(nb)], 2, False, {}, 23456)
    assert [json.loads(c.env[RUN_VARIABLE]) for c in copies] == [
        {"RANK": r, "WORLD_SIZE": 2, "MASTER_ADDR": "127.0.0.1", "MASTER_PORT": 23456} for r in (0, 1)]


def test_python_dash_m_nbdist_is_the_nbdist_command() -> None:
    done = subprocess.run([sys.executable, "-m", "nbdist", "run", "--help"], capture_output=True, text=True,
                          timeout=60)
    assert done.returncode == 0 and "--world-size N" in done.stdout and "--spawn" in done.stdout, done
