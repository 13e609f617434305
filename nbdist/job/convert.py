"""A rank notebook as one Python script that a launcher (torchrun, srun) runs once per rank.

nbdist knows what its magics mean, so each becomes what it does in a job:

- ``%load_ext nbdist`` and ``%%dist_init`` become ``nbdist.script.init()``, which forms the world from the
  launcher's variables with the notebook's ``--backend``, ``--device``, ``--env``, ``--pg-timeout`` and
  ``--debug`` (its rank, world size and master flags give way to the launcher's);
- a ``%%collective`` body runs as it is; ``--ranks 0-3`` becomes ``if RANK in ...:``;
- ``%dist_barrier`` becomes ``dist.barrier()``; the display magics are dropped with a comment;
- the ``parameters`` cell's names become command-line flags;
- a cell's last expression is printed as its Out row shows it.

Cells tagged ``nbdist-skip`` are left out, and so are cells tagged ``raises-exception`` (they fail on purpose,
and a job cannot go on after a failed collective). Any other IPython construct (``!cmd``, ``%timeit``, another
cell magic) is refused with its cell and line, unless ``allow_ipython`` keeps it as a comment.
"""

from __future__ import annotations

import argparse
import ast
import io
import re
import tokenize
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

from .._version import __version__
from ..errors import ExportError

Parse = Callable[[str], argparse.Namespace]  # a magic's flags, as the magic itself parses them
WORLD_NAMES = ("RANK", "WORLD_SIZE", "LOCAL_RANK", "MASTER_ADDR", "MASTER_PORT", "SPAWN")  # the launcher's
INIT_FLAGS = ("backend", "device", "env", "pg_timeout", "debug")  # %%dist_init's flags a script keeps
DISPLAY_ONLY = {"dist_status", "dist_dashboard", "dist_workers", "dist_env", "dist_doctor", "dist_config"}
ENDS_WORLD = {"dist_destroy", "dist_release", "dist_stop"}
REFUSED_WHY = {
    "dist_debug": "give %%dist_init --debug instead",
    "dist_bench": "measure with `nbdist bench` instead",
    "dist_follow": "export the notebook that drives, not a follower",
}
SKIP_TAG, FAILS_TAG, PARAMETERS_TAG = "nbdist-skip", "raises-exception", "parameters"
_MAGIC_CALL = re.compile(r"^(\s*)get_ipython\(\)\.run_line_magic\('(\w+)', (.*)\)\s*$")


@dataclass
class Script:
    """The script's text, and a line per cell left out or changed, for the user."""

    text: str
    notes: list[str] = field(default_factory=list)


@dataclass
class _Out:
    parse_init: Parse
    parse_collective: Parse
    allow_ipython: bool
    lines: list[str] = field(default_factory=list)
    notes: list[str] = field(default_factory=list)
    initialised: bool = False


def export(nb: Any, name: str, parse_init: Parse, parse_collective: Parse, allow_ipython: bool = False) -> Script:
    """The script for notebook ``nb`` (an nbformat v4 node) named ``name``; raises :class:`ExportError`."""
    out = _Out(parse_init, parse_collective, allow_ipython)
    out.lines += [
        "#!/usr/bin/env python3",
        f'"""{name}, exported by nbdist {__version__} (nbdist export).',
        "",
        "Run it with a launcher that starts one process per rank, for example:",
        "    torchrun --standalone --nproc-per-node 2 THIS_SCRIPT",
        "    srun -n 2 python THIS_SCRIPT",
        '"""',
        "import nbdist.script  # first: it chooses the backend before torch is imported, as %load_ext nbdist does",
    ]
    for number, cell in enumerate(nb.cells, start=1):
        source = "".join(cell.source) if isinstance(cell.source, list) else cell.source
        if cell.cell_type == "markdown":
            out.lines += ["", *(f"# {line}".rstrip() for line in source.splitlines())]
        elif cell.cell_type == "code" and source.strip():
            _code_cell(out, number, source, cell.get("metadata", {}).get("tags", []))
    if not out.initialised:
        raise ExportError(f"{name} never runs %%dist_init, so its script would form no world")
    return Script("\n".join(out.lines).rstrip() + "\n", out.notes)


def _code_cell(out: _Out, number: int, source: str, tags: list[str]) -> None:
    first, _, body = source.partition("\n")
    where = f"cell {number}"
    if SKIP_TAG in tags or FAILS_TAG in tags:
        why = "tagged nbdist-skip" if SKIP_TAG in tags else "tagged raises-exception: it fails on purpose"
        out.lines += ["", f"# {where}: left out ({why})", *(f"#   {line}".rstrip() for line in source.splitlines())]
        out.notes.append(f"{where} left out ({why})")
        return
    out.lines += ["", f"# {where}" + (" (parameters)" if PARAMETERS_TAG in tags else "")]
    if first.lstrip().startswith("%%"):
        magic, _, line = first.strip()[2:].partition(" ")
        if magic == "dist_init":
            out.lines += _python(out, number, body, offset=1)
            _init(out, number, line, 1)
        elif magic == "collective":
            _collective(out, number, line, body)
        elif out.allow_ipython:
            out.lines += [f"#   {text}".rstrip() for text in source.splitlines()]
            out.notes.append(f"{where}: %%{magic} kept as a comment (--allow-ipython)")
        else:
            raise ExportError(f"{where}, line 1: %%{magic} has no script form (pass --allow-ipython to keep the "
                              "cell as a comment, or tag it nbdist-skip)")
        return
    out.lines += _with_out(_python(out, number, source, offset=0), source)
    if PARAMETERS_TAG in tags:
        names = [n for n in _assigned(source) if n not in WORLD_NAMES]
        if names:
            given = ", ".join(f"{n!r}: {n}" for n in names)
            out.lines.append(f"globals().update(nbdist.script.parameters({{{given}}}))  # --NAME VALUE overrides")


def _init(out: _Out, number: int, line: str, at: int) -> None:
    try:
        args = out.parse_init(line)
    except Exception as exc:  # the magic's own parser: UsageError, SystemExit from argparse
        raise ExportError(f"cell {number}, line {at}: %dist_init {line}: {exc}") from None
    kept = {k: getattr(args, k, None) for k in INIT_FLAGS}
    given = ", ".join(f"{k}={v!r}" for k, v in kept.items() if v)
    dropped = [f"--{k.replace('_', '-')}" for k in ("rank", "world_size", "master_addr", "master_port", "spawn",
                                                    "slurm", "timeout", "token") if getattr(args, k, None)]
    if dropped:
        out.lines.append(f"# {' '.join(dropped)}: the launcher's, in a script")
    out.lines += [
        f"_world = nbdist.script.init(globals(){', ' if given else ''}{given})",
        "RANK, WORLD_SIZE, LOCAL_RANK, DEVICE = _world.rank, _world.world_size, _world.local_rank, _world.device",
        "import torch  # noqa: E402",
        "import torch.distributed as dist  # noqa: E402",
    ]
    out.initialised = True


def _collective(out: _Out, number: int, line: str, body: str) -> None:
    try:
        args = out.parse_collective(line)
    except Exception as exc:
        raise ExportError(f"cell {number}, line 1: %%collective {line}: {exc}") from None
    if not out.initialised:
        raise ExportError(f"cell {number}: a %%collective cell before %%dist_init")
    lines = _with_out(_python(out, number, body, offset=1), body)
    if not any(text.strip() and not text.lstrip().startswith("#") for text in lines):
        lines.append("pass")
    dropped = [word for word in line.split() if word.startswith("--") and word.split("=")[0] != "--ranks"]
    if dropped:
        out.lines.append(f"# %%collective {' '.join(dropped)}: nbdist's checks, limits and views; none in a script")
    if args.ranks:
        out.lines.append(f"if RANK in nbdist.script.on_ranks({args.ranks!r}):  # %%collective --ranks")
        lines = _indented(lines)
    out.lines += lines


def _python(out: _Out, number: int, source: str, offset: int) -> list[str]:
    """``source`` with its line magics made Python (or refused); ``offset``: lines above it in the cell."""
    from IPython.core.inputtransformer2 import TransformerManager

    source = source.rstrip()
    if not source:
        return []
    lines = source.splitlines()
    transformed = TransformerManager().transform_cell(source).rstrip().splitlines()
    if transformed == lines:
        return lines
    if len(transformed) != len(lines):
        raise ExportError(f"cell {number}: an IPython construct spanning lines has no script form")
    result = []
    for i, (mine, theirs) in enumerate(zip(lines, transformed, strict=True), start=1 + offset):
        if mine == theirs:
            result.append(mine)
            continue
        match = _MAGIC_CALL.match(theirs)
        indent = _indent(mine)
        if match is None:
            result.append(_refuse_or_keep(out, number, i, mine, "it is IPython, not Python"))
            continue
        name, line = match[2], ast.literal_eval(match[3])
        if name == "load_ext" and line.strip() == "nbdist":
            result.append(f"{indent}# %load_ext nbdist: nbdist.script, imported above, does its part")
        elif name == "dist_init":
            _init(out, number, line, i)
        elif name == "dist_barrier":
            result.append(f"{indent}dist.barrier()  # %dist_barrier")
        elif name in DISPLAY_ONLY:
            result.append(f"{indent}# {mine.strip()}: shows only, left out")
        elif name in ENDS_WORLD:
            result.append(f"{indent}# {mine.strip()}: the world ends when the script exits")
        else:
            why = REFUSED_WHY.get(name, "it is IPython, not Python")
            result.append(_refuse_or_keep(out, number, i, mine, why))
    return result


def _refuse_or_keep(out: _Out, number: int, line: int, text: str, why: str) -> str:
    if not out.allow_ipython:
        raise ExportError(f"cell {number}, line {line}: {text.strip()!r} has no script form ({why}); pass "
                          "--allow-ipython to keep it as a comment, or tag the cell nbdist-skip")
    out.notes.append(f"cell {number}, line {line}: {text.strip()} kept as a comment (--allow-ipython)")
    return _indent(text) + f"# {text.strip()}  (IPython; left out)"


def _indent(line: str) -> str:
    found = re.match(r"\s*", line)
    assert found is not None  # \s* matches every line
    return found[0]


def _with_out(lines: list[str], source: str) -> list[str]:
    """``lines`` with their last statement, if an expression not ending in ``;``, printed as an Out row.

    Not where the cell's last line was a magic (a magic's Out row is not a cell's value).
    """
    mine = [line.rstrip() for line in source.splitlines() if line.strip()]
    if not mine or mine[-1] not in (line.rstrip() for line in lines):
        return lines
    text = "\n".join(lines)
    try:
        tree = ast.parse(text)
    except SyntaxError:
        return lines  # Python reports it where it is, when the script runs
    if not tree.body or not isinstance(tree.body[-1], ast.Expr):
        return lines
    last = tree.body[-1]
    assert last.end_lineno is not None and last.end_col_offset is not None  # a parsed node has both
    tail = lines[last.end_lineno - 1][last.end_col_offset:]
    if tail.split("#", 1)[0].strip().startswith(";"):
        return lines
    head = lines[last.lineno - 1][: last.col_offset]
    segment = ast.get_source_segment(text, last.value)
    value = f"{head}nbdist.script.out({segment}){tail}".splitlines()
    return [*lines[: last.lineno - 1], *value, *lines[last.end_lineno :]]


def _indented(lines: list[str]) -> list[str]:
    """``lines`` one level in, except lines inside a string that spans lines (their text must not change)."""
    inside: set[int] = set()
    try:
        for token in tokenize.generate_tokens(io.StringIO("\n".join(lines) + "\n").readline):
            if token.type == tokenize.STRING and token.end[0] > token.start[0]:
                inside.update(range(token.start[0] + 1, token.end[0] + 1))
    except (tokenize.TokenError, SyntaxError):
        pass
    return [line if n in inside or not line.strip() else "    " + line for n, line in enumerate(lines, start=1)]


def _assigned(source: str) -> list[str]:
    """The names a cell assigns at its top level (``name = ...``, ``name: T = ...``), in order."""
    try:
        tree = ast.parse(source)
    except SyntaxError:
        return []
    names: list[str] = []
    for node in tree.body:
        targets = node.targets if isinstance(node, ast.Assign) else [node.target] if isinstance(
            node, ast.AnnAssign) and node.value is not None else []
        for target in targets:
            if isinstance(target, ast.Name) and target.id not in names:
                names.append(target.id)
    return names
