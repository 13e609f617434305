"""Every command and magic line README.md and the docs show: extracted, held to the code, and run where it can.

The pages are README.md and the hand-written pages of docs/ (:func:`doc_pages`); an item names its page and
line. A README section is its "## " heading; a docs page is about its "# " title.

What is extracted (:func:`extract`): each command of a ```bash block (``&&`` chains split), each line of a
```python block that starts with ``%``, each inline code span that starts with ``nbdist ``, ``python``,
``pip install``, ``jupyter `` or ``ssh `` (a command) or with ``%`` (a magic), and each inline ``--flag``
span, tied to its row's magics in the "Magics" table. Whatever is decided for an item, nbdist's own parsers
judge it: a command's subcommand and flags, a magic's name and flags, the flags of the Magics table per magic,
and the defaults the README states (:func:`documented_defaults`) against the code.

Each item is decided by exactly one entry of ``RUNS`` (the test that runs it), ``CHECKED`` (only checked,
with the reason) or ``SKIP`` (not run here, with the reason); a new README command fails until it is given
one, and an entry that no longer matches anything fails too. Commands run on loopback only: the README's
10.x addresses become 127.0.0.1, its ports free ones. The magics run in one two-kernel world per module,
formed by the tour's own ``%load_ext`` and ``%%dist_init`` lines.
"""

from __future__ import annotations

import argparse
import contextlib
import functools
import importlib.util
import io
import ipaddress
import os
import re
import shlex
import signal
import subprocess
import sys
import time
from collections.abc import Iterator
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest
from IPython.core.error import UsageError
from IPython.core.magics import ExtensionMagics

from nbdist import cli, config
from nbdist.backend import ascend, backends, envplan
from nbdist.drive import kernels
from nbdist.healmagics import CLASSES, magic_function
from nbdist.measure import bench
from nbdist.world.netinfo import Route
from nbdist.world.store import probe

from .conftest import REAPER, free_port

ROOT = Path(__file__).resolve().parent.parent
README = ROOT / "README.md"
DOCS = ROOT / "docs"
TOUR = DOCS / "tutorial" / "quickstart.md"  # the tour whose cells and outputs are run as they stand
# Not extracted here: the reference pages drawn from the parsers, and the page that writes other tools' magics
# (tests/test_docs.py holds both).
NOT_EXTRACTED = ("docs/reference/magics.md", "docs/reference/cli.md", "docs/coming-from.md")
MAGICS_SECTIONS = ("Magics", "Magics in practice")  # README's "## Magics", docs/reference/magics-notes.md
NBDIST = Path(sys.executable).with_name("nbdist")  # the console script, as the README types it

SHELL_PREFIXES = ("nbdist ", "python ", "python3 ", "pip install", "jupyter ", "ssh ")
# Placeholders in the README's synopses (`[--timeout S]`, `[--port P]`, `--randomly-seed=N`), as whole words.
PLACEHOLDERS = {"S": "30", "H": "127.0.0.1", "P": str(config.DEFAULT_PORT), "T": "readme-token", "N": "7"}
LOOPBACK = Route(master_ip="127.0.0.1", local_ip="127.0.0.1", interface="lo", master_is_local=True)
# Blank in the kernels and commands run here, so that what they show comes from the README's flags.
BLANK_ENV = ("RANK", "WORLD_SIZE", "LOCAL_RANK", "MASTER_ADDR", "MASTER_PORT", "NBDIST_TOKEN", "BACKEND",
             "DEVICE_ID", "GLOO_SOCKET_IFNAME", "NCCL_SOCKET_IFNAME", "HCCL_IF_BASE_PORT")
# ipyparallel's %%px and nbdistributed's %%distributed, for comparison; IPython's %timeit, which export refuses
FOREIGN_MAGICS = {"px", "distributed", "timeit", "debug"}  # others' magics, named for comparison (%debug: IPython's)

# --- what is decided for each item: run (by which test), checked only, or skipped -------------------------
# Keys are regular expressions that must match an item's whole text (whitespace collapsed).

RUNS = {
    r"%load_ext nbdist": "test_the_tours_first_cells_form_a_world_as_the_readme_shows",
    r"%%dist_init --rank 0 --world-size 2 --master-addr 127\.0\.0\.1":
        "test_the_tours_first_cells_form_a_world_as_the_readme_shows",
    r"%%collective": "test_the_tours_collective_cell_shows_what_the_readme_shows",
    r"%dist_status": "test_dist_status_shows_every_rank_joined",
    r"%dist_barrier(?: \[--timeout S\])?": "test_dist_barrier_lines_meet_on_every_rank",
    r"%dist_env": "test_dist_env_and_dist_doctor_run_in_a_world",
    r"%dist_doctor": "test_dist_env_and_dist_doctor_run_in_a_world",
    r"%dist_init\?": "test_the_help_line_prints_help_naming_every_flag_of_the_table",
    r"nbdist env(?: .*)?": "test_nbdist_env_commands_print_their_plan_and_exit_0",
    r"nbdist doctor(?: .*)?": "test_nbdist_doctor_commands_exit_0_or_1_without_a_traceback",
    r"nbdist serve(?: .*)?": "test_nbdist_serve_listens_on_loopback_and_stops",
    r"python -m pytest -p .*--randomly-seed=N": "test_the_seed_command_repeats_an_order",
}

CHECKED = {
    r"--.*": "a flag named in prose or a table: checked against the parsers of nbdist's magics and commands "
             "(under Benchmarks, also of the benchmark scripts)",
    r"%%?dist_init": "the magic's name in prose: checked that it exists",
    r"%load_ext": "IPython's magic named in prose: checked that it exists",
    r"python -m sphinx -W -b html docs docs/_build/html": ".ci/run builds the docs with it after the tests "
                                                          "(warnings are errors); the page's modules are checked",
    r"python -m pytest --collect-only -q": "pytest's own flags, counting the suite without running it",
    r"python examples/execute\.py --check": ".ci/run runs it; tests/test_examples_executed.py checks the same",
}

_SET_UP = "set-up of a fresh machine, not re-run: .ci/run makes the venv and installs, running the README's " \
          "second ```bash line (test_ci_runs_exactly_the_readmes_second_bash_line)"
SKIP = {
    r"python3 -m venv \.venv": _SET_UP,
    r"\. \.venv/bin/activate": _SET_UP,
    r"pip install torch==2\.13\.0": _SET_UP,
    r"pip install -e (?:\.|'\.\[test\]')": _SET_UP + "; the extra is checked to exist",
    r"python -m pytest": "the suite itself: .ci/run runs it, and run from inside itself it would recurse",
    r"%dist_init --spawn (?:\d+|N)": "starts worker kernels: tests/test_spawn.py::"
                                      "test_spawn_4_runs_collectives_survives_max_time_and_unload_leaves_no_worker "
                                      "runs --spawn 4, and tests/test_examples.py the one-notebook walkthrough",
    r"%dist_follow": "follows the world this module shares until released: tests/test_follow.py::"
                     "test_the_walkthrough_driven_from_rank_0_runs_on_its_follower_and_release_returns_it_to_lockstep "
                     "runs it",
    r"%dist_release": "tests/test_follow.py::"
                      "test_the_walkthrough_driven_from_rank_0_runs_on_its_follower_and_release_returns_it_to_lockstep "
                      "runs it",
    r"%%collective --(?:show|view|ranks) .*": "needs a world of 8 spawned ranks: tests/test_many_ranks.py (and "
                                              "tests/test_subset_cells.py for --ranks)",
    r"%dist_config(?: view=groups)?": "sets how tables are drawn in an 8-rank world: tests/test_many_ranks.py::"
                                      "test_one_raising_rank_stands_alone_and_view_ranks_gives_a_column_each",
    r"%dist_workers": "needs spawned workers: tests/test_spawn.py::"
                      "test_spawn_4_runs_collectives_survives_max_time_and_unload_leaves_no_worker runs it",
    r"%dist_sync(?: .*)?": "needs a rank that lost its state: tests/test_sync.py::test_dist_sync_copies_tensors_module_"
                   "and_optimizer_state_and_values_and_says_what_it_did_not runs it",
    r"%dist_replay(?: .*)?": "needs a spawned worker started again: tests/test_restart.py runs it",
    r"%dist_compare(?: .*)?": "needs ranks that hold different values: tests/test_compare.py runs it at 4 driven "
                              "ranks and 2 peers",
    r"python benchmarks/compare\.py(?: .*)?": "a benchmark of minutes (4 spawned ranks, a 10M-parameter model, DDP "
                                             "rounds); what it measures is tested in tests/test_compare.py",
    r"python benchmarks/store_ops\.py(?: .*)?": "a benchmark of a minute with 16 spawned ranks; its counters are "
                                               "tested in tests/world/test_store_counts.py",
    r"python benchmarks/driven_profile\.py(?: .*)?": "a benchmark of a minute (a driven world, 40 timed cells); "
                                                    "the script and its flags are checked",
    r"python benchmarks/driven_cells\.py(?: .*)?": "a benchmark of minutes, with ipyparallel beside nbdist; the "
                                                  "script and its flags are checked",
    r"nbdist demo": "one kernel, a worker and the whole walkthrough, about a minute: "
                    "tests/test_cli.py::test_demo_runs_the_walkthrough_and_exits_zero runs it",
    r"pip install torch==2\.13\.0 --index-url https://download\.pytorch\.org/whl/cpu":
        "downloads torch from PyTorch's index: nothing outside this machine is reachable",
    r"pip install -e '\.\[(?:docs|npu)\]'": "installs Sphinx and myst-nb (CI does, to build the docs), or torch_npu, "
                                          "from the network; the extra is checked to exist",
    r"pip install torch": "the CUDA build of several GB, for NVIDIA machines: not on a CPU machine",
    r"python examples/execute\.py": "executes every example notebook through nbdist run (minutes); "
                                    "tests/test_examples_executed.py checks that what it stored belongs to the cells",
    r"pip install -e '\.\[lab\]'": "installs JupyterLab and Notebook 7 from the network; the extra is checked to exist",
    r"pip install -e '\.\[bench\]'": "installs ipyparallel and nbdistributed from the network; the extra is checked "
                                    "to exist",
    r"jupyter lab": "a server for a browser; tests/test_examples.py::test_both_notebooks_run_as_one_world runs the "
                    "example notebooks with nbclient",
    r"%%dist_init .*10\.202\.73\.94.*": "two machines with an Ascend NPU each; its flags are still parsed",
    r"%%collective --max-time 5": "a fault-table row: tests/test_long_cells.py::"
                                  "test_max_time_ends_a_long_body_on_every_rank_naming_who_was_running runs it",
    r"%dist_stop": "stops the cells of the world: tests/test_long_cells.py::"
                   "test_dist_stop_in_another_joined_notebook_ends_the_others_cells runs it from a third notebook",
    r"nbdist stop(?: .*)?": "stops the cells of a world: tests/test_long_cells.py::"
                            "test_nbdist_stop_in_a_terminal_ends_every_ranks_cell_within_2s runs it",
    r"python examples/what_you_see/make_screenshots\.py": "needs Chromium, Playwright and JupyterLab (the lab "
                                                          "extra); it took the committed PNGs",
    r"python examples/course/make_screenshot\.py": "needs Chromium, Playwright and JupyterLab (the lab extra); it "
                                                   "took examples/course/all_gather.png",
    r"nbdist run(?: .*)?": "runs notebooks for minutes: tests/test_run.py runs it on small notebooks, and .ci/run "
                           "runs every example notebook through it (examples/run_examples.sh)",
    r"python -m nbdist": "the nbdist command under another name: tests/test_run.py runs it",
    r"%dist_destroy": "ends the world this module shares: tests/test_readme_claims.py::"
                      "test_dist_destroy_on_rank_0_keeps_its_server_running_for_the_others runs it",
    r"%(?:unload_ext|reload_ext)(?: nbdist)?": "tears nbdist down in the world this module shares: "
                                               "tests/test_extension.py::test_unload_and_reload_tear_down_cleanly "
                                               "runs both",
    r"ssh -N -L .*": "an SSH tunnel to another host: tests/test_tunnel.py::"
                     "test_a_rank_behind_a_tunnel_advertises_the_interface_that_routes_to_rank_0 runs the recipe "
                     "across network namespaces, with a forwarder standing in for ssh",
    r"python -m nbdist\.world\.pulse": "started by each kernel, not by people: tests/test_pulse.py::"
                                "test_pulse_beats_every_second_while_the_kernel_runs_python runs it; the module is "
                                "checked to exist",
    r"python benchmarks/cell_overhead\.py(?: .*)?": "a benchmark of minutes (30 runs per kind); the script and its "
                                                  "flags are checked",
    r"python benchmarks/rendezvous_scale\.py(?: .*)?":
        "a benchmark of up to 64 processes (--private-hosts also needs root for unshare); the script and its "
        "flags are checked",
    r"python benchmarks/simulated_world\.py(?: .*)?": "a benchmark of many minutes (up to 1,024 simulated ranks): "
                                                     "tests/test_simulated_world.py runs it at 4 ranks; the script "
                                                     "and its flags are checked",
    r"python benchmarks/vs_peers\.py(?: .*)?": "a benchmark of the peers (ipyparallel, nbdistributed: optional, "
                                              "from the network); the script and its flags are checked",
    r"(?:r = )?%dist_bench(?: .*)?": "measures for seconds on every rank: tests/test_bench.py::"
                                     "test_the_bench_on_2_ranks_shows_a_table_and_a_plot_and_returns_every_op_and_size "
                                     "runs it; its flags are parsed here",
    r"nbdist bench(?: .*)?": "starts a kernel and workers: tests/test_bench.py::"
                             "test_nbdist_bench_prints_the_table_writes_the_plot_and_leaves_no_worker runs it",
    r"%dist_debug(?: .*)?": "rebuilds the process group on every rank: tests/test_debug.py::"
                            "test_dist_debug_on_in_one_notebook_rebuilds_every_rank_with_detail_and_off_puts_back_"
                            "what_was_there runs it",
    r"%%collective --find-divergence": "tests/diverge/test_oplog_kernels.py runs it at 4 ranks",
    r"python benchmarks/find_divergence\.py(?: .*)?": "a benchmark of about a minute; the script and its flags are "
                                                      "checked",
    r"%%collective --trace": "tests/test_cheap_checks.py::"
                             "test_trace_records_every_collective_in_order_and_names_the_late_rank runs it",
    r"python examples/what_you_see/make_debug_screenshots\.py": "needs Chromium, Playwright, JupyterLab and a "
                                                                "--spawn 8 world: run by hand, its pictures committed",
    r"python examples/what_you_see/make_restart_screenshots\.py": "needs Chromium, Playwright, JupyterLab and a "
                                                                  "--spawn 2 world: run by hand, its pictures "
                                                                  "committed",
    r"python examples/what_you_see/make_replicas_screenshots\.py": "needs Chromium, Playwright, JupyterLab and a "
                                                                   "--spawn 4 world: run by hand, its pictures "
                                                                   "committed",
    r"python examples/what_you_see/make_trace_screenshot\.py": "needs Chromium, Playwright and JupyterLab (the lab "
                                                               "extra); it took examples/what_you_see/trace.png",
    r"python benchmarks/bench_vs_raw\.py(?: .*)?": "a benchmark of minutes; the script and its flags are checked",
    r"python benchmarks/(?:many_ranks_render|export_overhead)\.py(?: .*)?":
        "benchmarks (seconds for the rendering, minutes for the training loop) that write their figures to "
        "docs/figures/ (tests/test_figures.py checks those); the scripts are checked to exist",
    r"python benchmarks/memory\.py(?: .*)?": "a benchmark of minutes (8 spawned ranks; root for the memory cgroup): "
                                            "tests/test_binder_limits.py runs its binder part; the script and its "
                                            "flags are checked",
    r"python benchmarks/floods\.py(?: .*)?": "a benchmark of minutes with JupyterLab and Chromium; "
                                            "tests/test_floods.py runs a flood on real kernels",
    r"python benchmarks/soak\.py(?: .*)?": "a soak of ten minutes (the long version): tests/test_soak.py runs its "
                                          "--short version; the script and its flags are checked",
    r"%%collective --timeout 5": "a fault-table row: tests/test_in_step.py::"
                                 "test_a_rebuild_wait_keeps_the_cells_timeout_and_names_the_idle_rank_then_the_world_"
                                 "works runs it",
    r"%dist_dashboard(?: --once| --stop)?": "a widget with a thread: tests/test_dashboard.py runs it in a "
                                            "two-kernel world, tests/test_browser.py in JupyterLab",
    r"python examples/what_you_see/make_browser_screenshots\.py(?: .*)?":
        "needs Chromium, Playwright and JupyterLab; it runs tests/test_browser.py and took the committed PNGs",
    r'python -m pytest -m "not browser"': "the suite itself, less the browser file: .ci/run runs all of it",
    r"(?:python -m )?nbdist follow(?: .*)?": "a follower that a launcher starts: tests/test_follow_command.py::"
                                             "test_torchrun_starts_two_followers_that_a_notebook_drives_until_it_"
                                             "releases_them runs it under torchrun, and tests/test_slurm.py as "
                                             "Slurm tasks",
    r"%dist_init --spawn (?:\d+|N) --slurm .*": "needs a Slurm cluster: tests/test_slurm.py::test_a_slurm_job_of_"
                                                "followers_runs_the_walkthrough_and_a_task_killed_in_a_cell_or_idle_"
                                                "comes_back_as_a_new_step_on_its_node runs it on two nodes in network "
                                                "namespaces",
    r"%dist_init --rank 0 --world-size N --master-addr ADDR --token T":
        "the driving notebook of the launcher recipes: tests/test_follow_command.py::test_follow_exits_non_zero_"
        "with_one_line_for_each_cause runs it with a follower started by hand",
    r"export NBDIST_MASTER_ADDR=.*": "the recipes' variables, for a shell on the nodes: tests/test_slurm.py's "
                                     "tasks get them from sbatch; their use is unit-tested in tests/drive",
    r"ssh node2 .*": "needs a second machine that runs sshd: the follower's flags are checked",
    r"python benchmarks/cluster_start\.py(?: .*)?": "a benchmark of minutes on a Slurm of two network namespaces "
                                                   "(root), with ipyparallel beside nbdist; the script and its flags "
                                                   "are checked",
    r"%%px": "ipyparallel's magic, named for comparison: not nbdist's",
    r"%debug": "IPython's post-mortem, named as what %dist_pdb is like: tests/test_postmortem.py runs %dist_pdb for "
               "a notebook's own rank, which is IPython's post-mortem",
    r"%timeit": "IPython's magic, named as one that nbdist export refuses: tests/job/test_convert.py refuses it",
    r"nbdist export(?: .*)?": "writes and runs notebooks as scripts under torchrun: tests/test_export.py runs it on "
                              "every example notebook (--run 2), and with -o, --allow-ipython and a script's flags "
                              "after --",
    r"torchrun --standalone --nproc-per-node 2 walkthrough\.py": "tests/test_export.py runs the walkthrough's "
                                                                 "script under the same torchrun command (nbdist "
                                                                 "export --run 2)",
    r"%%distributed": "nbdistributed's magic, named for comparison: not nbdist's",
    r"%dist_where(?: .*)?": "asks every rank of a spawned world where it is: tests/test_where.py::"
                            "test_dist_where_in_the_idle_driving_notebook_shows_both_ranks_with_native_frames_or_why_"
                            "not runs it",
    r"%dist_pdb(?: .*)?": "opens the debugger on rank 1 of a spawned world: tests/test_postmortem.py::test_the_"
                          "driving_notebook_debugs_rank_1s_failure_at_its_failing_frame_with_rank_1s_values runs it",
    r"nbdist where(?: .*)?": "asks the ranks of a world while its driving notebook hangs: tests/test_where.py::"
                             "test_a_hang_in_all_reduce_is_named_by_collective_group_and_missing_rank_and_the_stop_"
                             "button_ends_it runs it",
    r"%%collective --no-check": "tests/test_where.py::test_a_hang_in_all_reduce_is_named_by_collective_group_and_"
                                "missing_rank_and_the_stop_button_ends_it runs it (rank 1 skips an all_reduce)",
    r"%%collective --max-time 20": "tests/test_many_ranks.py::test_at_8_ranks_max_time_ends_a_ddp_backward_hang_"
                                   "naming_the_collective_group_and_missing_rank runs it (rank 7 sleeps)",
    r"pip install 'nbdist\[debug\]'": "installs py-spy from the network; the extra is checked to exist, and the "
                                       "test extra brings py-spy",
}


# --- extraction (pure) -----------------------------------------------------------------------------------


@dataclass(frozen=True)
class Item:
    """One command, magic line or flag the README shows."""

    kind: str  # "shell", "magic" or "flag"
    text: str  # whitespace collapsed; `\|` in a table cell read as `|`
    line: int
    where: str  # "bash block", "python block", "inline" or "Magics table"
    section: str = ""  # the "## " heading it is under (a docs page: its "# " title)
    magics: tuple[str, ...] = ()  # a flag in the Magics table: its row's magics
    page: str = "README.md"

    def __str__(self) -> str:
        return f"{self.page}:{self.line}: {self.text!r} ({self.where})"


@dataclass(frozen=True)
class Block:
    """A fenced block: its language ("" for output), the line number of its first content line, its lines."""

    lang: str
    line: int
    lines: tuple[str, ...]


_FENCE = re.compile(r"\s*```(\w*|\{[\w-]+\}.*)\s*")  # a MyST directive, ```{toctree}: its own "language"
_SPAN = re.compile(r"(?<!`)(`+)(?!`)(.+?)(?<!`)\1(?!`)", re.S)
_CELL_BORDER = re.compile(r"(?<!\\)\|")
_FLAG = re.compile(r"(?<![\w-])--[A-Za-z][\w-]*")
_MAGIC = re.compile(r"(%%?)(\w+)(\?)?(?:\s+(.*))?")


def _collapse(text: str) -> str:
    return " ".join(text.split())


def split_blocks(text: str) -> tuple[list[Block], list[str]]:
    """The fenced blocks, and the README's lines with every fenced line blanked (so line numbers hold)."""
    blocks: list[Block] = []
    prose: list[str] = []
    lang: str | None = None
    start, body = 0, []
    for number, line in enumerate(text.splitlines(), 1):
        fence = _FENCE.fullmatch(line)
        if lang is None and fence:
            lang, start, body = fence.group(1), number + 1, []
        elif lang is not None and line.strip() == "```":
            blocks.append(Block(lang, start, tuple(body)))
            lang = None
        elif lang is not None:
            body.append(line)
        else:
            prose.append(line)
            continue
        prose.append("")
    assert lang is None, f"README.md:{start - 1}: a fenced block that is never closed"
    return blocks, prose


def _sections(prose: list[str], page: str = "README.md") -> list[str]:
    """The "## " heading each line is under; on a docs page, its "# " title."""
    mark = "## " if page == "README.md" else "# "
    current, out = "", []
    for line in prose:
        if line.startswith(mark):
            current = line[len(mark):].strip()
        out.append(current)
    return out


def spans(prose: list[str]) -> Iterator[tuple[int, str, str]]:
    """Inline code spans as (line, text, the table row it is in or ""); a span may wrap within a paragraph."""
    text = "\n".join(prose)
    for paragraph in re.finditer(r"[^\n]+(?:\n[^\n]+)*", text):
        first = text.count("\n", 0, paragraph.start()) + 1
        rows = paragraph.group().split("\n")
        # A table's rows are separate: a span never crosses a row's border.
        pieces = [(first + i, row, row) for i, row in enumerate(rows)] if rows[0].lstrip().startswith("|") \
            else [(first, paragraph.group(), "")]
        for number, piece, row in pieces:
            for m in _SPAN.finditer(piece):
                body = _collapse(m.group(2))
                yield number + piece.count("\n", 0, m.start()), body.replace("\\|", "|") if row else body, row


def _magics_of_row(row: str) -> tuple[str, ...]:
    """The magics a Magics-table row is about: the `%` spans of its first cell, by name."""
    cells = _CELL_BORDER.split(row.strip())
    first = cells[1] if len(cells) > 2 else ""
    names = [_MAGIC.match(m.group(2)).group(2) for m in _SPAN.finditer(first) if m.group(2).startswith("%")]
    return tuple(dict.fromkeys(names))


def split_chain(command: str) -> list[str]:
    """``a && b; c`` as its commands."""
    return [part.strip() for part in re.split(r"&&|\|\||;", command) if part.strip()]


def extract(text: str, page: str = "README.md") -> list[Item]:
    """Every shell command, magic line and flag a page shows, in its order."""
    blocks, prose = split_blocks(text)
    sections = _sections(prose, page)
    items: list[Item] = []
    for block in blocks:
        for offset, raw in enumerate(block.lines):
            line, number = raw.strip(), block.line + offset
            section = sections[number - 1]
            if block.lang == "bash" and line and not line.startswith("#"):
                items += [Item("shell", _collapse(c), number, "bash block", section, page=page)
                          for c in split_chain(line)]
            elif block.lang == "python" and line.startswith("%"):
                items.append(Item("magic", _collapse(line), number, "python block", section, page=page))
    for number, body, row in spans(prose):
        section = sections[number - 1]
        in_magics_table = bool(row) and section in MAGICS_SECTIONS
        where = "Magics table" if in_magics_table else "inline"
        if body.startswith("%"):
            items.append(Item("magic", body, number, where, section, page=page))
        elif body.startswith(SHELL_PREFIXES):
            items.append(Item("shell", body, number, where, section, page=page))
        elif body.startswith("--"):
            items.append(Item("flag", body, number, where, section, _magics_of_row(row) if in_magics_table else (),
                              page=page))
    return sorted(items, key=lambda i: i.line)


def decision(item: Item) -> list[tuple[str, str, str]]:
    """Every (table, pattern, why) that decides ``item``: exactly one is expected."""
    return [(name, pattern, why) for name, table in (("RUNS", RUNS), ("CHECKED", CHECKED), ("SKIP", SKIP))
            for pattern, why in table.items() if re.fullmatch(pattern, item.text)]


def fill(text: str, **values: str) -> str:
    """A synopsis made concrete: optional parts kept (brackets dropped), placeholders given values."""
    words = {**PLACEHOLDERS, **values}
    text = re.sub(r"(?<!\S)\[([^\]]*)\]", r"\1", text)
    return re.sub(r"(?<![\w.-])([A-Z])(?![\w.-])", lambda m: words.get(m.group(1), m.group(1)), text)


def localise(text: str) -> str:
    """The README's private 10.x addresses replaced by loopback: nothing here talks to another address."""
    return re.sub(r"\b10(?:\.\d{1,3}){3}\b", "127.0.0.1", text)


def assert_loopback_only(words: list[str]) -> None:
    """Refuse to run anything that names an address other than loopback."""
    for word in words:
        for piece in re.split(r"[=,\s]", word):
            try:
                address = ipaddress.ip_address(piece)
            except ValueError:
                continue
            assert address.is_loopback, f"refusing to run a command that names {piece}: {words}"


# --- the README, once --------------------------------------------------------------------------------------


def doc_pages() -> list[Path]:
    """README.md, then every hand-written page of docs/ (not the build, the figures or the copied notebooks)."""
    pages = sorted(p for p in DOCS.rglob("*.md") if not {"_build", "_examples", "figures"} & set(p.parts))
    return [README, *(p for p in pages if _name(p) not in NOT_EXTRACTED)]


def _name(path: Path) -> str:
    return path.relative_to(ROOT).as_posix()


@functools.cache
def page_texts() -> tuple[tuple[str, str], ...]:
    """(page, text) of every page, README.md first."""
    return tuple((_name(p), p.read_text(encoding="utf-8")) for p in doc_pages())


@functools.cache
def readme_text() -> str:
    return README.read_text(encoding="utf-8")


@functools.cache
def readme_items() -> tuple[Item, ...]:
    return tuple(item for page, text in page_texts() for item in extract(text, page))


@functools.cache
def tour_text() -> str:
    return TOUR.read_text(encoding="utf-8")


def all_defaults() -> list[Default]:
    return [d for page, text in page_texts() for d in documented_defaults(text, page)]


def items_run_by(test_name: str) -> list[Item]:
    """The items ``RUNS`` gives to ``test_name``; fails if there are none (the runner would run nothing)."""
    patterns = [p for p, name in RUNS.items() if name == test_name]
    found = [i for i in readme_items() if any(re.fullmatch(p, i.text) for p in patterns)]
    assert found, f"README.md shows nothing that {test_name} runs (patterns {patterns}): drop those RUNS entries"
    return found


def distinct(items: list[Item]) -> dict[str, Item]:
    """One item per text (the first place it is shown), to run each text once."""
    out: dict[str, Item] = {}
    for item in items:
        out.setdefault(item.text, item)
    return out


# --- nbdist's parsers, without running anything ------------------------------------------------------------


@functools.cache
def cli_parsers() -> dict[str, argparse.ArgumentParser]:
    """The ``nbdist`` subcommands' parsers, as :func:`nbdist.cli.main` builds them."""
    (sub,) = [a for a in cli.build_parser()._actions if isinstance(a, argparse._SubParsersAction)]
    return dict(sub.choices)


def options(parser: argparse.ArgumentParser | None) -> set[str]:
    return set() if parser is None else {o for a in parser._actions for o in a.option_strings}


def action(parser: argparse.ArgumentParser, flag: str) -> argparse.Action:
    return next(a for a in parser._actions if flag in a.option_strings)


def magic_method(name: str) -> Any:
    return magic_function("line", name) or magic_function("cell", name)


def magic_parser(name: str) -> argparse.ArgumentParser | None:
    """The parser ``@magic_arguments`` attached to a magic (None: it takes no flags)."""
    return getattr(magic_method(name), "parser", None)


def magic_exists(prefix: str, name: str) -> bool:
    kind = "cell" if prefix == "%%" else "line"
    return magic_function(kind, name) is not None or name in ExtensionMagics.magics[kind]


@functools.cache
def script_flags(script: str) -> frozenset[str]:
    """The flags a benchmark script's ``--help`` names."""
    proc = subprocess.run([sys.executable, script, "--help"], cwd=ROOT, capture_output=True, text=True, timeout=60)
    assert proc.returncode == 0, f"{script} --help: {proc.stderr}"
    return frozenset(_FLAG.findall(proc.stdout))


def all_script_flags(scripts: list[str]) -> dict[str, frozenset[str]]:
    """:func:`script_flags` of each of ``scripts``, two at a time (a ``--help`` that imports torch or Playwright
    takes a second or two of one core; two dozen of them, one after another, took 20 s)."""
    with ThreadPoolExecutor(max_workers=2) as pool:
        return dict(zip(scripts, pool.map(script_flags, scripts), strict=True))


def all_nbdist_flags() -> set[str]:
    flags = set().union(*(options(p) for p in cli_parsers().values()))
    for cls in CLASSES:
        for name in {**cls.magics["line"], **cls.magics["cell"]}:
            flags |= options(magic_parser(name))
    return flags


def parse_cli(parser: argparse.ArgumentParser, args: list[str]) -> str | None:
    """Parse ``args`` as the command would; argparse's complaint, or None."""
    err = io.StringIO()
    try:
        with contextlib.redirect_stderr(err):
            parser.parse_args(args)
    except SystemExit:
        return err.getvalue().strip().splitlines()[-1]
    return None


def pyproject_extras() -> set[str]:
    text = (ROOT / "pyproject.toml").read_text(encoding="utf-8")
    try:
        import tomllib
    except ModuleNotFoundError:  # Python 3.10: the section's keys are enough
        section = re.search(r"^\[project\.optional-dependencies\]\n(.*?)(?=^\[|\Z)", text, re.M | re.S)
        return set(re.findall(r"^([\w-]+)\s*=", section.group(1), re.M)) if section else set()
    return set(tomllib.loads(text)["project"].get("optional-dependencies", {}))


# --- documented defaults ------------------------------------------------------------------------------------


@dataclass(frozen=True)
class Default:
    """A default the README states: what it is of (``subject``), the value, where."""

    subject: str
    value: str
    line: int
    page: str = "README.md"

    def __str__(self) -> str:
        return f"{self.page}:{self.line}: {self.subject} documented as {self.value}"


# In a Magics-table row, per magic: "`--flag` (600 s", "`--flag` (29500)", "`--flag`, default 300 s",
# "`--flag` (300 s; for hccl ... 660 s by default".
_ROW_DEFAULTS = (
    (re.compile(r"`(--[\w-]+)`\s*\((\d+)(?:\s*s)?(?=[\s;),])"), "{magic} {flag}"),
    (re.compile(r"`(--[\w-]+)`,\s*default\s+(\d+)\s*s\b"), "{magic} {flag}"),
    (re.compile(r"`(--[\w-]+)`\s*\([^)]*?\bfor hccl\b[^;)]*?\b(\d+)\s*s by default"), "{magic} {flag} (hccl)"),
)
# Elsewhere: (pattern, subject, value from the match).
_PROSE_DEFAULTS = (
    (re.compile(r"default wait (\d+) minutes,\s+`--timeout`"), "dist_init --timeout", lambda m: int(m[1]) * 60),
    (re.compile(r"rendezvous server on `[^`\s]*:(\d+)`"), "dist_init --master-port", lambda m: m[1]),
    (re.compile(r"the master port \((\d+), TCP\)"), "dist_init --master-port", lambda m: m[1]),
    (re.compile(r"process-group timeout for hccl\b[^()]*\((\d+) s by default\)"), "dist_init --pg-timeout (hccl)",
     lambda m: m[1]),
    (re.compile(r"^\s*\|\s*`(HCCL_\w+)`\s*\|\s*(\d+)\b", re.M), None, lambda m: m[2]),
    (re.compile(r"`(HCCL_\w+)` fires on the NPU \((\d+) s by default\)"), None, lambda m: m[2]),
    (re.compile(r"binds to (\S+) unless `--host`"), "serve --host", lambda m: m[1]),
)
# The defaults this test must find in the README (issue 15: "cover at least").
REQUIRED_DEFAULTS = ("dist_init --timeout", "dist_init --master-port", "dist_init --pg-timeout",
                     "dist_init --pg-timeout (hccl)", "collective --timeout", "HCCL_CONNECT_TIMEOUT",
                     "HCCL_EXEC_TIMEOUT", "serve --host")


def documented_defaults(text: str, page: str = "README.md") -> list[Default]:
    """The defaults a page states next to a flag or variable, each with its line."""
    _, prose = split_blocks(text)
    sections = _sections(prose, page)
    found: list[Default] = []
    for number, row in enumerate(prose, 1):
        if sections[number - 1] not in MAGICS_SECTIONS or not row.lstrip().startswith("|"):
            continue
        for magic in _magics_of_row(row):
            for pattern, subject in _ROW_DEFAULTS:
                for m in pattern.finditer(row):
                    found.append(Default(subject.format(magic=magic, flag=m[1]), m[2], number, page))
    joined = "\n".join(prose)
    for pattern, subject, value in _PROSE_DEFAULTS:
        for m in pattern.finditer(joined):
            line = joined.count("\n", 0, m.start()) + 1
            if not (sections[line - 1] in MAGICS_SECTIONS and prose[line - 1].lstrip().startswith("|")):  # above
                found.append(Default(subject or m[1], str(value(m)), line, page))
    return sorted(set(found), key=lambda d: (d.line, d.subject))


def actual_defaults() -> dict[str, dict[str, object]]:
    """Per documented subject, what the code holds, by where it holds it (all must equal the README)."""
    cfg = config.resolve({"rank": 0, "world_size": 1, "master_addr": "127.0.0.1"}, {}, {})
    cli_ = cli_parsers()
    hccl = envplan.plan("hccl", LOOPBACK, {}, npu=ascend.Facts())
    planned = {v.key: v.value for v in hccl}
    barrier = {
        "%%collective's --timeout default": action(magic_parser("collective"), "--timeout").default,
        # The %dist_barrier row names no default of its own: it is held to the barrier default %%collective states.
        "%dist_barrier's --timeout default": action(magic_parser("dist_barrier"), "--timeout").default,
        "config.TIMEOUTS['barrier']": config.TIMEOUTS["barrier"],
    }
    return {
        "dist_init --timeout": {"config.TIMEOUTS['join']": config.TIMEOUTS["join"],
                                "%%dist_init without --timeout": cfg.timeout},
        "dist_init --master-port": {"config.DEFAULT_PORT": config.DEFAULT_PORT,
                                    "%%dist_init without --master-port": cfg.master_port,
                                    "nbdist env --master-port": action(cli_["env"], "--master-port").default,
                                    "nbdist doctor --master-port": action(cli_["doctor"], "--master-port").default},
        "dist_init --pg-timeout": {
            "config.TIMEOUTS['process_group']": config.TIMEOUTS["process_group"],
            **{f"the default {b} plan": envplan.process_group_timeout(b, envplan.plan(b, LOOPBACK, {}))
               for b in ("gloo", "nccl")}},
        "dist_init --pg-timeout (hccl)": {"the default hccl plan": envplan.process_group_timeout("hccl", hccl)},
        "collective --timeout": barrier,
        "dist_barrier --timeout": barrier,
        "HCCL_CONNECT_TIMEOUT": {"envplan.HCCL_CONNECT_TIMEOUT": envplan.HCCL_CONNECT_TIMEOUT,
                                 "the default hccl plan": planned.get("HCCL_CONNECT_TIMEOUT")},
        "HCCL_EXEC_TIMEOUT": {"envplan.HCCL_EXEC_TIMEOUT": envplan.HCCL_EXEC_TIMEOUT,
                              "the default hccl plan": planned.get("HCCL_EXEC_TIMEOUT")},
        "HCCL_WHITELIST_DISABLE": {"the default hccl plan": planned.get("HCCL_WHITELIST_DISABLE")},
        "serve --host": {"nbdist serve --host": action(cli_["serve"], "--host").default},
        "dist_bench --iters": {"bench.DEFAULT_ITERS": bench.DEFAULT_ITERS},
        "dist_bench --warmup": {"bench.DEFAULT_WARMUP": bench.DEFAULT_WARMUP},
    }


def documented(subject: str) -> str:
    """The one value the README gives ``subject``."""
    values = {d.value for d in all_defaults() if d.subject == subject}
    assert len(values) == 1, f"the docs give {subject} {sorted(values) or 'no'} default(s)"
    return values.pop()


def same_value(documented_value: str, actual: object) -> bool:
    try:
        return float(documented_value) == float(actual)  # type: ignore[arg-type]
    except (TypeError, ValueError):
        return documented_value == str(actual)


# --- extraction, unit-tested --------------------------------------------------------------------------------

SAMPLE = """\
# t

## Set up

```bash
python3 -m venv .venv && . .venv/bin/activate && nbdist demo
```

Run `nbdist env --backend hccl --rank 1
  --master-addr 10.1.2.3` or `%dist_env`; not `nbdist.get_device()`.

```python
%load_ext nbdist
x = 1
```
```
%%collective #1 (output, not a command)
```

## Magics

| magic | what it does |
|---|---|
| `%%dist_init` / `%dist_init` | `--backend auto\\|gloo`, `--timeout` (600 s to wait) |
| `%dist_barrier [--timeout S]` | all meet |

The process-group timeout for hccl stays high
(660 s by default). Then `--timeout 3`.
"""


def test_extraction_finds_commands_magics_and_flags_with_their_lines():
    got = [(i.kind, i.text, i.line, i.where, i.magics) for i in extract(SAMPLE)]
    assert got == [
        ("shell", "python3 -m venv .venv", 6, "bash block", ()),
        ("shell", ". .venv/bin/activate", 6, "bash block", ()),
        ("shell", "nbdist demo", 6, "bash block", ()),
        ("shell", "nbdist env --backend hccl --rank 1 --master-addr 10.1.2.3", 9, "inline", ()),
        ("magic", "%dist_env", 10, "inline", ()),
        ("magic", "%load_ext nbdist", 13, "python block", ()),
        ("magic", "%%dist_init", 24, "Magics table", ()),
        ("magic", "%dist_init", 24, "Magics table", ()),
        ("flag", "--backend auto|gloo", 24, "Magics table", ("dist_init",)),
        ("flag", "--timeout", 24, "Magics table", ("dist_init",)),
        ("magic", "%dist_barrier [--timeout S]", 25, "Magics table", ()),
        ("flag", "--timeout 3", 28, "inline", ()),
    ]


def test_documented_defaults_are_found_per_magic_with_their_lines():
    assert [(d.subject, d.value, d.line) for d in documented_defaults(SAMPLE)] == [
        ("dist_init --timeout", "600", 24), ("dist_init --pg-timeout (hccl)", "660", 27)]


def test_synopses_are_made_concrete_and_private_addresses_loopback():
    assert fill("nbdist serve [--host H] [--port P]", P="1234") == "nbdist serve --host 127.0.0.1 --port 1234"
    assert fill("%dist_barrier [--timeout S]") == "%dist_barrier --timeout 30"
    assert fill("pip install -e '.[lab]'") == "pip install -e '.[lab]'"
    assert localise("--master-addr 10.202.73.94 --x 110.2.3.4") == "--master-addr 127.0.0.1 --x 110.2.3.4"
    with pytest.raises(AssertionError, match="refusing"):
        assert_loopback_only(["--master-addr", "10.202.73.94"])
    assert_loopback_only(["--master-addr", "127.0.0.1", "--master-port", "29500"])


def test_output_blocks_may_differ_only_where_runs_differ():
    readme = ("%%collective #1 · 2 ranks", "...", "── rank 0 · vm · 1.5 ms ──", "Out: 1.0", "pid (differs): 2623")
    shown = "%%collective #7 · 2 ranks\nmore\n── rank 0 · host-b · 12.25 ms ──\nOut: 2.0\npid (differs): 99\n"
    assert shown_as(readme, shown, 1234) == ["Out: 1.0"]
    assert shown_as(("rendezvous 127.0.0.1:29500 · x",), "rendezvous 127.0.0.1:1234 · x", 1234) == []
    assert shown_as(("── rank 1 ──", "── rank 0 ──"), "── rank 0 ──\n── rank 1 ──", 1234) == ["── rank 0 ──"]  # order


# --- every item is decided, every decision still matches --------------------------------------------------


def test_the_readme_shows_commands_and_magics_to_check():
    kinds = {kind: [i for i in readme_items() if i.kind == kind] for kind in ("shell", "magic", "flag")}
    assert all(kinds.values()), {k: len(v) for k, v in kinds.items()}


def test_every_item_is_run_checked_or_skipped_by_exactly_one_entry():
    undecided = [str(i) for i in readme_items() if not decision(i)]
    ambiguous = [f"{i}: {[(t, p) for t, p, _ in decision(i)]}" for i in readme_items() if len(decision(i)) > 1]
    assert not undecided, ("README items nobody decided for: add each to RUNS, CHECKED or SKIP (with the reason):\n"
                           + "\n".join(undecided))
    assert not ambiguous, "README items more than one entry decides:\n" + "\n".join(ambiguous)


def test_every_run_check_and_skip_entry_still_matches_something_in_the_readme():
    texts = [i.text for i in readme_items()]
    stale = [f"{name}[{pattern!r}]" for name, table in (("RUNS", RUNS), ("CHECKED", CHECKED), ("SKIP", SKIP))
             for pattern in table if not any(re.fullmatch(pattern, t) for t in texts)]
    assert not stale, "entries that match nothing in README.md or docs/ any more (remove them): " + ", ".join(stale)


def test_every_runner_and_every_test_a_reason_names_exists():
    missing = [name for name in set(RUNS.values()) if not callable(globals().get(name))]
    for why in [*SKIP.values(), *CHECKED.values()]:
        for path, name in re.findall(r"(tests/\w+\.py)::(\w+)", why):
            source = ROOT / path
            if not source.exists() or not re.search(rf"^def {name}\(", source.read_text(encoding="utf-8"), re.M):
                missing.append(f"{path}::{name}")
        for name in re.findall(r"\((test_\w+)\)", why):
            if not callable(globals().get(name)):
                missing.append(name)
    assert not missing, f"tests named in RUNS or in a reason that do not exist: {missing}"


def test_ci_runs_exactly_the_readmes_second_bash_line():
    blocks, _ = split_blocks(readme_text())
    bash = [b for b in blocks if b.lang == "bash"]
    assert len(bash) >= 2, "README.md no longer has the two set-up ```bash blocks the SKIP entries rely on"
    (line,) = [x.strip() for x in bash[1].lines if x.strip()]
    ci = (ROOT / ".ci" / "run").read_text(encoding="utf-8").splitlines()
    assert line in [x.strip() for x in ci], f"README.md:{bash[1].line}: .ci/run does not run {line!r}"


# --- commands, magics, flags and defaults exist: each check lists its problems -------------------------------


def nbdist_command_problems(items: list[Item]) -> list[str]:
    """An `nbdist SUB ...` whose SUB is not a subcommand, or whose flags SUB does not take or refuses."""
    parsers, problems = cli_parsers(), []
    for item in items:
        if item.kind != "shell" or not item.text.startswith("nbdist "):
            continue
        words = shlex.split(fill(item.text))
        sub = words[1]
        if sub == "export" and "--" in words:  # what follows -- is the exported script's own (cli.main)
            words = words[: words.index("--")]
        if sub not in parsers:
            problems.append(f"{item}: nbdist has no subcommand {sub!r} (it has {', '.join(sorted(parsers))})")
            continue
        flags = {w.split("=")[0] for w in words[2:] if w.startswith("--")}
        unknown = flags - options(parsers[sub])
        if unknown:
            problems.append(f"{item}: nbdist {sub} takes no {', '.join(sorted(unknown))}")
        elif flags and "..." not in words and (complaint := parse_cli(parsers[sub], words[2:])):
            problems.append(f"{item}: nbdist {sub} refuses it: {complaint}")
    return problems


def other_command_problems(items: list[Item]) -> list[str]:
    """A `python -m MODULE` with no such module, a script or script flag that is not there, a missing pip extra."""
    extras, problems = pyproject_extras(), []
    shells = [(item, shlex.split(item.text)) for item in items
              if item.kind == "shell" and not item.text.startswith("nbdist ")]
    all_script_flags(sorted({words[1] for _, words in shells if words[0] in ("python", "python3")
                             and words[1].endswith(".py") and (ROOT / words[1]).is_file()}))
    for item, words in shells:
        if words[0] in ("python", "python3") and words[1:2] == ["-m"]:
            if importlib.util.find_spec(words[2]) is None:
                problems.append(f"{item}: there is no module {words[2]}")
        elif words[0] in ("python", "python3") and words[1].endswith(".py"):
            if not (ROOT / words[1]).is_file():
                problems.append(f"{item}: there is no script {words[1]}")
                continue
            unknown = {w.split("=")[0] for w in words[2:] if w.startswith("--")} - script_flags(words[1])
            if unknown:
                problems.append(f"{item}: {words[1]} takes no {', '.join(sorted(unknown))}")
        elif words[:2] == ["pip", "install"] and ("-e" in words or any(w.startswith("nbdist[") for w in words)):
            named = [w for w in words if w.startswith("nbdist[")]  # pip install 'nbdist[debug]'
            target = words[words.index("-e") + 1] if "-e" in words else named[0]
            wanted = set(re.findall(r"[\w-]+", target[target.find("["):])) if "[" in target else set()
            if wanted - extras:
                problems.append(f"{item}: pyproject.toml has no extra {', '.join(sorted(wanted - extras))} "
                                f"(it has {', '.join(sorted(extras))})")
    return problems


def magic_problems(items: list[Item]) -> list[str]:
    """A magic line naming a magic that does not exist, a flag it does not take, or arguments it refuses."""
    problems = []
    for item in items:
        if item.kind != "magic":
            continue
        prefix, name, _help, args = _MAGIC.fullmatch(item.text).groups()
        if name in FOREIGN_MAGICS:
            continue
        if not magic_exists(prefix, name):
            problems.append(f"{item}: there is no {'cell' if prefix == '%%' else 'line'} magic {prefix}{name}")
            continue
        if magic_method(name) is None:  # IPython's own (%load_ext and the like): the extension must exist
            if args and importlib.util.find_spec(args.split()[0]) is None:
                problems.append(f"{item}: there is no extension {args.split()[0]}")
            continue
        parser, args = magic_parser(name), fill(args or "")
        unquoted = re.sub(r"\"[^\"]*\"|'[^']*'", "''", args)  # a quoted value (--slurm "-N 2") holds no flags
        unknown = set(_FLAG.findall(unquoted)) - options(parser)
        if unknown:
            problems.append(f"{item}: {prefix}{name} takes no {', '.join(sorted(unknown))}")
        elif args and parser is None:
            problems.append(f"{item}: {prefix}{name} takes no arguments")
        elif args and "..." not in args:
            try:
                parser.parse_argstring(args)  # as IPython parses it: a comment is not stripped
            except UsageError as exc:
                problems.append(f"{item}: {prefix}{name} refuses it: UsageError: {exc}")
    return problems


def table_flag_problems(items: list[Item]) -> list[str]:
    """A flag of the Magics table that its row's magic does not take, or whose listed values are not its own."""
    problems = []
    for item in items:
        if item.kind != "flag" or not item.magics:
            continue
        flag, _, rest = item.text.partition(" ")
        listed = rest.strip("[]")
        for name in item.magics:
            parser = magic_parser(name)
            if flag not in options(parser):
                problems.append(f"{item}: %{name} takes no {flag} (it takes {', '.join(sorted(options(parser)))})")
            elif "|" in listed:
                choices = action(parser, flag).choices or (config.BACKENDS if flag == "--backend" else None)
                if set(listed.split("|")) != set(choices or ()):
                    problems.append(f"{item}: %{name} {flag} takes {'|'.join(choices or ['any value'])}")
    return problems


def prose_flag_problems(items: list[Item]) -> list[str]:
    """A flag named outside the Magics table that no magic or command of nbdist takes (nor, under Benchmarks,
    the benchmark scripts the README runs)."""
    known = all_nbdist_flags()
    scripts = sorted({w for i in items if i.kind == "shell" for w in i.text.split() if w.endswith(".py")})
    benchmarks = set().union(*all_script_flags([s for s in scripts if (ROOT / s).is_file()]).values())
    problems = []
    for item in items:
        if item.kind == "flag" and not item.magics:
            unknown = set(_FLAG.findall(item.text)) - (known | benchmarks if item.section == "Benchmarks" else known)
            if unknown:
                problems.append(f"{item}: no magic or command of nbdist takes {', '.join(sorted(unknown))}")
    return problems


def default_problems(defaults: list[Default]) -> list[str]:
    """A default the docs state that the code does not hold, or that this test cannot place."""
    actual, problems = actual_defaults(), []
    for d in defaults:
        if d.subject not in actual:
            problems.append(f"{d}: this test does not know where the code keeps it: add it to actual_defaults")
            continue
        problems += [f"{d}, but {where} is {value}" for where, value in actual[d.subject].items()
                     if not same_value(d.value, value)]
    return problems


BROKEN = """\
## Magics

| magic | what it does |
|---|---|
| `%%dist_init` | `--no-such-flag`, `--master-port` (1234), `--debug [files\\|verbose]` |
| `%dist_nothing` | gone |

Run `nbdist serve --hots H`, `nbdist frobnicate`, `%dist_barrier --timeout` and `%%collective --no-chek`,
and `pip install -e '.[gpu]'`; `--no-such-option` too.
"""


def test_the_checks_catch_flags_commands_values_and_defaults_that_do_not_exist():
    items = extract(BROKEN)
    found = "\n".join(nbdist_command_problems(items) + other_command_problems(items) + magic_problems(items)
                      + table_flag_problems(items) + prose_flag_problems(items)
                      + default_problems(documented_defaults(BROKEN)))
    for expected in ("README.md:5: '--no-such-flag' (Magics table): %dist_init takes no --no-such-flag",
                     "README.md:5: '--debug [files|verbose]' (Magics table): %dist_init --debug takes files|stdout",
                     "README.md:6: '%dist_nothing' (Magics table): there is no line magic %dist_nothing",
                     "README.md:8: 'nbdist serve --hots H' (inline): nbdist serve takes no --hots",
                     "README.md:8: 'nbdist frobnicate' (inline): nbdist has no subcommand 'frobnicate'",
                     "README.md:8: '%dist_barrier --timeout' (inline): %dist_barrier refuses it: UsageError",
                     "README.md:8: '%%collective --no-chek' (inline): %%collective takes no --no-chek",
                     "README.md:9: \"pip install -e '.[gpu]'\" (inline): pyproject.toml has no extra gpu",
                     "README.md:9: '--no-such-option' (inline): no magic or command of nbdist takes --no-such-option",
                     "README.md:5: dist_init --master-port documented as 1234, but config.DEFAULT_PORT is 29500"):
        assert expected in found, f"not caught: {expected}\n--- found:\n{found}"


def test_every_nbdist_command_names_a_subcommand_and_flags_it_takes():
    problems = nbdist_command_problems(list(readme_items()))
    assert not problems, "\n".join(problems)


def test_every_other_command_names_a_module_script_extra_or_flag_that_exists():
    problems = other_command_problems(list(readme_items()))
    assert not problems, "\n".join(problems)


def test_every_magic_line_names_a_magic_and_parses_with_its_flags():
    problems = magic_problems(list(readme_items()))
    assert not problems, "\n".join(problems)


def test_every_flag_the_magics_table_names_is_one_its_magic_takes_with_the_values_it_lists():
    assert any(i.kind == "flag" and i.magics for i in readme_items()), "no flags found in the Magics table"
    problems = table_flag_problems(list(readme_items()))
    assert not problems, "\n".join(problems)


def test_every_flag_named_elsewhere_is_one_that_nbdist_or_the_benchmark_it_is_about_takes():
    problems = prose_flag_problems(list(readme_items()))
    assert not problems, "\n".join(problems)


def test_the_defaults_the_readme_states_are_the_codes():
    problems = default_problems(all_defaults())
    assert not problems, "\n".join(problems)
    missing = sorted(set(REQUIRED_DEFAULTS) - {d.subject for d in all_defaults()})
    assert not missing, f"the docs no longer state these defaults where this test looks for them: {missing}"


# --- running the commands on loopback --------------------------------------------------------------------------


def clean_environ() -> dict[str, str]:
    """This environment without the variables that would change what a command shows."""
    prefixes = ("HCCL_", "TORCH_HCCL_", "GLOO_", "NCCL_", "TORCH_NCCL_", "NBDIST_")
    return {k: v for k, v in os.environ.items() if k not in BLANK_ENV and not k.startswith(prefixes)}


def command_words(item: Item, **values: str) -> list[str]:
    """The README's command, concrete and on loopback, as the argv to run (``...`` dropped)."""
    words = [w for w in shlex.split(fill(localise(item.text), **values)) if w != "..."]
    words[0] = str(NBDIST) if words[0] == "nbdist" else sys.executable if words[0] == "python" else words[0]
    assert_loopback_only(words)
    return words


def with_flag(words: list[str], flag: str, value: str) -> list[str]:
    """``words`` with ``flag value``: added where absent, replaced where present."""
    if flag in words:
        i = words.index(flag)
        return [*words[:i + 1], value, *words[i + 2:]]
    return [*words, flag, value]


def run(words: list[str], timeout: float = 60) -> subprocess.CompletedProcess:
    return subprocess.run(words, cwd=ROOT, env=clean_environ(), capture_output=True, text=True, timeout=timeout)


def run_two_at_a_time(commands: list[list[str]], timed: bool = False) -> list[Any]:
    """:func:`run` of each command, two at once (each is mostly Python starting and importing, on one core); in
    order. With ``timed``, each with the seconds it took."""

    def one(words: list[str]) -> tuple[subprocess.CompletedProcess, float]:
        started = time.monotonic()
        proc = run(words)
        return proc, time.monotonic() - started

    with ThreadPoolExecutor(max_workers=2) as pool:
        done = list(pool.map(one, commands))
    return done if timed else [proc for proc, _ in done]


@pytest.mark.timeout(90)
def test_nbdist_env_commands_print_their_plan_and_exit_0():
    """`nbdist env ...` and `nbdist env --backend hccl --rank 1 --world-size 2 --master-addr 10.202.73.94`
    (on loopback): exit 0, a plan whose header and HCCL values are what the README states."""
    env_parser = cli_parsers()["env"]
    commands = []
    for item in distinct(items_run_by("test_nbdist_env_commands_print_their_plan_and_exit_0")).values():
        words = command_words(item)
        commands.append((item, words if "--master-addr" in words else with_flag(words, "--master-addr", "127.0.0.1")))
    for (item, words), proc in zip(commands, run_two_at_a_time([words for _, words in commands]), strict=True):
        out = proc.stdout + proc.stderr
        assert proc.returncode == 0 and "Traceback" not in out, f"{item}: exit {proc.returncode}\n{out}"
        args = env_parser.parse_args(words[2:])
        backend = args.backend if args.backend != "auto" else backends.choose("auto", None, 0).backend
        head = re.search(rf"^# nbdist \S+ plan for rank {args.rank} of {args.world_size}, backend {backend}, "
                         rf"master 127\.0\.0\.1:{args.master_port}; process-group timeout ([\d.]+) s$",
                         proc.stdout, re.M)
        assert head, f"{item}: no plan header in\n{proc.stdout}"
        pg = documented("dist_init --pg-timeout (hccl)" if backend == "hccl" else "dist_init --pg-timeout")
        assert same_value(pg, head[1]), f"{item}: process-group timeout {head[1]} s, README.md says {pg} s"
        if backend == "hccl":
            for var in ("HCCL_CONNECT_TIMEOUT", "HCCL_EXEC_TIMEOUT"):
                assert f"\n{var}={documented(var)}\n" in proc.stdout, f"{item}: {var} is not {documented(var)}"


@pytest.mark.timeout(90)
def test_nbdist_doctor_commands_exit_0_or_1_without_a_traceback():
    """`nbdist doctor ...` and `nbdist doctor --master-addr 10.202.73.94 --backend hccl`, against 127.0.0.1 and a
    free port: one line per check, then the verdict; exit 0 (all passed) or 1 (a check failed)."""
    commands = []
    for item in distinct(items_run_by("test_nbdist_doctor_commands_exit_0_or_1_without_a_traceback")).values():
        port = free_port()
        commands.append((item, port, with_flag(with_flag(command_words(item), "--master-addr", "127.0.0.1"),
                                               "--master-port", str(port))))
    timed = run_two_at_a_time([words for _, _, words in commands], timed=True)
    for (item, port, _), (proc, took) in zip(commands, timed, strict=True):
        out = proc.stdout + proc.stderr
        assert proc.returncode in (0, 1) and "Traceback" not in out, f"{item}: exit {proc.returncode}\n{out}"
        assert f"TCP to 127.0.0.1:{port}" in proc.stdout, f"{item}: the master port was not checked\n{out}"
        assert re.search(r"^nbdist doctor: ", proc.stdout, re.M), f"{item}: no verdict line\n{out}"
        assert took < 30, f"{item}: took {took:.0f} s"


@pytest.mark.timeout(90)
def test_nbdist_serve_listens_on_loopback_and_stops():
    """`nbdist serve [--host H] [--port P] [--token T]`, every option given, on 127.0.0.1 and a free port: it
    listens, says where, and stops with exit 0 on SIGTERM."""
    for item in distinct(items_run_by("test_nbdist_serve_listens_on_loopback_and_stops")).values():
        port = free_port()
        words = with_flag(with_flag(command_words(item, P=str(port)), "--host", "127.0.0.1"), "--port", str(port))
        proc = subprocess.Popen(words, cwd=ROOT, env=clean_environ(), stdout=subprocess.PIPE,
                                stderr=subprocess.STDOUT, text=True)
        try:
            deadline = time.monotonic() + 30
            while probe("127.0.0.1", port, 0.5) != "open":
                assert proc.poll() is None, f"{item}: exited {proc.returncode}\n{proc.stdout.read()}"
                assert time.monotonic() < deadline, f"{item}: not listening on 127.0.0.1:{port} after 30 s"
                time.sleep(0.2)
            proc.send_signal(signal.SIGTERM)
            assert proc.wait(timeout=30) == 0, f"{item}: exit {proc.returncode}"
        finally:
            if proc.poll() is None:
                proc.kill()
                proc.wait(timeout=30)
        out = proc.stdout.read()
        assert f"rendezvous server on 127.0.0.1:{port}" in out and "server stopped" in out, f"{item}:\n{out}"
        assert "Traceback" not in out, f"{item}:\n{out}"


@pytest.mark.timeout(90)
def test_the_seed_command_repeats_an_order():
    """`python -m pytest -p randomly ... --randomly-seed=N` "repeats an order": the same seed, the same order
    (collected only, from one small test module)."""
    for item in distinct(items_run_by("test_the_seed_command_repeats_an_order")).values():
        words = [*command_words(item), "--collect-only", "-q", "-p", "no:cacheprovider", "tests/test_config.py"]
        orders = []
        for proc in run_two_at_a_time([words, words]):
            assert proc.returncode == 0, f"{item}: exit {proc.returncode}\n{proc.stdout}{proc.stderr}"
            orders.append([line for line in proc.stdout.splitlines() if "::" in line])
        assert orders[0] and orders[0] == orders[1], f"{item}: two runs collected\n{orders}"


# --- running the magics in one world ------------------------------------------------------------------------


@dataclass
class World:
    kernels: list[kernels.Kernel]
    port: int
    loaded: list[kernels.Result]
    joined: list[kernels.Result]
    lines: list[str]  # what each rank ran to join


def tour_blocks() -> tuple[Block, Block | None]:
    """The tour's ```python block that joins on loopback, and the output block shown after it."""
    blocks, _ = split_blocks(tour_text())
    for i, block in enumerate(blocks):
        first = block.lines[0].strip() if block.lines else ""
        if block.lang == "python" and first.startswith("%%dist_init") and "127.0.0.1" in first:
            after = next((b for b in blocks[i + 1:] if b.lang in ("", "python")), None)
            return block, after if after is not None and after.lang == "" else None
    raise AssertionError(f"{_name(TOUR)} has no ```python block that joins a world on 127.0.0.1 (the tour's)")


@pytest.fixture(scope="module")
def world() -> Iterator[World]:
    """Two kernels joined by the tour's own lines: `%load_ext nbdist`, then its `%%dist_init` on a free port
    (rank 1's notebook "says `--rank 1`")."""
    (load,) = {i.text for i in items_run_by("test_the_tours_first_cells_form_a_world_as_the_readme_shows")
               if i.text.startswith("%load_ext")}
    block, _ = tour_blocks()
    tour = _collapse(block.lines[0])
    assert "--master-port" not in tour and "--rank 0" in tour, f"{_name(TOUR)}:{block.line}: {tour!r}"
    port = free_port()
    lines = [f"{tour.replace('--rank 0', f'--rank {rank}')} --master-port {port}" for rank in (0, 1)]
    # The README's block is from a machine without CUDA ("backend choice: ...; no CUDA"); hide any CUDA here too.
    ks = kernels.start(2, env={**dict.fromkeys(BLANK_ENV, ""), "CUDA_VISIBLE_DEVICES": ""})
    try:
        loaded = kernels.execute_all(ks, load, timeout=60)
        joined = kernels.execute_all(ks, lines, timeout=120) if all(r.status == "ok" for r in loaded) else []
        yield World(ks, port, loaded, joined, lines)
    finally:
        REAPER.later(ks)  # rank 0, which hosts the server, stops last


def formed(world: World) -> World:
    """The world, failing (not skipping) when the tour's lines did not form it."""
    for rank, r in enumerate(world.loaded):
        assert r.status == "ok", f"rank {rank}: the README's `%load_ext nbdist` failed: {r.error}"
    for rank, r in enumerate(world.joined):
        assert r.status == "ok", f"rank {rank}: {world.lines[rank]!r} failed: {r.error}"
    return world


# What differs from run to run in an output block: (where, in the README's line, the regular expression there).
_VARIABLE = (
    (r"#\d+", r"#\d+"),  # the cell's number: this module's tests run in any order
    (r"\b\d+(?:\.\d+)? ms\b", r"[\d.]+ ms"),
    (r"(?<=pid \(differs\): )\d+", r"\d+"),
    (r"(?<=^host: )\S+", r"\S+"),
    (r"(?<=· )vm(?= ·)", r"\S+"),  # the README's host name
    (r"(?<=^torch: )\S+", r"\S+"),
)


def line_pattern(want: str, port: int) -> str:
    """A README output line as a regular expression: literal but for what differs from run to run."""
    want = want.rstrip().replace(f"127.0.0.1:{config.DEFAULT_PORT}", f"127.0.0.1:{port}")
    found = sorted((m.start(), m.end(), regex) for raw, regex in _VARIABLE for m in re.finditer(raw, want))
    out, at = "", 0
    for start, end, regex in found:
        if start >= at:
            out, at = out + re.escape(want[at:start]) + regex, end
    return out + re.escape(want[at:])


def shown_as(readme: tuple[str, ...], shown: str, port: int) -> list[str]:
    """The lines of a README output block that ``shown`` lacks, in order (`...` stands for any lines)."""
    lines, at, missing = [line.rstrip() for line in shown.splitlines()], 0, []
    for want in readme:
        if want.strip() in ("", "..."):
            continue
        pattern = line_pattern(want, port)
        hit = next((j for j in range(at, len(lines)) if re.fullmatch(pattern, lines[j])), None)
        if hit is None:
            missing.append(want)
        else:
            at = hit + 1
    return missing


@pytest.mark.timeout(150)
def test_the_tours_first_cells_form_a_world_as_the_readme_shows(world):
    """The tour's `%load_ext nbdist` and `%%dist_init --rank 0 --world-size 2 --master-addr 127.0.0.1` form a world,
    and rank 0 shows it as the README's block after them does."""
    world = formed(world)
    block, output = tour_blocks()
    assert output is not None, f"{_name(TOUR)}:{block.line}: no output block after the tour's %%dist_init"
    missing = shown_as(output.lines, world.joined[0].text(), world.port)
    assert not missing, (f"{_name(TOUR)}:{output.line}: rank 0's %%dist_init did not show these lines:\n"
                         + "\n".join(missing) + f"\n--- it showed:\n{world.joined[0].text()}")


@pytest.mark.timeout(120)
def test_the_tours_collective_cell_shows_what_the_readme_shows(world):
    """The tour's `%%collective` cell, run as it stands in both notebooks, shows the text form the README shows."""
    world = formed(world)
    blocks, _ = split_blocks(tour_text())
    index = next((i for i, b in enumerate(blocks) if b.lang == "python" and b.lines
                  and b.lines[0].strip() == "%%collective"), None)
    assert index is not None, "README.md has no ```python block that is a %%collective cell"
    cell, output = blocks[index], next((b for b in blocks[index + 1:] if b.lang == ""), None)
    results = kernels.execute_all(world.kernels, "\n".join(cell.lines) + "\n", timeout=90)
    for rank, r in enumerate(results):
        assert r.status == "ok", f"{_name(TOUR)}:{cell.line}: rank {rank}: {r.error}"
    assert output is not None, f"{_name(TOUR)}:{cell.line}: no output block after the %%collective cell"
    for rank, r in enumerate(results):
        missing = shown_as(output.lines, r.text(), world.port)
        assert not missing, (f"{_name(TOUR)}:{output.line}: rank {rank} did not show these lines:\n"
                             + "\n".join(missing)
                             + f"\n--- it showed:\n{r.text()}")


@pytest.mark.timeout(180)
def test_the_tours_training_cell_shows_its_table_live_then_the_final_one(world):
    """The tour's second `%%collective` cell (a DDP loop with a tqdm bar): live table, then one final table."""
    world = formed(world)
    blocks, _ = split_blocks(tour_text())
    cells = [b for b in blocks if b.lang == "python" and b.lines and b.lines[0].strip() == "%%collective"]
    assert len(cells) >= 2, "README.md's tour has no training cell"
    cell = cells[1]
    steps = re.search(r"range\((\d+)\)", "\n".join(cell.lines))
    assert steps, f"{_name(TOUR)}:{cell.line}: the training cell has no loop"
    results = kernels.execute_all(world.kernels, "\n".join(cell.lines) + "\n", timeout=150)
    for rank, r in enumerate(results):
        assert r.status == "ok", f"{_name(TOUR)}:{cell.line}: rank {rank}: {r.error}"
        assert any("state: running" in t for t in r.updates()), f"rank {rank}: no live table: {r.updates()}"
        final = r.text()
        # One bar per rank; ranks in lockstep can finish at the same rate, and identical rows are shown once.
        bars = 1 if "all 2 ranks (identical)" in final else 2
        assert final.count(f"{steps[1]}/{steps[1]}") == bars and "state:" not in final, final
        assert len(final.splitlines()) < 15, final


@pytest.mark.timeout(60)
def test_dist_status_shows_every_rank_joined(world):
    """`%dist_status`: a table of ranks, joined or left, alive, host."""
    world = formed(world)
    for text in distinct(items_run_by("test_dist_status_shows_every_rank_joined")):
        for rank, r in enumerate(kernels.execute_all(world.kernels, text, timeout=30)):
            assert r.status == "ok", f"rank {rank}: {text}: {r.error}"
            for other in (0, 1):
                assert re.search(rf"── rank {other} ──\nstate: joined\nalive: yes", r.text()), (text, r.text())


@pytest.mark.timeout(90)
def test_dist_barrier_lines_meet_on_every_rank(world):
    """`%dist_barrier [--timeout S]`, with and without `--timeout`: all ranks meet."""
    world = formed(world)
    for text in distinct(items_run_by("test_dist_barrier_lines_meet_on_every_rank")):
        for line in dict.fromkeys([fill(text), re.sub(r"\s*\[[^\]]*\]", "", text)]):
            for rank, r in enumerate(kernels.execute_all(world.kernels, line, timeout=60)):
                assert r.status == "ok", f"rank {rank}: {line}: {r.error}"
                assert "nbdist: all 2 ranks met" in r.text(), (line, r.text())


@pytest.mark.timeout(90)
def test_dist_env_and_dist_doctor_run_in_a_world(world):
    """`%dist_env` (the plan for this world; changes nothing) and `%dist_doctor` (checks, one line each), as the
    README types them, in a joined world: no error, and what each is for is shown."""
    world = formed(world)
    k = world.kernels[1]
    for text in distinct(items_run_by("test_dist_env_and_dist_doctor_run_in_a_world")):
        r = k.execute(text, timeout=60)
        assert r.status == "ok", f"{text}: {r.error}"
        if text.startswith("%dist_env"):
            assert re.search(r"^[A-Z_]+=\S", r.text(), re.M), (text, r.text())
        else:
            assert f"TCP to 127.0.0.1:{world.port}" in r.text(), (text, r.text())
            assert all(re.match(r"\[(?: ok |info|warn|FAIL)\] |nbdist doctor: ", line)
                       for line in r.text().splitlines() if line.strip()), (text, r.text())


@pytest.mark.timeout(60)
def test_the_help_line_prints_help_naming_every_flag_of_the_table(world):
    """"Every magic has generated help: `%dist_init?`": it prints help naming every flag the Magics table names."""
    world = formed(world)
    table = [i for i in readme_items() if i.kind == "flag" and i.magics]
    for text in distinct(items_run_by("test_the_help_line_prints_help_naming_every_flag_of_the_table")):
        name = _MAGIC.fullmatch(text).group(2)
        r = world.kernels[0].execute(text, timeout=30)
        assert r.status == "ok", f"{text}: {r.error}"
        page = re.sub(r"\x1b\[[0-9;]*m", "", "".join(p.get("data", {}).get("text/plain", "") for p in r.payload))
        assert page, f"{text} printed no help"
        flags = {i.text.split()[0] for i in table if name in i.magics}
        absent = sorted(f for f in flags if f not in page)
        assert flags and not absent, f"{text}: the help does not name {absent}:\n{page}"
