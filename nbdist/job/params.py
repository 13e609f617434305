"""A notebook's ``parameters`` cell as a script's command-line flags: ``--epochs 3`` overrides ``epochs = 5``.

As papermill and ``nbdist run --param`` read them, a value is a Python literal
(``3``, ``0.1``, ``'adam'``, ``[1, 2]``), else a string; ``--help`` lists every
parameter with its default.
"""

from __future__ import annotations

import argparse
import ast
from collections.abc import Mapping, Sequence
from typing import Any


def literal(text: str) -> Any:
    """``text`` as a Python literal, else as the string itself."""
    try:
        return ast.literal_eval(text)
    except (ValueError, SyntaxError, MemoryError, RecursionError):
        return text


def parser(defaults: Mapping[str, Any], prog: str | None = None) -> argparse.ArgumentParser:
    parse = argparse.ArgumentParser(prog=prog, description="A script exported by nbdist from a notebook; its "
                                    "parameters cell's names are flags (a value is a Python literal, else a string).")
    for name, value in defaults.items():
        flags = [f"--{name}"] + ([f"--{name.replace('_', '-')}"] if "_" in name else [])
        parse.add_argument(*flags, dest=name, type=literal, default=value, metavar="VALUE",
                           help=f"default {value!r}")
    return parse


def parameters(defaults: Mapping[str, Any], argv: Sequence[str] | None = None, prog: str | None = None
               ) -> dict[str, Any]:
    """``defaults`` with the values given on the command line (``argv``, else ``sys.argv[1:]``)."""
    return vars(parser(defaults, prog).parse_args(argv))
