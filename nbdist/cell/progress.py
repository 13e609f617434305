"""tqdm's notebook bars as text bars inside a rank's column.

A ``tqdm.notebook`` bar (what ``tqdm.auto`` picks in Jupyter) is a widget: the
column would hold only its first state, since its updates go to the frontend
as widget messages. While a %%collective body runs, bars made from
``tqdm.notebook`` are made as tqdm's text bars instead (``tqdm.asyncio``'s, so
``async for`` still works), writing carriage-return updates to stderr, which
the column keeps as the latest state (:mod:`nbdist.cell.outputlog`). Outside bodies
the notebook bars are untouched. ``tqdm.notebook`` first imported inside a
body (``from tqdm.auto import tqdm`` in the cell itself) is switched as soon as
it is loaded, by an import hook that stands only while a body runs.
"""

from __future__ import annotations

import importlib.abc
import importlib.machinery
import sys
from typing import Any

_active = [False]
_NOTEBOOK_ONLY = ("display", "colour")


def _text_bars_new(original: Any) -> Any:
    def __new__(cls: type, *args: Any, **kwargs: Any) -> Any:
        if not _active[0]:
            return original(cls, *args, **kwargs)
        from tqdm.asyncio import tqdm_asyncio

        kwargs = {k: v for k, v in kwargs.items() if k not in _NOTEBOOK_ONLY}
        kwargs.setdefault("file", sys.stderr)
        return tqdm_asyncio(*args, **kwargs)  # not a cls: Python does not run cls.__init__ on it

    __new__.__nbdist_original__ = original  # type: ignore[attr-defined]
    return __new__


def patch_loaded() -> None:
    """Install the switch on ``tqdm.notebook``'s bar class, if that module is loaded (idempotent)."""
    module = sys.modules.get("tqdm.notebook")
    cls = getattr(module, "tqdm_notebook", None)
    if cls is None or _ours(cls):
        return
    cls.__new__ = staticmethod(_text_bars_new(cls.__new__))


def _ours(cls: type) -> bool:
    return hasattr(getattr(cls.__dict__.get("__new__"), "__func__", None), "__nbdist_original__")


def unpatch() -> None:
    """Put tqdm's own ``__new__`` back (``%unload_ext``)."""
    module = sys.modules.get("tqdm.notebook")
    cls = getattr(module, "tqdm_notebook", None)
    if cls is not None and _ours(cls):
        del cls.__new__  # the inherited one (tqdm.std's) is what stood before


class _SwitchOnImport(importlib.abc.MetaPathFinder):
    """Finds ``tqdm.notebook`` as the import system would, and switches its bars once it has loaded."""

    def find_spec(self, name: str, path: Any, target: Any = None) -> Any:
        if name != "tqdm.notebook":
            return None
        spec = importlib.machinery.PathFinder.find_spec(name, path)
        if spec is not None and spec.loader is not None and hasattr(spec.loader, "exec_module"):
            spec.loader = _SwitchingLoader(spec.loader)
        return spec


class _SwitchingLoader(importlib.abc.Loader):
    def __init__(self, real: Any) -> None:
        self.real = real

    def create_module(self, spec: Any) -> Any:
        return self.real.create_module(spec)

    def exec_module(self, module: Any) -> None:
        self.real.exec_module(module)
        patch_loaded()


class TextBars:
    """``with TextBars():`` around a body: notebook bars made inside it are text bars."""

    def __init__(self) -> None:
        self._hook: _SwitchOnImport | None = None

    def __enter__(self) -> TextBars:
        patch_loaded()
        if "tqdm.notebook" not in sys.modules:
            self._hook = _SwitchOnImport()
            sys.meta_path.insert(0, self._hook)
        _active[0] = True
        return self

    def __exit__(self, *exc: object) -> None:
        _active[0] = False
        if self._hook is not None and self._hook in sys.meta_path:
            sys.meta_path.remove(self._hook)
