"""Keep torch's C++ log lines out of the notebook, where nbdist can (at ``%load_ext``, before torch loads).

nbdist's own store and process groups make torch's C++ code print to fd 2, which
ipykernel shows in the cell: ``[W... socket.cpp:207] [c10d] The hostname of the
client socket cannot be retrieved. err=-3`` on every connect where reverse DNS
fails, and ``[W... TCPStore.cpp:138] [c10d] recvValueWithTimeout failed on
SocketImpl(...)`` followed by a 20-frame ``Exception raised from recvBytes``
trace on the surviving ranks when the rank hosting the store dies.

torch reads its C++ log level once, from ``TORCH_CPP_LOG_LEVEL``, when ``import
torch`` loads ``torch._C``; setting the variable later changes nothing. So
:func:`quiet_before_torch` sets it only while torch is not yet imported and the
user has not set it, and otherwise returns a note saying how to silence the lines.

What stays visible:

- ``warnings.warn`` from user code, and torch's ``TORCH_WARN`` raised inside a call
  made from Python: torch turns those into Python warnings (``torch::PyWarningHandler``);
  they end in "(Triggered internally at ...)".
- C++ errors (``[E...]`` lines, e.g. "Gloo connectFullMesh failed"), and every
  exception raised into Python, including gloo's "Connection closed by peer".

What is hidden besides nbdist's noise: any torch C++ ``LOG(WARNING)``/``C10D_WARNING``
line, and a ``TORCH_WARN`` raised on a thread that is not running a Python call
(torch's default handler, ``c10::WarningHandler::process``, logs those at WARNING).
Child processes started from the kernel inherit the variable.

gloo's own log lines (``[.../gloo/...] WARN ...``) follow ``GLOO_LOG_LEVEL``, not
this variable; none appeared in the cases above (peer killed before, during or
between collectives), so nbdist leaves that variable alone.
"""

from __future__ import annotations

import os
import sys
from collections.abc import Mapping, MutableMapping

# What nbdist sets before torch loads. torch reads it in c10::detail::setLogLevelFlagFromEnv()
# (c10/util/Logging.cpp), called by c10::initLogging() from initModule() (torch/csrc/Module.cpp)
# when `import torch` loads torch._C. It sets FLAGS_caffe2_log_level (default 1, WARNING), which
# gates c10's LOG(...) (MessageLogger) and c10d's C10D_WARNING/C10D_INFO
# (torch/csrc/distributed/c10d/logging.cpp, isLogLevelEnabled). torch has no API to change it
# after import. ERROR, not FATAL: [E...] lines come with real failures and stay.
QUIET = {"TORCH_CPP_LOG_LEVEL": "ERROR"}

_EXAMPLES = ('"[c10d] The hostname of the client socket cannot be retrieved" and the "Exception raised from ..." '
             "traces printed when a rank dies")


def torch_loaded(modules: Mapping[str, object] = sys.modules) -> bool:
    """Whether torch's C++ side may have started: ``torch`` or any submodule imported (also a failed import)."""
    return any(name == "torch" or name.startswith("torch.") for name in modules)


def plan(environ: Mapping[str, str], modules: Mapping[str, object] = sys.modules) -> tuple[dict[str, str], str | None]:
    """What to set (a subset of :data:`QUIET`) and the note for the init summary, if any; changes nothing.

    A variable present in ``environ`` is the user's, whatever its value (even empty): never overridden.
    """
    missing = {key: value for key, value in QUIET.items() if key not in environ}
    if not missing:
        return {}, None
    if not torch_loaded(modules):
        return missing, None
    settings = " ".join(f"{key}={value}" for key, value in missing.items())
    note = (f"torch was imported before %load_ext nbdist, so torch's C++ log lines (such as {_EXAMPLES}) may appear "
            f"in this notebook; to silence them, restart the kernel and run %load_ext nbdist before anything imports "
            f"torch, or set {settings} before starting Jupyter")
    return {}, note


def quiet_before_torch(environ: MutableMapping[str, str] = os.environ,
                       modules: Mapping[str, object] = sys.modules) -> str | None:
    """Set :data:`QUIET` in ``environ`` if torch is not loaded yet and the user has not set it.

    Returns None when set (or when the user's own value stands); when torch is already
    loaded, sets nothing and returns a note for the init summary (shown as "warning: {note}.").
    """
    values, note = plan(environ, modules)
    environ.update(values)
    return note
