"""What a rank's column shows of an error: the user's frames, with nbdist's own hidden.

A cell stopped inside ``dist.all_reduce`` because another rank failed raises
through many of nbdist's frames around one line of the user's code. The short
form leaves those frames out; the full form keeps everything, one click away.
Pure stdlib, so it can be used and tested without torch or a kernel.
"""

from __future__ import annotations

import functools
import os
import re
import sysconfig
import traceback
from types import TracebackType

_PACKAGE_DIR = os.path.realpath(os.path.dirname(os.path.dirname(__file__)))  # nbdist/, above view/
_STDLIB_DIR = os.path.realpath(sysconfig.get_paths()["stdlib"])

# The same words traceback uses between the parts of a chain.
_CAUSE = "\nThe above exception was the direct cause of the following exception:\n\n"
_CONTEXT = "\nDuring handling of the above exception, another exception occurred:\n\n"


@functools.lru_cache(maxsize=1024)
def _real(filename: str) -> str:
    # Pseudo-names such as "<frozen os>" or "<ipython-input-1-x>" are not paths: realpath would
    # glue them to the working directory, which could lie under the package directory.
    return filename if filename.startswith("<") else os.path.realpath(filename)


def _under(path: str, directory: str) -> bool:
    return path == directory or path.startswith(directory + os.sep)


def _is_internal(filename: str) -> bool:
    """Whether ``filename`` is a module of the nbdist package itself."""
    return _under(_real(filename), _PACKAGE_DIR)


def _is_library(filename: str) -> bool:
    """Whether ``filename`` is installed library code or the standard library (frozen modules included)."""
    real = _real(filename)
    parts = real.split(os.sep)
    return (
        "site-packages" in parts or "dist-packages" in parts or _under(real, _STDLIB_DIR) or real.startswith("<frozen ")
    )


def is_cell(filename: str) -> bool:
    """Whether ``filename`` is the pseudo-file IPython compiles a notebook cell under."""
    return filename.startswith(("<ipython-input-", "<cell")) or _IPYKERNEL_CELL.search(filename) is not None


# ipykernel compiles a cell under <tmp>/ipykernel_<pid>/<hash>.py (not its own launcher, ipykernel_launcher.py)
_IPYKERNEL_CELL = re.compile(r"[/\\]ipykernel_\d+[/\\][^/\\]+\.py$")


# A frame's first line as traceback writes it (also in a SyntaxError's own lines).
_FRAME_FILE = re.compile(r'^(?P<indent>[ \t]*)File "(?P<path>[^"\n]+)", line (?P<line>\d+)', re.MULTILINE)


def _library_path(path: str) -> str | None:
    """An installed module's path from its package down (``torch/_tensor.py``), or None for any other file."""
    parts = path.replace("\\", "/").split("/")
    for marker in ("site-packages", "dist-packages"):
        if marker in parts:
            return "/".join(parts[len(parts) - parts[::-1].index(marker):])
    real = _real(path)
    return os.path.relpath(real, _STDLIB_DIR).replace(os.sep, "/") if _under(real, _STDLIB_DIR) else None


def _frame_place(m: re.Match[str]) -> str:
    path, line = m["path"], m["line"]
    if is_cell(path):
        return f"{m['indent']}cell line {line}"
    shown = _library_path(path)
    return m[0] if shown is None else f'{m["indent"]}File "{shown}", line {line}'


def readable(text: str) -> str:
    """A formatted traceback as a column shows it: a frame of the cell as ``cell line 5`` (not ipykernel's
    temporary file, whose name holds the kernel's pid), an installed module from its package down
    (``File "torch/_tensor.py", line 623``); every other line as it is."""
    return _FRAME_FILE.sub(_frame_place, text)


def _skipped(tb: TracebackType | None, skip: int) -> TracebackType | None:
    # Like capture.error_of: drop the caller's frames but never the innermost one.
    for _ in range(skip):
        if tb is not None and tb.tb_next is not None:
            tb = tb.tb_next
    return tb


def _chain(te: traceback.TracebackException) -> list[tuple[str, traceback.TracebackException]]:
    """The parts of an exception chain, oldest first, each after the words that lead into it."""
    parts: list[tuple[str, traceback.TracebackException]] = []
    seen: set[int] = set()
    current: traceback.TracebackException | None = te
    while current is not None and id(current) not in seen:  # a cyclic chain must still end
        seen.add(id(current))
        if current.__cause__ is not None:
            lead, following = _CAUSE, current.__cause__
        elif current.__context__ is not None and not current.__suppress_context__:
            lead, following = _CONTEXT, current.__context__
        else:
            lead, following = "", None
        parts.append((lead, current))
        current = following
    return parts[::-1]


def _short(te: traceback.TracebackException) -> str:
    """The chain formatted like traceback does, with nbdist's frames left out of every part."""
    out: list[str] = []
    for lead, part in _chain(te):
        out.append(lead)
        kept = [frame for frame in part.stack if not _is_internal(frame.filename)]
        hidden = len(part.stack) - len(kept)
        if hidden:
            out.append(f"Traceback (nbdist's own frames hidden; {hidden} hidden):\n")
        elif kept:
            out.append("Traceback (most recent call last):\n")
        out.extend(traceback.StackSummary.from_list(kept).format())
        out.extend(part.format_exception_only())  # includes add_note() notes on Python 3.11+
    return "".join(out)


def _where(stack: traceback.StackSummary) -> str:
    """One line naming the innermost frame of the user's code, or "" when there is none."""
    outside = [frame for frame in stack if not _is_internal(frame.filename)]
    users = [frame for frame in outside if not _is_library(frame.filename)]
    frames = users or outside
    if not frames:
        return ""
    frame = frames[-1]
    # A cell's pseudo-filename means nothing to the reader; a module's base name does.
    place = (
        f"line {frame.lineno}"
        if is_cell(frame.filename)
        else f"{os.path.basename(frame.filename)} line {frame.lineno}"
    )
    return f"`{frame.line}`, {place}" if frame.line else place


def _safe_text(exc: BaseException) -> str:
    """``str(exc)``, else ``repr(exc)``, else a placeholder: whichever first does not raise."""
    for render in (str, repr):
        try:
            return render(exc)
        except Exception:  # the user's __str__ may do anything
            continue
    return f"<{type(exc).__name__} object>"


def summarise(exc: BaseException, skip: int = 0) -> dict[str, str]:
    """What a rank's column shows of an error; never raises.

    Returns ``ename``, ``evalue``, ``traceback`` (the full text after dropping the first ``skip``
    frames, which are the caller's own), ``short`` (the same without nbdist's frames) and ``where``
    (the innermost frame of the user's code, in one line).
    """
    ename = type(exc).__name__
    evalue = _safe_text(exc)
    try:
        tb = _skipped(exc.__traceback__, skip)
        full = "".join(traceback.format_exception(type(exc), exc, tb))
        te = traceback.TracebackException(type(exc), exc, tb)
        return {"ename": ename, "evalue": evalue, "traceback": full, "short": _short(te), "where": _where(te.stack)}
    except Exception:  # formatting an odd exception must not hide the error itself
        text = f"{ename}: {evalue}\n" if evalue else f"{ename}\n"  # the last line traceback would print
        return {"ename": ename, "evalue": evalue, "traceback": text, "short": text, "where": ""}
