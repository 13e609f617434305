"""Help that users read speaks their words: no internal ones in the magics' help or the command's help.

The words of nbdist's insides (cut, generation, fingerprint, rolling hash, wait slice, pulse) stay in the code
and the explanation pages; ``%magic?``, ``nbdist CMD --help`` and ``help(nbdist.x)`` say what a user sees.
The real parsers are read: the magics' ``magic_arguments`` ones and ``nbdist.cli``'s.
"""

from __future__ import annotations

import argparse
import re
from collections.abc import Iterator

import pytest

import nbdist
from nbdist import cli
from nbdist.magics import DistMagics

INTERNAL = re.compile(r"\b(cut|cuts|cutting|generations?|fingerprints?|rolling hash(es)?|wait slices?|pulses?)\b",
                      re.IGNORECASE)


def _action_texts(where: str, parser: argparse.ArgumentParser) -> Iterator[tuple[str, str]]:
    """(where, text) for a parser's description, epilog and each argument's help, named by its flag."""
    yield f"{where} (description)", parser.description or ""
    yield f"{where} (epilog)", parser.epilog or ""
    for action in parser._actions:  # argparse keeps its arguments here; there is no public list
        if isinstance(action, argparse._SubParsersAction):
            continue
        name = "/".join(action.option_strings) or action.metavar or action.dest
        yield f"{where} {name}", action.help or ""
        if action.choices is not None:
            yield f"{where} {name} (choices)", " ".join(map(str, action.choices))


def magic_texts() -> Iterator[tuple[str, str]]:
    """Every magic's docstring (what ``%magic?`` shows, usage included) and its flags' help."""
    for kind, names in DistMagics.magics.items():
        for magic, method in names.items():
            func = getattr(DistMagics, method)
            where = f"{'%%' if kind == 'cell' else '%'}{magic}"
            yield f"{where} (docstring)", func.__doc__ or ""
            parser = getattr(func, "parser", None)  # set by @magic_arguments
            if parser is not None:
                yield from _action_texts(where, parser)


def cli_texts() -> Iterator[tuple[str, str]]:
    """The ``nbdist`` command's help: the top level, each subcommand's one-line help, and each subcommand's flags."""
    parser = cli.build_parser()
    yield from _action_texts("nbdist", parser)
    (sub,) = [a for a in parser._actions if isinstance(a, argparse._SubParsersAction)]
    for choice in sub._choices_actions:  # the one-line help each subcommand has in `nbdist --help`
        yield f"nbdist {choice.dest} (help)", choice.help or ""
    for name, subparser in sub.choices.items():
        yield from _action_texts(f"nbdist {name}", subparser)
        yield f"nbdist {name} --help", subparser.format_help()


def api_texts() -> Iterator[tuple[str, str]]:
    """``help(nbdist.x)`` for the package's public functions."""
    for name in nbdist.__all__:
        value = getattr(nbdist, name)
        if callable(value):
            yield f"nbdist.{name}", value.__doc__ or ""


def _offending(texts: Iterator[tuple[str, str]]) -> list[str]:
    found = []
    for where, text in texts:
        words = sorted({m.group(0).lower() for m in INTERNAL.finditer(text)})
        if words:
            found.append(f"{where}: {', '.join(words)}")
    return found


def test_the_scan_reads_every_magic_and_every_subcommand() -> None:
    magics = {where.split()[0] for where, _ in magic_texts()}
    assert {"%dist_init", "%%collective", "%dist_status", "%dist_stop", "%dist_follow", "%dist_debug"} <= magics
    commands = {where.split()[1] for where, _ in cli_texts() if where.startswith("nbdist ")}
    assert {"demo", "run", "bench", "follow", "export", "serve", "env", "doctor", "stop"} <= commands
    flags = [where for where, text in magic_texts() if where.startswith("%%collective --") and text]
    assert "%%collective --max-time" in flags, flags


def test_the_pattern_finds_each_internal_word_as_a_whole_word() -> None:
    for word in ("cut", "Cut", "generation", "fingerprints", "rolling hash", "wait slice", "pulse"):
        assert INTERNAL.search(f"the {word} here"), word
    for word in ("shortcut", "execute", "generated", "impulse", "fingerprinting"):
        assert INTERNAL.search(word) is None, word


@pytest.mark.parametrize("texts", [magic_texts, cli_texts, api_texts], ids=["magics", "cli", "api"])
def test_help_users_read_uses_no_internal_words(texts) -> None:
    found = _offending(texts())
    assert not found, ("internal words in help users read (say what the user sees, e.g. 'closes the stuck "
                       "collective', 'the rebuilt process group'):\n" + "\n".join(found))
